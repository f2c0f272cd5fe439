//! A load test of one standalone driver: jobs submitted back to back by concurrent clients to a
//! driver with 4 executors, with seeded cancels of queued and running jobs mixed in, while idle
//! TCP connections are held open to the web UI and the control plane for the whole run (and
//! reopened as the driver closes them at its first-request deadline or to make room).
//!
//! It checks that every job ends in a final state (succeeded, or cancelled when the test asked
//! for it; none failed, none stuck), that the web UI (`/api/v1/jobs`, `/metrics`) and
//! `ringflow status` keep answering (a generous limit that only a hang breaks; the latencies
//! are reported, not asserted), that the driver's memory stays bounded, that its open files and
//! threads return near their level before the load, and that it keeps only `--retained-jobs`
//! finished jobs. It prints the figures.
//!
//! The regular suite runs a small version; `benches/load_driver.sh` runs the full size (200
//! jobs, 500 + 500 idle connections). Environment: `RINGFLOW_LOAD_JOBS` (default 20),
//! `RINGFLOW_LOAD_IDLE` (idle connections per port, default 50), `RINGFLOW_LOAD_CLIENTS`
//! (default 4), `RINGFLOW_LOAD_SEED` (default 15).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};

use crate::distributed::executor;
use crate::helpers::*;
use crate::process::Process;
use crate::security::{driver, write};

const SECRET: &str = "0d9c8b7a6f5e4d3c2b1a09f8e7d6c5b4";
/// Executors of the driver.
const EXECUTORS: usize = 4;
/// The longest a probe of the UI or `ringflow status` may take: only a hang breaks it (speed is
/// reported, never asserted).
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// How long one submitted job may take, queueing behind the others included.
const JOB_LIMIT: Duration = Duration::from_secs(600);

/// The size of the run, from the environment.
struct LoadConfig {
    jobs: usize,
    idle: usize,
    clients: usize,
    seed: u64,
    /// The driver's `--retained-jobs`: a quarter of the jobs, so that retention is exercised.
    retained: usize,
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        Err(_) => default,
    }
}

impl LoadConfig {
    fn from_env() -> LoadConfig {
        let jobs = env_number("RINGFLOW_LOAD_JOBS", 20).max(1) as usize;
        LoadConfig {
            jobs,
            idle: env_number("RINGFLOW_LOAD_IDLE", 50) as usize,
            clients: env_number("RINGFLOW_LOAD_CLIENTS", 4).max(1) as usize,
            seed: env_number("RINGFLOW_LOAD_SEED", 15),
            retained: (jobs / 4).max(1),
        }
    }
}

/// What `/proc` says about a process.
#[derive(Clone, Copy, Debug)]
struct Usage {
    rss_kib: u64,
    fds: usize,
    threads: u64,
}

fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("the driver (pid {pid}) has no /proc status: {e}"));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd cannot be listed: {e}"));
    Usage {
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
    }
}

/// Raises this process's open-file limit to its hard limit: the test holds many connections.
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid pointer.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// Sets a stop flag when dropped, so that the helper threads end when the test does, even
/// when it fails.
struct Stopper(Arc<AtomicBool>);

