//! A chaos soak: an elastic job on 4 executors (`min_executors = 2`, `max_executors = 4`)
//! trains while a seeded schedule kills executors (SIGKILL), stops them (SIGSTOP, then SIGCONT
//! after less or more than the ring's deadline), delays or drops the traffic sent to them
//! (`tc netem`, where allowed: `network`) and starts new ones that join the driver with its
//! secret. At the end the job must have succeeded with every epoch using each row exactly
//! once, identical replicas, no process and no temporary file left behind, and a checkpoint
//! and model that load. It prints the faults and the recovery time of each.
//!
//! `RINGFLOW_SOAK_SECS` (default 60) is how long faults are injected; the job is sized from a
//! short clean run to train at least that long. `RINGFLOW_SOAK_SEED` (default 1) seeds the
//! schedule. `testing/chaos-soak.sh` runs the long version (600 s) with its report shown.

mod faults;
mod network;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::helpers::{job, regression_toml, repo, ringflow_env, s, summary, write_regression_data};
use crate::process::Process;
use crate::recovery::local_executors;
use faults::{Executors, Fault, FaultKind, MARK_ENV, Reaper, Target};

/// The ring's deadline in the soak's job (`cluster.comm_timeout_s`).
const COMM_TIMEOUT_S: u64 = 4;

/// Epochs of the clean run that sizes the soak.
const CLEAN_EPOCHS: u64 = 8;

/// How long faults are injected and the schedule's seed, from the environment.
fn settings() -> (Duration, u64) {
    let read = |name: &str, default: u64| match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        Err(_) => default,
    };
    let secs = read("RINGFLOW_SOAK_SECS", 60);
    assert!(
        (10..=86_400).contains(&secs),
        "RINGFLOW_SOAK_SECS must be between 10 and 86400, not {secs}"
    );
    (Duration::from_secs(secs), read("RINGFLOW_SOAK_SEED", 1))
}

/// The soak's directories: data, checkpoints, and the private temporary directory of every
/// process it starts (`TMPDIR`), which must be empty at the end.
struct Dirs {
    _root: tempfile::TempDir,
    root: PathBuf,
    train: PathBuf,
    test: PathBuf,
    tmp: PathBuf,
    rows: usize,
}

impl Dirs {
    fn new() -> Dirs {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().to_path_buf();
        let (train, test, tmp) = (path.join("train"), path.join("test"), path.join("tmp"));
        for d in [&train, &test, &tmp] {
            std::fs::create_dir(d).unwrap();
        }
        // 19,200 rows (divisible by 2, 3 and 4 executors) in 48 row groups (partitions).
        let rows = write_regression_data(&train, &[2400; 8], 400);
        write_regression_data(&test, &[2000], 500);
        Dirs {
            _root: root,
            root: path,
            train,
            test,
            tmp,
            rows,
        }
    }

    /// The spec of a job of `epochs` epochs; returns its path.
    fn spec(&self, name: &str, epochs: u64, seed: u64) -> String {
        let train = format!(
            "epochs = {epochs}\nbatch_size = 16\nseed = {seed}\n\
             optimizer = {{ kind = \"sgd\", lr = 0.02, momentum = 0.9 }}"
        );
        let cluster = format!(
            "executors = 4\nmin_executors = 2\nmax_executors = 4\n\
             comm_timeout_s = {COMM_TIMEOUT_S}\ncheckpoint_dir = \"{}\"",
            s(&self.root.join(name))
        );
        let toml = regression_toml(name, &s(&self.train), "", 16, &train, &cluster);
        job(&self.root, name, &toml)
    }
}

