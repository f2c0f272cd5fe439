//! Object stores for real: each test starts its own S3 server (moto, on a port the OS picks)
//! and points training data, SQL lookup tables, checkpoints, evaluation, predictions and
//! `ringflow sql` at it through `s3://` URLs.
//!
//! Every command runs with the test process's `AWS_*` variables removed, so a developer's
//! credentials, profile or endpoint never leak in; the server's endpoint and dummy credentials
//! are set where a test wants them.

use std::time::{Duration, Instant};

use crate::helpers::{job, repo, s, summary};

mod moto;

pub(crate) use moto::{BUCKET, Moto, ringflow_aws, ringflow_s3};

const MNIST_TRAIN: &str = "examples/data/mnist/train.parquet";
const MNIST_TEST: &str = "examples/data/mnist/test.parquet";
const LABEL_NAMES: &str = "examples/data/mnist/label_names.csv";

/// The data rows of a table that `ringflow sql` printed, cells trimmed.
fn rows(printed: &str) -> Vec<Vec<String>> {
    printed
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1) // the header
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// No executor was started (the job was refused while it was planned).
fn assert_no_executor_started(err: &str) {
    assert!(
        !err.contains("executor processes") && !err.contains("registered from"),
        "the job should have been refused before any executor started:\n{err}"
    );
}

/// A URL mistaken for a relative local path would leave `s3:/...` in the working directory.
fn assert_no_local_s3_dir() {
    let stray = repo().join("s3:");
    assert!(
        !stray.exists(),
        "an s3:// URL was written as a local path: {} exists",
        stray.display()
    );
}

/// MNIST, the job spec of `examples/mnist.toml` for one epoch, data and checkpoints on S3.
fn mnist_spec(name: &str, checkpoint_dir: &str, sql: &str) -> String {
    format!(
        r#"
name = "{name}"
[data]
train = "s3://{BUCKET}/mnist/train.parquet"
test = "s3://{BUCKET}/mnist/test.parquet"
features = ["image"]
scale = 255.0
{sql}
[model]
kind = "mlp"
layers = [784, 100, 10]
activation = "relu"
[train]
epochs = 1
batch_size = 128
optimizer = {{ kind = "sgd", lr = 0.1, momentum = 0.9 }}
schedule = {{ kind = "cosine", warmup_steps = 150 }}
lr_scaling = "linear"
seed = 42
[cluster]
checkpoint_dir = "{checkpoint_dir}"
"#
    )
}

/// Runs the job spec at `spec` on two local executors against the server; returns its summary.
fn train_on_s3(server: &Moto, spec: &str, dir: &std::path::Path) -> serde_json::Value {
    let out = dir.join("train.json");
    ringflow_s3(
        server,
        &[
            "local",
            spec,
            "--executors",
            "2",
            "--summary-json",
            &s(&out),
        ],
    )
    .assert_success();
    summary(&out)
}

