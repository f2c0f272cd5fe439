//! Seeing a job: progress lines on a non-terminal stderr, and `--tensorboard` event files read
//! back with the `tensorboard` Python package's own reader.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::helpers::{ringflow, ringflow_env, s, small_mnist_job, summary};

const LIMIT: Duration = Duration::from_secs(300);

/// Loads the event files of `dir` with TensorBoard's `EventAccumulator` and returns
/// `{tag: [[step, value], …]}` of every scalar. Fails the test when the `tensorboard` package
/// cannot be imported (testing/run-tests.sh installs it).
fn tensorboard_scalars(dir: &Path) -> serde_json::Value {
    const SCRIPT: &str = r#"
import json, sys
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"NO_TENSORBOARD: {e}")
    sys.exit(3)
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                  for tag in acc.Tags()["scalars"]}))
"#;
    let out = Command::new("python3")
        .args(["-c", SCRIPT, &s(dir)])
        .output()
        .unwrap_or_else(|e| panic!("python3 cannot be started: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.starts_with("NO_TENSORBOARD"),
        "the `tensorboard` Python package is needed to read the event files back \
         (testing/run-tests.sh installs it; or python3 -m pip install tensorboard==2.21.0): {stdout}"
    );
    assert!(
        out.status.success(),
        "TensorBoard's reader failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("TensorBoard's reader printed no JSON ({e}):\n{stdout}\n{stderr}")
    })
}

/// The points of `tag`: (step, value).
fn points(scalars: &serde_json::Value, tag: &str) -> Vec<(u64, f64)> {
    scalars[tag]
        .as_array()
        .unwrap_or_else(|| panic!("no scalar {tag:?} in {scalars}"))
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

/// A two-epoch MNIST job with `--tensorboard`: TensorBoard reads the training loss at global
/// steps, one loss per epoch, throughput and the test figures; stderr (not a terminal) has
/// plain epoch lines and no progress-bar escapes.
#[test]
fn tensorboard_event_files_read_back_with_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_mnist_job(dir.path(), "tb", 1, 2, 128, &dir.path().join("run"));
    let tb = dir.path().join("tb/run-1");
    let out = dir.path().join("summary.json");
    // 5 ms more per step (469 steps an epoch) makes each epoch outlast the executors' 1 s
    // progress interval, so that progress reaches the CLI within every epoch.
    let run = ringflow_env(
        &[
            "local",
            &spec,
            "--tensorboard",
            &s(&tb),
            "--summary-json",
            &s(&out),
        ],
        &[("RINGFLOW_TEST_STRAGGLER", Some("0:5"))],
        LIMIT,
    );
    run.assert_success();
    assert!(run.stderr.contains("\nepoch 1/2: loss "), "{}", run.stderr);
    assert!(run.stderr.contains("\nepoch 2/2: loss "), "{}", run.stderr);
    // The test split is evaluated after epoch 1 as well (`train.eval_every_epochs` = 1); the
    // last epoch's evaluation is the summary's.
    assert!(
        run.stderr.contains("\ntest after epoch 1/2: accuracy 0."),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("test after epoch 2/2"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains('\u{1b}'),
        "no terminal escapes when stderr is not a terminal:\n{}",
        run.stderr
    );
    let sm = summary(&out);
    assert_eq!(sm["status"], "succeeded", "{sm}");

    let files: Vec<String> = std::fs::read_dir(&tb)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with("events.out.tfevents.") && files[0].ends_with(".ringflow"),
        "{files:?}"
    );

    let scalars = tensorboard_scalars(&tb);
    let loss = points(&scalars, "train/loss");
    assert!(!loss.is_empty(), "train/loss has points: {scalars}");
    for &(step, value) in &loss {
        assert!(
            (1..2 * 469).contains(&step),
            "global step {step}: {scalars}"
        );
        assert!(value.is_finite() && value > 0.0, "{scalars}");
    }
    assert!(
        loss.windows(2).all(|w| w[0].0 < w[1].0),
        "global steps increase: {scalars}"
    );
    let rate = points(&scalars, "train/samples_per_s");
    assert_eq!(rate.len(), loss.len(), "{scalars}");
    assert!(rate.iter().all(|&(_, r)| r > 0.0), "{scalars}");

    let epochs = points(&scalars, "epoch/loss");
    assert_eq!(
        epochs.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2],
        "one point per epoch: {scalars}"
    );
    let history = sm["history"].as_array().unwrap();
    for (&(_, value), h) in epochs.iter().zip(history) {
        let want = h["loss"].as_f64().unwrap();
        assert!(
            (value - want).abs() < 1e-4 * want.max(1.0),
            "{value} vs {want}"
        );
    }
    assert_eq!(points(&scalars, "epoch/samples_per_s").len(), 2);

    let acc = points(&scalars, "test/accuracy");
    let want = sm["test_accuracy"].as_f64().unwrap();
    assert_eq!(
        acc.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2],
        "after each epoch: {scalars}"
    );
    assert!((acc[1].1 - want).abs() < 1e-6, "{} vs {want}", acc[1].1);
    assert!(acc[0].1 > 0.5 && acc[0].1 < 1.0, "{scalars}");
    assert!(want > 0.85, "the model learned: {sm}");
    assert_eq!(points(&scalars, "test/loss").len(), 2, "{scalars}");
    assert!(scalars.get("test/mse").is_none(), "{scalars}");
}

/// A TensorBoard directory that cannot be created fails the command at once, naming it.
#[test]
fn an_unusable_tensorboard_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let tb = file.join("tb");
    let run = ringflow(
        &[
            "local",
            "examples/mnist.toml",
            "--tensorboard",
            &s(&tb),
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&dir.path().join("run"))),
        ],
        LIMIT,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains(&format!(
            "error: --tensorboard {} cannot be created: {} is a regular file",
            s(&tb),
            s(&file)
        )),
        "{err}"
    );
    assert!(!err.contains("started "), "no executor was started: {err}");
}
