//! `ringflow export --format onnx`: the exported model passes ONNX's full checker and
//! onnxruntime gives `ringflow predict`'s classes and probabilities on the same rows; what
//! cannot be exported is refused by name.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Float32Type, Int64Type};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::helpers::{job, mnist_data, repo, ringflow, s};

const LIMIT: Duration = Duration::from_secs(600);

/// Checks `model` with `onnx.checker.check_model(full_check=True)` and runs it with
/// onnxruntime on `rows` (JSON: a list of feature rows); returns `[class, probability]` of
/// each row and the model's `ringflow.classes` metadata. Fails the test when onnx or
/// onnxruntime cannot be imported (testing/run-tests.sh installs them).
fn onnxruntime_predictions(model: &Path, rows: &Path) -> serde_json::Value {
    const SCRIPT: &str = r#"
import json, sys
try:
    import numpy as np, onnx, onnxruntime as ort
except ImportError as e:
    print(f"NO_ONNX: {e}")
    sys.exit(3)
path, rows = sys.argv[1], json.load(open(sys.argv[2]))
m = onnx.load(path)
onnx.checker.check_model(m, full_check=True)
meta = {p.key: json.loads(p.value) for p in m.metadata_props}
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
(probabilities,) = session.run(["probabilities"], {"features": np.asarray(rows, dtype=np.float32)})
print(json.dumps({
    "opset": [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")],
    "classes": meta.get("ringflow.classes"),
    "rows": [[int(p.argmax()), float(p.max())] for p in probabilities],
}))
"#;
    let out = Command::new("python3")
        .args(["-c", SCRIPT, &s(model), &s(rows)])
        .output()
        .unwrap_or_else(|e| panic!("python3 cannot be started: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.starts_with("NO_ONNX"),
        "the onnx and onnxruntime Python packages are needed (testing/run-tests.sh installs \
         them; or python3 -m pip install onnx==1.23.2 onnxruntime==1.31.1): {stdout}"
    );
    assert!(
        out.status.success(),
        "onnx or onnxruntime failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the check printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// Every row of the Parquet files at `path` (a file or a directory of parts) as one batch.
fn read_all(path: &Path) -> RecordBatch {
    let files: Vec<_> = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let batches: Vec<RecordBatch> = files
        .iter()
        .flat_map(|f| {
            let file = std::fs::File::open(f).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            reader.build().unwrap().map(|b| b.unwrap())
        })
        .collect();
    concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// The `columns` of `batch` as rows of f32 features (a list column's values in place), by
/// the `id` column.
fn feature_rows(batch: &RecordBatch, columns: &[&str]) -> BTreeMap<i64, Vec<f32>> {
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>();
    let mut rows: BTreeMap<i64, Vec<f32>> = BTreeMap::new();
    for name in columns {
        let col = batch.column_by_name(name).unwrap();
        for (i, id) in ids.values().iter().enumerate() {
            let values = match col.data_type() {
                DataType::FixedSizeList(..) => col.as_fixed_size_list().value(i),
                DataType::List(_) => col.as_list::<i32>().value(i),
                _ => col.slice(i, 1),
            };
            let values = cast(&values, &DataType::Float32).unwrap();
            let values = values.as_primitive::<Float32Type>();
            rows.entry(*id).or_default().extend(values.values().iter());
        }
    }
    rows
}

/// Trains `spec` for a few steps (`sets`), predicts its test split, exports it to ONNX and
/// checks onnxruntime's class and probability of every row against `predict`'s; exporting
/// again is refused without `--overwrite`, leaving the file as it was.
fn parity(name: &str, spec: &str, sets: &[&str], data: &str, columns: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut args = vec!["local", spec, "--executors", "1", "--ui", "off"];
    let ckpt = format!("cluster.checkpoint_dir={}", s(&run));
    for set in sets.iter().copied().chain([ckpt.as_str()]) {
        args.extend(["--set", set]);
    }
    ringflow(&args, LIMIT).assert_success();
    let model = run.join("model");
    let preds = dir.path().join("preds");
    let (m, p) = (s(&model), s(&preds));
    let predict = [
        "predict", "--model", &m, "--data", data, "--output", &p, "--id", "id",
    ];
    ringflow(&predict, LIMIT).assert_success();
    let onnx = dir.path().join(format!("{name}.onnx"));
    let export = [
        "export",
        "--model",
        &m,
        "--format",
        "onnx",
        "--output",
        &s(&onnx),
    ];
    let exported = ringflow(&export, LIMIT);
    exported.assert_success();
    assert!(exported.stdout.contains(&s(&onnx)), "{}", exported.stdout);
    let written = std::fs::read(&onnx).unwrap();
    let again = ringflow(&export, LIMIT);
    let err = again.assert_clean_failure();
    assert!(err.contains("already exists; pass --overwrite"), "{err}");
    assert_eq!(
        std::fs::read(&onnx).unwrap(),
        written,
        "{name}: a refusal changes nothing"
    );
    let overwrite: Vec<&str> = export.iter().copied().chain(["--overwrite"]).collect();
    ringflow(&overwrite, LIMIT).assert_success();

    let rows = feature_rows(&read_all(&repo().join(data)), columns);
    let rows_file = dir.path().join("rows.json");
    let values: Vec<&Vec<f32>> = rows.values().collect();
    std::fs::write(&rows_file, serde_json::to_vec(&values).unwrap()).unwrap();
    let ort = onnxruntime_predictions(&onnx, &rows_file);
    assert_eq!(ort["opset"], serde_json::json!([17]), "{name}: {ort}");
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{}.json", s(&onnx))).unwrap()).unwrap();
    assert_eq!(sidecar["classes"], ort["classes"], "{name}");

    let predicted = read_all(&preds);
    let ids = cast(predicted.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>();
    let probability = predicted.column_by_name("probability").unwrap();
    let probability = probability.as_primitive::<Float32Type>();
    let class = cast(
        predicted.column_by_name("prediction").unwrap(),
        &DataType::Utf8,
    )
    .unwrap();
    let class = class.as_string::<i32>();
    let index: BTreeMap<i64, usize> = rows.keys().enumerate().map(|(i, id)| (*id, i)).collect();
    assert_eq!(
        predicted.num_rows(),
        rows.len(),
        "{name}: every row predicted once"
    );
    let mut largest = 0f64;
    for i in 0..predicted.num_rows() {
        let row = &ort["rows"][index[&ids.value(i)]];
        let ort_class = row[0].as_u64().unwrap() as usize;
        let want = match &sidecar["classes"] {
            serde_json::Value::Array(names) => names[ort_class].as_str().unwrap().to_string(),
            _ => ort_class.to_string(),
        };
        assert_eq!(
            class.value(i),
            want,
            "{name}: the class of row id {}",
            ids.value(i)
        );
        let gap = (row[1].as_f64().unwrap() - f64::from(probability.value(i))).abs();
        largest = largest.max(gap);
    }
    assert!(
        largest <= 1e-5,
        "{name}: probabilities differ by up to {largest}"
    );
    eprintln!("{name}: largest probability difference against onnxruntime {largest:e}");
}

/// Iris: normalization and class names inside the exported model.
#[test]
fn an_exported_iris_model_predicts_as_ringflow_does_in_onnxruntime() {
    let data = "examples/data/iris/test.parquet";
    let columns = ["sepal_length", "sepal_width", "petal_length", "petal_width"];
    parity(
        "iris",
        "examples/iris.toml",
        &["train.epochs=3"],
        data,
        &columns,
    );
}

/// MNIST: `data.scale` inside the exported model, 784 values of a list column per row.
#[test]
fn an_exported_mnist_mlp_predicts_as_ringflow_does_in_onnxruntime() {
    let data = "examples/data/mnist/test.parquet";
    parity(
        "mnist",
        "examples/mnist.toml",
        &["train.epochs=1"],
        data,
        &["image"],
    );
}

/// Every layer of a fixed-shape `sequential` model (convolutions with stride, padding,
/// dilation and groups, batch norm, both poolings with padding, a residual block with a
/// shortcut, layer norm, both GELUs, dropout): the CNN's `data.shape` reshape and its batch
/// norm's running statistics inside the exported model.
#[test]
fn an_exported_cnn_of_every_image_layer_predicts_as_ringflow_does_in_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"name = "cnn-layers"
{data}shape = [1, 28, 28]
[model]
kind = "sequential"
layers = [
  {{ type = "conv2d", out_channels = 8, kernel = 3, padding = 1 }},
  {{ type = "batch_norm" }},
  {{ type = "relu" }},
  {{ type = "max_pool2d", kernel = 3, stride = 2, padding = 1 }},
  {{ type = "residual", layers = [
      {{ type = "conv2d", out_channels = 8, kernel = 3, padding = 2, dilation = 2, groups = 2 }},
      {{ type = "batch_norm" }},
      {{ type = "gelu" }},
  ] }},
  {{ type = "residual", layers = [
      {{ type = "conv2d", out_channels = 12, kernel = 3, stride = 2, padding = 1 }},
      {{ type = "gelu_exact" }},
  ], shortcut = [ {{ type = "conv2d", out_channels = 12, kernel = 1, stride = 2 }} ] }},
  {{ type = "avg_pool2d", kernel = 3, stride = 1, padding = 1 }},
  {{ type = "conv2d", out_channels = 16, kernel = 3 }},
  {{ type = "tanh" }},
  {{ type = "global_avg_pool2d" }},
  {{ type = "layer_norm" }},
  {{ type = "dropout", p = 0.1 }},
  {{ type = "linear", out = 32 }},
  {{ type = "sigmoid" }},
  {{ type = "flatten" }},
  {{ type = "linear" }},
]
[train]
batch_size = 64
optimizer = {{ kind = "adam", lr = 0.003 }}
"#,
        data = mnist_data()
    );
    let spec = job(dir.path(), "cnn", &toml);
    let data = "examples/data/mnist/test.parquet";
    parity("cnn", &spec, &["train.epochs=1"], data, &["image"]);
}

/// What cannot be exported fails with one sentence naming it, and writes nothing: a missing
/// directory and a URL (an output that exists without `--overwrite`: [`parity`]).
#[test]
fn what_cannot_be_exported_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.onnx");
    let missing = dir.path().join("nothing");
    let run = ringflow(
        &[
            "export",
            "--model",
            &s(&missing),
            "--format",
            "onnx",
            "--output",
            &s(&out),
        ],
        LIMIT,
    );
    let err = run.assert_clean_failure();
    assert!(err.contains(&s(&missing)), "{err}");
    assert!(!out.exists());
    let run = ringflow(
        &[
            "export",
            "--model",
            "s3://bucket/model",
            "--format",
            "onnx",
            "--output",
            &s(&out),
        ],
        LIMIT,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("s3://bucket/model is not a local directory"),
        "{err}"
    );
    assert!(!out.exists());
}
