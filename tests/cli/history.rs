//! A job's event log (`<checkpoint_dir>/events.jsonl`), `ringflow history` over it, and the
//! `--timeline` Chrome trace of every rank's steps.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{job, mnist_data, ringflow, s, small_mnist_job, summary};

const LIMIT: Duration = Duration::from_secs(300);

/// A two-executor, two-epoch MNIST job with `--timeline`: its event log holds submitted,
/// started, two epoch ends and finished in that order; `ringflow history` shows both epochs (and
/// `--json` has them); the timeline is a Chrome trace with every phase of every step of both
/// ranks, in time order within each rank.
#[test]
fn event_log_history_and_timeline_of_a_two_executor_job() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let spec = small_mnist_job(dir.path(), "hist", 2, 2, 256, &ckpt);
    let trace_path = dir.path().join("T.json");
    let out = dir.path().join("summary.json");
    let run = ringflow(
        &[
            "local",
            &spec,
            "--timeline",
            &s(&trace_path),
            "--summary-json",
            &s(&out),
        ],
        LIMIT,
    );
    run.assert_success();
    let sm = summary(&out);
    assert!(
        run.stderr
            .contains(&format!("written to {}", s(&trace_path))),
        "{}",
        run.stderr
    );
    check_event_log(&ckpt.join("events.jsonl"), &sm);
    check_history(&s(&ckpt), sm["job_id"].as_str().unwrap());
    check_timeline(&trace_path, sm["steps"].as_u64().unwrap());
}

