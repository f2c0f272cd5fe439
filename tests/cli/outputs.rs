//! Where jobs write, and what decides it: flags that set spec fields are applied before the one
//! check of the spec; job names are plain names; a job writes only into the directories it was
//! given; output locations are checked before any executor starts; a job holds an exclusive
//! lock on its checkpoint directory; job ids differ between runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringflow_driver::outputs::{LOCK_FILE, LockOwner};
use serde_json::Value;

use crate::helpers::{
    Run, regression_job, ringflow, ringflow_in, s, small_mnist_job, summary, write_regression_data,
};
use crate::process::Process;
use crate::s3::{BUCKET, Moto, ringflow_aws, ringflow_s3};

/// A limit for runs that must be refused long before it (planning reads only footers), and for
/// the small jobs here.
const DEADLINE: Duration = Duration::from_secs(300);

/// The line `ringflow local` prints once its executor processes run.
const STARTED: &str = "executor processes (pids";

/// A small regression job on 200 rows written into `dir/data`: a second or two of training.
fn quick_job(dir: &Path, name: &str, cluster: &str) -> String {
    let data = dir.join("data");
    if !data.exists() {
        std::fs::create_dir(&data).unwrap();
        write_regression_data(&data, &[200], 50);
    }
    regression_job(dir, name, &s(&data), "", cluster)
}

/// Fails unless `run` was refused with one error line containing each of `needles`, before
/// any executor started; returns the error line.
pub(crate) fn refused_before_executors(run: &Run, needles: &[&str]) -> String {
    let stderr = run.assert_clean_failure();
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line:\n{stderr}");
    for needle in needles {
        assert!(errors[0].contains(needle), "{needle:?} in:\n{stderr}");
    }
    assert!(
        !stderr.contains(STARTED),
        "refused before any executor started:\n{stderr}"
    );
    errors[0].to_string()
}

/// Every file below `root`, relative to it.
pub(crate) fn files_below(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// `--executors` (and `--resume`) are overrides like `--set`, applied before the spec is
/// checked: the issue's `--executors 4 --set cluster.min_executors=2` trains, and what the
/// flag makes inconsistent is refused naming both fields and the flag.
#[test]
fn flags_set_spec_fields_before_the_spec_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let spec = quick_job(dir.path(), "flags", "");
    let ckpt = format!("cluster.checkpoint_dir={}", s(&dir.path().join("run")));
    let out = dir.path().join("summary.json");
    let run = ringflow(
        &[
            "local",
            &spec,
            "--set",
            &ckpt,
            "--executors",
            "2",
            "--set",
            "cluster.min_executors=2",
            "--set",
            "cluster.max_executors=3",
            "--summary-json",
            &s(&out),
            "--ui",
            "off",
        ],
        DEADLINE,
    );
    run.assert_success();
    assert_eq!(summary(&out)["executors"], 2);

    let local = |args: &[&str]| {
        let mut all = vec!["local", spec.as_str(), "--set", ckpt.as_str()];
        all.extend(args);
        ringflow(&all, DEADLINE)
    };
    for (args, needles) in [
        (
            &["--executors", "1", "--set", "cluster.min_executors=2"][..],
            &[
                "cluster.min_executors: must be between 1 and cluster.executors (1), not 2",
                "(cluster.executors was set by --executors 1)",
            ][..],
        ),
        (
            &["--executors", "2", "--set", "cluster.backup_workers=2"],
            &[
                "cluster.backup_workers: must be less than cluster.executors (2)",
                "cluster.executors was set by --executors 2",
            ],
        ),
        (
            &["--set", "cluster.max_executors=2", "--executors", "3"],
            &[
                "cluster.max_executors: must be at least cluster.executors (3), not 2",
                "cluster.executors was set by --executors 3",
            ],
        ),
        (
            &["--executors", "0"],
            &["cluster.executors: must be at least 1 (cluster.executors was set by --executors 0)"],
        ),
        (
            &["--executors", "100000"],
            &["--executors asks for 100000 executors", "at most 256"],
        ),
        (
            &["--resume", ""],
            &["cluster.checkpoint_dir: is empty", "set by --resume"],
        ),
        (
            &["--resume", "/"],
            &[
                "cluster.checkpoint_dir: \"/\" is the file system's root",
                "set by --resume /",
            ],
        ),
    ] {
        refused_before_executors(&local(args), needles);
    }
    for (command, extra) in [("eval", &[][..]), ("predict", &["--output", "preds"][..])] {
        for (n, needle) in [
            ("0", "--executors must be at least 1"),
            ("100000", "at most 256"),
        ] {
            let mut args = vec![command, "--model", "no/model", "--data", "d.parquet"];
            args.extend(extra);
            args.extend(["--executors", n]);
            refused_before_executors(&ringflow(&args, DEADLINE), &[needle]);
        }
    }
}

