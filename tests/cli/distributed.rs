//! Driver and executor processes: rendezvous, the ring, partitions, replicas, and shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{job, mnist_data, repo, ringflow, s, summary, write_regression_data};
use crate::process::Process;

const LONG: Duration = Duration::from_secs(900);

/// `ringflow bench allreduce --check` verifies sum, average, broadcast and all-gather computed
/// by real executor processes against the serial result, for several ring sizes and awkward
/// lengths.
#[test]
fn collectives_across_processes_equal_the_serial_computation() {
    for (ranks, floats) in [(1, 10), (2, 0), (3, 1), (4, 3), (5, 100_003), (3, 65_537)] {
        let run = ringflow(
            &[
                "bench",
                "allreduce",
                "--ranks",
                &ranks.to_string(),
                "--floats",
                &floats.to_string(),
                "--check",
            ],
            LONG,
        );
        run.assert_success();
        assert!(
            run.stdout
                .contains(&format!("allreduce check ranks={ranks} floats={floats} ok")),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn the_benchmark_prints_its_figures() {
    let run = ringflow(
        &[
            "bench",
            "allreduce",
            "--ranks",
            "3",
            "--size-mb",
            "1",
            "--iters",
            "3",
        ],
        LONG,
    );
    run.assert_success();
    let last = run.stdout.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("allreduce ranks=3 bytes=1048576 time_ms="),
        "{last}"
    );
    for key in ["algbw_GBps=", "busbw_GBps="] {
        let v: f64 = last
            .split(key)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {last}"));
        assert!(v > 0.0, "{last}");
    }
}

/// Four executors reach the accuracy of one, and every replica ends bit-identical.
#[test]
fn mnist_on_four_executors_matches_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut acc = Vec::new();
    for n in [1, 4] {
        let out = dir.path().join(format!("{n}.json"));
        ringflow(
            &[
                "local",
                "examples/mnist.toml",
                "--executors",
                &n.to_string(),
                "--set",
                &format!(
                    "cluster.checkpoint_dir={}",
                    s(&dir.path().join(n.to_string()))
                ),
                "--summary-json",
                &s(&out),
            ],
            LONG,
        )
        .assert_success();
        let sm = summary(&out);
        assert_eq!(sm["executors"], n);
        assert_eq!(
            sm["samples"],
            5 * 60_000,
            "every row once per epoch (60000 = 0 mod {n})"
        );
        assert_eq!(
            sm["replicas_identical"], true,
            "parameter checksums of all ranks agree"
        );
        assert_eq!(sm["test_rows"], 10_000);
        acc.push(sm["test_accuracy"].as_f64().unwrap());
    }
    assert!(acc[0] >= 0.975, "1 executor: {}", acc[0]);
    assert!(
        (acc[0] - acc[1]).abs() <= 0.005,
        "4 executors {} vs 1 executor {}: more than 0.5 points apart",
        acc[1],
        acc[0]
    );
}

/// Three executors over 1000 rows: each epoch trains on exactly 999 rows (the documented
/// remainder, rows mod N, is left out), and evaluation covers every test row.
#[test]
fn every_row_is_used_once_per_epoch_apart_from_the_remainder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rows = write_regression_data(&data, &[400, 333, 267], 50);
    assert_eq!(rows, 1000);
    let spec = job(
        dir.path(),
        "rows",
        &format!(
            r#"
[data]
train = "{train}"
test = "{train}"
features = ["a", "b", "v"]
label = "y"
[model]
kind = "mlp"
layers = [4, 8, 1]
[train]
epochs = 3
batch_size = 40
loss = "mse"
[cluster]
executors = 3
checkpoint_dir = "{ckpt}"
"#,
            train = s(&data),
            ckpt = s(&dir.path().join("ckpt")),
        ),
    );
    let out = dir.path().join("s.json");
    ringflow(&["local", &spec, "--summary-json", &s(&out)], LONG).assert_success();
    let sm = summary(&out);
    assert_eq!(sm["samples"], 3 * 999);
    assert_eq!(
        sm["steps"],
        3 * 9,
        "⌈333 / 40⌉ = 9 steps per epoch on every rank"
    );
    assert_eq!(sm["test_rows"], 1000);
    assert_eq!(sm["replicas_identical"], true);
}

