//! What travels between the driver and its executors, at any size: a tagger whose vocabulary
//! made its task larger than gRPC's default 4 MiB, and a vocabulary of 500,000 distinct tokens,
//! train (the vocabulary goes to each executor in chunks, outside the task) and evaluate; a
//! token, a class name or a `data.sql` longer than its documented bound is refused at planning
//! with one sentence naming the file and row, or the key, and the setting; and an executor
//! that cannot receive its task fails the job at once, naming the executor and the cause, with
//! `ringflow local` and with a standalone driver. Every run has a deadline, so a job left
//! "running" fails the test instead of hanging it.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Int64Array};

use crate::helpers::{job, regression_job, ringflow, ringflow_env, s, summary, write_parquet};
use crate::process::Process;
use crate::security::driver;
use crate::sequences::strings;

const DEADLINE: Duration = Duration::from_secs(300);

/// The test hook that makes an executor's task channel decode at most this many bytes.
const TASK_LIMIT_HOOK: &str = "RINGFLOW_TEST_MAX_TASK_BYTES";

/// The number of ids of the vocabulary saved with the model in `model_dir`.
fn saved_vocabulary(model_dir: &Path) -> usize {
    let text = std::fs::read_to_string(model_dir.join("checkpoint.json")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&text).unwrap();
    meta["extra"]["preprocessing"]["vocabulary"]
        .as_array()
        .unwrap_or_else(|| panic!("no vocabulary saved in {}", model_dir.display()))
        .len()
}

/// A tiny tagger (or, without `tagger`, a sequence classifier) of `train`, `[data]` lines
/// `extra`.
fn sequence_job(dir: &Path, name: &str, train: &Path, tagger: bool, extra: &str) -> String {
    let (label, middle) = if tagger {
        (
            "tags",
            "{ type = \"lstm\", hidden = 4, bidirectional = true }",
        )
    } else {
        ("label", "{ type = \"sequence_pool\", reduce = \"mean\" }")
    };
    job(
        dir,
        name,
        &format!(
            r#"
[data]
train = "{train}"
features = ["tokens"]
label = "{label}"
{extra}
[model]
kind = "sequential"
layers = [{{ type = "embedding", dim = 2 }}, {middle}, {{ type = "linear" }}]
[train]
epochs = 1
batch_size = 500
optimizer = {{ kind = "sgd", lr = 0.1 }}
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            train = s(train),
            ckpt = s(&dir.join(name)),
        ),
    )
}

/// 2,000 sentences of 20 distinct URLs of about 120 bytes each: a vocabulary of 40,002 ids
/// whose JSON (4.9 MB) made the task larger than 4 MiB, and stalled the job.
fn write_urls(path: &Path) {
    let pad = "p".repeat(90);
    let tokens: Vec<Vec<String>> = (0..2000)
        .map(|row| {
            (0..20)
                .map(|j| format!("https://example.com/{row:05}/{j:02}/{pad}"))
                .collect()
        })
        .collect();
    let tags: Vec<Vec<&str>> = (0..2000)
        .map(|_| {
            (0..20)
                .map(|j| if j == 0 { "B-URL" } else { "O" })
                .collect()
        })
        .collect();
    let tokens: Vec<Vec<&str>> = tokens
        .iter()
        .map(|r| r.iter().map(String::as_str).collect())
        .collect();
    write_parquet(
        path,
        vec![("tokens", strings(&tokens)), ("tags", strings(&tags))],
        500,
    );
}

