//! A dead executor is reported by its cause, as soon as it is knowable: `ringflow local` by its
//! child's exit status, a standalone driver by the executor's closed connection, with what the
//! executor said as it died (out of memory), and never by a neighbour's broken ring.

use std::process::Command;
use std::time::Duration;

use crate::distributed::executor;
use crate::helpers::{job, mnist_data, repo, s, small_mnist_job, summary};
use crate::process::Process;
use crate::recovery::watch_local;

const LIMIT: Duration = Duration::from_secs(300);

/// The heartbeat's sentence, which none of these losses may fall back to.
const SILENCE: &str = "stopped sending heartbeats";

/// The rank of the executor with process id `pid`, from the job's "rank N: executor
/// exec-HOST-PID-…" lines.
fn rank_of(stderr: &str, pid: i32) -> usize {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("rank "))
        .find(|l| l.contains(&format!("-{pid}-")))
        .and_then(|l| l.split(':').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no rank line names process {pid}:\n{stderr}"))
}

/// `ringflow local` on two executors with `extra` settings, one of them killed with SIGKILL
/// once the first epoch is done: the exit status, its rank, and stderr.
fn local_with_a_killed_executor(extra: &[&str]) -> (std::process::ExitStatus, usize, String) {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_mnist_job(dir.path(), "killed", 2, 6, 64, &dir.path().join("run"));
    let mut args: Vec<String> = ["local", spec.as_str(), "--ui", "off"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    let (run, pids, _) = watch_local(&args, "epoch 1/6");
    assert_eq!(pids.len(), 2, "{}", run.stderr());
    let rank = rank_of(&run.stderr(), pids[1]);
    // SAFETY: kill(2) on an executor process this test's `ringflow local` started.
    unsafe {
        libc::kill(pids[1], libc::SIGKILL);
    }
    let (status, stderr) = run.finish(LIMIT);
    (status, rank, stderr)
}

/// A job that is not elastic fails at once with the killed executor's exit status, not with
/// its neighbour's broken ring or the heartbeat timeout.
#[test]
fn local_names_a_killed_executor_by_its_exit_status() {
    let (status, rank, stderr) = local_with_a_killed_executor(&[]);
    assert!(!status.success(), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{stderr}"));
    assert!(
        error.starts_with("error: executor exec-")
            && error.ends_with(&format!(
                "(rank {rank}) exited: killed by signal 9 (SIGKILL)"
            )),
        "{stderr}"
    );
    assert!(!stderr.contains(SILENCE), "{stderr}");
}

/// An elastic job re-forms its ring without the killed executor, and its recovery message
/// names the same cause.
#[test]
fn an_elastic_recovery_names_a_killed_executor_by_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let (status, rank, stderr) = local_with_a_killed_executor(&[
        "--set",
        "cluster.min_executors=1",
        "--summary-json",
        &s(&out),
    ]);
    assert!(status.success(), "{stderr}");
    let recovery = stderr
        .lines()
        .find(|l| l.starts_with("recovery 1: the ring is re-formed with 1 executors"))
        .unwrap_or_else(|| panic!("no recovery:\n{stderr}"));
    assert!(
        recovery.contains(&format!(
            "(rank {rank}) exited: killed by signal 9 (SIGKILL))"
        )),
        "{recovery}"
    );
    assert!(!stderr.contains(SILENCE), "{stderr}");
    assert_eq!(summary(&out)["executors_lost"], 1);
}

/// A driver whose heartbeat timeout is far away, so that only a closed connection can tell.
fn patient_driver() -> (Process, String) {
    let driver = Process::start(&[
        "driver",
        "--bind",
        "127.0.0.1:0",
        "--ui",
        "off",
        "--executor-timeout",
        "600",
    ]);
    let url = driver.printed_after("driver listening on ");
    (driver, url)
}

/// The executor id an executor process printed when it registered.
fn executor_id(e: &Process) -> String {
    let line = e.wait_for("registered with");
    line.split_whitespace()
        .nth(1)
        .expect("executor ID registered with …")
        .to_string()
}

/// A standalone driver learns of a SIGKILLed executor from its closed connection, in seconds.
#[test]
fn a_standalone_driver_names_an_executor_whose_connection_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_driver, url) = patient_driver();
    let _e1 = executor(&url, &[]);
    let e2 = executor(&url, &[]);
    let killed = executor_id(&e2);
    let spec = small_mnist_job(dir.path(), "cut", 2, 20, 64, &dir.path().join("run"));
    let run = Process::start(&["submit", &spec, "--driver", &url]);
    run.wait_for_start("epoch 1/20");
    // SAFETY: kill(2) on an executor process this test started.
    unsafe {
        libc::kill(e2.pid() as i32, libc::SIGKILL);
    }
    let (status, stderr) = run.finish(LIMIT);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.lines().any(
            |l| l.starts_with(&format!("error: executor {killed} (rank "))
                && l.ends_with(
                    "lost its connection to the driver (its process ended or its host went down)"
                )
        ),
        "{stderr}"
    );
    assert!(!stderr.contains(SILENCE), "{stderr}");
}

/// An executor whose address space is limited (`RLIMIT_AS`) builds a model too wide for it:
/// the allocation fails, and before the process aborts it tells stderr and the driver, whose
/// job error then says so.
#[test]
fn an_executor_out_of_memory_says_so_before_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let (_driver, url) = patient_driver();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
    cmd.args(["executor", "--driver", &url, "--cores", "1"])
        .current_dir(repo());
    // SAFETY: between fork and exec only setrlimit, which is async-signal-safe, is called.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let limit = libc::rlimit {
                rlim_cur: 2 << 30,
                rlim_max: 2 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let e = Process::spawn(cmd);
    e.wait_for("registered with");
    // 784 × 1,000,000 weights: 3.1 GB in one tensor, beyond the executor's 2 GiB.
    let spec = job(
        dir.path(),
        "wide",
        &format!(
            r#"name = "wide"
{data}[model]
kind = "mlp"
layers = [784, 1000000, 10]
[train]
epochs = 1
batch_size = 64
[cluster]
executors = 1
checkpoint_dir = "{ckpt}"
"#,
            data = mnist_data(),
            ckpt = s(&dir.path().join("run")),
        ),
    );
    let run = Process::start(&["submit", &spec, "--driver", &url]);
    let (status, stderr) = run.finish(LIMIT);
    assert!(!status.success(), "{stderr}");
    let words = "it reported: out of memory allocating 3136000000 bytes (2.9 GiB)";
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("error: executor exec-")
                && l.contains("(rank 0)")
                && l.ends_with(words)),
        "{stderr}"
    );
    let (_, executor_stderr) = e.finish(Duration::from_secs(30));
    assert!(
        executor_stderr.contains("out of memory allocating 3136000000 bytes"),
        "{executor_stderr}"
    );
}
