//! Checkpoints and `--resume`: a job killed mid-epoch continues from its last checkpoint to the
//! same parameters, bit for bit; a damaged checkpoint is refused.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::distributed::executor;
use crate::helpers::{job, mnist_data, repo, ringflow, s, summary};
use crate::process::Process;

const LONG: Duration = Duration::from_secs(900);

/// Two executors, Adam, dropout and periodic checkpoints: everything a resume must restore.
fn spec(dir: &std::path::Path, name: &str) -> String {
    job(
        dir,
        name,
        &format!(
            r#"
{data}shuffle_buffer = 2000
[model]
kind = "mlp"
layers = [784, 32, 10]
dropout = 0.1
[train]
epochs = 2
batch_size = 64
optimizer = {{ kind = "adam", lr = 0.001 }}
schedule = {{ kind = "cosine", warmup_steps = 50 }}
[cluster]
executors = 2
checkpoint_every_steps = 100
"#,
            data = mnist_data(),
        ),
    )
}

/// A secret file in `dir`, for executors started by hand to join a `ringflow local` run.
fn secret_file(dir: &std::path::Path) -> String {
    let path = dir.join("secret");
    std::fs::write(&path, "executors started by hand may join this run\n").unwrap();
    s(&path)
}

fn checkpoint_step(dir: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(dir.join("checkpoint/checkpoint.json")).ok()?;
    let meta: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some((meta["epoch"].as_u64()?, meta["step"].as_u64()?))
}

/// `ringflow local ARGS`, followed until a stderr line starts with `until`: the run, its
/// executors' pids and its embedded driver's URL (from the line "started N executor processes
/// (pids …) for driver URL").
pub(crate) fn watch_local(args: &[String], until: &str) -> (Process, Vec<i32>, String) {
    let run = Process::start(args);
    let (pids, driver) = local_executors(&run);
    run.wait_for_start(until);
    (run, pids, driver)
}

/// The executors' pids and the embedded driver's URL of a `ringflow local` run, from its line
/// "started N executor processes (pids …) for driver URL" (waiting for it as
/// [`Process::wait_for`] does).
pub(crate) fn local_executors(run: &Process) -> (Vec<i32>, String) {
    let line = run.wait_for("(pids ");
    let rest = line.split("(pids ").nth(1).unwrap();
    let (pids, driver) = rest.split_once(')').unwrap();
    let pids = pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let driver = driver
        .split("for driver ")
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    (pids, driver)
}

/// Kills `ringflow local` (driver and executors: SIGKILL, no chance to clean up) once a
/// mid-run checkpoint exists, resumes with `--resume`, and gets the parameters of an
/// uninterrupted run; a damaged checkpoint is then refused with the file named.
#[test]
fn a_killed_job_resumes_to_the_same_parameters_and_damage_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "resume");
    let (clean, expected) = uninterrupted_run(&spec, dir.path());
    // The same job, killed after its first checkpoint of the second epoch's middle.
    let run_dir = dir.path().join("killed");
    let killed_at = kill_after_a_mid_epoch_checkpoint(&spec, &run_dir, (1, 469));
    let resumed = dir.path().join("resumed.json");
    resume_ends_like((&clean, expected), &spec, &run_dir, &resumed, killed_at);
    damaged_tensor_is_refused(&spec, &run_dir);
    truncated_metadata_is_refused(&spec, &run_dir);
}

/// Runs `spec` to its end with checkpoints under `dir/clean`; returns its summary, whose
/// replicas agree, and its parameters' checksum.
pub(crate) fn uninterrupted_run(spec: &str, dir: &Path) -> (serde_json::Value, u64) {
    let clean_dir = dir.join("clean");
    let clean = dir.join("clean.json");
    ringflow(
        &[
            "local",
            spec,
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&clean_dir)),
            "--summary-json",
            &s(&clean),
        ],
        LONG,
    )
    .assert_success();
    let clean = summary(&clean);
    let expected = clean["param_checksum"].as_u64().expect("a checksum");
    assert_eq!(clean["replicas_identical"], true);
    (clean, expected)
}