/// A BiLSTM tagger whose vocabulary is larger than gRPC's default message (4 MiB) trains on two
/// executors, saves every token, and `ringflow eval` of the saved model (whose task carries
/// the same vocabulary) reads it back.
#[test]
fn a_tagger_whose_vocabulary_passes_4_mib_trains_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("urls.parquet");
    write_urls(&data);
    let spec = sequence_job(dir.path(), "urls", &data, true, "");
    let out = dir.path().join("urls.json");
    // The executors say when they fetch the preprocessing.
    let log = ("RINGFLOW_LOG", Some("warn,ringflow_executor::worker=info"));
    let args = [
        "local",
        &spec,
        "--executors",
        "2",
        "--summary-json",
        &s(&out),
    ];
    let run = ringflow_env(&args, &[log], DEADLINE);
    run.assert_success();
    // Too large to travel inside the tasks (4.9 MB), the vocabulary reached each executor in
    // chunks.
    let fetched = "fetched the job's preprocessing (4";
    assert_eq!(run.stderr.matches(fetched).count(), 2, "{}", run.stderr);
    let trained = summary(&out);
    assert_eq!(trained["replicas_identical"], true, "{trained}");
    let model = dir.path().join("urls/model");
    assert_eq!(saved_vocabulary(&model), 40_002);
    let eval_out = dir.path().join("eval.json");
    ringflow(
        &[
            "eval",
            "--model",
            &s(&model),
            "--data",
            &s(&data),
            "--summary-json",
            &s(&eval_out),
        ],
        DEADLINE,
    )
    .assert_success();
    // One figure per real token: 2,000 sentences of 20.
    assert_eq!(summary(&eval_out)["test_rows"], 40_000);
}

/// A sequence classifier over 500,000 distinct tokens (5,000 rows of 100) with
/// `data.vocab.max_size = 500002` trains with every token given an id: a legal vocabulary this
/// large is never refused.
#[test]
fn a_vocabulary_of_500000_distinct_tokens_trains() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("words.parquet");
    let tokens: Vec<Vec<String>> = (0..5000)
        .map(|row| (0..100).map(|j| format!("w{}", row * 100 + j)).collect())
        .collect();
    let tokens: Vec<Vec<&str>> = tokens
        .iter()
        .map(|r| r.iter().map(String::as_str).collect())
        .collect();
    let labels: ArrayRef = Arc::new(Int64Array::from_iter_values((0..5000).map(|r| r % 2)));
    write_parquet(
        &data,
        vec![("tokens", strings(&tokens)), ("label", labels)],
        1000,
    );
    let spec = sequence_job(
        dir.path(),
        "words",
        &data,
        false,
        "vocab = { max_size = 500002 }",
    );
    let out = dir.path().join("words.json");
    ringflow(&["local", &spec, "--summary-json", &s(&out)], DEADLINE).assert_success();
    assert_eq!(summary(&out)["samples"], 5000);
    assert_eq!(saved_vocabulary(&dir.path().join("words/model")), 500_002);
}

/// 40 short tagged sentences, row `row` holding `token` tagged `tag`.
fn tagged_with(path: &Path, row: usize, token: &str, tag: &str) {
    let mut tokens: Vec<Vec<&str>> = (0..40).map(|_| vec!["a", "b"]).collect();
    let mut tags: Vec<Vec<&str>> = (0..40).map(|_| vec!["B-X", "O"]).collect();
    tokens[row] = vec![token, "b"];
    tags[row] = vec![tag, "O"];
    write_parquet(
        path,
        vec![("tokens", strings(&tokens)), ("tags", strings(&tags))],
        16,
    );
}

/// A token longer than `data.vocab.max_token_bytes` (1024 by default) and a tag longer than a
/// class name may be are refused at planning naming the file, the row and the bound; raising
/// `data.vocab.max_token_bytes` admits the long token.
#[test]
fn an_overlong_token_or_class_name_is_refused_by_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("t.parquet");
    let spec = sequence_job(dir.path(), "long", &data, true, "");
    let long_token = "x".repeat(2000);
    tagged_with(&data, 7, &long_token, "B-X");
    let run = ringflow(&["local", &spec], DEADLINE);
    let err = run.assert_clean_failure();
    let expected = "row 7 (0-based): column `tokens` holds a token of 2000 bytes, more than \
                    data.vocab.max_token_bytes = 1024";
    assert!(err.contains(&s(&data)) && err.contains(expected), "{err}");
    ringflow(
        &["local", &spec, "--set", "data.vocab.max_token_bytes=4096"],
        DEADLINE,
    )
    .assert_success();

    let long_tag = format!("B-{}", "y".repeat(300));
    tagged_with(&data, 9, "a", &long_tag);
    let run = ringflow(&["local", &spec], DEADLINE);
    let err = run.assert_clean_failure();
    let expected = "row 9 (0-based): column `tags` holds a class name of 302 bytes, more than \
                    the 256 bytes a class name may have";
    assert!(err.contains(&s(&data)) && err.contains(expected), "{err}");
}

