//! Models given as a list of layers (`kind = "sequential"`): the driver completes the spec from
//! the data, prints the model summary at job start, and the job trains, saves and evaluates.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field};

use crate::helpers::{job, ringflow, s, summary, write_parquet};

const DEADLINE: Duration = Duration::from_secs(300);

/// Writes `rows` 8×8 one-channel images as a fixed-size list column `image` of 64 floats and
/// an int64 `label`: class 0 is bright in the top half, class 1 in the bottom half, with noise.
fn write_halves(path: &Path, rows: usize, seed: u64) {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut values = Vec::with_capacity(rows * 64);
    let mut labels = Vec::with_capacity(rows);
    for i in 0..rows {
        let class = (i % 2) as i64;
        for cell in 0..64 {
            let bright = (class == 0) == (cell < 32);
            let noise: f32 = rng.random_range(-0.4..0.4);
            values.push(if bright { 1.0 } else { 0.0 } + noise);
        }
        labels.push(class);
    }
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let image = FixedSizeListArray::new(item, 64, Arc::new(Float32Array::from(values)), None);
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("image", Arc::new(image)),
        ("label", Arc::new(Int64Array::from(labels))),
    ];
    write_parquet(path, columns, 64);
}

/// A CNN spec over `dir`'s data with `layers` (TOML), no `model.input` and no `model.classes`:
/// the driver takes them from `data.shape` and the label column's statistics.
fn cnn_job(dir: &Path, name: &str, layers: &str) -> String {
    let toml = format!(
        r#"name = "{name}"
[data]
train = "{train}"
test = "{test}"
features = ["image"]
label = "label"
shape = [1, 8, 8]
[model]
kind = "sequential"
layers = [
{layers}
]
[train]
epochs = 3
batch_size = 16
optimizer = {{ kind = "adam", lr = 0.01 }}
[cluster]
executors = 1
checkpoint_dir = "{ckpt}"
"#,
        train = s(&dir.join("train.parquet")),
        test = s(&dir.join("test.parquet")),
        ckpt = s(&dir.join(name)),
    );
    job(dir, name, &toml)
}

const CNN: &str = r#"  { type = "conv2d", out_channels = 4, kernel = 3, padding = 1 },
  { type = "batch_norm" },
  { type = "relu" },
  { type = "max_pool2d", kernel = 2 },
  { type = "flatten" },
  { type = "linear" },"#;

#[test]
fn a_sequential_cnn_trains_from_a_spec_alone_and_prints_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    write_halves(&dir.path().join("train.parquet"), 256, 1);
    write_halves(&dir.path().join("test.parquet"), 64, 2);
    let spec = cnn_job(dir.path(), "cnn", CNN);
    let out = dir.path().join("summary.json");
    let run = ringflow(&["local", &spec, "--summary-json", &s(&out)], DEADLINE);
    run.assert_success();
    // conv 1→4 3×3: 36 + 4; batch norm: 8 trainable + 8 running statistics; linear 4·4·4 → 2
    // (classes from the label's statistics): 128 + 2.
    let (trainable, total) = (40 + 8 + 130, 40 + 16 + 130);
    let err = &run.stderr;
    assert!(err.contains("model (sequential):"), "{err}");
    let line = |start: &str| {
        err.lines()
            .map(str::trim)
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in:\n{err}"))
            .to_string()
    };
    let conv = line("layers.0 (conv2d)");
    assert!(
        conv.contains("[n, 4, 8, 8]") && conv.ends_with(" 40"),
        "{conv}"
    );
    assert!(line("layers.1 (batch_norm)").ends_with(" 16"));
    let linear = line("layers.5 (linear)");
    assert!(
        linear.contains("[n, 2]") && linear.ends_with(" 130"),
        "{linear}"
    );
    assert_eq!(line("Total params:"), format!("Total params: {total}"));
    assert_eq!(
        line("Trainable params:"),
        format!("Trainable params: {trainable}")
    );

    let sm = summary(&out);
    assert_eq!(sm["status"], "succeeded");
    assert_eq!(sm["parameters"], total);
    assert_eq!(sm["trainable_parameters"], trainable);
    let accuracy = sm["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= 0.9, "test accuracy {accuracy}");

    // The saved model carries the completed spec, so `eval` rebuilds it as trained.
    let model = sm["model_path"].as_str().unwrap();
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(model).join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["model"]["input"], serde_json::json!([1, 8, 8]));
    assert_eq!(meta["model"]["classes"], 2);
    let eval_out = dir.path().join("eval.json");
    let test = s(&dir.path().join("test.parquet"));
    ringflow(
        &[
            "eval",
            "--model",
            model,
            "--data",
            &test,
            "--summary-json",
            &s(&eval_out),
        ],
        DEADLINE,
    )
    .assert_success();
    let ev = summary(&eval_out);
    assert_eq!(ev["test_rows"], 64);
    let eval_accuracy = ev["test_accuracy"].as_f64().unwrap();
    assert!(
        (eval_accuracy - accuracy).abs() < 1e-9,
        "eval {eval_accuracy} vs training's {accuracy}"
    );
}

#[test]
fn a_layer_that_cannot_take_its_input_is_one_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_halves(&dir.path().join("train.parquet"), 32, 1);
    write_halves(&dir.path().join("test.parquet"), 8, 2);
    let no_flatten = CNN.replace("  { type = \"flatten\" },\n", "");
    let spec = cnn_job(dir.path(), "bad", &no_flatten);
    let run = ringflow(&["local", &spec], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(
        err.contains(
            "model.layers[4] (linear) needs a flat [n, features] input but gets [n, 4, 4, 4]; \
             add { type = \"flatten\" } before it"
        ),
        "{err}"
    );
    // Classes of a label data.sql makes: the driver's label pass counts them (issue 41).
    let spec = cnn_job(dir.path(), "sql", CNN);
    let run = ringflow(
        &[
            "local",
            &spec,
            "--set",
            "data.sql=SELECT image, label FROM input",
        ],
        DEADLINE,
    );
    run.assert_success();
    assert!(
        run.stderr
            .contains("data.label: 2 outputs (the largest class index + 1)"),
        "{}",
        run.stderr
    );
}
