//! Data prep with SQL, whole-data statistics, string labels, Arrow Flight, `sql`, `eval` and
//! `predict`: real Parquet, real DataFusion, real processes.

use std::time::Duration;

use crate::distributed::executor;
use crate::helpers::{job, repo, ringflow, s, summary};
use crate::process::Process;

const LONG: Duration = Duration::from_secs(900);

/// A spec over MNIST with the given `[data]` body (paths absolute) and model layers.
fn mnist_spec(dir: &std::path::Path, name: &str, data: &str, layers: &str) -> String {
    job(
        dir,
        name,
        &format!(
            r#"
[data]
{data}
[model]
kind = "mlp"
layers = {layers}
[train]
epochs = 1
batch_size = 128
optimizer = {{ kind = "sgd", lr = 0.05, momentum = 0.9 }}
[cluster]
executors = 1
checkpoint_dir = "{ckpt}"
"#,
            ckpt = s(&dir.join(name)),
        ),
    )
}

fn mnist(split: &str) -> String {
    s(&repo().join(format!("examples/data/mnist/{split}.parquet")))
}

/// The SQL example trains with a filter, a join against a lookup table (string classes), a
/// derived feature and standardization; `eval` of the saved model reproduces the job's test
/// accuracy, and `predict` writes class names for every test row, one part per executor.
#[test]
fn the_sql_example_trains_evaluates_and_predicts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let ckpt = format!("cluster.checkpoint_dir={}", s(&dir.path().join("run")));
    ringflow(
        &[
            "local",
            "examples/mnist_sql.toml",
            "--set",
            "train.epochs=1",
            "--set",
            &ckpt,
            "--summary-json",
            &s(&out),
        ],
        LONG,
    )
    .assert_success();
    let sm = summary(&out);
    assert_eq!(sm["data_source"], "direct");
    assert_eq!(sm["replicas_identical"], true);
    let accuracy = sm["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.9, "{sm}");
    assert_eq!(sm["test_rows"], 10_000);
    assert_eq!(sm["peak_rss_mib"].as_array().unwrap().len(), 2);

    let model = s(&dir.path().join("run/model"));
    check_saved_preprocessing(&dir.path().join("run/model/checkpoint.json"));
    let test = mnist("test");
    let eval_accuracy = eval_reproduces(&model, &test, &dir.path().join("eval.json"), accuracy);
    predictions_name_classes(&model, &test, &dir.path().join("preds"), eval_accuracy);
}

/// The saved model holds the string classes (sorted) and the standardization of every feature.
fn check_saved_preprocessing(checkpoint_json: &std::path::Path) {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint_json).unwrap()).unwrap();
    let classes = &meta["extra"]["preprocessing"]["classes"];
    assert_eq!(classes[0], "eight", "sorted class names: {classes}");
    assert_eq!(classes.as_array().unwrap().len(), 10);
    assert_eq!(
        meta["extra"]["preprocessing"]["normalize"]["mean"]
            .as_array()
            .unwrap()
            .len(),
        785
    );
}

/// `eval` of `model` on `test` reproduces the training job's test accuracy; returns it.
fn eval_reproduces(model: &str, test: &str, eval_out: &std::path::Path, accuracy: f64) -> f64 {
    ringflow(
        &[
            "eval",
            "--model",
            model,
            "--data",
            test,
            "--executors",
            "2",
            "--summary-json",
            &s(eval_out),
        ],
        LONG,
    )
    .assert_success();
    let ev = summary(eval_out);
    assert_eq!(ev["kind"], "eval");
    assert_eq!(ev["test_rows"], 10_000);
    let eval_accuracy = ev["test_accuracy"].as_f64().unwrap();
    assert!(
        (eval_accuracy - accuracy).abs() < 1e-9,
        "eval {eval_accuracy} vs training's test accuracy {accuracy}"
    );
    eval_accuracy
}

