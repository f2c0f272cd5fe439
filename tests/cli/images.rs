//! Image columns (`data.image`), example shapes (`data.shape`) and augmentation
//! (`data.augment`) end to end: PNG bytes in Parquet decoded by real executors.

use std::path::Path;
use std::time::Duration;

use crate::helpers::{job, ringflow, s, summary, write_image_mnist};

const LONG: Duration = Duration::from_secs(600);

/// Writes a job named `name` over `train` (and `test`) with the `[data]` lines `features` (the
/// feature columns, an image column or a shape): an MLP 784-32-10 on 2 executors, 2 epochs of
/// SGD. Returns the spec's path.
fn spec(dir: &Path, name: &str, train: &Path, test: &Path, features: &str) -> String {
    job(
        dir,
        name,
        &format!(
            r#"name = "{name}"
[data]
train = "{train}"
test = "{test}"
label = "label"
scale = 255.0
{features}
[model]
kind = "mlp"
layers = [784, 32, 10]
[train]
epochs = 2
batch_size = 50
optimizer = {{ kind = "sgd", lr = 0.1, momentum = 0.9 }}
[cluster]
executors = 2
checkpoint_dir = "{ckpt}"
"#,
            train = s(train),
            test = s(test),
            ckpt = s(&dir.join(name)),
        ),
    )
}

/// Writes the job `name` ([`spec`]) and runs it with `local`; returns its summary.
fn train(dir: &Path, name: &str, files: [&Path; 2], features: &str) -> serde_json::Value {
    let spec = spec(dir, name, files[0], files[1], features);
    let out = dir.join(format!("{name}.json"));
    ringflow(&["local", &spec, "--summary-json", &s(&out)], LONG).assert_success();
    summary(&out)
}

/// PNG bytes decode to exactly the pixels of the raw column: an MLP trained on the PNG column
/// ends with the same loss and test accuracy as one trained on the raw bytes read with
/// `data.shape = [1, 28, 28]` (which an MLP takes flat). `eval` of the PNG model reproduces its
/// accuracy and `predict` on PNG data writes a prediction per row.
#[test]
fn png_images_train_evaluate_and_predict_like_their_raw_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (train_file, test_file) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    write_image_mnist(&train_file, "train", 3000, 1000, None);
    write_image_mnist(&test_file, "test", 1000, 1000, None);
    let png = "image = { column = \"png\", size = [28, 28], channels = 1 }";
    let raw = "features = [\"image\"]\nshape = [1, 28, 28]";
    let files = [train_file.as_path(), test_file.as_path()];
    let from_png = train(dir.path(), "png", files, png);
    let from_raw = train(dir.path(), "raw", files, raw);
    let accuracy = from_png["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.8, "{from_png}");
    for key in ["final_train_loss", "test_accuracy", "test_rows"] {
        assert_eq!(
            from_png[key], from_raw[key],
            "{key}: {from_png} vs {from_raw}"
        );
    }
    assert_eq!(from_png["replicas_identical"], true);

    let model = s(&dir.path().join("png/model"));
    let eval_out = dir.path().join("eval.json");
    ringflow(
        &[
            "eval",
            "--model",
            &model,
            "--data",
            &s(&test_file),
            "--summary-json",
            &s(&eval_out),
        ],
        LONG,
    )
    .assert_success();
    assert_eq!(summary(&eval_out)["test_accuracy"].as_f64(), Some(accuracy));
    let preds = dir.path().join("preds");
    let run = ringflow(
        &[
            "predict",
            "--model",
            &model,
            "--data",
            &s(&test_file),
            "--output",
            &s(&preds),
            "--id",
            "id",
        ],
        LONG,
    );
    run.assert_success();
    assert!(
        run.stdout.contains("1000 predictions written"),
        "{}",
        run.stdout
    );
}

/// A PNG that cannot be decoded fails the job: one sentence naming the file, the row and the
/// decoder's reason, a non-zero exit, and no model written.
#[test]
fn a_corrupt_image_fails_the_job_naming_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let (train_file, test_file) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    write_image_mnist(&train_file, "train", 600, 200, Some(437));
    write_image_mnist(&test_file, "test", 100, 100, None);
    let png = "image = { column = \"png\", size = [28, 28], channels = 1 }";
    let spec = spec(dir.path(), "bad", &train_file, &test_file, png);
    let run = ringflow(&["local", &spec], LONG);
    let stderr = run.assert_clean_failure();
    assert!(
        stderr.contains(&format!(
            "{}: column `png` (data.image) row 437 (0-based): is cut short",
            s(&train_file)
        )),
        "{stderr}"
    );
    assert!(
        !dir.path().join("bad/model").exists(),
        "a model was written"
    );
}

/// Augmentation draws from the job's seed: two runs with the same seed end identical, and
/// the augmented run differs from one without augmentation.
#[test]
fn augmentation_is_the_same_on_every_run_with_the_same_seed() {
    let dir = tempfile::tempdir().unwrap();
    let (train_file, test_file) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    write_image_mnist(&train_file, "train", 600, 300, None);
    write_image_mnist(&test_file, "test", 200, 200, None);
    let png = "image = { column = \"png\", size = [28, 28], channels = 1 }";
    let augmented = format!("{png}\naugment = {{ random_crop = 2, horizontal_flip = true }}");
    let files = [train_file.as_path(), test_file.as_path()];
    let runs: Vec<serde_json::Value> =
        [("a", augmented.as_str()), ("b", &augmented), ("plain", png)]
            .into_iter()
            .map(|(name, data)| train(dir.path(), name, files, data))
            .collect();
    assert_eq!(
        runs[0]["final_train_loss"], runs[1]["final_train_loss"],
        "{runs:?}"
    );
    assert_eq!(
        runs[0]["test_accuracy"], runs[1]["test_accuracy"],
        "{runs:?}"
    );
    assert_ne!(
        runs[0]["final_train_loss"], runs[2]["final_train_loss"],
        "{runs:?}"
    );
}