/// The event log at `path` holds submitted, started, one checkpoint per epoch, two epoch ends,
/// two evaluations and finished, in that order, each with the job id of the summary `sm`.
fn check_event_log(path: &Path, sm: &Value) {
    let text = std::fs::read_to_string(path).expect("events.jsonl");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let names: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    let main: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| ["submitted", "started", "epoch_end", "finished"].contains(n))
        .collect();
    assert_eq!(
        main,
        ["submitted", "started", "epoch_end", "epoch_end", "finished"],
        "{names:?}"
    );
    assert_eq!(names.first(), Some(&"submitted"));
    assert_eq!(names.last(), Some(&"finished"));
    assert_eq!(
        names.iter().filter(|n| **n == "checkpoint").count(),
        2,
        "one checkpoint per epoch: {names:?}"
    );
    // The test split after epoch 1 (training went on) and after training.
    let evaluated: Vec<&Value> = lines.iter().filter(|l| l["event"] == "evaluated").collect();
    assert_eq!(evaluated.len(), 2, "{names:?}");
    assert_eq!(evaluated[0]["epoch"], 0, "{}", evaluated[0]);
    assert!(evaluated[1].get("epoch").is_none(), "{}", evaluated[1]);
    assert!(evaluated[0]["accuracy"].as_f64().unwrap() > 0.5);
    for l in &lines {
        assert_eq!(l["job_id"], sm["job_id"], "{l}");
        assert!(l["at"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    let started = lines.iter().find(|l| l["event"] == "started").unwrap();
    assert_eq!(started["ranks"].as_array().unwrap().len(), 2, "{started}");
    let epoch = lines.iter().find(|l| l["event"] == "epoch_end").unwrap();
    assert_eq!(epoch["samples"], 60_000, "{epoch}");
    assert!(
        epoch["phases"]["forward"].as_f64().unwrap() > 0.0,
        "{epoch}"
    );
    let finished = lines.last().unwrap();
    assert_eq!(finished["state"], "succeeded");
    assert_eq!(finished["summary"]["epochs"], 2);
}

/// `ringflow history` of the checkpoint directory `ckpt` shows job `job_id` with both epochs,
/// both executors and the test accuracy, for people and as JSON.
fn check_history(ckpt: &str, job_id: &str) {
    let run = ringflow(&["history", ckpt], LIMIT);
    run.assert_success();
    assert!(
        run.stdout
            .starts_with(&format!("job {job_id} (hist, train): succeeded\n")),
        "{}",
        run.stdout
    );
    for needle in [
        "\n  1/2 ",
        "\n  2/2 ",
        "executors (2): rank 0 ",
        "test: accuracy ",
    ] {
        assert!(run.stdout.contains(needle), "{needle:?} in\n{}", run.stdout);
    }
    let run = ringflow(&["history", ckpt, "--json"], LIMIT);
    run.assert_success();
    let h: Value = serde_json::from_str(&run.stdout).expect("--json prints JSON");
    assert_eq!(h["jobs"].as_array().unwrap().len(), 1);
    let j = &h["jobs"][0];
    assert_eq!(j["job_id"], job_id);
    assert_eq!(j["state"], "succeeded");
    assert_eq!(j["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(j["executors"].as_array().unwrap().len(), 2);
    assert!(j["test"]["accuracy"].as_f64().unwrap() > 0.5, "{j}");
    for e in j["epochs"].as_array().unwrap() {
        assert!(e["test"]["accuracy"].as_f64().unwrap() > 0.5, "{j}");
    }
}

/// The timeline at `trace_path` is a Chrome trace with the five phases of each of the `steps`
/// steps of ranks 0 and 1, in time order within each rank, and a name for each rank.
fn check_timeline(trace_path: &Path, steps: u64) {
    let trace: Value =
        serde_json::from_slice(&std::fs::read(trace_path).unwrap()).expect("the trace is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let mut by_rank: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        by_rank
            .entry(e["pid"].as_u64().unwrap())
            .or_default()
            .push(e);
    }
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), [0, 1]);
    for (rank, xs) in &by_rank {
        assert_eq!(xs.len() as u64, 5 * steps, "rank {rank}: 5 phases per step");
        for phase in ["data", "forward", "backward", "allreduce", "optimizer"] {
            assert!(
                xs.iter().any(|e| e["name"] == phase),
                "rank {rank} has no {phase}"
            );
        }
        let ts: Vec<f64> = xs.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(
            ts.windows(2).all(|w| w[0] <= w[1]),
            "rank {rank}: ts not monotone"
        );
        assert!(xs.iter().all(|e| e["dur"].as_f64().unwrap() >= 0.0
            && e["tid"] == 0
            && e["args"]["epoch"].is_u64()
            && e["args"]["step"].is_u64()));
        let name = events
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == *rank)
            .unwrap_or_else(|| panic!("rank {rank} has no process_name"));
        let label = name["args"]["name"].as_str().unwrap();
        assert!(
            label.starts_with(&format!("rank {rank} (executor ")),
            "{label}"
        );
    }
}

/// `ringflow history` on a directory without an event log, or with a broken line, fails with
/// one sentence naming the file (and the line); a `--timeline` that cannot be written fails
/// before the job starts.
#[test]
fn history_and_timeline_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = ringflow(&["history", &s(dir.path())], LIMIT);
    let err = run.assert_clean_failure();
    let file = s(&dir.path().join("events.jsonl"));
    assert!(err.contains(&file), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let good = r#"{"event":"submitted","job_id":"j-0001","at":"2025-01-01T00:00:00.000Z","elapsed_s":0,"name":"j","kind":"train","executors":1}"#;
    std::fs::write(
        dir.path().join("events.jsonl"),
        format!("{good}\nnot json\n"),
    )
    .unwrap();
    let run = ringflow(&["history", &s(dir.path())], LIMIT);
    let err = run.assert_clean_failure();
    assert!(err.contains(&format!("{file} line 2 ")), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let spec = job(
        dir.path(),
        "t",
        &format!(
            "{}\n[model]\nkind = \"mlp\"\nlayers = [784, 10]\n",
            mnist_data()
        ),
    );
    let bad = dir.path().join("no/such/dir/t.json");
    let run = ringflow(&["local", &spec, "--timeline", &s(&bad)], LIMIT);
    let err = run.assert_clean_failure();
    assert!(err.contains(&s(&bad)), "{err}");
    assert!(!err.contains("started"), "no executor started: {err}");
}
