//! Training jobs that must succeed, and what they must produce.

use std::time::Duration;

use crate::helpers::{job, mnist_data, ringflow, s, summary, write_regression_data};

const MINUTES: Duration = Duration::from_secs(600);

/// The committed MNIST example, unchanged, reaches the accuracy the project promises.
#[test]
fn mnist_example_reaches_its_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let ckpt = dir.path().join("run");
    ringflow(
        &[
            "local",
            "examples/mnist.toml",
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&ckpt)),
            "--summary-json",
            &s(&out),
        ],
        MINUTES,
    )
    .assert_success();
    let sm = summary(&out);
    assert_eq!(sm["status"], "succeeded");
    assert_eq!(sm["job"], "mnist-mlp");
    assert_eq!(sm["executors"], 1);
    assert_eq!(sm["epochs"], 5);
    assert_eq!(sm["steps"], 5 * 469);
    assert_eq!(sm["samples"], 5 * 60_000);
    assert_eq!(sm["test_rows"], 10_000);
    let acc = sm["test_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.975, "test accuracy {acc} < 0.975");
    for key in ["wall_s", "train_samples_per_s", "final_train_loss"] {
        assert!(sm[key].as_f64().unwrap() > 0.0, "{key}: {}", sm[key]);
    }
    let model = sm["model_path"].as_str().unwrap();
    assert!(
        std::path::Path::new(model)
            .join("checkpoint.json")
            .is_file()
    );
    assert!(model.starts_with(&s(&ckpt)));
}

/// Numeric columns of several widths and a list column, a regression loss, several files read
/// as a directory and as a glob: every row is used once per epoch, and the model learns.
#[test]
fn regression_on_mixed_columns_from_a_directory_and_a_glob() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let total = write_regression_data(&data, &[400, 333, 267], 100);
    std::fs::write(data.join("_SUCCESS"), b"").unwrap();
    for (name, train) in [
        ("dir", s(&data)),
        ("glob", format!("{}/part-*.parquet", s(&data))),
    ] {
        let spec = job(
            dir.path(),
            name,
            &format!(
                r#"
[data]
train = "{train}"
test = "{test}"
features = ["a", "b", "v"]
label = "y"
[model]
kind = "mlp"
layers = [4, 16, 1]
activation = "tanh"
[train]
epochs = 30
batch_size = 32
loss = "mse"
optimizer = {{ kind = "adam", lr = 0.01 }}
[cluster]
checkpoint_dir = "{ckpt}"
"#,
                test = s(&data.join("part-2.parquet")),
                ckpt = s(&dir.path().join(name)),
            ),
        );
        let out = dir.path().join(format!("{name}.json"));
        ringflow(&["local", &spec, "--summary-json", &s(&out)], MINUTES).assert_success();
        let sm = summary(&out);
        assert_eq!(
            sm["samples"],
            30 * total,
            "{name}: every row once per epoch"
        );
        assert_eq!(sm["test_rows"], 267);
        assert!(sm["test_accuracy"].is_null());
        // The target's variance is about 3; a model that learned nothing scores about that.
        let mse = sm["test_mse"].as_f64().unwrap();
        assert!(mse < 0.05, "{name}: test mse {mse}");
    }
}

/// A lone executor with plain SGD updates its dense layers' weights inside the backward pass;
/// the same job with a clipping limit no gradient reaches (which needs the gradients stored,
/// so the step updates every weight after the pass) ends with the same parameters, bit for
/// bit, under a schedule whose rate changes every step.
#[test]
fn sgd_inside_the_backward_pass_ends_where_the_step_alone_does() {
    let dir = tempfile::tempdir().unwrap();
    let checksums: Vec<u64> = ["", "clip_grad_norm = 1e30"]
        .iter()
        .enumerate()
        .map(|(i, clip)| {
            let spec = job(
                dir.path(),
                &format!("sgd{i}"),
                &format!(
                    r#"name = "sgd-in-backward"
{data}
[model]
kind = "mlp"
layers = [784, 64, 48, 10]
activation = "relu"
[train]
epochs = 1
batch_size = 100
optimizer = {{ kind = "sgd", lr = 0.1 }}
schedule = {{ kind = "cosine", warmup_steps = 5 }}
{clip}
[cluster]
checkpoint_dir = "{ckpt}"
"#,
                    data = mnist_data(),
                    ckpt = s(&dir.path().join(format!("run{i}"))),
                ),
            );
            let out = dir.path().join(format!("sgd{i}.json"));
            ringflow(&["local", &spec, "--summary-json", &s(&out)], MINUTES).assert_success();
            let sm = summary(&out);
            let acc = sm["test_accuracy"].as_f64().unwrap();
            assert!(acc > 0.9, "{clip:?}: test accuracy {acc}");
            sm["param_checksum"].as_u64().expect("a checksum")
        })
        .collect();
    assert_eq!(
        checksums[0], checksums[1],
        "the weights differ from the step's alone"
    );
}