/// Runs `spec` with checkpoints in `run_dir` and kills it (SIGKILL) once a checkpoint of the
/// middle of epoch `after.0` (0-based) exists, beyond its first step `after.1`; returns that
/// checkpoint's step.
pub(crate) fn kill_after_a_mid_epoch_checkpoint(
    spec: &str,
    run_dir: &Path,
    after: (u64, u64),
) -> u64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringflow"))
        .args([
            "local",
            spec,
            "--set",
            &format!("cluster.checkpoint_dir={}", s(run_dir)),
        ])
        .current_dir(repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let killed_at = loop {
        if let Some((epoch, step)) = checkpoint_step(run_dir)
            && epoch == after.0
            && step > after.1
        {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the job ended before it could be killed"
            );
            child.kill().unwrap();
            child.wait().unwrap();
            break step;
        }
        assert!(
            Instant::now() < deadline,
            "no mid-epoch checkpoint appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before a mid-epoch checkpoint"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(!run_dir.join("model").exists(), "killed before the end");
    killed_at
}

/// `--resume` of the run killed at step `killed_at` (checkpoints in `run_dir`) ends with the
/// parameters (checksum `expected`) and test accuracy of the uninterrupted run's summary `clean`.
pub(crate) fn resume_ends_like(
    (clean, expected): (&serde_json::Value, u64),
    spec: &str,
    run_dir: &Path,
    resumed: &Path,
    killed_at: u64,
) {
    let run = ringflow(
        &[
            "local",
            spec,
            "--resume",
            &s(run_dir),
            "--summary-json",
            &s(resumed),
        ],
        LONG,
    );
    run.assert_success();
    let (_, saved_step) = checkpoint_step(run_dir).unwrap();
    assert!(
        run.stderr
            .contains("resuming from the checkpoint at epoch 1 step"),
        "{}",
        run.stderr
    );
    let resumed = summary(resumed);
    assert_eq!(
        resumed["param_checksum"].as_u64(),
        Some(expected),
        "killed at step {killed_at}, saved {saved_step}: the resumed run must end with the \
         clean run's parameters"
    );
    assert_eq!(resumed["test_accuracy"], clean["test_accuracy"]);
}

/// A damaged tensor file (the one the checkpoint's metadata names): found by its checksum,
/// never loaded; the error names the file.
fn damaged_tensor_is_refused(spec: &str, run_dir: &Path) {
    let ckpt = run_dir.join("checkpoint");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("checkpoint.json")).unwrap())
            .unwrap();
    let model_file = ckpt.join(
        meta["files"]["model"]["name"]
            .as_str()
            .expect("a model file"),
    );
    let mut bytes = std::fs::read(&model_file).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff;
    std::fs::write(&model_file, &bytes).unwrap();
    let run = ringflow(&["local", spec, "--resume", &s(run_dir)], LONG);
    let err = run.assert_clean_failure();
    let name = model_file
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(err.contains(&name), "names the damaged file: {err}");
}

/// A truncated metadata file: refused by the driver before any executor starts.
fn truncated_metadata_is_refused(spec: &str, run_dir: &Path) {
    let ckpt = run_dir.join("checkpoint");
    std::fs::write(ckpt.join("checkpoint.json"), b"{\"format\": 1, \"mod").unwrap();
    let run = ringflow(&["local", spec, "--resume", &s(run_dir)], LONG);
    let err = run.assert_clean_failure();
    assert!(
        err.contains("checkpoint.json") && err.contains("not valid JSON"),
        "{err}"
    );
    assert!(!err.contains("executor processes"), "{err}");
}