/// A job started in an empty directory, told where its checkpoints and summary go, writes
/// nothing anywhere else in that directory; `name = ".."`, `name = "."`, an empty
/// checkpoint directory and the root are refused before any executor starts, writing nothing.
#[test]
fn a_job_writes_only_into_the_directories_it_was_given() {
    let specs = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    for (name, cluster, needle) in [
        (
            "..",
            "",
            "name: is not a plain name: it \"..\" names a directory",
        ),
        (
            ".",
            "",
            "name: is not a plain name: it \".\" names a directory",
        ),
        (
            "dot-dot-dir",
            "checkpoint_dir = \"\"",
            "cluster.checkpoint_dir: is empty",
        ),
        (
            "root",
            "checkpoint_dir = \"/\"",
            "cluster.checkpoint_dir: \"/\" is the file system's root",
        ),
        (
            "root2",
            "checkpoint_dir = \"file:///\"",
            "the file system's root",
        ),
    ] {
        let spec = quick_job(specs.path(), "spec", cluster);
        let text = std::fs::read_to_string(&spec).unwrap();
        let text = text.replace("name = \"spec\"", &format!("name = {name:?}"));
        std::fs::write(&spec, text).unwrap();
        let run = ringflow_in(work.path(), &["local", &spec, "--ui", "off"], DEADLINE);
        refused_before_executors(&run, &[needle]);
        assert_eq!(
            files_below(work.path()),
            Vec::<PathBuf>::new(),
            "{name:?} wrote"
        );
    }

    let spec = quick_job(specs.path(), "contained", "checkpoint_dir = \"ckpt\"");
    let run = ringflow_in(
        work.path(),
        &[
            "local",
            &spec,
            "--summary-json",
            "out/summary.json",
            "--ui",
            "off",
        ],
        DEADLINE,
    );
    run.assert_success();
    let files = files_below(work.path());
    let stray: Vec<&PathBuf> = files
        .iter()
        .filter(|f| !f.starts_with("ckpt") && f.as_path() != Path::new("out/summary.json"))
        .collect();
    assert!(
        stray.is_empty(),
        "files outside the job's directories: {stray:?}"
    );
    for expected in [
        "ckpt/events.jsonl",
        "ckpt/model/checkpoint.json",
        "out/summary.json",
    ] {
        assert!(
            files.contains(&PathBuf::from(expected)),
            "{expected} in {files:?}"
        );
    }
    assert!(
        !files.contains(&PathBuf::from(format!("ckpt/{LOCK_FILE}"))),
        "the lock is removed at the end: {files:?}"
    );
}