/// Trains on S3 data with checkpoints on S3 (two executors), then evaluates and predicts with
/// the model straight from the bucket, predictions written back to it and read with SQL.
#[test]
fn train_evaluate_and_predict_with_data_and_model_on_s3() {
    let started = Instant::now();
    let server = Moto::start();
    server.put(&[
        ("mnist/train.parquet", MNIST_TRAIN),
        ("mnist/test.parquet", MNIST_TEST),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (model, acc) = train_with_the_model_saved_on_s3(&server, dir.path());
    let test = format!("s3://{BUCKET}/mnist/test.parquet");
    eval_from_s3_scores_like_training(&server, &model, &test, &dir.path().join("eval.json"), acc);
    predictions_go_to_s3(&server, &model, &test);
    history_is_read_from_s3(&server);
    assert_no_local_s3_dir();
    eprintln!("train/eval/predict on S3 took {:?}", started.elapsed());
}

/// One epoch of MNIST from the bucket on two executors, its model saved in the bucket (and
/// nothing under a local `s3:` directory); returns the model's URL and the test accuracy.
fn train_with_the_model_saved_on_s3(server: &Moto, dir: &std::path::Path) -> (String, f64) {
    let spec = job(
        dir,
        "s3-mnist",
        &mnist_spec(
            "s3-mnist",
            &format!("s3://{BUCKET}/runs/x"),
            "label = \"label\"",
        ),
    );
    let sm = train_on_s3(server, &spec, dir);
    assert_eq!(sm["status"], "succeeded");
    assert_eq!(sm["executors"], 2);
    assert_eq!(sm["samples"], 60_000);
    assert_eq!(sm["test_rows"], 10_000);
    assert_eq!(sm["replicas_identical"], true);
    let acc = sm["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.9, "test accuracy {acc} after one epoch from S3");
    let model = format!("s3://{BUCKET}/runs/x/model");
    assert_eq!(sm["model_path"], model.as_str());
    let saved: Vec<String> = server
        .list("runs/x/model/")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(
        saved.contains(&"runs/x/model/checkpoint.json".to_string())
            && saved.iter().any(|k| k.ends_with(".safetensors")),
        "the model is in the bucket: {saved:?}"
    );
    assert_no_local_s3_dir();
    (model, acc)
}

/// Evaluation reads the model and the data (`test`) from the bucket and scores what training
/// did (test accuracy `acc`).
fn eval_from_s3_scores_like_training(
    server: &Moto,
    model: &str,
    test: &str,
    eval_out: &std::path::Path,
    acc: f64,
) {
    let run = ringflow_s3(
        server,
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
    );
    run.assert_success();
    assert!(run.stdout.contains("accuracy"), "{}", run.stdout);
    let ev = summary(eval_out);
    assert_eq!(ev["test_rows"], 10_000);
    let eval_acc = ev["test_accuracy"].as_f64().unwrap();
    assert!(
        (eval_acc - acc).abs() < 0.002,
        "eval accuracy {eval_acc} vs {acc} at the end of training"
    );
}

/// Predictions of `model` on `test` go to the bucket, one part per executor, every row once
/// with its id, as SQL over the bucket shows.
fn predictions_go_to_s3(server: &Moto, model: &str, test: &str) {
    let preds = format!("s3://{BUCKET}/preds");
    ringflow_s3(
        server,
        &[
            "predict",
            "--model",
            model,
            "--data",
            test,
            "--output",
            &preds,
            "--id",
            "id",
            "--executors",
            "2",
        ],
    )
    .assert_success();
    let parts = server.list("preds/");
    assert!(
        !parts.is_empty()
            && parts
                .iter()
                .all(|(k, n)| k.starts_with("preds/part-") && k.ends_with(".parquet") && *n > 0),
        "part files in the bucket: {parts:?}"
    );
    let run = ringflow_s3(
        server,
        &[
            "sql",
            "SELECT count(*) AS n, count(DISTINCT id) AS ids, \
             sum(CASE WHEN prediction BETWEEN 0 AND 9 THEN 1 ELSE 0 END) AS digits FROM p",
            "--table",
            &format!("p={preds}/"),
        ],
    );
    run.assert_success();
    assert_eq!(
        rows(&run.stdout),
        vec![vec!["10000", "10000", "10000"]],
        "{}",
        run.stdout
    );
}

/// The event log is in the bucket: the training job, then the evaluation and prediction of
/// its model; `ringflow history` reads it from there.
fn history_is_read_from_s3(server: &Moto) {
    let run = ringflow_s3(
        server,
        &["history", &format!("s3://{BUCKET}/runs/x"), "--json"],
    );
    run.assert_success();
    let history: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let jobs: Vec<(&str, &str)> = history["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["kind"].as_str().unwrap(), j["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        jobs,
        [
            ("train", "succeeded"),
            ("eval", "succeeded"),
            ("predict", "succeeded")
        ],
        "{}",
        run.stdout
    );
    assert_eq!(history["jobs"][0]["epochs"].as_array().unwrap().len(), 1);
}

/// `data.sql` over S3 data joins a lookup table that is a CSV on S3 (string labels, found by
/// a distributed pass); evaluation applies the same query, reading the table again.
#[test]
fn a_job_prepares_s3_data_with_sql_joining_an_s3_lookup_table() {
    let started = Instant::now();
    let server = Moto::start();
    server.put(&[
        ("mnist/train.parquet", MNIST_TRAIN),
        ("mnist/test.parquet", MNIST_TEST),
        ("tables/names.csv", LABEL_NAMES),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        r#"label = "digit"
sql = """
SELECT input.image, names.name AS digit
FROM input JOIN names ON input.label = names.label
"""
tables = {{ names = "s3://{BUCKET}/tables/names.csv" }}"#
    );
    let spec = job(
        dir.path(),
        "s3-sql",
        &mnist_spec("s3-sql", &format!("s3://{BUCKET}/runs/sql"), &sql),
    );
    let sm = train_on_s3(&server, &spec, dir.path());
    assert_eq!(sm["status"], "succeeded");
    assert_eq!(sm["samples"], 60_000, "every row joined a name");
    assert_eq!(sm["test_rows"], 10_000);
    let acc = sm["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.9, "test accuracy {acc} with string labels from S3");

    let eval_out = dir.path().join("eval.json");
    ringflow_s3(
        &server,
        &[
            "eval",
            "--model",
            &format!("s3://{BUCKET}/runs/sql/model"),
            "--data",
            &format!("s3://{BUCKET}/mnist/test.parquet"),
            "--summary-json",
            &s(&eval_out),
        ],
    )
    .assert_success();
    let ev = summary(&eval_out);
    assert_eq!(ev["test_rows"], 10_000);
    let eval_acc = ev["test_accuracy"].as_f64().unwrap();
    assert!(
        (eval_acc - acc).abs() < 0.002,
        "eval accuracy {eval_acc} vs {acc} at the end of training"
    );
    assert_no_local_s3_dir();
    eprintln!("SQL job on S3 took {:?}", started.elapsed());
}

/// `ringflow sql` reads Parquet and CSV tables from S3 exactly as from local files, and writes
/// its result to S3.
#[test]
fn sql_reads_and_writes_tables_on_s3() {
    let server = Moto::start();
    server.put(&[
        ("mnist/train.parquet", MNIST_TRAIN),
        ("tables/names.csv", LABEL_NAMES),
    ]);
    let query = "SELECT label, count(*) AS n FROM t GROUP BY label ORDER BY label";
    let local = ringflow_s3(
        &server,
        &["sql", query, "--table", &format!("t={MNIST_TRAIN}")],
    );
    local.assert_success();
    let remote = ringflow_s3(
        &server,
        &[
            "sql",
            query,
            "--table",
            &format!("t=s3://{BUCKET}/mnist/train.parquet"),
        ],
    );
    remote.assert_success();
    let counts = rows(&remote.stdout);
    assert_eq!(counts.len(), 10, "{}", remote.stdout);
    assert_eq!(counts[7], vec!["7", "6265"], "{}", remote.stdout);
    assert_eq!(remote.stdout, local.stdout, "S3 and local files agree");

    let run = ringflow_s3(
        &server,
        &[
            "sql",
            query,
            "--table",
            &format!("t=s3://{BUCKET}/mnist/train.parquet"),
            "--output",
            &format!("s3://{BUCKET}/out/counts.parquet"),
        ],
    );
    run.assert_success();
    assert!(run.stdout.contains("wrote 10 rows"), "{}", run.stdout);
    assert_eq!(
        server
            .list("out/")
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>(),
        ["out/counts.parquet"]
    );
    let run = ringflow_s3(
        &server,
        &[
            "sql",
            "SELECT sum(c.n) AS total, count(*) AS named, max(names.name) AS last \
             FROM c JOIN names ON c.label = names.label",
            "--table",
            &format!("c=s3://{BUCKET}/out/counts.parquet"),
            "--table",
            &format!("names=s3://{BUCKET}/tables/names.csv"),
        ],
    );
    run.assert_success();
    assert_eq!(
        rows(&run.stdout),
        vec![vec!["60000", "10", "zero"]],
        "{}",
        run.stdout
    );
    assert_no_local_s3_dir();
}

/// Without credentials an s3:// input is refused while the job is planned, naming the URL;
/// a missing object or model is named as missing. No executor starts.
#[test]
fn missing_credentials_and_missing_objects_fail_cleanly() {
    let server = Moto::start();
    server.put(&[("mnist/train.parquet", MNIST_TRAIN)]);
    let dir = tempfile::tempdir().unwrap();
    let train = format!("s3://{BUCKET}/mnist/train.parquet");
    let spec = job(
        dir.path(),
        "s3-errors",
        &format!(
            r#"
[data]
train = "{train}"
features = ["image"]
label = "label"
[model]
kind = "mlp"
layers = [784, 10]
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            ckpt = s(&dir.path().join("run")),
        ),
    );
    // The endpoint is there and the object exists: only the credentials are missing.
    let no_credentials = [
        ("AWS_ENDPOINT_URL", server.url.clone()),
        ("AWS_DEFAULT_REGION", "us-east-1".to_string()),
    ];
    let start = Instant::now();
    let run = ringflow_aws(&["local", &spec, "--executors", "2"], &no_credentials);
    let err = run.assert_clean_failure();
    assert!(err.contains("no AWS credentials"), "{err}");
    assert!(err.contains("data.train") && err.contains(&train), "{err}");
    assert!(
        err.contains("AWS_ACCESS_KEY_ID"),
        "names the variable: {err}"
    );
    assert_no_executor_started(err);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "refused at once, not after {:?}",
        start.elapsed()
    );

    let run = ringflow_aws(
        &[
            "sql",
            "SELECT count(*) FROM t",
            "--table",
            &format!("t={train}"),
        ],
        &no_credentials,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("no AWS credentials") && err.contains(&train),
        "{err}"
    );

    let model = format!("s3://{BUCKET}/runs/x/model");
    let run = ringflow_aws(
        &["eval", "--model", &model, "--data", MNIST_TEST],
        &no_credentials,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("no AWS credentials") && err.contains(&model),
        "{err}"
    );
    assert_no_executor_started(err);

    // With credentials: objects that are not there.
    let nope = format!("s3://{BUCKET}/nope.parquet");
    for key in ["data.train", "data.test"] {
        let run = ringflow_s3(
            &server,
            &["local", &spec, "--set", &format!("{key}={nope}")],
        );
        let err = run.assert_clean_failure();
        assert!(
            err.contains(key) && err.contains(&nope) && err.contains("does not exist"),
            "{key}: {err}"
        );
        assert_no_executor_started(err);
    }
    let missing_model = format!("s3://{BUCKET}/runs/nope/model");
    let run = ringflow_s3(
        &server,
        &["eval", "--model", &missing_model, "--data", &train],
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains(&missing_model) && err.contains("does not exist"),
        "{err}"
    );
    assert_no_executor_started(err);
    assert_no_local_s3_dir();
}

/// Outputs on S3 (a checkpoint directory, a prediction directory) without credentials are
/// refused while the job is planned too, not after the executors have done the work.
#[test]
fn s3_outputs_without_credentials_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    crate::helpers::write_regression_data(&data, &[200], 100);
    let body = |ckpt: &str| {
        format!(
            r#"
[data]
train = "{train}"
features = ["a", "b", "v"]
label = "y"
[model]
kind = "mlp"
layers = [4, 1]
[train]
loss = "mse"
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            train = s(&data),
        )
    };
    let no_credentials = [("AWS_DEFAULT_REGION", "us-east-1".to_string())];

    let ckpt = format!("s3://{BUCKET}/runs/never");
    let spec = job(dir.path(), "to-s3", &body(&ckpt));
    let run = ringflow_aws(&["local", &spec], &no_credentials);
    let err = run.assert_clean_failure();
    assert!(
        err.contains("no AWS credentials") && err.contains(&ckpt),
        "{err}"
    );
    assert_no_executor_started(err);

    // A local model, predictions to S3.
    let local_ckpt = dir.path().join("run");
    let spec = job(dir.path(), "local", &body(&s(&local_ckpt)));
    ringflow_aws(&["local", &spec], &no_credentials).assert_success();
    let preds = format!("s3://{BUCKET}/preds");
    let run = ringflow_aws(
        &[
            "predict",
            "--model",
            &s(&local_ckpt.join("model")),
            "--data",
            &s(&data),
            "--output",
            &preds,
        ],
        &no_credentials,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("no AWS credentials") && err.contains(&preds),
        "{err}"
    );
    assert_no_executor_started(err);
    assert_no_local_s3_dir();
}