/// A driver and executors as separate processes: no cluster spec, only the driver's URL; a
/// job that asks for more executors than exist fails after its rendezvous deadline with a
/// message saying how many registered and from where.
#[test]
fn standalone_driver_executors_and_rendezvous_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Process::start(&["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    let url = driver.printed_after("driver listening on ");
    let spec = |n: usize, timeout: u64, name: &str| {
        job(
            dir.path(),
            name,
            &format!(
                r#"
{data}[model]
kind = "mlp"
layers = [784, 32, 10]
[train]
epochs = 1
batch_size = 256
optimizer = {{ kind = "sgd", lr = 0.1, momentum = 0.9 }}
[cluster]
executors = {n}
rendezvous_timeout_s = {timeout}
checkpoint_dir = "{ckpt}"
"#,
                data = mnist_data(),
                ckpt = s(&dir.path().join(name)),
            ),
        )
    };
    // No executors at all.
    let run = ringflow(&["submit", &spec(2, 2, "none"), "--driver", &url], LONG);
    let err = run.assert_clean_failure();
    assert!(
        err.contains("waited 2 s for 2 executors, but 0 registered"),
        "{err}"
    );

    let mut e1 = executor(&url, &[]);
    let run = ringflow(&["submit", &spec(2, 3, "one"), "--driver", &url], LONG);
    let err = run.assert_clean_failure();
    assert!(
        err.contains("but 1 registered: exec-"),
        "names the executor: {err}"
    );
    assert!(
        err.contains(" from "),
        "and where it registered from: {err}"
    );

    let mut e2 = executor(&url, &[]);
    let out = dir.path().join("ok.json");
    let run = ringflow(
        &[
            "submit",
            &spec(2, 30, "two"),
            "--driver",
            &url,
            "--summary-json",
            &s(&out),
        ],
        LONG,
    );
    run.assert_success();
    let sm = summary(&out);
    assert_eq!(sm["executors"], 2);
    assert_eq!(sm["replicas_identical"], true);
    assert!(sm["test_accuracy"].as_f64().unwrap() > 0.9);

    let status = ringflow(&["status", "--driver", &url], Duration::from_secs(30));
    status.assert_success();
    assert_eq!(
        status.stdout.matches(" idle ").count(),
        2,
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("succeeded"), "{}", status.stdout);
    assert!(
        status.stdout.contains("DEVICES") && status.stdout.contains(" cpu"),
        "executors list their devices: {}",
        status.stdout
    );

    for d in [&mut e1, &mut e2, &mut driver] {
        d.terminate();
    }
}

/// Interrupting `ringflow local` (Ctrl-C, SIGTERM, or killing it outright) leaves no executor
/// process behind.
#[test]
fn interrupting_local_leaves_no_executor_running() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringflow"))
            .args([
                "local",
                "examples/mnist_wide.toml",
                "--executors",
                "3",
                "--set",
                "train.epochs=50",
                "--set",
                &format!("cluster.checkpoint_dir={}", s(dir.path())),
            ])
            .current_dir(repo())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pids = Vec::new();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(120);
        // Wait until the executors exist and training has started.
        while Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(rest) = line.split("(pids ").nth(1) {
                pids = rest
                    .split(')')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .map(|p| p.parse::<i32>().unwrap())
                    .collect();
            }
            if line.starts_with("rank 2:") {
                break;
            }
        }
        assert_eq!(pids.len(), 3, "the executors' pids were printed");
        std::thread::sleep(Duration::from_millis(1500));
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        std::thread::spawn(move || for _ in lines {});
        wait_with_deadline(&mut child, Duration::from_secs(30));
        let deadline = Instant::now() + Duration::from_secs(15);
        while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let left: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
        for &p in &left {
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        assert!(
            left.is_empty(),
            "signal {signal}: executors still running: {left:?}"
        );
    }
}

/// A process that exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => !status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
        Err(_) => false,
    }
}

fn wait_with_deadline(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An executor of the driver at `url` with one core and `extra` options, once it has
/// registered.
pub(crate) fn executor(url: &str, extra: &[&str]) -> Process {
    let mut args = vec!["executor", "--driver", url, "--cores", "1"];
    args.extend(extra);
    let e = Process::start(&args);
    e.wait_for(&format!("registered with {url}"));
    e
}

/// A model kind defined in user code (`examples/custom_model.rs`) trains with `local` on two
/// executor processes, which are that same program; the stock binary refuses the kind by name.
#[test]
fn a_custom_model_kind_trains_in_its_own_binary() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_ringflow"))
        .parent()
        .expect("target directory")
        .join("examples/custom_model");
    assert!(
        exe.is_file(),
        "{} is missing: `cargo test` builds the examples",
        exe.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.json");
    let ckpt = format!("cluster.checkpoint_dir={}", s(dir.path()));
    let run = crate::helpers::run_program(
        &exe,
        &[
            "local",
            "examples/custom_model.toml",
            "--set",
            "train.epochs=1",
            "--set",
            &ckpt,
            "--summary-json",
            &s(&out),
        ],
        LONG,
    );
    run.assert_success();
    let sm = summary(&out);
    assert_eq!(sm["executors"], 2);
    assert_eq!(sm["replicas_identical"], true);
    assert!(
        sm["test_accuracy"].as_f64().unwrap() > 0.93,
        "{}",
        sm["test_accuracy"]
    );

    let run = ringflow(
        &["local", "examples/custom_model.toml", "--set", &ckpt],
        LONG,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("model.kind \"residual_mlp\" is not known"),
        "{err}"
    );
    assert!(err.contains("mlp"), "lists the known kinds: {err}");
}