/// Output locations that cannot be written are refused at submit, in one sentence naming the
/// key (or flag), the path and why, before any executor starts.
#[test]
fn outputs_that_cannot_be_written_are_refused_before_any_executor_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let f = s(&file);
    let below = format!("{f}/ckpt");
    let mut cases: Vec<(String, String)> = vec![
        (
            f.clone(),
            format!("cluster.checkpoint_dir {f} is a regular file, not a directory"),
        ),
        (
            "/dev/null".into(),
            "cluster.checkpoint_dir /dev/null is a character device, not a directory".into(),
        ),
        (
            "/proc/self".into(),
            "cluster.checkpoint_dir /proc/self is not writable".into(),
        ),
        (
            below.clone(),
            format!("cluster.checkpoint_dir {below} cannot be created: {f} is a regular file"),
        ),
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // (Root may write into any directory of a normal file system; /proc stands in above.)
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.path().join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
        cases.push((
            s(&ro),
            format!("cluster.checkpoint_dir {} is not writable", s(&ro)),
        ));
    }
    let spec = quick_job(dir.path(), "outs", "");
    for (ckpt, needle) in &cases {
        let set = format!("cluster.checkpoint_dir={ckpt}");
        let run = ringflow(&["local", &spec, "--set", &set, "--ui", "off"], DEADLINE);
        refused_before_executors(&run, &[needle, "outs.toml"]);
    }

    // A megabyte-long name is refused by the spec check, without repeating it.
    let long = quick_job(dir.path(), "long", "");
    let text = std::fs::read_to_string(&long).unwrap();
    let text = text.replace(
        "name = \"long\"",
        &format!("name = \"{}\"", "n".repeat(1 << 20)),
    );
    std::fs::write(&long, text).unwrap();
    let run = ringflow(&["local", &long, "--ui", "off"], DEADLINE);
    let line = refused_before_executors(&run, &["is 1048576 bytes long, over the limit of 100"]);
    assert!(line.len() < 500, "{} bytes", line.len());

    // The command line's own files, and a prediction's output.
    let ckpt = format!("cluster.checkpoint_dir={}", s(&dir.path().join("run")));
    let summary_below = format!("{f}/summary.json");
    for (flag, path, needle) in [
        (
            "--summary-json",
            summary_below.clone(),
            format!(
                "--summary-json {summary_below} cannot be written: its directory {f} is a regular file"
            ),
        ),
        (
            "--summary-json",
            s(dir.path()),
            format!(
                "--summary-json {} is a directory, not a file",
                s(dir.path())
            ),
        ),
        (
            "--tensorboard",
            f.clone(),
            format!("--tensorboard {f} is a regular file, not a directory"),
        ),
    ] {
        let run = ringflow(&["local", &spec, "--set", &ckpt, flag, &path], DEADLINE);
        refused_before_executors(&run, &[&needle]);
    }
    assert!(!dir.path().join("run").exists(), "nothing was created");
    let run = ringflow(
        &[
            "predict",
            "--model",
            "no/model",
            "--data",
            "d.parquet",
            "--output",
            &f,
        ],
        DEADLINE,
    );
    refused_before_executors(
        &run,
        &[&format!("--output {f} is a regular file, not a directory")],
    );
}

/// Two `ringflow local` runs started at once on one checkpoint directory: one trains, the other
/// is refused before any executor starts, naming the first (its job id and pid); the event log
/// holds only the first's job, which `history` reports as succeeded; the lock is gone after.
#[test]
fn two_runs_at_once_on_one_checkpoint_dir_one_trains_and_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let spec = small_mnist_job(dir.path(), "conc", 1, 2, 128, &ckpt);
    let outs = [dir.path().join("a.json"), dir.path().join("b.json")];
    let runs: Vec<Process> = outs
        .iter()
        .map(|out| Process::start(&["local", &spec, "--summary-json", &s(out), "--ui", "off"]))
        .collect();
    let pids: Vec<u32> = runs.iter().map(Process::pid).collect();
    let ended: Vec<_> = runs.into_iter().map(|r| r.finish(DEADLINE)).collect();
    let winners: Vec<usize> = (0..2).filter(|&i| ended[i].0.success()).collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one run trains:\n{}\n---\n{}",
        ended[0].1,
        ended[1].1
    );
    let (won, lost) = (winners[0], 1 - winners[0]);
    let job_id = summary(&outs[won])["job_id"].as_str().unwrap().to_string();
    let refusal = &ended[lost].1;
    assert!(
        refusal.contains(&format!(
            "cluster.checkpoint_dir {} is in use by job {job_id} (pid {} on ",
            s(&ckpt),
            pids[won]
        )),
        "{refusal}"
    );
    assert!(!refusal.contains(STARTED), "{refusal}");
    assert!(!outs[lost].exists());

    // Job ids: name, submission time, a tag of the driver, a counter.
    let (name, rest) = job_id.split_once('-').unwrap();
    assert_eq!(name, "conc", "{job_id}");
    let parts: Vec<&str> = rest.split('-').collect();
    assert_eq!(parts.len(), 3, "{job_id}");
    assert!(
        parts[0].len() == 14 && parts[0].bytes().all(|b| b.is_ascii_digit()),
        "{job_id}"
    );
    assert!(
        parts[1].len() == 4 && parts[1].bytes().all(|b| b.is_ascii_alphanumeric()),
        "{job_id}"
    );
    assert_eq!(parts[2], "0001", "{job_id}");

    let log = std::fs::read_to_string(ckpt.join("events.jsonl")).unwrap();
    for line in log.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(record["job_id"], job_id.as_str(), "{line}");
    }
    let history = ringflow(&["history", &s(&ckpt), "--json"], DEADLINE);
    history.assert_success();
    let h: Value = serde_json::from_str(&history.stdout).unwrap();
    let jobs = h["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{h}");
    assert_eq!(jobs[0]["job_id"], job_id.as_str());
    assert_eq!(jobs[0]["state"], "succeeded");
    assert!(!ckpt.join(LOCK_FILE).exists(), "the lock is released");
}

