//! Convolutional networks across executors: batch norm's running statistics (state that is not
//! a gradient) stay identical on every replica and come back exactly on `--resume`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take;

use crate::helpers::{job, read_mnist, repo, ringflow, s, summary, write_parquet};
use crate::recovery::{kill_after_a_mid_epoch_checkpoint, resume_ends_like, uninterrupted_run};

/// The longest a training run of these tests may take.
const LONG: Duration = Duration::from_secs(900);

/// Rows of the MNIST subset the job trains on (one in ten), and steps per epoch on 4
/// executors with batches of 32.
const ROWS: u64 = 6_000;
const STEPS_PER_EPOCH: u64 = ROWS / 4 / 32;

/// Every tenth row of the shipped MNIST training split, written to `dir/train.parquet` in
/// row groups of 1,500.
fn mnist_subset(dir: &Path) -> PathBuf {
    let all = read_mnist("train", None);
    let every_tenth = UInt32Array::from_iter_values((0..all.num_rows() as u32).step_by(10));
    let columns: Vec<(&str, ArrayRef)> = ["id", "label", "image"]
        .into_iter()
        .map(|name| {
            let column = all.column_by_name(name).unwrap();
            (
                name,
                Arc::new(take(column, &every_tenth, None).unwrap()) as ArrayRef,
            )
        })
        .collect();
    let path = dir.join("train.parquet");
    write_parquet(&path, columns, 1_500);
    path
}

/// The `[data]` table of these jobs: `train` and MNIST's test split, as 1×28×28 images.
fn data_table(train: &Path) -> String {
    format!(
        r#"[data]
train = "{train}"
test = "{repo}/examples/data/mnist/test.parquet"
features = ["image"]
shape = [1, 28, 28]
label = "label"
scale = 255.0
"#,
        train = s(train),
        repo = s(&repo()),
    )
}

/// A small CNN with two batch norms on a tenth of MNIST, 4 executors, checkpoints every 10
/// steps (so that some fall mid-epoch).
fn spec(dir: &Path) -> String {
    job(
        dir,
        "bn",
        &format!(
            r#"
{data}shuffle_buffer = 1000
[model]
kind = "sequential"
classes = 10
layers = [
  {{ type = "conv2d", out_channels = 8, kernel = 3, padding = 1 }},
  {{ type = "batch_norm" }},
  {{ type = "relu" }},
  {{ type = "max_pool2d", kernel = 2 }},
  {{ type = "conv2d", out_channels = 16, kernel = 3, padding = 1 }},
  {{ type = "batch_norm" }},
  {{ type = "relu" }},
  {{ type = "global_avg_pool2d" }},
  {{ type = "linear" }},
]
[train]
epochs = 3
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.005 }}
[cluster]
executors = 4
checkpoint_every_steps = 10
"#,
            data = data_table(&mnist_subset(dir)),
        ),
    )
}

/// Four replicas with batch norm end bit-identical (parameters and running statistics: the
/// checksum covers both), the model learns, and a run killed mid-epoch resumes to the same
/// parameters and statistics as the uninterrupted one.
#[test]
fn batch_norm_replicas_stay_identical_and_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let (clean, expected) = uninterrupted_run(&spec, dir.path());
    assert_eq!(clean["executors"], 4);
    assert_eq!(clean["samples"], 3 * ROWS);
    let accuracy = clean["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.25, "the CNN learns: test accuracy {accuracy}");
    let run_dir = dir.path().join("killed");
    let killed_at = kill_after_a_mid_epoch_checkpoint(&spec, &run_dir, (1, STEPS_PER_EPOCH));
    let resumed = dir.path().join("resumed.json");
    resume_ends_like((&clean, expected), &spec, &run_dir, &resumed, killed_at);
}

/// `train.winograd = false` keeps every convolution off Winograd's algorithm: a CNN whose second
/// convolution (16 → 16 channels, 3×3) would run it trains as well either way, along a slightly
/// different path (the losses differ: the setting reached the engine); the summary says which,
/// and the log says when Winograd is off.
#[test]
fn winograd_can_be_turned_off_and_trains_alike() {
    let dir = tempfile::tempdir().unwrap();
    let train = mnist_subset(dir.path());
    let toml = format!(
        r#"
{data}[model]
kind = "sequential"
classes = 10
layers = [
  {{ type = "conv2d", out_channels = 16, kernel = 3, padding = 1 }},
  {{ type = "relu" }},
  {{ type = "max_pool2d", kernel = 2 }},
  {{ type = "conv2d", out_channels = 16, kernel = 3, padding = 1 }},
  {{ type = "relu" }},
  {{ type = "max_pool2d", kernel = 2 }},
  {{ type = "flatten" }},
  {{ type = "linear" }},
]
[train]
epochs = 2
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.003 }}
"#,
        data = data_table(&train),
    );
    let spec = job(dir.path(), "winograd", &toml);
    let mut runs = Vec::new();
    for winograd in [true, false] {
        let out = dir.path().join(format!("{winograd}.json"));
        let set = format!("train.winograd={winograd}");
        let args = ["--log", "info", "local", &spec, "--set", &set];
        let run = ringflow(&[&args[..], &["--summary-json", &s(&out)]].concat(), LONG);
        run.assert_success();
        let said = run
            .stderr
            .contains("convolutions without Winograd's algorithm");
        assert_eq!(said, !winograd, "winograd {winograd}: {}", run.stderr);
        let sm = summary(&out);
        assert_eq!(sm["winograd"], winograd, "{sm}");
        let accuracy = sm["test_accuracy"].as_f64().unwrap();
        runs.push((accuracy, sm["final_train_loss"].as_f64().unwrap()));
    }
    let ((on_accuracy, on_loss), (off_accuracy, off_loss)) = (runs[0], runs[1]);
    assert!(on_accuracy >= 0.9, "with Winograd: {on_accuracy}");
    assert!(
        (on_accuracy - off_accuracy).abs() <= 0.02,
        "with Winograd {on_accuracy}, without {off_accuracy}: more than two points apart"
    );
    assert_ne!(
        on_loss, off_loss,
        "train.winograd = false gave Winograd's very loss"
    );
}
