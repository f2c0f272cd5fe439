//! Backup workers (`cluster.backup_workers`): a straggler's late gradients are dropped, the job
//! does not wait for it, and every row of every epoch is either trained on or counted as dropped.

use std::time::Duration;

use crate::helpers::{job, mnist_data, ringflow_env, s, summary};

const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn backup_workers_train_past_a_straggler() {
    let dir = tempfile::tempdir().unwrap();
    let spec = job(
        dir.path(),
        "backup",
        &format!(
            r#"
{data}shuffle_buffer = 2000
[model]
kind = "mlp"
layers = [784, 32, 10]
[train]
epochs = 2
batch_size = 64
optimizer = {{ kind = "sgd", lr = 0.05, momentum = 0.9 }}
[cluster]
executors = 3
backup_workers = 1
checkpoint_dir = "{ckpt}"
"#,
            data = mnist_data(),
            ckpt = s(&dir.path().join("run")),
        ),
    );
    let out = dir.path().join("summary.json");
    // Rank 2 sleeps 30 ms in every step: without backups every step would wait for it.
    ringflow_env(
        &["local", &spec, "--summary-json", &s(&out)],
        &[("RINGFLOW_TEST_STRAGGLER", Some("2:30"))],
        LIMIT,
    )
    .assert_success();
    let sm = summary(&out);
    assert_eq!(sm["status"], "succeeded", "{sm}");
    assert_eq!(sm["replicas_identical"], true, "{sm}");
    let samples = sm["samples"].as_u64().unwrap();
    let dropped = sm["dropped_samples"].as_u64().unwrap();
    assert!(dropped > 0, "the straggler's gradients were dropped: {sm}");
    assert_eq!(
        samples + dropped,
        2 * 60_000,
        "every row of every epoch is trained on or dropped, once: {sm}"
    );
    for epoch in sm["history"].as_array().unwrap() {
        let rows = epoch["samples"].as_u64().unwrap() + epoch["dropped_samples"].as_u64().unwrap();
        assert_eq!(rows, 60_000, "{epoch}");
    }
    let acc = sm["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.9, "test accuracy {acc}");
}
