//! Checkpoints of earlier formats: what an earlier ringflow saved still resumes and evaluates
//! (`tests/cli/fixtures/`); what today's saves keeps the spec as its user wrote it beside the
//! spec the driver resolved.

use std::path::Path;
use std::time::Duration;

use crate::helpers::{repo, ringflow, s};

const LONG: Duration = Duration::from_secs(300);

/// The iris job the format-1 fixture was trained with (its data paths made absolute here).
const ITS_SPEC: &str = r#"name = "iris-checkpoint-v1"

[data]
train = "examples/data/iris/train.parquet"
test = "examples/data/iris/test.parquet"
features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
label = "species"
normalize = "standard"

[model]
kind = "mlp"
layers = [4, 16, 3]
activation = "relu"

[train]
epochs = 2
batch_size = 16
optimizer = { kind = "sgd", lr = 0.05, momentum = 0.9 }
loss = "cross_entropy"
seed = 42

[cluster]
executors = 2
checkpoint_every_steps = 3
"#;

/// `ITS_SPEC` with absolute data paths and `epochs` epochs, written into `dir`.
fn spec(dir: &Path, epochs: u64) -> String {
    let examples = format!("{}/examples/", s(&repo()));
    let text = ITS_SPEC
        .replace("\"examples/", &format!("\"{examples}"))
        .replace("epochs = 2", &format!("epochs = {epochs}"));
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    s(&path)
}

/// A copy of the format-1 fixture in `dir/run`.
fn format_1_run(dir: &Path) -> std::path::PathBuf {
    let from = repo().join("tests/cli/fixtures/checkpoint-format-1");
    let run = dir.join("run");
    for part in ["checkpoint", "model"] {
        std::fs::create_dir_all(run.join(part)).unwrap();
        for file in std::fs::read_dir(from.join(part)).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, run.join(part).join(file.file_name().unwrap())).unwrap();
        }
    }
    run
}

/// A format-1 checkpoint resumes where it stopped and trains on; its saved model evaluates.
#[test]
fn a_format_1_checkpoint_resumes_and_its_model_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = format_1_run(dir.path());
    let test = s(&repo().join("examples/data/iris/test.parquet"));
    let model = s(&run_dir.join("model"));
    let eval = ringflow(&["eval", "--model", &model, "--data", &test], LONG);
    eval.assert_success();
    assert!(eval.stdout.contains("accuracy 0.8667"), "{}", eval.stdout);
    let spec = spec(dir.path(), 3);
    let resumed = ringflow(&["local", &spec, "--resume", &s(&run_dir)], LONG);
    resumed.assert_success();
    assert!(
        resumed
            .stderr
            .contains("resuming from the checkpoint at epoch 2 step 8"),
        "{}",
        resumed.stderr
    );
    assert!(resumed.stderr.contains("epoch 3/3"), "{}", resumed.stderr);
}

/// A checkpoint and a saved model keep the spec file's text byte for byte and the overrides as
/// given beside the spec the driver resolved, whose numbers read as they were written.
#[test]
fn a_checkpoint_keeps_the_spec_as_written_beside_the_resolved_one() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), 1);
    let run_dir = dir.path().join("run");
    let set_dir = format!("cluster.checkpoint_dir={}", s(&run_dir));
    let run = ringflow(
        &["local", &spec, "--set", &set_dir, "--executors", "1"],
        LONG,
    );
    run.assert_success();
    let text = std::fs::read_to_string(&spec).unwrap();
    for saved in ["checkpoint", "model"] {
        let file = run_dir.join(saved).join("checkpoint.json");
        let raw = std::fs::read_to_string(&file).unwrap();
        let meta: serde_json::Value = serde_json::from_str(&raw).unwrap();
        let written = &meta["extra"]["spec_as_written"];
        assert_eq!(written["toml"].as_str(), Some(text.as_str()), "{saved}");
        assert_eq!(written["file"].as_str(), Some(spec.as_str()), "{saved}");
        let overrides = [format!("--set {set_dir}"), "--executors 1".to_string()];
        assert_eq!(
            written["overrides"],
            serde_json::json!(overrides),
            "{saved}"
        );
        let job = &meta["extra"]["job"];
        assert_eq!(
            job["model"]["layers"],
            serde_json::json!([4, 16, 3]),
            "{saved}"
        );
        assert_eq!(
            job["train"]["optimizer"]["lr"].to_string(),
            "0.05",
            "{saved}: {raw}"
        );
        assert!(
            !raw.contains("0.0500000"),
            "{saved}: a number came back changed: {raw}"
        );
    }
}