/// The soak. Faults stop before the job's last epochs (a loss after a rank finished training
/// is not recovered, by design); everything else is fair game.
#[test]
fn an_elastic_job_survives_a_seeded_chaos_schedule() {
    let (soak, seed) = settings();
    let dirs = Dirs::new();
    let mark = format!("{}-{seed}", std::process::id());
    let _reaper = Reaper(mark.clone());

    let (epoch_s, clean_mse) = calibrate(&dirs, seed);
    // Enough epochs to train through the soak even at the clean run's pace; faults only slow
    // it down.
    let epochs = ((soak.as_secs_f64() * 1.1 / epoch_s).ceil() as u64 + 3).clamp(6, 20_000);
    let quiet_from = epochs - (epochs / 10).max(2);
    println!(
        "chaos soak: seed {seed}, faults for {} s, {epochs} epochs of {} rows ({epoch_s:.2} s \
         apart in a clean run)",
        soak.as_secs(),
        dirs.rows
    );

    let spec = dirs.spec("chaos", epochs, seed);
    let secret = dirs.root.join("secret");
    std::fs::write(&secret, "executors started by the soak join with this\n").unwrap();
    let out = dirs.root.join("summary.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
    cmd.args(["local", &spec, "--summary-json", &s(&out), "--secret-file"])
        .arg(&secret)
        .env(MARK_ENV, &mark)
        .env("TMPDIR", &dirs.tmp)
        .current_dir(repo());
    let started = Instant::now();
    let run = Process::spawn(cmd);
    let (pids, driver) = local_executors(&run);
    assert_eq!(pids.len(), 4, "{}", run.stderr());
    run.wait_for_start("epoch 1/");

    let mut executors = Executors::new(pids);
    let target = Target {
        driver: &driver,
        secret_file: &secret,
        mark: &mark,
        tmp: &dirs.tmp,
        comm_timeout: Duration::from_secs(COMM_TIMEOUT_S),
        network: match network::available() {
            Ok(can) => {
                println!("network faults: {can:?}");
                Some(can)
            }
            Err(why) => {
                println!("network faults are not injected: {why}");
                None
            }
        },
    };
    let faults = faults::inject(
        &run,
        &mut executors,
        &target,
        seed,
        started,
        soak,
        quiet_from,
    );
    let limit = Duration::from_secs(soak.as_secs() * 4 + 300);
    let (status, stderr) = run.finish(limit);
    let wall = started.elapsed();
    let ckpt = dirs.root.join("chaos");
    let history = history_of(&ckpt);
    report(&faults, &history, wall);
    assert!(status.success(), "the job failed ({status}):\n{stderr}");
    assert_eq!(history["state"], "succeeded", "{history}");
    check_faults_were_survived(&faults, &history, executors.all(), &stderr);
    check_every_row_once(&summary(&out), &history, epochs, dirs.rows);
    check_nothing_left_behind(&mark, &dirs.tmp, &ckpt);
    check_outputs_load(&dirs, &ckpt, epochs, clean_mse);
}

/// A clean run of the same job for [`CLEAN_EPOCHS`] epochs: the seconds from one epoch's end
/// to the next in its event log (training, checkpoint and planning: the pace that sizes the
/// soak), and the test MSE of its model (which the soak's, trained far longer, must match).
fn calibrate(dirs: &Dirs, seed: u64) -> (f64, f64) {
    let spec = dirs.spec("clean", CLEAN_EPOCHS, seed);
    let tmp = s(&dirs.tmp);
    let env = [("TMPDIR", Some(tmp.as_str()))];
    ringflow_env(&["local", &spec], &env, Duration::from_secs(600)).assert_success();
    let log = std::fs::read_to_string(dirs.root.join("clean/events.jsonl")).unwrap();
    let ends: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "epoch_end")
        .filter_map(|e| e["elapsed_s"].as_f64())
        .collect();
    assert_eq!(ends.len() as u64, CLEAN_EPOCHS, "{log}");
    let pace = (ends[ends.len() - 1] - ends[0]) / (ends.len() - 1) as f64;
    (
        pace.max(0.05),
        eval_mse(dirs, &dirs.root.join("clean/model")),
    )
}

/// `ringflow eval` of the model in `model` on the test split; its MSE.
fn eval_mse(dirs: &Dirs, model: &Path) -> f64 {
    let out = dirs.root.join("eval.json");
    let tmp = s(&dirs.tmp);
    let args = [
        "eval",
        "--model",
        &s(model),
        "--data",
        &s(&dirs.test),
        "--summary-json",
        &s(&out),
    ];
    let env = [("TMPDIR", Some(tmp.as_str()))];
    ringflow_env(&args, &env, Duration::from_secs(300)).assert_success();
    let sm = summary(&out);
    assert_eq!(sm["test_rows"], 2000, "{sm}");
    sm["test_mse"].as_f64().expect("a test MSE")
}

