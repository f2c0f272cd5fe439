//! Sizes: a batch far beyond the data trains, and a job that cannot fit an executor's memory is
//! refused before any executor works for it, naming the estimate, the limit and the setting.

use std::path::Path;
use std::time::Duration;

use crate::distributed::executor;
use crate::helpers::{ringflow, s, small_mnist_job, summary};
use crate::process::Process;
use crate::ui::http_get;

const DEADLINE: Duration = Duration::from_secs(600);

/// The events of `<ckpt>/events.jsonl`, parsed.
fn events(ckpt: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(ckpt.join("events.jsonl")).expect("an event log");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect()
}

/// The MNIST example with `batch_size = 1000000000`: the executor used to reserve
/// `batch × features × 4` bytes (3.1 TB) and abort. Now the batch is the executor's whole
/// share, one step per epoch, and the job succeeds.
#[test]
fn an_absurd_batch_size_trains_one_step_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let ckpt = dir.path().join("run");
    let run = ringflow(
        &[
            "local",
            "examples/mnist.toml",
            "--set",
            "train.batch_size=1000000000",
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&ckpt)),
            "--summary-json",
            &s(&out),
        ],
        DEADLINE,
    );
    run.assert_success();
    assert!(
        run.stderr.contains("1 steps per epoch"),
        "the plan says one step: {}",
        run.stderr
    );
    let sm = summary(&out);
    assert_eq!(sm["status"], "succeeded");
    assert_eq!(sm["epochs"], 5);
    assert_eq!(sm["steps"], 5, "one step per epoch");
    assert_eq!(sm["samples"], 5 * 60_000, "every row once per epoch");
    assert_eq!(sm["test_rows"], 10_000);
    let loss = sm["final_train_loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0, "{sm}");
    let accuracy = sm["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.1 && accuracy <= 1.0, "{sm}");
    // The whole share in one batch is about 200 MB of features, nowhere near 3.1 TB.
    let rss = sm["peak_rss_mib"][0].as_f64().unwrap();
    assert!(rss > 0.0 && rss < 4096.0, "peak RSS {rss} MiB: {sm}");

    // The estimate was made with the effective batch (the 60,000 rows of the share), logged
    // with the submission, and it stays below what the executor really used: it errs low.
    let log = events(&ckpt);
    let memory = &log[0]["memory"];
    assert_eq!(log[0]["event"], "submitted", "{log:?}");
    let estimate = memory["bytes"].as_f64().unwrap() / (1 << 20) as f64;
    assert!(
        estimate > 100.0 && estimate <= rss,
        "estimate {estimate} MiB, peak {rss} MiB"
    );
    let activations = memory["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["what"] == "activations")
        .unwrap_or_else(|| panic!("no activations part: {memory}"));
    assert!(
        activations["bytes"].as_u64().unwrap() > 4 * 60_000 * 784,
        "{memory}"
    );
    assert!(run.stderr.contains("memory: about "), "{}", run.stderr);
}

/// A model no machine can hold: `local` refuses it before starting any executor process, in
/// one sentence with the estimate, this machine's memory and the setting to lower, and the
/// event log records the estimate and the refusal.
#[test]
fn local_refuses_a_job_that_cannot_fit_before_any_executor_starts() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("run");
    let run = ringflow(
        &[
            "local",
            "examples/mnist.toml",
            "--executors",
            "2",
            "--set",
            "model.layers=[784, 2000000, 2000000, 10]",
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&ckpt)),
        ],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    assert!(err.contains("the job needs about "), "{err}");
    assert!(
        err.contains("TiB of memory per executor (model and optimizer "),
        "{err}"
    );
    assert!(
        err.contains("each of 2 executors gets of this machine's "),
        "names the limit: {err}"
    );
    assert!(
        err.contains("; lower model.layers, or give the executors more memory"),
        "{err}"
    );
    assert!(
        !err.contains("executor processes"),
        "no executor started: {err}"
    );
    let log = events(&ckpt);
    assert_eq!(log[0]["event"], "submitted");
    assert!(log[0]["memory"]["bytes"].as_u64().unwrap() > 1 << 40);
    let last = log.last().unwrap();
    assert_eq!(last["event"], "finished");
    assert_eq!(last["state"], "failed");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("lower model.layers"),
        "{last}"
    );
}

/// A standalone driver refuses a job that its only executor (`--memory 64MiB`) cannot hold,
/// naming that executor, and runs the same job once an executor with enough memory joins,
/// choosing it over the small one. The web UI shows every executor's limit and the estimate.
#[test]
fn executors_advertise_their_memory_and_the_driver_matches_jobs_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Process::start(&["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    let url = driver.printed_after("driver listening on ");
    let ui = driver.printed_after("web UI at ");
    let mut small = executor(&url, &["--memory", "64MiB"]);
    let spec = small_mnist_job(dir.path(), "mem", 1, 1, 256, &dir.path().join("run"));

    let run = ringflow(&["submit", &spec, "--driver", &url], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains("the job needs about "), "{err}");
    assert!(
        err.contains("more than the 64.0 MiB (--memory) of executor exec-"),
        "names the executor and its limit: {err}"
    );
    assert!(
        err.contains("give the executors more memory"),
        "says what to do: {err}"
    );

    let mut big = executor(&url, &[]);
    let out = dir.path().join("ok.json");
    let run = ringflow(
        &[
            "submit",
            &spec,
            "--driver",
            &url,
            "--summary-json",
            &s(&out),
        ],
        DEADLINE,
    );
    run.assert_success();
    assert_eq!(summary(&out)["status"], "succeeded");

    let status = ringflow(&["status", "--driver", &url], Duration::from_secs(30));
    status.assert_success();
    assert!(
        status.stdout.contains("MEMORY") && status.stdout.contains(" 64.0 MiB "),
        "status lists each executor's memory: {}",
        status.stdout
    );

    let (status, body) = http_get(&format!("{ui}api/v1/executors"));
    assert_eq!(status, 200, "{body}");
    let executors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut limits: Vec<(u64, String)> = executors
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["memory_bytes"].as_u64().unwrap_or(0),
                e["memory_source"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    limits.sort();
    assert_eq!(limits[0], (64 << 20, "--memory".to_string()), "{executors}");
    assert!(limits[1].0 > 64 << 20, "the machine's memory: {executors}");
    let (status, body) = http_get(&format!("{ui}api/v1/jobs"));
    assert_eq!(status, 200, "{body}");
    let jobs: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        jobs[0]["memory"]["bytes"].as_u64().unwrap() > 64 << 20,
        "{jobs}"
    );
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .any(|j| j["state"] == "failed"
                && j["error"].as_str().unwrap_or("").contains("(--memory)")),
        "{jobs}"
    );
    for p in [&mut small, &mut big, &mut driver] {
        p.terminate();
    }
}
