//! Tensor fusion (`cluster.fusion`): fixed bucket sizes and the autotune of `"auto"`, on real
//! executor processes.

use std::time::Duration;

use crate::helpers::{job, repo, ringflow, s, summary};

const MINUTES: Duration = Duration::from_secs(600);

/// A 2-executor job of the 784-1024-1024-10 MLP (7.1 MiB of gradients: 1, 4 and 16 MiB buckets
/// give three different plans) on MNIST's test split (10,000 rows, 39 steps per rank at batch
/// 128: enough for the three candidates' 21 steps).
fn wide_mlp_job(dir: &std::path::Path, fusion: &str) -> String {
    job(
        dir,
        "fusion",
        &format!(
            r#"name = "fusion"
[data]
train = "{repo}/examples/data/mnist/test.parquet"
test = "{repo}/examples/data/mnist/test.parquet"
features = ["image"]
label = "label"
scale = 255.0
[model]
kind = "mlp"
layers = [784, 1024, 1024, 10]
activation = "relu"
[train]
epochs = 1
batch_size = 128
optimizer = {{ kind = "sgd", lr = 0.05, momentum = 0.9 }}
[cluster]
executors = 2
fusion = {fusion}
checkpoint_dir = "{ckpt}"
"#,
            repo = s(&repo()),
            ckpt = s(&dir.join("ckpt")),
        ),
    )
}

#[test]
fn auto_fusion_tries_each_bucket_plan_and_keeps_one_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let spec = wide_mlp_job(dir.path(), "\"auto\"");
    let out = dir.path().join("summary.json");
    let run = ringflow(&["local", &spec, "--summary-json", &s(&out)], MINUTES);
    run.assert_success();
    let sum = summary(&out);
    let fusion = &sum["fusion"];
    assert_eq!(fusion["tuned"], true, "{fusion}");
    let tried: Vec<f64> = fusion["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["bucket_mib"].as_f64().unwrap())
        .collect();
    assert_eq!(tried, [1.0, 4.0, 16.0], "64 MiB gives the 16 MiB plan");
    assert!(
        fusion["trials"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["step_ms"].as_f64().unwrap() > 0.0),
        "{fusion}"
    );
    let kept = fusion["bucket_mib"].as_f64().unwrap();
    assert!(tried.contains(&kept), "{fusion}");
    // Every rank switched buckets at the same steps and kept the same size: the ring's sums
    // stayed consistent, and the replicas are identical.
    assert_eq!(sum["replicas_identical"], true);
    assert!(sum["test_accuracy"].as_f64().unwrap() > 0.8, "{sum}");
    assert!(
        run.stdout.contains("fusion autotune kept"),
        "the summary names the choice:\n{}",
        run.stdout
    );
}

#[test]
fn a_fixed_bucket_size_is_used_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let spec = wide_mlp_job(dir.path(), "2");
    let out = dir.path().join("summary.json");
    ringflow(&["local", &spec, "--summary-json", &s(&out)], MINUTES).assert_success();
    let sum = summary(&out);
    let fusion = &sum["fusion"];
    assert_eq!(fusion["bucket_mib"], 2.0, "{fusion}");
    assert_eq!(fusion["first_bucket_mib"], 1.0, "{fusion}");
    assert!(fusion.get("trials").is_none(), "{fusion}");
    assert_eq!(sum["replicas_identical"], true);
}