/// The job's history (`ringflow history DIR --json`, from its event log), whatever its end.
fn history_of(ckpt: &Path) -> Value {
    let run = crate::helpers::ringflow(&["history", &s(ckpt), "--json"], Duration::from_secs(60));
    run.assert_success();
    let all: Value = serde_json::from_str(&run.stdout).expect("history --json prints JSON");
    let jobs = all["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "one job in the log: {all}");
    jobs[0].clone()
}

/// Whether the executor id `id` (`exec-HOST-PID-TAG`) belongs to process `pid`.
fn is_pid(id: &str, pid: i32) -> bool {
    id.contains(&format!("-{pid}-"))
}

/// Seconds from `at` to the RFC 3339 UTC time `rfc` (`2025-05-01T12:00:03.250Z`).
fn seconds_until(at: SystemTime, rfc: &str) -> Option<f64> {
    let num = |r: std::ops::Range<usize>| rfc.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm) = (num(11..13)?, num(14..16)?);
    let sec: f64 = rfc.get(17..)?.trim_end_matches('Z').parse().ok()?;
    // Howard Hinnant's days-from-civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let then = (days * 86_400 + hh * 3600 + mm * 60) as f64 + sec;
    let now = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(then - now)
}

/// The recovery that followed fault `f`: among the re-formings after it and before the next
/// kill or stop (in `later`), the one that lost (or, for a new executor, added) its executor,
/// else the first (a stop that broke the ring but lost nothing).
fn recovery_of<'a>(f: &Fault, later: &[Fault], recoveries: &'a [Value]) -> Option<&'a Value> {
    let end = later
        .iter()
        .find(|n| !matches!(n.kind, FaultKind::Start))
        .map(|n| n.at);
    let window: Vec<&Value> = recoveries
        .iter()
        .filter(|r| {
            let at = r["at"].as_str().unwrap_or_default();
            seconds_until(f.at, at).is_some_and(|s| s >= 0.0)
                && end.is_none_or(|e| seconds_until(e, at).is_some_and(|s| s < 0.0))
        })
        .collect();
    let names = |r: &&&Value, key: &str| {
        r[key]
            .as_array()
            .is_some_and(|ids| ids.iter().any(|i| is_pid(i.as_str().unwrap_or(""), f.pid)))
    };
    match f.kind {
        FaultKind::Start => window.iter().find(|r| names(r, "joined")).copied(),
        _ => window
            .iter()
            .find(|r| names(r, "lost"))
            .or(window.first())
            .copied(),
    }
}

/// Prints each fault (time, kind, target) with the recovery that followed it.
fn report(faults: &[Fault], history: &Value, wall: Duration) {
    let recoveries = history["recoveries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    println!(
        "{} faults, {} recoveries, job ran {:.0} s",
        faults.len(),
        recoveries.len(),
        wall.as_secs_f64()
    );
    println!("  time    fault                target     recovery");
    for (i, f) in faults.iter().enumerate() {
        let outcome = match recovery_of(f, &faults[i + 1..], &recoveries) {
            Some(r) => {
                let took = seconds_until(f.at, r["at"].as_str().unwrap_or_default());
                format!(
                    "ring re-formed with {} executors (generation {}) {:.1} s later, {:.1} s \
                     after it broke: {}",
                    r["world_after"],
                    r["generation"],
                    took.unwrap_or(f64::NAN),
                    r["waited_s"].as_f64().unwrap_or(f64::NAN),
                    r["cause"]
                        .as_str()
                        .filter(|c| !c.is_empty())
                        .unwrap_or("it joined at an epoch boundary"),
                )
            }
            None => "no re-forming (the ring waited, or the executor was idle)".into(),
        };
        println!(
            "  {:6.1}s {:20} pid {:<7} {outcome}",
            f.since_start,
            f.describe(),
            f.pid
        );
    }
}

