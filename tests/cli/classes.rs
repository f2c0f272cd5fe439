//! Class labels the footers cannot tell (issue 41, item 4): class names, and labels `data.sql`
//! makes, are counted by the driver's label pass when the job is planned, so a `sequential`
//! model without `model.classes` trains on them, and a test split holding a class training
//! never sees is refused by name before any executor starts.

use std::path::Path;
use std::time::Duration;

use crate::helpers::{job, repo, ringflow, s, summary};
use crate::test_split::labelled;

const LONG: Duration = Duration::from_secs(600);

/// A sequential model whose last layer takes its width from the classes.
const SEQUENTIAL: &str = r#"[model]
kind = "sequential"
layers = [{ type = "linear", out = 16 }, { type = "relu" }, { type = "linear" }]
"#;

/// The saved model's resolved spec.
fn saved_spec(model: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(model.join("checkpoint.json")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&text).unwrap();
    meta["extra"]["job"].clone()
}

/// Runs `spec` with `--summary-json`; returns the summary and the messages.
fn train(dir: &Path, spec: &str) -> (serde_json::Value, String) {
    let out = dir.join("summary.json");
    let run = ringflow(
        &["local", spec, "--ui", "off", "--summary-json", &s(&out)],
        LONG,
    );
    run.assert_success();
    (summary(&out), format!("{}{}", run.stdout, run.stderr))
}

#[test]
fn a_sequential_model_without_classes_takes_them_from_class_names() {
    let dir = tempfile::tempdir().unwrap();
    let repo = s(&repo());
    let spec = job(
        dir.path(),
        "iris",
        &format!(
            r#"[data]
train = "{repo}/examples/data/iris/train.parquet"
test = "{repo}/examples/data/iris/test.parquet"
features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
label = "species"
normalize = "standard"
{SEQUENTIAL}[train]
epochs = 30
batch_size = 16
optimizer = {{ kind = "adam", lr = 0.01 }}
[cluster]
executors = 2
checkpoint_dir = "{run}"
"#,
            run = s(&dir.path().join("run"))
        ),
    );
    let (summary, messages) = train(dir.path(), &spec);
    assert!(
        messages.contains("data.label: 3 classes in the label column, counted on the driver in"),
        "{messages}"
    );
    assert!(
        summary["test_accuracy"].as_f64().unwrap() >= 0.9,
        "{summary}"
    );
    let model = dir.path().join("run/model");
    let resolved = saved_spec(&model);
    assert_eq!(
        resolved["data"]["label_classes"],
        serde_json::json!(["setosa", "versicolor", "virginica"])
    );
    // `predict` names the classes.
    let preds = dir.path().join("preds");
    let data = format!("{repo}/examples/data/iris/test.parquet");
    let predict = [
        "predict",
        "--model",
        &s(&model),
        "--data",
        &data,
        "--output",
        &s(&preds),
    ];
    ringflow(&predict, LONG).assert_success();
}

/// The labels of `examples/mnist_sql.toml` (a join names each digit), and class indices a
/// query computes, both complete a `sequential` model.
#[test]
fn labels_made_by_sql_complete_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let repo = s(&repo());
    let cases = [
        (
            "names",
            "SELECT input.id, input.image, names.name AS digit FROM input JOIN names ON \
             input.label = names.label WHERE input.id < 6000",
            10,
        ),
        (
            "indices",
            "SELECT id, image, label % 4 AS digit FROM input WHERE id < 6000",
            4,
        ),
    ];
    for (name, sql, classes) in cases {
        let spec = job(
            dir.path(),
            name,
            &format!(
                r#"[data]
train = "{repo}/examples/data/mnist/train.parquet"
test = "{repo}/examples/data/mnist/test.parquet"
sql = "{sql}"
tables = {{ names = "{repo}/examples/data/mnist/label_names.csv" }}
features = ["image"]
label = "digit"
scale = 255.0
{SEQUENTIAL}[train]
epochs = 3
optimizer = {{ kind = "adam", lr = 0.002 }}
[cluster]
executors = 2
checkpoint_dir = "{run}"
"#,
                run = s(&dir.path().join(name))
            ),
        );
        let (summary, messages) = train(dir.path(), &spec);
        assert!(
            messages.contains("of the labels data.sql makes, counted on the driver"),
            "{messages}"
        );
        let resolved = saved_spec(&dir.path().join(name).join("model"));
        assert_eq!(
            resolved["model"]["classes"],
            serde_json::json!(classes),
            "{name}: {resolved}"
        );
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        assert!(accuracy >= 0.8, "{name}: test accuracy {accuracy}");
    }
}

#[test]
fn a_test_class_training_never_sees_is_refused_by_name_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    labelled(&train, &["ant", "bee"], None);
    labelled(&test, &["ant", "bee", "cicada"], None);
    for model in [SEQUENTIAL, "[model]\nkind = \"mlp\"\nlayers = [2, 8, 2]\n"] {
        let spec = job(
            dir.path(),
            "bugs",
            &format!(
                "[data]\ntrain = \"{}\"\ntest = \"{}\"\nfeatures = [\"x0\", \"x1\"]\nlabel = \
                 \"label\"\n{model}[cluster]\ncheckpoint_dir = \"{}\"\n",
                s(&train),
                s(&test),
                s(&dir.path().join("bugs"))
            ),
        );
        let run = ringflow(&["local", &spec, "--executors", "2", "--ui", "off"], LONG);
        let stderr = run.assert_clean_failure();
        for want in [
            "data.test",
            "test.parquet",
            "the class `cicada`",
            "data.train never has",
        ] {
            assert!(stderr.contains(want), "{want:?} in:\n{stderr}");
        }
        assert!(!dir.path().join("bugs/model").exists(), "nothing trained");
    }
}
