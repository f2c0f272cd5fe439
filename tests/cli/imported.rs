//! Weights PyTorch wrote, without torch: the committed fixtures of `testing/torch_fixtures.py`
//! (a model trained in PyTorch, saved as a safetensors state_dict with bf16, fp16 and int64
//! tensors, and exported by `torch.onnx.export`, whose `Gemm`s read `[out, in]` weights with
//! `transB = 1`) start a ringflow job through `model.init_from`, and `predict` gives the
//! probabilities PyTorch computed for the same rows.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Float32Array, Int64Array};

use crate::helpers::{job, repo, ringflow, s, write_parquet};
use crate::parity::{predictions, read_all};

const LONG: Duration = Duration::from_secs(300);

/// The fixture's rows and PyTorch's probabilities for them.
fn fixture() -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let path = repo().join("tests/cli/fixtures/torch/mlp.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let floats = |key: &str| -> Vec<Vec<f32>> {
        let rows = json[key].as_array().unwrap();
        let row = |r: &serde_json::Value| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        };
        rows.iter().map(row).collect()
    };
    (floats("rows"), floats("probabilities"))
}

/// The rows as Parquet, `id` and four features, with PyTorch's classes as the label.
fn write_rows(path: &Path, rows: &[Vec<f32>], probabilities: &[Vec<f32>]) {
    let column = |j: usize| -> ArrayRef {
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r[j])))
    };
    let class = |p: &Vec<f32>| (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
    let labels = probabilities.iter().map(|p| class(p) as i64);
    let columns = vec![
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)) as ArrayRef,
        ),
        ("a", column(0)),
        ("b", column(1)),
        ("c", column(2)),
        ("d", column(3)),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(labels)) as ArrayRef,
        ),
    ];
    write_parquet(path, columns, 16);
}

#[test]
fn weights_pytorch_saved_and_exported_give_pytorchs_probabilities() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, wanted) = fixture();
    let data = dir.path().join("rows.parquet");
    write_rows(&data, &rows, &wanted);
    for file in ["mlp.safetensors", "mlp.onnx"] {
        let weights = repo().join("tests/cli/fixtures/torch").join(file);
        let run = dir.path().join(file);
        // The first layers frozen, the head at a rate too small to move an f32: one epoch
        // leaves PyTorch's weights as they are, and the model is saved for `predict`.
        let spec = job(
            dir.path(),
            "imported",
            &format!(
                r#"[data]
train = "{data}"
features = ["a", "b", "c", "d"]
label = "label"
[model]
kind = "sequential"
classes = 3
init_from = "{weights}"
freeze = ["layers.0", "layers.1"]
layers = [{{ type = "linear", out = 8 }}, {{ type = "batch_norm" }}, {{ type = "relu" }}, {{ type = "linear" }}]
[train]
epochs = 1
batch_size = 16
optimizer = {{ kind = "sgd", lr = 1e-30 }}
[cluster]
executors = 1
checkpoint_dir = "{run}"
"#,
                data = s(&data),
                weights = s(&weights),
                run = s(&run),
            ),
        );
        let trained = ringflow(&["local", &spec, "--ui", "off"], LONG);
        trained.assert_success();
        assert!(
            trained.stderr.contains("loaded 8 tensors"),
            "{file}: {}",
            trained.stderr
        );
        let preds = dir.path().join(format!("{file}.preds"));
        let model = s(&run.join("model"));
        let args = [
            "predict",
            "--model",
            &model,
            "--data",
            &s(&data),
            "--output",
            &s(&preds),
            "--id",
            "id",
        ];
        ringflow(&args, LONG).assert_success();
        let got = predictions(&read_all(&preds));
        let mut largest = 0f32;
        for (id, p) in wanted.iter().enumerate() {
            let best = (0..3).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
            let (class, probability) = &got[&(id as i64)];
            assert_eq!(class, &best.to_string(), "{file}: row {id}");
            largest = largest.max((probability - p[best]).abs());
        }
        eprintln!("{file}: largest probability difference from PyTorch {largest:e}");
        assert!(
            largest <= 1e-5,
            "{file}: probabilities differ from PyTorch's by {largest}"
        );
    }
}
