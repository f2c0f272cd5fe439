//! `model.init_from` with a state_dict PyTorch wrote: a model trained in PyTorch in the test,
//! saved with `safetensors.torch.save_file(model.state_dict())` (its head in fp16, its batch
//! norm with `num_batches_tracked`), is fine-tuned by ringflow with its first layers frozen.

use std::path::Path;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};

use crate::helpers::{job, read_mnist, repo, ringflow, s, summary};
use crate::parity::{LIMIT, feature_rows, python_json};

/// Trains `Net` (784 → 64, batch norm, ReLU, 10: ringflow's layer names) on the training rows
/// of `rows` for two epochs and saves its state_dict at `out`; prints its accuracy on the test
/// rows and its tensors (name → values, in PyTorch's layout).
const TRAIN: &str = r#"
import json, sys
try:
    import torch, safetensors.torch
except ImportError as e:
    print(f"MISSING: {e}")
    sys.exit(3)
rows, out = sys.argv[1:3]
data = json.load(open(rows))
x = torch.tensor(data["x"], dtype=torch.float32) / 255.0
y = torch.tensor(data["y"])
test_x = torch.tensor(data["test_x"], dtype=torch.float32) / 255.0
test_y = torch.tensor(data["test_y"])
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([
            torch.nn.Linear(784, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10)])
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
net = Net()
opt = torch.optim.Adam(net.parameters(), 1e-3)
for epoch in range(2):
    for i in range(0, len(x), 64):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[i:i + 64]), y[i:i + 64]).backward()
        opt.step()
net.eval()
with torch.no_grad():
    accuracy = (net(test_x).argmax(-1) == test_y).float().mean().item()
state = {k: v.contiguous() for k, v in net.state_dict().items()}
state["layers.3.weight"] = state["layers.3.weight"].half()
safetensors.torch.save_file(state, out)
print(json.dumps({
    "accuracy": accuracy,
    "tensors": {k: v.float().flatten().tolist() for k, v in net.state_dict().items()},
}))
"#;

/// The first `n` rows of MNIST's `split` as pixel rows and labels.
fn mnist_rows(split: &str, n: usize) -> (Vec<Vec<f32>>, Vec<i64>) {
    let batch = read_mnist(split, Some(n));
    let x: Vec<Vec<f32>> = feature_rows(&batch, &["image"]).into_values().collect();
    let labels = cast(batch.column_by_name("label").unwrap(), &DataType::Int64).unwrap();
    let y: Vec<i64> = labels.as_primitive::<Int64Type>().values().to_vec();
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>().values();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "rows by id, as feature_rows orders them"
    );
    (x, y)
}

/// `n` training and `n` test rows of MNIST as JSON at `path`, for [`TRAIN`].
fn write_rows(path: &Path, n: usize) {
    let ((x, y), (test_x, test_y)) = (mnist_rows("train", n), mnist_rows("test", n));
    let json = serde_json::json!({ "x": x, "y": y, "test_x": test_x, "test_y": test_y });
    std::fs::write(path, json.to_string()).unwrap();
}

#[test]
fn a_state_dict_trained_in_pytorch_is_fine_tuned_with_its_first_layers_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.json");
    write_rows(&rows, 3000);
    let state = dir.path().join("torch.safetensors");
    let torch = python_json(TRAIN, &[s(&rows), s(&state)], crate::NEED_TORCH);
    let spec = job(
        dir.path(),
        "tuned",
        &format!(
            r#"name = "tuned"
[data]
train = "{repo}/examples/data/mnist/train.parquet"
test = "{repo}/examples/data/mnist/test.parquet"
features = ["image"]
label = "label"
scale = 255.0
[model]
kind = "sequential"
classes = 10
init_from = "{state}"
freeze = ["layers.0", "layers.1"]
layers = [
  {{ type = "linear", out = 64 }},
  {{ type = "batch_norm" }},
  {{ type = "relu" }},
  {{ type = "linear" }},
]
[train]
epochs = 1
optimizer = {{ kind = "adam", lr = 0.001 }}
[cluster]
executors = 2
checkpoint_dir = "{run}"
"#,
            repo = s(&repo()),
            state = s(&state),
            run = s(&dir.path().join("run")),
        ),
    );
    let out = dir.path().join("summary.json");
    let run = ringflow(
        &["local", &spec, "--ui", "off", "--summary-json", &s(&out)],
        LIMIT,
    );
    run.assert_success();
    assert!(run.stderr.contains("loaded 8 tensors"), "{}", run.stderr);
    // The head goes on learning from all of MNIST: it ends at least as good as PyTorch left it.
    let accuracy = summary(&out)["test_accuracy"].as_f64().unwrap();
    let before = torch["accuracy"].as_f64().unwrap();
    eprintln!("test accuracy: PyTorch's model {before}, fine-tuned by ringflow {accuracy}");
    assert!(
        accuracy >= before - 0.005,
        "fine-tuned {accuracy}, PyTorch's {before}"
    );

    // The frozen layers come back from ringflow's export exactly as PyTorch wrote them.
    let exported = dir.path().join("back.safetensors");
    let m = s(&dir.path().join("run/model"));
    let export = [
        "export",
        "--model",
        &m,
        "--format",
        "torch",
        "--output",
        &s(&exported),
    ];
    ringflow(&export, LIMIT).assert_success();
    let bytes = std::fs::read(&exported).unwrap();
    let back = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for name in [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.running_mean",
        "layers.1.running_var",
    ] {
        let view = back.tensor(name).unwrap();
        let got: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let want: Vec<f32> = torch["tensors"][name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(
            got, want,
            "{name} is frozen: PyTorch's values, in PyTorch's layout"
        );
    }
}