/// A `data.sql` of 2 MiB and a class of `data.label_classes` of 300 bytes are refused with one
/// sentence naming the key and its bound, by `local` and by a driver that `submit` reaches.
#[test]
fn an_overlong_sql_or_label_class_is_refused_at_planning() {
    let dir = tempfile::tempdir().unwrap();
    let train = s(&dir.path().join("part-0.parquet"));
    crate::helpers::write_regression_data(dir.path(), &[200], 100);
    let ckpt = format!("checkpoint_dir = \"{}\"", s(&dir.path().join("ckpt")));
    let comment = "-".repeat(2 << 20);
    let sql = format!("sql = \"SELECT a, b, v, y FROM input /* {comment} */\"");
    let spec = regression_job(dir.path(), "sql", &train, &sql, &ckpt);
    let expected = "data.sql: is 2.0 MiB long, more than the 1.0 MiB a query may have";
    let err = ringflow(&["local", &spec], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(err.contains(expected) && err.lines().count() <= 2, "{err}");
    let (_driver, url, _) = driver(&[]);
    let err = ringflow(&["submit", &spec, "--driver", &url], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(err.contains(expected), "{err}");

    let classes = format!("label_classes = [\"a\", \"{}\"]", "c".repeat(300));
    let spec = regression_job(dir.path(), "classes", &train, &classes, &ckpt);
    let err = ringflow(&["local", &spec], DEADLINE)
        .assert_clean_failure()
        .to_string();
    assert!(
        err.contains("data.label_classes: class 1 is 300 bytes long, more than the 256 bytes"),
        "{err}"
    );
}

/// The sentence a job fails with when its executor cannot receive its task.
fn assert_names_the_executor(err: &str) {
    assert!(
        err.contains("executor exec-") && err.contains("could not receive its task"),
        "{err}"
    );
    assert!(err.contains("decoded message length too large"), "{err}");
}

/// An executor whose task channel takes fewer bytes than its task (the test hook
/// `RINGFLOW_TEST_MAX_TASK_BYTES`) reports that it could not receive it, and the job fails at
/// once naming the executor and the cause: with `ringflow local`, and with `ringflow driver`,
/// `ringflow executor` and `ringflow submit` as separate processes.
#[test]
fn a_task_an_executor_cannot_receive_fails_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let train = s(&dir.path().join("part-0.parquet"));
    crate::helpers::write_regression_data(dir.path(), &[200], 100);
    let ckpt = format!("checkpoint_dir = \"{}\"", s(&dir.path().join("ckpt")));
    let spec = regression_job(dir.path(), "undelivered", &train, "", &ckpt);
    let run = ringflow_env(
        &["local", &spec],
        &[(TASK_LIMIT_HOOK, Some("512"))],
        DEADLINE,
    );
    assert_names_the_executor(run.assert_clean_failure());

    let (_driver, url, _) = driver(&[]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
    cmd.args(["executor", "--driver", &url, "--cores", "1"])
        .env(TASK_LIMIT_HOOK, "512")
        .current_dir(crate::helpers::repo());
    let refusing = Process::spawn(cmd);
    refusing.wait_for(&format!("registered with {url}"));
    let run = ringflow(&["submit", &spec, "--driver", &url], DEADLINE);
    assert_names_the_executor(run.assert_clean_failure());
    refusing.wait_for("could not receive its task");
    // The executor is free again, for a job it can receive.
    let status = ringflow(&["status", "--driver", &url], DEADLINE);
    status.assert_success();
    assert_eq!(
        status.stdout.matches(" idle ").count(),
        1,
        "{}",
        status.stdout
    );
    assert!(!status.stdout.contains(" busy "), "{}", status.stdout);
}
