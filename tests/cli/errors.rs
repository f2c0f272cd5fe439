//! Bad input: one clear error naming what is at fault, a non-zero exit, never a panic.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Float32Array, Int64Array, StringArray};

use crate::helpers::{job, ringflow, ringflow_env, s, summary, write_parquet};

const DEADLINE: Duration = Duration::from_secs(120);

fn spec(train: &str, features: &str, layers: &str, extra: &str) -> String {
    format!(
        r#"
[data]
train = "{train}"
features = {features}
label = "label"
[model]
kind = "mlp"
layers = {layers}
[train]
epochs = 1
{extra}
"#
    )
}

#[test]
fn unknown_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let body = spec(
        "examples/data/mnist/train.parquet",
        "[\"image\"]",
        "[784, 10]",
        "epochz = 3",
    );
    let path = job(dir.path(), "typo", &body);
    let run = ringflow(&["local", &path], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains("unknown key `train.epochz`"), "{err}");
    assert!(err.contains("typo.toml"), "{err}");

    let run = ringflow(
        &[
            "local",
            "examples/mnist.toml",
            "--set",
            "train.optimizer.lrate=0.1",
        ],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    assert!(err.contains("train.optimizer.lrate"), "{err}");

    let run = ringflow(
        &["local", "examples/mnist.toml", "--set", "train.epochs"],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    assert!(err.contains("--set train.epochs"), "{err}");
}

#[test]
fn missing_data_and_columns_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = job(
        dir.path(),
        "nofile",
        &spec("no/such/file.parquet", "[\"image\"]", "[784, 10]", ""),
    );
    let err = ringflow(&["local", &path], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(
        err.contains("data.train") && err.contains("no/such/file.parquet"),
        "{err}"
    );

    let path = job(
        dir.path(),
        "nocol",
        &spec(
            "examples/data/mnist/train.parquet",
            "[\"pixels\"]",
            "[784, 10]",
            "",
        ),
    );
    let err = ringflow(&["local", &path], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(
        err.contains("train.parquet") && err.contains("`pixels`"),
        "{err}"
    );
    assert!(err.contains("image"), "lists the columns that exist: {err}");

    let path = job(
        dir.path(),
        "width",
        &spec(
            "examples/data/mnist/train.parquet",
            "[\"image\"]",
            "[780, 10]",
            "",
        ),
    );
    let err = ringflow(&["local", &path], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(
        err.contains("784 values per row") && err.contains("780 inputs"),
        "{err}"
    );
}

#[test]
fn a_label_outside_the_model_classes_names_file_column_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.json");
    let path = job(
        dir.path(),
        "five",
        &spec(
            "examples/data/mnist/train.parquet",
            "[\"image\"]",
            "[784, 5]",
            "batch_size = 500",
        )
        .replace(
            "[train]",
            &format!("[cluster]\ncheckpoint_dir = \"{}\"\n[train]", s(dir.path())),
        ),
    );
    let run = ringflow(&["local", &path, "--summary-json", &s(&out)], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains("train.parquet"), "{err}");
    assert!(err.contains("column `label` row "), "{err}");
    assert!(err.contains("not one of the model's 5 classes"), "{err}");
    assert_eq!(summary(&out)["status"], "failed");
}

#[test]
fn a_cuda_job_on_a_machine_without_a_usable_gpu_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let body = spec(
        "examples/data/mnist/train.parquet",
        "[\"image\"]",
        "[784, 10]",
        "",
    )
    .replace(
        "[train]",
        &format!(
            "[cluster]\ndevice = \"cuda\"\ncheckpoint_dir = \"{}\"\n[train]",
            s(dir.path())
        ),
    );
    let path = job(dir.path(), "gpu", &body);
    // No GPU is visible even where there is one, so a `--features cuda` build fails too.
    let run = ringflow_env(
        &["local", &path],
        &[("CUDA_VISIBLE_DEVICES", Some(""))],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "one error line:\n{err}");
    assert!(lines[0].contains("cluster.device = \"cuda\""), "{err}");
    if !cfg!(feature = "cuda") {
        assert!(lines[0].contains("without CUDA support"), "{err}");
    }
    assert!(
        !err.contains("executor processes"),
        "fails before starting executors:\n{err}"
    );
}

/// A file with a feature column of `values` and an integer label.
fn write_one_column(path: &std::path::Path, values: ArrayRef) {
    let rows = values.len();
    write_parquet(
        path,
        vec![
            ("x", values),
            ("label", Arc::new(Int64Array::from(vec![0i64; rows]))),
        ],
        1000,
    );
}

#[test]
fn nulls_non_finite_values_wrong_types_and_empty_data() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, ArrayRef, &str)> = vec![
        (
            "nulls",
            Arc::new(Float32Array::from(vec![
                Some(1.0),
                Some(2.0),
                None,
                Some(4.0),
            ])),
            "column `x` row 2 (0-based): the value is null",
        ),
        (
            "nan",
            Arc::new(Float32Array::from(vec![1.0, f32::NAN, 3.0, 4.0])),
            "column `x` row 1 (0-based): the value is NaN (not finite)",
        ),
        (
            "strings",
            Arc::new(StringArray::from(vec!["a", "b", "c", "d"])),
            "column `x` has type Utf8",
        ),
        (
            "empty",
            Arc::new(Float32Array::from(Vec::<f32>::new())),
            "holds 0 rows",
        ),
    ];
    for (name, values, expected) in cases {
        let file = dir.path().join(format!("{name}.parquet"));
        write_one_column(&file, values);
        let path = job(dir.path(), name, &spec(&s(&file), "[\"x\"]", "[1, 2]", ""));
        let run = ringflow(&["local", &path], DEADLINE);
        let err = run.assert_clean_failure();
        assert!(
            err.contains(expected),
            "{name}: expected {expected:?} in:\n{err}"
        );
        if name != "empty" {
            assert!(
                err.contains(&format!("{name}.parquet")),
                "{name}: names the file: {err}"
            );
        }
    }
}