/// A lock held by a live process (this test) refuses a job, naming its holder; once that
/// process is gone (a crashed driver), the next job takes the lock over, says so, and removes
/// it at its end.
#[test]
fn a_live_holder_refuses_and_a_dead_one_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    let spec = quick_job(
        dir.path(),
        "held",
        &format!("checkpoint_dir = \"{}\"", s(&ckpt)),
    );
    let mut holder = LockOwner::this_process("holder-20250101000000-abcd-0001");
    let write = |owner: &LockOwner| {
        std::fs::write(ckpt.join(LOCK_FILE), serde_json::to_vec(owner).unwrap()).unwrap();
    };
    write(&holder);
    let run = ringflow(&["local", &spec, "--ui", "off"], DEADLINE);
    refused_before_executors(
        &run,
        &[
            &format!(
                "cluster.checkpoint_dir {} is in use by job {} (pid {} on {} since {}",
                s(&ckpt),
                holder.job_id,
                std::process::id(),
                holder.host,
                holder.since
            ),
            &format!("ringflow cancel {}", holder.job_id),
        ],
    );
    assert!(
        !ckpt.join("events.jsonl").exists(),
        "the refused job logged nothing"
    );

    let mut gone = std::process::Command::new("true").spawn().unwrap();
    holder.pid = gone.id();
    gone.wait().unwrap();
    holder.pid_start = None;
    write(&holder);
    let run = ringflow(&["local", &spec, "--ui", "off"], DEADLINE);
    run.assert_success();
    assert!(
        run.stderr.contains(&format!(
            "took over the lock of cluster.checkpoint_dir {} from job {}",
            s(&ckpt),
            holder.job_id
        )) && run.stderr.contains("whose process has ended"),
        "{}",
        run.stderr
    );
    assert!(!ckpt.join(LOCK_FILE).exists(), "released at the end");
}

/// On S3 the lock is an object created with a conditional put: a job on a fresh prefix takes
/// and removes it; a live holder's lock refuses the next job; a dead holder's is replaced on
/// condition of its e-tag; a store told not to write conditionally runs the job unlocked,
/// saying so.
#[test]
fn the_lock_on_an_s3_checkpoint_dir_is_a_conditional_put() {
    let server = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("s3://{BUCKET}/runs/locked");
    let spec = quick_job(dir.path(), "s3lock", &format!("checkpoint_dir = \"{url}\""));
    let lock_key = format!("runs/locked/{LOCK_FILE}");
    let keys = |server: &Moto| -> Vec<String> {
        server
            .list("runs/locked/")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let local = ["local", spec.as_str(), "--ui", "off"];

    ringflow_s3(&server, &local).assert_success();
    let after = keys(&server);
    assert!(
        after.iter().any(|k| k.ends_with("events.jsonl")),
        "{after:?}"
    );
    assert!(!after.contains(&lock_key), "released: {after:?}");

    let mut holder = LockOwner::this_process("holder-20250101000000-abcd-0001");
    let put_lock = |owner: &LockOwner| {
        let file = dir.path().join("lock.json");
        std::fs::write(&file, serde_json::to_vec(owner).unwrap()).unwrap();
        server.put(&[(lock_key.as_str(), s(&file).as_str())]);
    };
    put_lock(&holder);
    refused_before_executors(
        &ringflow_s3(&server, &local),
        &[&format!(
            "cluster.checkpoint_dir {url} is in use by job {} (pid {}",
            holder.job_id,
            std::process::id()
        )],
    );

    let mut gone = std::process::Command::new("true").spawn().unwrap();
    holder.pid = gone.id();
    gone.wait().unwrap();
    holder.pid_start = None;
    put_lock(&holder);
    let run = ringflow_s3(&server, &local);
    run.assert_success();
    assert!(
        run.stderr.contains(&format!(
            "took over the lock of cluster.checkpoint_dir {url} from job {}",
            holder.job_id
        )),
        "{}",
        run.stderr
    );
    assert!(
        !keys(&server).contains(&lock_key),
        "released after a takeover"
    );

    let mut env: Vec<(&str, String)> = server.credentials().to_vec();
    env.push(("AWS_CONDITIONAL_PUT", "disabled".into()));
    let run = ringflow_aws(&local, &env);
    run.assert_success();
    assert!(
        run.stderr.contains(&format!(
            "cluster.checkpoint_dir {url} is not locked: its store cannot write conditionally"
        )),
        "{}",
        run.stderr
    );
}