/// `predict` writes one part per executor with every test row's id once and class names,
/// right as often as `eval` said.
fn predictions_name_classes(model: &str, test: &str, preds: &std::path::Path, eval_accuracy: f64) {
    let run = ringflow(
        &[
            "predict",
            "--model",
            model,
            "--data",
            test,
            "--output",
            &s(preds),
            "--id",
            "id",
            "--executors",
            "2",
        ],
        LONG,
    );
    run.assert_success();
    assert!(
        run.stdout.contains("10000 predictions written"),
        "{}",
        run.stdout
    );
    assert!(preds.join("part-00000.parquet").is_file());
    assert!(preds.join("part-00001.parquet").is_file());
    // Read the predictions back with SQL: every id once, class names, right ~as often as eval.
    let check = ringflow(
        &[
            "sql",
            "SELECT count(*) AS n, count(DISTINCT p.id) AS ids, \
             sum(CASE WHEN p.prediction = names.name THEN 1 ELSE 0 END) AS correct \
             FROM p JOIN t ON p.id = t.id JOIN names ON t.label = names.label",
            "--table",
            &format!("p={}", s(preds)),
            "--table",
            &format!("t={test}"),
            "--table",
            "names=examples/data/mnist/label_names.csv",
        ],
        LONG,
    );
    check.assert_success();
    let row = check
        .stdout
        .lines()
        .find(|l| l.contains("10000"))
        .unwrap_or_else(|| panic!("{}", check.stdout));
    let cells: Vec<u64> = row
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert_eq!(cells[..2], [10_000, 10_000], "{row}");
    assert_eq!(cells[2] as f64 / 10_000.0, eval_accuracy, "{row}");
}

/// The tabular example: string classes and standardization computed by the executors and
/// merged by the driver equal what SQL computes over the whole training split.
#[test]
fn whole_data_statistics_match_sql_over_the_training_split() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let ckpt = format!("cluster.checkpoint_dir={}", s(&dir.path().join("run")));
    ringflow(
        &[
            "local",
            "examples/iris.toml",
            "--set",
            &ckpt,
            "--summary-json",
            &s(&out),
        ],
        LONG,
    )
    .assert_success();
    let sm = summary(&out);
    assert!(sm["test_accuracy"].as_f64().unwrap() >= 0.9, "{sm}");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("run/model/checkpoint.json")).unwrap(),
    )
    .unwrap();
    let pre = &meta["extra"]["preprocessing"];
    assert_eq!(
        pre["classes"],
        serde_json::json!(["setosa", "versicolor", "virginica"])
    );
    let stats = ringflow(
        &[
            "sql",
            "SELECT avg(sepal_length), stddev_pop(sepal_length), avg(petal_width), \
             stddev_pop(petal_width) FROM t",
            "--table",
            "t=examples/data/iris/train.parquet",
        ],
        LONG,
    );
    stats.assert_success();
    let row = stats
        .stdout
        .lines()
        .filter(|l| l.starts_with('|'))
        .nth(1)
        .unwrap_or_else(|| panic!("{}", stats.stdout));
    let sql: Vec<f64> = row
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let mean = pre["normalize"]["mean"].as_array().unwrap();
    let std = pre["normalize"]["std"].as_array().unwrap();
    let saved = [
        mean[0].as_f64().unwrap(),
        std[0].as_f64().unwrap(),
        mean[3].as_f64().unwrap(),
        std[3].as_f64().unwrap(),
    ];
    for (a, b) in saved.iter().zip(&sql) {
        assert!((a - b).abs() < 1e-5, "saved {saved:?} vs SQL {sql:?}");
    }
}