impl Drop for Stopper {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Whether the peer has closed `conn` (it sent nothing, so any byte or error means closed).
fn is_closed(conn: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match conn.peek(&mut buf) {
        Ok(_) => true,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

fn connect_idle(addr: &SocketAddr) -> Option<TcpStream> {
    let conn = TcpStream::connect_timeout(addr, Duration::from_secs(2)).ok()?;
    conn.set_nonblocking(true).ok()?;
    Some(conn)
}

/// Holds `n` connections that send nothing to each of `addrs` on a thread, reopening every
/// one the driver closes (twice a second), until `stop` is set; the thread returns how many
/// connections it opened in all.
fn hold_idle(addrs: &[String], n: usize, stop: Arc<AtomicBool>) -> JoinHandle<usize> {
    let addrs: Vec<SocketAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
    std::thread::spawn(move || {
        let mut conns: Vec<(SocketAddr, Option<TcpStream>)> = addrs
            .iter()
            .flat_map(|a| std::iter::repeat_n(*a, n))
            .map(|a| (a, None))
            .collect();
        let mut opened = 0;
        while !stop.load(Ordering::SeqCst) {
            for (addr, conn) in conns.iter_mut() {
                if conn.as_ref().is_none_or(is_closed) {
                    *conn = connect_idle(addr);
                    opened += usize::from(conn.is_some());
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        opened
    })
}

/// `GET url` on a new connection, with deadlines: its latency, or why it failed.
fn timed_get(url: &str) -> Result<Duration, String> {
    let start = Instant::now();
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr: SocketAddr = host.parse().expect("an address");
    let mut conn = TcpStream::connect_timeout(&addr, ANSWER_LIMIT).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(ANSWER_LIMIT))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply)
        .map_err(|e| format!("{url}: {e}"))?;
    let head = String::from_utf8_lossy(&reply[..reply.len().min(32)]).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{url} answered {head:?}"));
    }
    Ok(start.elapsed())
}

/// What the prober measured while the load ran.
#[derive(Default)]
struct Probes {
    ui: Vec<Duration>,
    status: Vec<Duration>,
    usage: Vec<Usage>,
    errors: Vec<String>,
}

/// Probes the UI and `ringflow status` and samples the driver's usage, once a second, until
/// `stop` is set.
fn probe(pid: u32, url: String, ui: String, secret: String, stop: Arc<AtomicBool>) -> Probes {
    let mut p = Probes::default();
    while !stop.load(Ordering::SeqCst) {
        p.usage.push(usage(pid));
        for path in ["api/v1/jobs", "api/v1/executors", "metrics"] {
            match timed_get(&format!("{ui}{path}")) {
                Ok(t) => p.ui.push(t),
                Err(e) => p.errors.push(e),
            }
        }
        let start = Instant::now();
        let run = ringflow(
            &["status", "--driver", &url, "--secret-file", &secret],
            Duration::from_secs(60),
        );
        if run.status.success() {
            p.status.push(start.elapsed());
        } else {
            p.errors
                .push(format!("ringflow status failed: {}", run.stderr));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    p
}

/// Everything the clients share.
struct Load {
    config: LoadConfig,
    dir: PathBuf,
    data: String,
    url: String,
    secret: String,
    next: AtomicUsize,
    outcomes: Mutex<Vec<Outcome>>,
}

/// How one job ended.
#[derive(Debug)]
struct Outcome {
    index: usize,
    executors: usize,
    cancel_asked: bool,
    /// What `ringflow cancel` said, when it was asked.
    cancel_reply: String,
    exit_ok: bool,
    /// `status` of the job's summary.
    status: String,
    error: String,
}

/// Job `i`'s spec: a tiny MLP on the regression data, on 1 to 4 executors.
fn spec(load: &Load, i: usize, executors: usize) -> String {
    let train = format!("epochs = 20\nbatch_size = 16\nseed = {i}");
    let ckpt = s(&load.dir.join("runs").join(format!("load-{i}")));
    let cluster = format!("executors = {executors}\ncheckpoint_dir = \"{ckpt}\"");
    let toml = regression_toml("load", &load.data, "", 16, &train, &cluster);
    job(&load.dir, &format!("load-{i}"), &toml)
}

/// Submits job `i` and follows it to its end; a seeded quarter of the jobs are cancelled from
/// another process after a seeded delay (queued or running, whichever they are by then).
fn run_job(load: &Load, i: usize) -> Outcome {
    let mut rng = rand::rngs::StdRng::seed_from_u64(load.config.seed ^ ((i as u64 + 1) << 8));
    let executors = rng.random_range(1..=EXECUTORS);
    let cancel_asked = rng.random_range(0..4) == 0;
    let delay = Duration::from_millis(rng.random_range(0..2000));
    let spec = spec(load, i, executors);
    let out = load.dir.join(format!("load-{i}.json"));
    let submit = Process::start(&[
        "submit",
        &spec,
        "--driver",
        &load.url,
        "--secret-file",
        &load.secret,
        "--summary-json",
        &s(&out),
    ]);
    let mut cancel_reply = String::new();
    if cancel_asked {
        let id = submit.printed_after("submitted job ");
        let id = id.split_whitespace().next().unwrap().to_string();
        std::thread::sleep(delay);
        let run = ringflow(
            &[
                "cancel",
                &id,
                "--driver",
                &load.url,
                "--secret-file",
                &load.secret,
            ],
            Duration::from_secs(60),
        );
        // A job that ended before the cancel may already be forgotten (`--retained-jobs`).
        let forgotten = run.stderr.contains(&format!("has no job \"{id}\""));
        assert!(run.status.success() || forgotten, "{}", run.stderr);
        cancel_reply = match forgotten {
            true => "had already ended (forgotten)".to_string(),
            false => run.stdout.trim().to_string(),
        };
    }
    let (status, stderr) = submit.finish(JOB_LIMIT);
    let sm = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let field = |k: &str| {
        sm.as_ref()
            .and_then(|v| v[k].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    Outcome {
        index: i,
        executors,
        cancel_asked,
        cancel_reply,
        exit_ok: status.success(),
        status: if sm.is_some() {
            field("status")
        } else {
            format!("no summary; stderr:\n{stderr}")
        },
        error: field("error"),
    }
}

/// A client: takes the next job until all are taken.
fn client(load: &Load) {
    loop {
        let i = load.next.fetch_add(1, Ordering::SeqCst);
        if i >= load.config.jobs {
            return;
        }
        let outcome = run_job(load, i);
        load.outcomes.lock().unwrap().push(outcome);
    }
}

/// The `q`-quantile of `times`, in milliseconds.
fn quantile_ms(times: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return f64::NAN;
    }
    ms[((ms.len() - 1) as f64 * q).round() as usize]
}

fn latency_line(what: &str, times: &[Duration]) -> String {
    format!(
        "{what}: {} answers, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        times.len(),
        quantile_ms(times, 0.5),
        quantile_ms(times, 0.9),
        quantile_ms(times, 0.99),
        quantile_ms(times, 1.0)
    )
}

/// Checks every job's end: a succeeded summary and exit 0, or, for a job the test cancelled,
/// a cancelled one (or succeeded, when the cancel came after its end).
fn check_outcomes(outcomes: &[Outcome], jobs: usize) -> (usize, usize) {
    assert_eq!(outcomes.len(), jobs, "not every job was submitted");
    let (mut succeeded, mut cancelled) = (0, 0);
    for o in outcomes {
        match o.status.as_str() {
            "succeeded" => {
                assert!(o.exit_ok, "job {} succeeded but its submit failed", o.index);
                if o.cancel_asked {
                    assert!(o.cancel_reply.contains("had already ended"), "{o:?}");
                }
                succeeded += 1;
            }
            "cancelled" if o.cancel_asked => {
                assert!(!o.exit_ok, "a cancelled job {} exited 0", o.index);
                assert!(o.cancel_reply.starts_with("cancelled job "), "{o:?}");
                cancelled += 1;
            }
            other => panic!(
                "job {} on {} executors ended {other:?} ({}): {o:?}",
                o.index, o.executors, o.error
            ),
        }
    }
    (succeeded, cancelled)
}

/// The value of `ringflow_jobs_forgotten_total` in `/metrics`.
fn forgotten(ui: &str) -> u64 {
    let (code, text) = crate::ui::http_get(&format!("{ui}metrics"));
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("ringflow_jobs_forgotten_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no ringflow_jobs_forgotten_total in:\n{text}")) as u64
}

/// Checks the driver once the load has ended: no job left queued or running, every executor
/// idle, and only the last `retained` finished jobs kept (the others forgotten).
fn after_the_load(url: &str, ui: &str, secret: &str, jobs: usize, retained: usize) {
    let status = || {
        let run = ringflow(
            &["status", "--driver", url, "--secret-file", secret],
            Duration::from_secs(60),
        );
        run.assert_success();
        run.stdout
    };
    let out = status();
    for state in [" queued ", " waiting ", " running ", " busy "] {
        assert!(!out.contains(state), "{state:?} after the load:\n{out}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while forgotten(ui) < (jobs - retained) as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        forgotten(ui),
        (jobs - retained) as u64,
        "the driver does not forget old finished jobs"
    );
    let out = status();
    assert!(out.contains(&format!("JOBS ({retained})\n")), "{out}");
}

/// Waits (at most 60 s) until the driver's open files and threads are back within `slack` of
/// `start`; returns its usage then.
fn settled(pid: u32, start: Usage, slack: usize) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = usage(pid);
        let back = now.fds <= start.fds + slack && now.threads <= start.threads + slack as u64;
        if back || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Starts the driver (secret, UI, retention) and its executors; returns them with the URLs.
fn cluster(dir: &Path, retained: usize) -> (Process, Vec<Process>, String, String, String) {
    let secret = write(dir, "secret", SECRET);
    let (driver, url, ui) = driver(&[
        "--secret-file",
        &secret,
        "--retained-jobs",
        &retained.to_string(),
    ]);
    let executors = (0..EXECUTORS)
        .map(|_| executor(&url, &["--secret-file", &secret]))
        .collect();
    (driver, executors, url, ui, secret)
}

#[test]
fn one_driver_serves_many_jobs_and_idle_connections_and_stays_bounded() {
    let config = LoadConfig::from_env();
    let open_files = raise_open_files();
    assert!(
        open_files as usize > 2 * config.idle + 256,
        "the open-file limit ({open_files}) is too low for {} idle connections per port",
        config.idle
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_regression_data(&data, &[200, 200, 200, 200], 50);
    let (driver, _executors, url, ui, secret) = cluster(dir.path(), config.retained);
    let pid = driver.pid();
    let start = usage(pid);
    let began = Instant::now();

    let grpc = url.strip_prefix("http://").unwrap().to_string();
    let ui_addr = ui.trim_start_matches("http://").trim_end_matches('/');
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Stopper(stop.clone());
    let idle = hold_idle(&[grpc, ui_addr.to_string()], config.idle, stop.clone());
    let prober = {
        let (url, ui, secret, stop) = (url.clone(), ui.clone(), secret.clone(), stop.clone());
        std::thread::spawn(move || probe(pid, url, ui, secret, stop))
    };
    let load = Load {
        data: s(&data),
        dir: dir.path().to_path_buf(),
        url: url.clone(),
        secret: secret.clone(),
        next: AtomicUsize::new(0),
        outcomes: Mutex::new(Vec::new()),
        config,
    };
    std::thread::scope(|scope| {
        for _ in 0..load.config.clients {
            scope.spawn(|| client(&load));
        }
    });
    drop(stopper);
    let probes = prober.join().expect("the prober ends");
    let reopened = idle.join().expect("the idle-connection thread ends");
    let wall = began.elapsed();
    let outcomes = load.outcomes.into_inner().unwrap();
    let config = load.config;

    let (succeeded, cancelled) = check_outcomes(&outcomes, config.jobs);
    assert!(probes.errors.is_empty(), "{:#?}", probes.errors);
    let slowest = probes.ui.iter().chain(&probes.status).max().copied();
    assert!(
        slowest.is_some_and(|t| t < ANSWER_LIMIT),
        "the driver stopped answering: slowest probe {slowest:?}"
    );

    after_the_load(&url, &ui, &secret, config.jobs, config.retained);

    // The driver's resources return near where they were.
    let end = settled(pid, start, 16);
    let max_rss = probes.usage.iter().map(|u| u.rss_kib).max().unwrap_or(0);
    eprintln!(
        "load: {} jobs ({succeeded} succeeded, {cancelled} cancelled, {} cancels asked) by {} \
         clients in {:.1} s; {} idle connections per port held, {reopened} opened in all",
        config.jobs,
        outcomes.iter().filter(|o| o.cancel_asked).count(),
        config.clients,
        wall.as_secs_f64(),
        config.idle,
    );
    eprintln!(
        "driver RSS: start {} MiB, max {} MiB, end {} MiB; open files {} -> {}; threads {} -> {}",
        start.rss_kib / 1024,
        max_rss / 1024,
        end.rss_kib / 1024,
        start.fds,
        end.fds,
        start.threads,
        end.threads
    );
    eprintln!("{}", latency_line("web UI", &probes.ui));
    eprintln!("{}", latency_line("ringflow status", &probes.status));
    assert!(
        end.fds <= start.fds + 16,
        "open files of the driver: {} before the load, {} after",
        start.fds,
        end.fds
    );
    assert!(
        end.threads <= start.threads + 16,
        "threads of the driver: {} before the load, {} after",
        start.threads,
        end.threads
    );
    // Generous: only unbounded growth breaks it.
    let bound = 2 * start.rss_kib + 256 * 1024;
    assert!(
        end.rss_kib <= bound,
        "the driver's memory grew from {} KiB to {} KiB (bound {bound} KiB)",
        start.rss_kib,
        end.rss_kib
    );
}
