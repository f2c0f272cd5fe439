//! Fine-tuning (`model.init_from`, `model.init_skip`, `model.freeze`,
//! `train.optimizer.groups`): a CNN pretrained on MNIST's digits 0–4 gets a new head trained
//! on 5–9 with its convolutions frozen, and what does not fit the model is refused before any
//! executor starts.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::helpers::{job, repo, ringflow, s, summary};

/// The longest one training run here may take.
const LONG: Duration = Duration::from_secs(900);

/// The layers before the head: two convolutions with batch norms (layers 0–7).
const FEATURES: &str = r#"
  { type = "conv2d", out_channels = 16, kernel = 3, padding = 1 },
  { type = "batch_norm" },
  { type = "relu" },
  { type = "max_pool2d", kernel = 2 },
  { type = "conv2d", out_channels = 32, kernel = 3, padding = 1 },
  { type = "batch_norm" },
  { type = "relu" },
  { type = "max_pool2d", kernel = 2 },
  { type = "flatten" },
  { type = "linear", out = 64 },
  { type = "relu" },
  { type = "linear" },
"#;

/// The default optimizer of these jobs.
const ADAM: &str = r#"{ kind = "adam", lr = 0.002 }"#;

/// A job on MNIST's digits `where_label` (a SQL condition on both splits), one epoch, with
/// `model_extra` lines in `[model]` and `optimizer` as `train.optimizer`, written to
/// `dir/<name>.toml`; returns its path.
fn spec(dir: &Path, name: &str, where_label: &str, model_extra: &str, optimizer: &str) -> String {
    let repo = s(&repo());
    job(
        dir,
        name,
        &format!(
            r#"name = "{name}"
[data]
train = "{repo}/examples/data/mnist/train.parquet"
test = "{repo}/examples/data/mnist/test.parquet"
sql = "SELECT id, image, label FROM input WHERE {where_label}"
features = ["image"]
shape = [1, 28, 28]
label = "label"
scale = 255.0
[model]
kind = "sequential"
classes = 10
layers = [{FEATURES}]
{model_extra}
[train]
epochs = 1
batch_size = 64
optimizer = {optimizer}
[cluster]
executors = 2
checkpoint_dir = "{run}"
"#,
            run = s(&dir.join(name)),
        ),
    )
}

/// Trains `spec` and returns its summary and its messages (stdout and stderr).
fn train(dir: &Path, spec: &str) -> (serde_json::Value, String) {
    let out = dir.join(format!("{}.json", spec.len()));
    let run = ringflow(
        &["local", spec, "--ui", "off", "--summary-json", &s(&out)],
        LONG,
    );
    run.assert_success();
    (summary(&out), format!("{}{}", run.stdout, run.stderr))
}