/// Runs the resume spec on 2 executors with a 3 s ring deadline and `extra` settings, stops
/// (SIGSTOP) one executor as soon as the first epoch has ended (both ranks are then in the
/// second), and returns the exit status, the time from the stop to the end, and stderr. The
/// stopped executor is killed afterwards. (A stop at a fixed time after the ranks were assigned
/// landed after the last epoch once epochs took 0.2 s.)
fn run_with_a_hung_executor(
    extra: &[&str],
    summary_json: &std::path::Path,
) -> (std::process::ExitStatus, Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "hung");
    let mut args: Vec<String> = [
        "local",
        spec.as_str(),
        "--set",
        &format!("cluster.checkpoint_dir={}", s(&dir.path().join("run"))),
        "--set",
        "cluster.comm_timeout_s=3",
        "--summary-json",
        &s(summary_json),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    let (run, pids, _) = watch_local(&args, "epoch 1/");
    assert_eq!(pids.len(), 2, "{}", run.stderr());
    let stopped = pids[1];
    let stopped_at = Instant::now();
    unsafe {
        libc::kill(stopped, libc::SIGSTOP);
    }
    let (status, stderr) = run.finish(Duration::from_secs(120));
    let ended = stopped_at.elapsed();
    unsafe {
        libc::kill(stopped, libc::SIGKILL);
    }
    (status, ended, stderr)
}

/// A hung executor (SIGSTOP: alive, connected, silent) is detected within the ring's deadline
/// and the job ends with an error naming a rank instead of hanging.
#[test]
fn a_hung_executor_is_detected_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hung.json");
    let (status, ended, stderr) = run_with_a_hung_executor(&["--set", "train.epochs=20"], &out);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("rank") && stderr.contains("error: "),
        "names the rank: {stderr}"
    );
    assert!(
        ended < Duration::from_secs(60),
        "detected after {ended:?}: {stderr}"
    );
}

/// The same hung executor in an elastic job: detected, the ring re-formed without it, and the
/// job finishes on the survivor.
#[test]
fn an_elastic_job_recovers_without_a_hung_executor() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hung.json");
    let (status, _, stderr) = run_with_a_hung_executor(
        &[
            "--set",
            "cluster.min_executors=1",
            "--set",
            "train.epochs=6",
        ],
        &out,
    );
    let sm = recovered_on_the_survivor(status, &stderr, &out);
    assert_eq!(sm["executors_lost"], 1, "{sm}");
}

/// Checks that a hung-executor run succeeded after one recovery onto the survivor, with the
/// accuracy of a good run; returns the summary.
fn recovered_on_the_survivor(
    status: std::process::ExitStatus,
    stderr: &str,
    out: &std::path::Path,
) -> serde_json::Value {
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("recovery 1: the ring is re-formed with 1 executors"),
        "{stderr}"
    );
    let sm = summary(out);
    assert_eq!(sm["recoveries"], 1, "{sm}");
    assert!(sm["test_accuracy"].as_f64().unwrap() > 0.9, "{sm}");
    sm
}

