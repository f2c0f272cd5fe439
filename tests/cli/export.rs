//! `ringflow export --format onnx`: the exported model passes ONNX's full checker and
//! onnxruntime gives `ringflow predict`'s classes and probabilities on the same rows; what
//! cannot be exported is refused by name.

use std::path::Path;

use crate::helpers::{ringflow, s};
use crate::parity::{
    Example, IRIS, LENET, LIMIT, MNIST_MLP, Trained, every_image_layer, every_image_layer_job,
    png_cnn, png_mnist, python_json,
};

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
    print(f"MISSING: {e}")
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
    python_json(
        SCRIPT,
        &[s(model), s(rows)],
        "the onnx and onnxruntime Python packages are needed (testing/run-tests.sh installs \
         them; or python3 -m pip install onnx==1.23.2 onnxruntime==1.31.1)",
    )
}

/// Trains `spec` for a few steps (`sets`), predicts its test split, exports it to ONNX and
/// checks onnxruntime's class and probability of every row against `predict`'s; exporting
/// again is refused without `--overwrite`, leaving the file as it was.
fn parity(example: &Example<'_>) {
    let name = example.name;
    let trained = Trained::new(example);
    let m = s(&trained.model);
    let onnx = trained.dir.path().join(format!("{name}.onnx"));
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

    let rows = trained.dir.path().join("rows.json");
    trained.write_rows(&rows);
    let ort = onnxruntime_predictions(&onnx, &rows);
    assert_eq!(ort["opset"], serde_json::json!([17]), "{name}: {ort}");
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{}.json", s(&onnx))).unwrap()).unwrap();
    assert_eq!(sidecar["classes"], ort["classes"], "{name}");
    trained.check(
        &format!("{name} in onnxruntime"),
        &ort["rows"],
        &sidecar["classes"],
    );
}

/// Iris: normalization and class names inside the exported model.
#[test]
fn an_exported_iris_model_predicts_as_ringflow_does_in_onnxruntime() {
    parity(&IRIS);
}

/// MNIST: `data.scale` inside the exported model, 784 values of a list column per row.
#[test]
fn an_exported_mnist_mlp_predicts_as_ringflow_does_in_onnxruntime() {
    parity(&MNIST_MLP);
}

/// The shipped LeNet (`examples/mnist_cnn.toml`): convolutions and pooling after the
/// `data.shape` reshape.
#[test]
fn an_exported_lenet_predicts_as_ringflow_does_in_onnxruntime() {
    parity(&LENET);
}

/// Every layer of a fixed-shape `sequential` model (convolutions with stride, padding,
/// dilation and groups, batch norm, both poolings with padding, a residual block with a
/// shortcut, layer norm, both GELUs, dropout): the CNN's `data.shape` reshape and its batch
/// norm's running statistics inside the exported model.
#[test]
fn an_exported_cnn_of_every_image_layer_predicts_as_ringflow_does_in_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let spec = every_image_layer_job(dir.path());
    parity(&every_image_layer(&spec));
}

/// What cannot be exported fails with one sentence naming it, and writes nothing: a missing
/// directory and a URL (an output that exists without `--overwrite`: [`parity`]).
/// A model of an image column (`data.image`, PNG files decoded by the executors) takes the
/// decoded pixels: the rows onnxruntime gets are the raw pixels beside each PNG (PNG is
/// lossless).
#[test]
fn an_exported_image_column_model_takes_the_decoded_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (sets, test) = png_mnist(dir.path());
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    parity(&png_cnn(&sets, &test));
}

#[test]
fn what_cannot_be_exported_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.onnx");
    let missing = dir.path().join("nothing");
    let missing_dir = s(&missing);
    let cases = [
        (missing_dir.as_str(), missing_dir.clone()),
        (
            "s3://bucket/model",
            "s3://bucket/model is not a local directory".to_string(),
        ),
    ];
    for (model, want) in cases {
        let export = [
            "export",
            "--model",
            model,
            "--format",
            "onnx",
            "--output",
            &s(&out),
        ];
        let err = ringflow(&export, LIMIT).assert_clean_failure().to_string();
        assert!(err.contains(&want), "{err}");
        assert!(!out.exists());
    }
}
