//! The soak's side of the chaos: the executors it may hit, the seeded schedule of faults, and
//! the guard that leaves no process behind.
//!
//! Every process the soak starts carries the environment variable [`MARK_ENV`] with a value of
//! its own, and the executors of `ringflow local` inherit it, so the soak finds all of them
//! (however they were re-parented) by reading `/proc/*/environ`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::network::{self, Capability, Impaired, Impairment};
use crate::process::Process;

/// Marks every process the soak starts (value: unique per run).
pub(super) const MARK_ENV: &str = "RINGFLOW_SOAK_MARK";

/// What the soak did to an executor.
#[derive(Clone, Debug)]
pub(super) enum FaultKind {
    /// SIGKILL.
    Kill,
    /// SIGSTOP, then SIGCONT after `held`.
    Stop { held: Duration },
    /// A new `ringflow executor` joined the driver with its secret.
    Start,
    /// Packets sent to the executor delayed or dropped (`tc netem`) for `held`.
    Network { how: Impairment, held: Duration },
}

/// One fault, for the report.
#[derive(Clone, Debug)]
pub(super) struct Fault {
    /// When it was injected, on the wall clock (compared with the event log's times).
    pub at: std::time::SystemTime,
    /// Seconds since the job was started.
    pub since_start: f64,
    pub kind: FaultKind,
    /// The executor's process id.
    pub pid: i32,
}

impl Fault {
    /// The fault in words: `SIGSTOP for 2.0 s`.
    pub fn describe(&self) -> String {
        match &self.kind {
            FaultKind::Kill => "SIGKILL".into(),
            FaultKind::Stop { held } => format!("SIGSTOP for {:.1} s", held.as_secs_f64()),
            FaultKind::Start => "new executor".into(),
            FaultKind::Network { how, held } => {
                format!("{} for {:.1} s", how.describe(), held.as_secs_f64())
            }
        }
    }
}

/// How the soak reaches the job: its driver, secret and the environment of its processes.
pub(super) struct Target<'a> {
    pub driver: &'a str,
    pub secret_file: &'a Path,
    /// The value of [`MARK_ENV`] and the private temporary directory of every process.
    pub mark: &'a str,
    pub tmp: &'a Path,
    /// The ring deadline of the job (`cluster.comm_timeout_s`), which stops are timed around.
    pub comm_timeout: Duration,
    /// Which network faults can be injected, if any ([`network::available`]).
    pub network: Option<Capability>,
}

/// The executors the soak may hit: those `ringflow local` started and those the soak started.
pub(super) struct Executors {
    pids: Vec<i32>,
    started: Vec<Process>,
    /// The loopback address that each executor the soak started binds its ring to.
    addresses: Vec<(i32, std::net::Ipv4Addr)>,
}

impl Executors {
    /// The executors of `ringflow local`, by process id.
    pub fn new(pids: Vec<i32>) -> Executors {
        Executors {
            pids,
            started: Vec::new(),
            addresses: Vec::new(),
        }
    }

    /// Executors still running (neither ended nor stopped).
    fn running(&self) -> Vec<i32> {
        self.pids
            .iter()
            .copied()
            .filter(|&p| state(p).is_some_and(|s| s != 'Z' && s != 'T'))
            .collect()
    }

    /// Starts a `ringflow executor` that joins `target`'s driver; waits until it registered.
    fn start(&mut self, target: &Target) -> i32 {
        let address = network::executor_address(self.started.len());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
        cmd.args(["executor", "--driver", target.driver, "--cores", "1"])
            .args([
                "--ring-bind",
                &format!("{address}:0"),
                "--exit-with-driver",
                "10",
            ])
            .arg("--secret-file")
            .arg(target.secret_file)
            .env(MARK_ENV, target.mark)
            .env("TMPDIR", target.tmp)
            .current_dir(crate::helpers::repo());
        let e = Process::spawn(cmd);
        e.wait_for("registered with");
        let pid = e.pid() as i32;
        self.pids.push(pid);
        self.started.push(e);
        self.addresses.push((pid, address));
        pid
    }

    /// A running executor the soak started, with its own address, picked by `rng`.
    fn addressed(&self, rng: &mut StdRng) -> Option<(i32, std::net::Ipv4Addr)> {
        let running = self.running();
        let candidates: Vec<_> = self
            .addresses
            .iter()
            .filter(|(pid, _)| running.contains(pid))
            .copied()
            .collect();
        (!candidates.is_empty()).then(|| candidates[rng.random_range(0..candidates.len())])
    }

    /// Every process id the soak knows of (ended ones included).
    pub fn all(&self) -> &[i32] {
        &self.pids
    }
}

