//! The PyTorch checks of `ringflow export --format torch`, which need torch (about 2 GB with
//! the CUDA libraries PyPI's wheel brings): `testing/interop.sh` installs it once into
//! `target/interop-python` and runs this target (`cargo test --test interop`), which
//! `cargo test --workspace` leaves out. For every example model of fixed-shape examples, the
//! exported state_dict loads into the generated module with `load_state_dict(strict=True)`
//! and its forward gives `ringflow predict`'s classes and probabilities (1e-5).

#[allow(dead_code)]
#[path = "../cli/helpers.rs"]
mod helpers;
#[allow(dead_code)]
#[path = "../cli/parity.rs"]
mod parity;
mod taggers;
mod weights;

use std::path::Path;

use helpers::{ringflow, s};
use parity::{
    Example, IRIS, LENET, LIMIT, MNIST_MLP, Trained, every_image_layer, every_image_layer_job,
    png_cnn, png_mnist, python_json,
};

/// The start of the Python scripts of these checks: imports torch (exit 3 when it is missing),
/// loads the generated module `argv[1]` and the state_dict `argv[2]` strictly (`m`, `model`,
/// `tensors`; `rows` is `argv[3]`), in evaluation mode.
pub(crate) const LOAD_EXPORTED: &str = r#"
import importlib.util, json, sys
try:
    import torch, safetensors.torch
except ImportError as e:
    print(f"MISSING: {e}")
    sys.exit(3)
module, state, rows = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("exported", module)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
model = m.Model()
tensors = safetensors.torch.load_file(state)
model.load_state_dict(tensors, strict=True)
model.eval()
"#;

/// What a check that finds no torch says.
pub(crate) const NEED_TORCH: &str =
    "torch is needed: run these checks with testing/interop.sh, which installs it";

/// Loads the module `module` with the state_dict `state`, strictly, and runs it on `rows`:
/// `[class, probability]` of each row, the module's `CLASSES`, and the state_dict's names and
/// shapes. Fails the test when torch cannot be imported (testing/interop.sh installs it).
fn torch_predictions(module: &Path, state: &Path, rows: &Path) -> serde_json::Value {
    const REST: &str = r#"
with torch.no_grad():
    p = model(torch.tensor(json.load(open(rows)), dtype=torch.float32)).softmax(-1)
best = p.max(dim=-1)
print(json.dumps({
    "classes": m.CLASSES,
    "rows": [[int(i), float(v)] for v, i in zip(best.values, best.indices)],
    "tensors": {k: [str(t.dtype), list(t.shape)] for k, t in tensors.items()},
}))
"#;
    python_json(
        &format!("{LOAD_EXPORTED}{REST}"),
        &[s(module), s(state), s(rows)],
        NEED_TORCH,
    )
}

/// Trains, predicts, exports for PyTorch and compares; returns torch's answer.
fn parity(example: &Example<'_>) -> serde_json::Value {
    let name = example.name;
    let trained = Trained::new(example);
    let state = trained.dir.path().join(format!("{name}.safetensors"));
    let m = s(&trained.model);
    let export = [
        "export",
        "--model",
        &m,
        "--format",
        "torch",
        "--output",
        &s(&state),
    ];
    ringflow(&export, LIMIT).assert_success();
    let module = state.with_extension("py");
    let rows = trained.dir.path().join("rows.json");
    trained.write_rows(&rows);
    let torch = torch_predictions(&module, &state, &rows);
    trained.check(
        &format!("{name} in PyTorch"),
        &torch["rows"],
        &torch["classes"],
    );
    torch
}

#[test]
fn iris_exports_to_pytorch_with_its_normalization_and_classes() {
    let torch = parity(&IRIS);
    // PyTorch's layout: Linear.weight is [out, in].
    assert_eq!(
        torch["tensors"]["layers.0.weight"],
        serde_json::json!(["torch.float32", [16, 4]])
    );
    assert_eq!(
        torch["classes"].as_array().map(Vec::len),
        Some(3),
        "{torch}"
    );
}

#[test]
fn the_mnist_mlp_exports_to_pytorch() {
    parity(&MNIST_MLP);
}

#[test]
fn the_mnist_cnn_exports_to_pytorch() {
    parity(&LENET);
}

/// Batch norms carry `num_batches_tracked` (int64), as PyTorch's do.
#[test]
fn a_cnn_of_every_image_layer_exports_to_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let spec = every_image_layer_job(dir.path());
    let torch = parity(&every_image_layer(&spec));
    assert_eq!(
        torch["tensors"]["layers.1.num_batches_tracked"],
        serde_json::json!(["torch.int64", []]),
        "{torch}"
    );
}

/// A model of an image column takes the decoded pixels in PyTorch too.
#[test]
fn an_image_column_model_exports_to_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let (sets, test) = png_mnist(dir.path());
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    parity(&png_cnn(&sets, &test));
}