/// An elastic job (`min_executors = 2`) on 4 executors loses one to SIGKILL after its first
/// epoch, as soon as an idle executor has registered: the driver re-forms the ring from the 3
/// survivors and the idle one, the epoch restarts on them with every row used once, and the job
/// ends as accurate as a clean run. Five epochs of ~0.4 s leave the kill well inside the job
/// (with three and a further 700 ms wait, the kill sometimes came after the others had
/// finished).
#[test]
fn an_elastic_job_survives_a_killed_executor() {
    let dir = tempfile::tempdir().unwrap();
    let spec = job(
        dir.path(),
        "elastic",
        &format!(
            r#"
{data}[model]
kind = "mlp"
layers = [784, 64, 10]
[train]
epochs = 5
batch_size = 64
optimizer = {{ kind = "sgd", lr = 0.05, momentum = 0.9 }}
[cluster]
executors = 4
min_executors = 2
"#,
            data = mnist_data(),
        ),
    );
    let clean = dir.path().join("clean.json");
    ringflow(
        &[
            "local",
            &spec,
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&dir.path().join("clean"))),
            "--summary-json",
            &s(&clean),
        ],
        LONG,
    )
    .assert_success();
    let clean = summary(&clean);

    let out = dir.path().join("elastic.json");
    // The spare executor below joins the local driver with its secret.
    let secret = secret_file(dir.path());
    let args: Vec<String> = [
        "local",
        spec.as_str(),
        "--set",
        &format!("cluster.checkpoint_dir={}", s(&dir.path().join("run"))),
        "--summary-json",
        &s(&out),
        "--secret-file",
        &secret,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let (run, pids, driver) = watch_local(&args, "epoch 1/5");
    assert_eq!(pids.len(), 4, "{}", run.stderr());
    // An executor that registers while the job runs (`executor` returns once the driver has
    // it): idle until the ring is re-formed. Then kill one executor outright.
    let _spare = executor(&driver, &["--secret-file", &secret]);
    unsafe {
        libc::kill(pids[2], libc::SIGKILL);
    }
    let (status, stderr) = run.finish(Duration::from_secs(600));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("recovery 1: the ring is re-formed with 4 executors"),
        "{stderr}"
    );
    assert!(stderr.contains(" joins the job"), "{stderr}");
    let sm = summary(&out);
    assert_eq!(sm["recoveries"], 1, "{sm}");
    assert_eq!(sm["executors_lost"], 1, "{sm}");
    assert_eq!(sm["replicas_identical"], true, "{sm}");
    assert_every_row_once(&sm, 5);
    let (a, b) = (
        sm["test_accuracy"].as_f64().unwrap(),
        clean["test_accuracy"].as_f64().unwrap(),
    );
    assert!(
        (a - b).abs() <= 0.005,
        "recovered {a} vs clean {b}: {stderr}"
    );
}

/// Summary `sm` has `epochs` epochs, each of which used MNIST's 60,000 training rows once.
fn assert_every_row_once(sm: &serde_json::Value, epochs: usize) {
    let history = sm["history"].as_array().unwrap();
    assert_eq!(history.len(), epochs, "{sm}");
    for epoch in history {
        assert_eq!(
            epoch["samples"], 60_000,
            "every row once per epoch: {epoch}"
        );
    }
}

/// The epochs of an [`elastic_run`]: enough that an executor started once the first has
/// ended registers before the job does (an epoch takes well under a second).
const ELASTIC_EPOCHS: usize = 5;

/// A `ringflow local` run of [`spec`] as an elastic job, followed until its first epoch.
struct ElasticRun {
    run: Process,
    /// Its executors' pids.
    pids: Vec<i32>,
    /// The embedded driver's URL.
    driver: String,
    /// The secret file that executors started by hand join it with.
    secret: String,
    /// Where its summary is written.
    summary: std::path::PathBuf,
}

/// Starts [`spec`] named `name` in `dir` with `min_executors = 1`, [`ELASTIC_EPOCHS`] epochs
/// and `extra` arguments.
fn elastic_run(dir: &std::path::Path, name: &str, extra: &[&str]) -> ElasticRun {
    let spec = spec(dir, name);
    let summary = dir.join(format!("{name}.json"));
    let secret = secret_file(dir);
    let mut args: Vec<String> = vec!["local".into(), spec];
    args.extend(extra.iter().map(|a| a.to_string()));
    for set in [
        format!("cluster.checkpoint_dir={}", s(&dir.join("run"))),
        "cluster.min_executors=1".into(),
        format!("train.epochs={ELASTIC_EPOCHS}"),
    ] {
        args.extend(["--set".into(), set]);
    }
    args.extend(["--summary-json".into(), s(&summary)]);
    args.extend(["--secret-file".into(), secret.clone()]);
    let (run, pids, driver) = watch_local(&args, &format!("epoch 1/{ELASTIC_EPOCHS}"));
    ElasticRun {
        run,
        pids,
        driver,
        secret,
        summary,
    }
}