/// Executors whose working directory cannot see the data get it from the driver over Arrow
/// Flight (`data.source = "auto"`); `"direct"` then fails naming the file.
#[test]
fn executors_that_cannot_read_the_data_get_it_from_the_driver() {
    let driver_dir = tempfile::tempdir().unwrap();
    let data = driver_dir.path().join("driver-only");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(mnist("train"), data.join("train.parquet")).unwrap();
    std::fs::copy(mnist("test"), data.join("test.parquet")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Process::start_in(
        &["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"],
        driver_dir.path(),
    );
    let url = driver.printed_after("driver listening on ");
    // Executors run in the repository root, where `driver-only/` does not exist.
    let mut executors: Vec<Process> = (0..2).map(|_| executor(&url, &[])).collect();
    let spec = |source: &str| {
        mnist_spec(
            dir.path(),
            source,
            &format!(
                "train = \"driver-only/train.parquet\"\ntest = \"driver-only/test.parquet\"\n\
                 features = [\"image\"]\nlabel = \"label\"\nscale = 255.0\nsource = \"{source}\"\n\
                 cache_mb = 0"
            ),
            "[784, 32, 10]",
        )
    };
    let out = dir.path().join("auto.json");
    let run = ringflow(
        &[
            "submit",
            &spec("auto"),
            "--driver",
            &url,
            "--set",
            "cluster.executors=2",
            "--summary-json",
            &s(&out),
        ],
        LONG,
    );
    run.assert_success();
    assert!(
        run.stderr
            .contains("serving the data from the driver over Arrow Flight, because rank"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("driver-only/train.parquet: does not exist"),
        "names the file: {}",
        run.stderr
    );
    let sm = summary(&out);
    assert_eq!(sm["data_source"], "driver");
    assert_eq!(sm["samples"], 60_000);
    assert!(sm["test_accuracy"].as_f64().unwrap() > 0.9, "{sm}");

    let run = ringflow(
        &[
            "submit",
            &spec("direct"),
            "--driver",
            &url,
            "--set",
            "cluster.executors=2",
        ],
        LONG,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("driver-only/train.parquet: does not exist"),
        "{err}"
    );
    for d in executors.iter_mut().chain([&mut driver]) {
        d.terminate();
    }
}

/// `ringflow sql` prints a table, writes Parquet with `--output`, and runs `COPY ... TO`.
#[test]
fn the_sql_command_queries_and_writes_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("train={}", mnist("train"));
    let run = ringflow(
        &[
            "sql",
            "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label",
            "--table",
            &table,
        ],
        LONG,
    );
    run.assert_success();
    assert!(run.stdout.contains("| 1     | 6742 |"), "{}", run.stdout);
    assert!(run.stdout.contains("10 rows"), "{}", run.stdout);

    let counts = dir.path().join("counts.parquet");
    ringflow(
        &[
            "sql",
            "SELECT label, count(*) AS n FROM train GROUP BY label",
            "--table",
            &table,
            "--output",
            &s(&counts),
        ],
        LONG,
    )
    .assert_success();
    let copied = dir.path().join("copied.parquet");
    ringflow(
        &[
            "sql",
            &format!(
                "COPY (SELECT sum(n) AS total FROM counts) TO '{}' STORED AS PARQUET",
                s(&copied)
            ),
            "--table",
            &format!("counts={}", s(&counts)),
        ],
        LONG,
    )
    .assert_success();
    let back = ringflow(
        &[
            "sql",
            "SELECT total FROM c",
            "--table",
            &format!("c={}", s(&copied)),
        ],
        LONG,
    );
    back.assert_success();
    assert!(back.stdout.contains("| 60000 |"), "{}", back.stdout);

    let err = ringflow(&["sql", "SELECT nope FROM train", "--table", &table], LONG);
    assert!(err.assert_clean_failure().contains("nope"));
    let err = ringflow(&["sql", "SELECT 1", "--table", "t=missing.parquet"], LONG);
    assert!(err.assert_clean_failure().contains("missing.parquet"));
}

/// Bad SQL, a query whose output lacks the label or has a non-numeric feature, a missing
/// path or lookup table, and string labels with the wrong loss: one clear error each, before
/// any executor starts; a label outside the given classes fails naming the value.
#[test]
fn bad_data_prep_is_refused_before_executors_work() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (mnist("train"), mnist("test"));
    let names = s(&repo().join("examples/data/mnist/label_names.csv"));
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "syntax",
            "sql = \"SELEC image, label FROM input\"\nfeatures = [\"image\"]\nlabel = \"label\"".into(),
            "[784, 10]",
            vec!["data.sql", "SELEC"],
        ),
        (
            "unknown_column",
            "sql = \"SELECT imagex, label FROM input\"\nfeatures = [\"image\"]\nlabel = \"label\"".into(),
            "[784, 10]",
            vec!["data.sql", "imagex"],
        ),
        (
            "no_label",
            "sql = \"SELECT image FROM input\"\nfeatures = [\"image\"]\nlabel = \"label\"".into(),
            "[784, 10]",
            vec!["the output of data.sql", "has no column `label` (data.label)"],
        ),
        (
            "text_feature",
            "sql = \"SELECT CAST(id AS VARCHAR) AS f, label FROM input\"\nfeatures = [\"f\"]\nlabel = \"label\"".into(),
            "[1, 10]",
            vec!["column `f` has type Utf8", "a feature must be a number"],
        ),
        (
            "missing_table",
            "sql = \"SELECT image, label FROM input JOIN names USING (label)\"\ntables = { names = \"nope/names.csv\" }\nfeatures = [\"image\"]\nlabel = \"label\"".into(),
            "[784, 10]",
            vec!["data.tables.names", "nope/names.csv", "does not exist"],
        ),
        (
            "string_label_mse",
            format!("sql = \"SELECT image, names.name FROM input JOIN names ON input.label = names.label\"\ntables = {{ names = \"{names}\" }}\nfeatures = [\"image\"]\nlabel = \"name\""),
            "[784, 1]",
            vec!["holds strings", "cross_entropy"],
        ),
    ];
    for (name, data, layers, expect) in cases {
        let data = format!("train = \"{train}\"\n{data}");
        let path = mnist_spec(dir.path(), name, &data, layers);
        let extra: &[&str] = if name == "string_label_mse" {
            &["--set", "train.loss=mse"]
        } else {
            &[]
        };
        let mut args = vec!["local", path.as_str(), "--executors", "2"];
        args.extend_from_slice(extra);
        let run = ringflow(&args, LONG);
        let err = run.assert_clean_failure();
        for e in &expect {
            assert!(err.contains(e), "{name}: expected {e:?} in:\n{err}");
        }
        assert!(
            !err.contains("executor processes"),
            "{name}: executors were started:\n{err}"
        );
    }
    let missing = mnist_spec(
        dir.path(),
        "missing_path",
        "train = \"no/such/train.parquet\"\nfeatures = [\"image\"]\nlabel = \"label\"",
        "[784, 10]",
    );
    let err = ringflow(&["local", &missing], LONG);
    assert!(
        err.assert_clean_failure()
            .contains("\"no/such/train.parquet\" does not exist")
    );

    // Classes given, but the data holds another one: the executor names the value and file.
    let given = mnist_spec(
        dir.path(),
        "unknown_class",
        &format!(
            "train = \"{test}\"\nsql = \"SELECT image, names.name FROM input JOIN names ON \
             input.label = names.label\"\ntables = {{ names = \"{names}\" }}\nfeatures = \
             [\"image\"]\nlabel = \"name\"\nscale = 255.0\nlabel_classes = [\"zero\", \"one\", \
             \"two\", \"three\", \"four\", \"five\", \"six\", \"seven\", \"eight\", \"ten\"]"
        ),
        "[784, 10]",
    );
    let err = ringflow(&["local", &given], LONG);
    let err = err.assert_clean_failure();
    assert!(
        err.contains("label \"nine\" is not one of the classes") && err.contains("test.parquet"),
        "{err}"
    );
}