/// Runs the seeded schedule against the job `run` until `soak` has passed since `started`, the
/// job ended, or it reached the epoch `quiet_from` (1-based; faults stop there, since a loss
/// after a rank finished training is not recoverable, as docs/fault-tolerance.md says).
/// Faults come one at a time, 5 to 12 s apart; the pool of running executors never drops
/// below 3 before a fault, so the ring never falls under `min_executors = 2`.
pub(super) fn inject(
    run: &Process,
    executors: &mut Executors,
    target: &Target,
    seed: u64,
    started: Instant,
    soak: Duration,
    quiet_from: u64,
) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let fault = |kind, pid| Fault {
        at: std::time::SystemTime::now(),
        since_start: started.elapsed().as_secs_f64(),
        kind,
        pid,
    };
    loop {
        let gap = Duration::from_millis(rng.random_range(5_000..12_000));
        if !sleep_while_training(run, gap) {
            break;
        }
        if started.elapsed() >= soak || last_epoch(&run.stderr()) + 1 >= quiet_from {
            break;
        }
        let running = executors.running();
        if running.len() < 3 {
            let pid = executors.start(target);
            faults.push(fault(FaultKind::Start, pid));
            continue;
        }
        let pid = running[rng.random_range(0..running.len())];
        let kind = rng.random_range(0..4);
        if kind == 3
            && let Some(can) = target.network
            && let Some((pid, how, impaired)) = impair(executors, can, &mut rng)
        {
            let held = Duration::from_millis(rng.random_range(3_000..10_000));
            faults.push(fault(FaultKind::Network { how, held }, pid));
            sleep_while_training(run, held);
            drop(impaired);
            continue;
        }
        match kind {
            0 => {
                signal(pid, libc::SIGKILL);
                faults.push(fault(FaultKind::Kill, pid));
                // A replacement, as a cluster manager would start one.
                sleep_while_training(run, Duration::from_millis(rng.random_range(500..3_000)));
                let new = executors.start(target);
                faults.push(fault(FaultKind::Start, new));
            }
            kind => {
                // Shorter than the ring's deadline (the ring waits), or longer (it breaks; past
                // the heartbeat timeout the executor is also declared lost).
                let comm = target.comm_timeout.as_millis() as u64;
                let held = Duration::from_millis(match kind {
                    1 => rng.random_range(comm / 4..comm * 3 / 4),
                    _ => rng.random_range(comm + 1_000..comm + 10_000),
                });
                signal(pid, libc::SIGSTOP);
                faults.push(fault(FaultKind::Stop { held }, pid));
                std::thread::sleep(held);
                signal(pid, libc::SIGCONT);
            }
        }
    }
    faults
}

/// Starts impairing the packets sent to a running executor the soak started, until
/// the returned guard is dropped; `None` when no such executor runs or `tc` refused (said on
/// stderr).
fn impair(
    executors: &Executors,
    can: Capability,
    rng: &mut StdRng,
) -> Option<(i32, Impairment, Impaired)> {
    let (pid, address) = executors.addressed(rng)?;
    let how = match (can, rng.random_range(0..2)) {
        (Capability::Netem, 0) => {
            Impairment::Delay(Duration::from_millis(rng.random_range(200..1_500)))
        }
        (Capability::Netem, _) => Impairment::Loss(rng.random_range(10..40)),
        (Capability::Throttle, _) => Impairment::Throttle(rng.random_range(100..1_000)),
    };
    match Impaired::install(address, how) {
        Ok(impaired) => Some((pid, how, impaired)),
        Err(e) => {
            eprintln!("network fault not injected: {e}");
            None
        }
    }
}

/// Sleeps `d` unless the job ends first; returns whether it still runs.
fn sleep_while_training(run: &Process, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if run.has_ended() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    !run.has_ended()
}

/// The last epoch (1-based) that `ringflow local` reported as ended ("epoch K/N: loss …").
pub(super) fn last_epoch(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("epoch ")?.split_once('/'))
        .filter(|(_, rest)| rest.contains(": loss"))
        .filter_map(|(k, _)| k.parse().ok())
        .max()
        .unwrap_or(0)
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this soak started (or `ringflow local` started for it).
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The state letter of process `pid` in `/proc/PID/stat` (`R`, `S`, `T`, `Z`, …), if it exists.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces; the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Running processes (not zombies) whose environment holds `MARK_ENV=mark`, with their
/// command lines.
pub(super) fn marked(mark: &str) -> Vec<(i32, String)> {
    let needle = format!("{MARK_ENV}={mark}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| state(pid).is_some_and(|s| s != 'Z'))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
        })
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (pid, cmd.trim().to_string())
        })
        .collect()
}

/// Kills every process marked with its value when dropped, so a failing soak leaves nothing
/// running (the executors of `ringflow local` included).
pub(super) struct Reaper(pub String);

impl Drop for Reaper {
    fn drop(&mut self) {
        for (pid, _) in marked(&self.0) {
            signal(pid, libc::SIGCONT);
            signal(pid, libc::SIGKILL);
        }
    }
}