/// An executor that registers while an elastic job runs joins it at the next epoch boundary
/// (up to `max_executors`), with the same state as the others.
#[test]
fn an_idle_executor_joins_an_elastic_job_at_an_epoch_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let ElasticRun {
        run,
        driver,
        secret,
        summary: out,
        ..
    } = elastic_run(dir.path(), "join", &["--set", "cluster.max_executors=3"]);
    let _spare = executor(&driver, &["--secret-file", &secret]);
    let (status, stderr) = run.finish(Duration::from_secs(600));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("the ring is re-formed with 3 executors at an epoch boundary")
            && stderr.contains(" joins the job"),
        "{stderr}"
    );
    let sm = summary(&out);
    assert_eq!(sm["recoveries"], 0, "{sm}");
    assert_eq!(sm["executors"], 3, "{sm}");
    assert_eq!(sm["replicas_identical"], true, "{sm}");
    assert_every_row_once(&sm, ELASTIC_EPOCHS);
}

/// The ring that admits a joiner breaks before the joiner received the job's state (a second
/// executor is killed while the joiner, stopped, has not connected yet): the joiner recovers
/// like the survivor, goes after it in the next ring, and the job ends with identical replicas.
#[test]
fn a_joiner_whose_first_ring_breaks_recovers_like_a_survivor() {
    let dir = tempfile::tempdir().unwrap();
    let ElasticRun {
        run,
        pids,
        driver,
        secret,
        summary: out,
    } = elastic_run(dir.path(), "joiner", &["--executors", "3"]);
    let spare = executor(&driver, &["--secret-file", &secret]);
    let signal = |pid: i32, signal: i32| unsafe {
        libc::kill(pid, signal);
    };
    // The spare is chosen to join the re-formed ring, but cannot connect to it yet.
    signal(spare.pid() as i32, libc::SIGSTOP);
    signal(pids[2], libc::SIGKILL);
    run.wait_for(" joins the job");
    // The new ring breaks before the joiner is in it.
    signal(pids[1], libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(500));
    signal(spare.pid() as i32, libc::SIGCONT);
    let (status, stderr) = run.finish(Duration::from_secs(600));
    assert!(status.success(), "{stderr}");
    // The second ring held the joiner, which went on in the third.
    assert!(
        stderr.contains("recovery 2: the ring is re-formed with 2 executors"),
        "{stderr}"
    );
    let sm = summary(&out);
    assert_eq!(sm["executors_lost"], 2, "{sm}");
    assert_eq!(sm["replicas_identical"], true, "{sm}");
    assert_every_row_once(&sm, ELASTIC_EPOCHS);
}

/// With backup workers the survivor does not wait for the hung executor at all; the driver
/// still detects it (heartbeats), tells the survivor to re-form through its progress reports,
/// and the job finishes on the survivor with every row of every epoch accounted for.
#[test]
fn an_elastic_job_with_backup_workers_recovers_without_a_hung_executor() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hung.json");
    let (status, _, stderr) = run_with_a_hung_executor(
        &[
            "--set",
            "cluster.min_executors=1",
            "--set",
            "cluster.backup_workers=1",
            // The survivor trains on without waiting: enough epochs (0.2 s each or more) that
            // it is still training when the driver's 3 s deadline finds the hung executor.
            "--set",
            "train.epochs=40",
        ],
        &out,
    );
    let sm = recovered_on_the_survivor(status, &stderr, &out);
    let history = sm["history"].as_array().unwrap();
    assert!(
        !history.is_empty(),
        "at least the epoch after the recovery: {sm}"
    );
    for epoch in history {
        let rows = epoch["samples"].as_u64().unwrap() + epoch["dropped_samples"].as_u64().unwrap();
        assert_eq!(rows, 60_000, "every row once per epoch: {epoch}");
    }
}