/// The saved model's tensors by name, as the bits of their values.
fn saved_bits(model: &Path) -> BTreeMap<String, Vec<u32>> {
    let loaded = ringflow_ml::checkpoint::load(model).expect("a saved model");
    loaded
        .model_tensors()
        .map(|(name, _, values)| {
            (
                name.to_string(),
                values.iter().map(|v| v.to_bits()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_new_head_on_frozen_convolutions_learns_digits_the_base_never_saw() {
    let dir = tempfile::tempdir().unwrap();
    let base = spec(dir.path(), "base", "label < 5", "", ADAM);
    let (base_summary, _) = train(dir.path(), &base);
    let base_model = dir.path().join("base").join("model");
    let model_lines = format!(
        "init_from = \"{}\"\ninit_skip = [\"layers.9\", \"layers.11\"]\nfreeze = [\"layers.0\", \
         \"layers.1\", \"layers.4\", \"layers.5\"]",
        s(&base_model)
    );
    // The new head learns faster than the rest: a parameter group.
    let groups =
        r#"{ kind = "adam", lr = 0.002, groups = [{ params = "layers.11", lr = 0.004 }] }"#;
    let tuned = spec(dir.path(), "tuned", "label >= 5", &model_lines, groups);
    let (tuned_summary, messages) = train(dir.path(), &tuned);
    let loaded = "loaded 12 tensors (4,992 values); left initialized by model.init_skip: \
                  layers.9.weight, layers.9.bias, layers.11.weight, layers.11.bias";
    assert!(
        messages.contains(loaded),
        "the job's messages say what was loaded:\n{messages}"
    );
    let accuracy = tuned_summary["test_accuracy"].as_f64().unwrap();
    eprintln!(
        "base on 0–4: {}; new head on 5–9: {accuracy}",
        base_summary["test_accuracy"]
    );
    assert!(accuracy >= 0.97, "test accuracy on digits 5–9: {accuracy}");

    let (before, after) = (
        saved_bits(&base_model),
        saved_bits(&dir.path().join("tuned/model")),
    );
    for (name, bits) in &after {
        let frozen = ["layers.0.", "layers.1.", "layers.4.", "layers.5."]
            .iter()
            .any(|p| name.starts_with(p));
        if frozen {
            assert_eq!(bits, &before[name], "{name} is frozen: bit-identical");
        } else {
            assert_ne!(bits, &before[name], "{name} trained");
        }
    }
    assert!(after.contains_key("layers.1.running_mean"));
}

#[test]
fn weights_that_do_not_fit_are_refused_before_any_executor_starts() {
    let dir = tempfile::tempdir().unwrap();
    let base = spec(dir.path(), "small", "label < 2", "", ADAM);
    let run = ringflow(
        &[
            "local",
            &base,
            "--ui",
            "off",
            "--set",
            "data.sql=SELECT id, image, label FROM input WHERE id < 300",
        ],
        LONG,
    );
    run.assert_success();
    let model = s(&dir.path().join("small").join("model"));
    let wider = spec(dir.path(), "wider", "label < 2", "", ADAM);
    let text = std::fs::read_to_string(&wider).unwrap();
    std::fs::write(
        &wider,
        text.replace("out_channels = 32", "out_channels = 48"),
    )
    .unwrap();
    let cases: [(&str, &[String], &[&str]); 6] = [
        (
            &wider,
            &[format!("model.init_from={model}")],
            &[
                "model.init_from",
                "\"layers.4.weight\"",
                "[48, 16, 3, 3]",
                "[32, 16, 3, 3]",
            ],
        ),
        (
            &base,
            &[format!(
                "model.init_from={}",
                s(&dir.path().join("nothing.safetensors"))
            )],
            &["model.init_from", "nothing.safetensors"],
        ),
        (
            &base,
            &["model.freeze=[\"layers.99\"]".into()],
            &["model.freeze", "\"layers.99\""],
        ),
        (
            &base,
            &["model.freeze=[\"*\"]".into()],
            &[
                "model.freeze",
                "freezes every parameter",
                "would train nothing",
            ],
        ),
        (
            &base,
            &["train.optimizer={ kind = \"sgd\", groups = [{ params = \"layers.3\" }] }".into()],
            &["train.optimizer.groups[0]", "names no trainable parameter"],
        ),
        (
            &base,
            &[
                format!("model.init_from={model}"),
                "model.init_skip=[\"head\"]".into(),
            ],
            &["model.init_skip", "\"head\""],
        ),
    ];
    for (spec, sets, wanted) in cases {
        let mut args = vec!["local", spec, "--ui", "off"];
        for set in sets {
            args.extend(["--set", set.as_str()]);
        }
        let run = ringflow(&args, LONG);
        let err = run.stderr.clone();
        assert!(!run.status.success(), "{sets:?} is refused");
        for want in wanted {
            assert!(err.contains(want), "{sets:?}: {want} in\n{err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// ringflow's own ONNX export is a source of weights too: its initializers carry the model's
/// names in ringflow's layout (`MatMul` on `[in, out]`), so they load bit for bit.
#[test]
fn an_exported_onnx_file_gives_back_the_weights_it_was_made_from() {
    let dir = tempfile::tempdir().unwrap();
    let few = "label < 3 AND id < 400";
    let base = spec(dir.path(), "base", few, "", ADAM);
    train(dir.path(), &base);
    let model = dir.path().join("base/model");
    let onnx = dir.path().join("base.onnx");
    let export = [
        "export",
        "--model",
        &s(&model),
        "--format",
        "onnx",
        "--output",
        &s(&onnx),
    ];
    ringflow(&export, LONG).assert_success();
    let lines = format!(
        "init_from = \"{}\"\nfreeze = [\"layers.0\", \"layers.1\", \"layers.4\", \"layers.5\", \
         \"layers.9\"]",
        s(&onnx)
    );
    let tuned = spec(dir.path(), "tuned", few, &lines, ADAM);
    let (_, messages) = train(dir.path(), &tuned);
    assert!(messages.contains("loaded 16 tensors"), "{messages}");
    let (before, after) = (
        saved_bits(&model),
        saved_bits(&dir.path().join("tuned/model")),
    );
    for (name, bits) in &after {
        match name.starts_with("layers.11.") {
            true => assert_ne!(bits, &before[name], "{name} trained"),
            false => assert_eq!(
                bits, &before[name],
                "{name} came from the ONNX file, frozen"
            ),
        }
    }
}
