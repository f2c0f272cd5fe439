//! Object stores for real: each test starts its own S3 server (moto, on a port the OS picks)
//! and points training data, SQL lookup tables, checkpoints, evaluation, predictions and
//! `ringflow sql` at it through `s3://` URLs.
//!
//! Every command runs with the test process's `AWS_*` variables removed, so a developer's
//! credentials, profile or endpoint never leak in; the server's endpoint and dummy credentials
//! are set where a test wants them.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::helpers::{Run, job, repo, ringflow_env, run_command, s, summary};

const DEADLINE: Duration = Duration::from_secs(120);
pub(crate) const BUCKET: &str = "ringflow-test";
const MNIST_TRAIN: &str = "examples/data/mnist/train.parquet";
const MNIST_TEST: &str = "examples/data/mnist/test.parquet";
const LABEL_NAMES: &str = "examples/data/mnist/label_names.csv";

/// The client side of the tests: create a bucket, upload files, list keys (with sizes).
const BOTO: &str = r#"
import os, sys, boto3
c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
op, bucket, *rest = sys.argv[1:]
if op == "mb":
    c.create_bucket(Bucket=bucket)
elif op == "put":
    for item in rest:
        key, path = item.split("=", 1)
        c.upload_file(path, bucket, key)
elif op == "ls":
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=rest[0]):
        for o in page.get("Contents", []):
            print(o["Key"], o["Size"])
else:
    sys.exit("unknown op " + op)
"#;

/// A moto S3 server on 127.0.0.1, killed when dropped.
pub(crate) struct Moto {
    child: Child,
    url: String,
}

impl Moto {
    /// Starts the server and creates the bucket [`BUCKET`].
    pub(crate) fn start() -> Moto {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(check_moto_installed);
        // Port 0: the OS picks a free port, and werkzeug prints the address it bound.
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        without_aws_vars(&mut cmd);
        let mut child = cmd.spawn().expect("python3 starts");
        let (tx, rx) = mpsc::channel::<String>();
        // Both streams are drained for the server's whole life (it logs every request), and
        // every line is offered to the channel until nobody listens.
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped"));
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
        }
        drop(tx);
        let mut server = Moto {
            child,
            url: String::new(),
        };
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        let mut seen = Vec::new();
        while server.url.is_empty() {
            let left = limit.saturating_sub(start.elapsed());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("Running on http://") {
                        let rest = &line[at + "Running on ".len()..];
                        let url = rest.split_whitespace().next().unwrap_or(rest);
                        server.url = url.trim_end_matches('/').to_string();
                    }
                    seen.push(line);
                }
                Err(_) => panic!(
                    "moto's server printed no address within {limit:?} (or exited: {:?}); its \
                     output:\n{}",
                    server.child.try_wait(),
                    seen.join("\n")
                ),
            }
        }
        drop(rx);
        let addr = server.url.trim_start_matches("http://").to_string();
        while TcpStream::connect(&addr).is_err() {
            assert!(
                start.elapsed() < limit,
                "moto's server at {} accepts no connections after {limit:?}",
                server.url
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.boto(&["mb", BUCKET]);
        server
    }

    /// Runs the boto3 client script with `args` (`OP BUCKET ...`); returns its stdout.
    fn boto(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(BOTO).args(args);
        without_aws_vars(&mut cmd);
        for (name, value) in self.credentials() {
            cmd.env(name, value);
        }
        let run = run_command(&mut cmd, DEADLINE);
        assert!(
            run.status.success(),
            "boto3 {args:?} failed:\n{}",
            run.stderr
        );
        run.stdout
    }

    /// Uploads local files (relative to the repository root): `(key, path)`.
    pub(crate) fn put(&self, files: &[(&str, &str)]) {
        let items: Vec<String> = files.iter().map(|(k, p)| format!("{k}={p}")).collect();
        let mut args = vec!["put", BUCKET];
        args.extend(items.iter().map(String::as_str));
        self.boto(&args);
    }

    /// The keys below `prefix`, sorted, with their sizes.
    pub(crate) fn list(&self, prefix: &str) -> Vec<(String, u64)> {
        let mut keys: Vec<(String, u64)> = self
            .boto(&["ls", BUCKET, prefix])
            .lines()
            .map(|l| {
                let (k, n) = l.rsplit_once(' ').expect("KEY SIZE");
                (k.to_string(), n.parse().expect("a size"))
            })
            .collect();
        keys.sort();
        keys
    }

    /// The endpoint and the dummy credentials that the server accepts.
    pub(crate) fn credentials(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ]
    }
}