/// Enough faults were injected, the ring was re-formed at least once, and every executor the
/// job lost is one the soak hit (none was lost by itself).
fn check_faults_were_survived(faults: &[Fault], history: &Value, all: &[i32], stderr: &str) {
    let hits: Vec<i32> = faults
        .iter()
        .filter(|f| !matches!(f.kind, FaultKind::Start))
        .map(|f| f.pid)
        .collect();
    assert!(hits.len() >= 3, "only {} faults: {faults:?}", hits.len());
    let recoveries = history["recoveries"].as_array().expect("recoveries");
    assert!(!recoveries.is_empty(), "no recovery: {stderr}");
    for r in recoveries {
        for id in r["lost"].as_array().into_iter().flatten() {
            let id = id.as_str().unwrap_or_default();
            assert!(
                hits.iter().any(|&p| is_pid(id, p)),
                "executor {id} was lost but the soak did not hit it (pids {all:?}): {r}"
            );
        }
    }
}

/// The summary and the event log agree that every epoch used each row once (trained on, or
/// dropped by backup workers), and the replicas ended identical.
fn check_every_row_once(sm: &Value, history: &Value, epochs: u64, rows: usize) {
    assert_eq!(sm["replicas_identical"], true, "{sm}");
    for (from, list) in [
        ("summary", &sm["history"]),
        ("event log", &history["epochs"]),
    ] {
        let list = list.as_array().expect("epochs");
        assert_eq!(list.len() as u64, epochs, "{from}: one entry per epoch");
        for (i, e) in list.iter().enumerate() {
            let used = e["samples"].as_u64().unwrap() + e["dropped_samples"].as_u64().unwrap_or(0);
            assert_eq!(used, rows as u64, "{from}: epoch {i} used {used} rows: {e}");
        }
    }
}

/// No process the soak started (or theirs) survives, the processes' temporary directory is
/// empty, and the checkpoint directory holds only the event log, the model and the last
/// checkpoint's files.
fn check_nothing_left_behind(mark: &str, tmp: &Path, ckpt: &Path) {
    // Executors the soak started exit 10 s after their driver is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !faults::marked(mark).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = faults::marked(mark);
    assert!(left.is_empty(), "processes left running: {left:?}");

    let leaked: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leaked.is_empty(), "temporary files left: {leaked:?}");

    let mut files = Vec::new();
    walk(ckpt, &mut files);
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(ckpt.join("checkpoint/checkpoint.json")).unwrap(),
    )
    .unwrap();
    let named: Vec<&str> = meta["files"]
        .as_object()
        .expect("files")
        .values()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for f in &files {
        let rel = f.strip_prefix(ckpt).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy();
        let expected = match rel.parent().and_then(|p| p.to_str()) {
            Some("") => name == "events.jsonl",
            Some("model") => !name.starts_with('.') && !name.ends_with(".tmp"),
            Some("checkpoint") => name == "checkpoint.json" || named.contains(&name.as_ref()),
            _ => false,
        };
        assert!(
            expected,
            "{} should not be in the checkpoint directory",
            rel.display()
        );
    }
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, files)
        } else {
            files.push(p)
        }
    }
}

/// The last checkpoint verifies (every checksum) and is at the end of training, and the model
/// evaluates at least as well as the clean run's.
fn check_outputs_load(dirs: &Dirs, ckpt: &Path, epochs: u64, clean_mse: f64) {
    let loaded = ringflow_ml::checkpoint::load(&ckpt.join("checkpoint"))
        .unwrap_or_else(|e| panic!("the last checkpoint does not load: {e}"));
    assert_eq!(loaded.meta.epoch, epochs, "{:?}", loaded.meta);
    let mse = eval_mse(dirs, &ckpt.join("model"));
    println!("test MSE {mse:.5} (clean {CLEAN_EPOCHS}-epoch run {clean_mse:.5})");
    assert!(
        mse <= clean_mse * 1.5 + 1e-3,
        "the soak's model evaluates worse ({mse}) than a clean {CLEAN_EPOCHS}-epoch run's ({clean_mse})"
    );
}