/// Fails, saying how CI installs it, unless python3 can import moto's server and boto3.
fn check_moto_installed() {
    let check = Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .stdin(Stdio::null())
        .output();
    match check {
        Ok(o) if o.status.success() => {}
        other => panic!(
            "moto's S3 server is not installed for python3 (`python3 -c \"import moto.server, \
             boto3\"` failed: {}); testing/run-tests.sh installs it; or run `python3 -m pip \
             install \"moto[server]==5.2.1\" boto3`",
            match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => format!("python3 cannot be started: {e}"),
            }
        ),
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the `AWS_*` variables this test process holds.
fn aws_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("AWS_"))
        .collect()
}

fn without_aws_vars(cmd: &mut Command) {
    for k in aws_vars() {
        cmd.env_remove(k);
    }
}

/// Runs `ringflow ARGS` with no inherited `AWS_*` variable and then `set` set.
pub(crate) fn ringflow_aws(args: &[&str], set: &[(&str, String)]) -> Run {
    let removed = aws_vars();
    let mut env: Vec<(&str, Option<&str>)> = removed.iter().map(|k| (k.as_str(), None)).collect();
    env.extend(set.iter().map(|(k, v)| (*k, Some(v.as_str()))));
    ringflow_env(args, &env, DEADLINE)
}

/// Runs `ringflow ARGS` against `server`'s endpoint with its credentials.
pub(crate) fn ringflow_s3(server: &Moto, args: &[&str]) -> Run {
    ringflow_aws(args, &server.credentials())
}

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
    let spec = job(
        dir.path(),
        "s3-mnist",
        &mnist_spec(
            "s3-mnist",
            &format!("s3://{BUCKET}/runs/x"),
            "label = \"label\"",
        ),
    );
    let sm = train_on_s3(&server, &spec, dir.path());
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

    // Evaluation reads the model and the data from the bucket and scores what training did.
    let test = format!("s3://{BUCKET}/mnist/test.parquet");
    let eval_out = dir.path().join("eval.json");
    let run = ringflow_s3(
        &server,
        &[
            "eval",
            "--model",
            &model,
            "--data",
            &test,
            "--executors",
            "2",
            "--summary-json",
            &s(&eval_out),
        ],
    );
    run.assert_success();
    assert!(run.stdout.contains("accuracy"), "{}", run.stdout);
    let ev = summary(&eval_out);
    assert_eq!(ev["test_rows"], 10_000);
    let eval_acc = ev["test_accuracy"].as_f64().unwrap();
    assert!(
        (eval_acc - acc).abs() < 0.002,
        "eval accuracy {eval_acc} vs {acc} at the end of training"
    );

    // Predictions go to the bucket, one part per executor, every row once with its id.
    let preds = format!("s3://{BUCKET}/preds");
    ringflow_s3(
        &server,
        &[
            "predict",
            "--model",
            &model,
            "--data",
            &test,
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
        &server,
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
    // The event log is in the bucket: the training job, then the evaluation and prediction of
    // its model; `ringflow history` reads it from there.
    let run = ringflow_s3(
        &server,
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
    assert_no_local_s3_dir();
    eprintln!("train/eval/predict on S3 took {:?}", started.elapsed());
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
