//! A saved model as an ONNX model ([`export`]), opset [`OPSET`].
//!
//! A tagger of token sequences takes `tokens` and `lengths` instead and gives one output per
//! token ([`sequences`]). Otherwise the graph takes `features`, `[batch, width]` float32: the model's feature columns read as
//! the data has them, in `data.features` order (a list column's values in place), before
//! `data.scale` and normalization, which the graph applies as the executors do. For a model of
//! encoded images (`data.image`) they are the decoded pixels, resized to `data.image.size` and
//! converted to its channels, channels first (`[C, H, W]` flattened), values 0 to 255. It gives
//! `logits` and `probabilities` (softmax over the classes) for `cross_entropy`, `logits` and
//! `probability` (sigmoid) for `binary_cross_entropy`, and `prediction` for `mse`, each with a
//! first axis of any size (`batch`).
//!
//! The model's `metadata_props` and the JSON sidecar ([`Exported::sidecar`]) carry the
//! resolved spec, the class names, the vocabulary and the preprocessing, so a server can name
//! a prediction as `ringflow predict` does.

mod features;
mod graph;
mod mlp;
mod ops;
pub mod proto;
mod sequences;
mod sequential;

use std::path::{Path, PathBuf};

use ringflow_ml::loss::LossKind;
use serde_json::json;

use crate::error::ExportError;
use crate::saved::SavedModelDir;
use graph::{Attr, Dim, Graph};
use proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto};

/// The ONNX operator set the graphs use (every operator in them is in opset 17).
pub const OPSET: i64 = 17;
/// The IR version of opset 17 (ONNX 1.12).
const IR_VERSION: i64 = 8;
/// The name of the graph's input.
pub const INPUT: &str = "features";

/// An exported model.
pub struct Exported {
    /// The ONNX model, serialized.
    pub model: Vec<u8>,
    /// What the model's metadata holds, as one JSON document: inputs, outputs, classes,
    /// vocabulary, preprocessing and the resolved spec.
    pub sidecar: serde_json::Value,
}

impl Exported {
    /// Where the sidecar of a model written to `path` goes: `path` with `.json` added.
    pub fn sidecar_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".json");
        PathBuf::from(name)
    }

    /// Writes the model to `path` and its sidecar beside it, each to a temporary name first
    /// and renamed into place, so a reader never sees half a file; refuses to replace either
    /// unless `overwrite`.
    pub fn write(&self, path: &Path, overwrite: bool) -> Result<(), ExportError> {
        let sidecar = Exported::sidecar_path(path);
        let text = serde_json::to_vec_pretty(&self.sidecar).expect("a sidecar serializes");
        let files = [
            (path, self.model.as_slice()),
            (sidecar.as_path(), text.as_slice()),
        ];
        crate::files::write_new(&files, overwrite)
    }
}

/// `saved` as an ONNX model; an error naming the model kind, layer or setting it cannot
/// express.
pub fn export(saved: &SavedModelDir) -> Result<Exported, ExportError> {
    let spec = &saved.saved.spec;
    let shape = saved.model.shape();
    let mut g = Graph::default();
    let (out, dims, input) = match shape.sequence {
        Some(_) => {
            saved.check_tagger("ONNX")?;
            let length = [Dim::Named("batch"), Dim::Named("length")];
            g.int64_input(sequences::TOKENS, &length);
            g.int64_input(sequences::LENGTHS, &[Dim::Named("batch")]);
            let out = sequences::lower(&mut g, saved)?;
            let dims = vec![
                length[0].clone(),
                length[1].clone(),
                Dim::Fixed(shape.outputs),
            ];
            (out, dims, tokens_input())
        }
        None => {
            let width = shape.input_width();
            g.input(INPUT, &[Dim::Named("batch"), Dim::Fixed(width)]);
            let x = features::preprocess(&mut g, saved, INPUT, width)?;
            let out = match spec.model.kind.as_str() {
                "mlp" => mlp::lower(&mut g, saved, &x)?,
                "sequential" => sequential::lower(&mut g, saved, &x)?,
                kind => return Err(ExportError::custom_kind("ONNX", kind)),
            };
            let dims = vec![Dim::Named("batch"), Dim::Fixed(shape.outputs)];
            (out, dims, features_input(saved, width))
        }
    };
    let outputs = heads(&mut g, &out, &dims, spec.train.loss);
    let sidecar = sidecar(saved, input, &outputs);
    let model = ModelProto {
        ir_version: Some(IR_VERSION),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        producer_name: Some("ringflow".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        graph: Some(g.finish(&spec.name)),
        metadata_props: metadata(&sidecar),
        ..Default::default()
    };
    Ok(Exported {
        model: prost::Message::encode_to_vec(&model),
        sidecar,
    })
}

/// The graph outputs for `loss` on the model's output `out` (of `shape`: `[batch, outputs]`,
/// or `[batch, length, outputs]` for a tagger): their names.
fn heads(g: &mut Graph, out: &str, shape: &[Dim], loss: LossKind) -> Vec<&'static str> {
    match loss {
        LossKind::CrossEntropy => {
            let p = g.op("Softmax", &[out], vec![Attr::Int("axis", -1)]);
            g.output(out, "logits", shape);
            g.output(&p, "probabilities", shape);
            vec!["logits", "probabilities"]
        }
        LossKind::BinaryCrossEntropy => {
            let p = g.op("Sigmoid", &[out], Vec::new());
            g.output(out, "logits", shape);
            g.output(&p, "probability", shape);
            vec!["logits", "probability"]
        }
        LossKind::Mse => {
            g.output(out, "prediction", shape);
            vec!["prediction"]
        }
    }
}

/// The sidecar's `input` of a model of feature columns (or an image column) `width` wide.
fn features_input(saved: &SavedModelDir, width: usize) -> serde_json::Value {
    json!({
        "name": INPUT,
        "shape": ["batch", width],
        "features": saved.saved.spec.data.features,
        "image": saved.saved.spec.data.image,
    })
}

/// The sidecar's `input` of a tagger: token ids and lengths.
fn tokens_input() -> serde_json::Value {
    json!({
        "tokens": { "name": sequences::TOKENS, "shape": ["batch", "length"], "type": "int64",
                    "ids": "the vocabulary's (id 1 for a token it lacks), any id past a row's length" },
        "lengths": { "name": sequences::LENGTHS, "shape": ["batch"], "type": "int64" },
    })
}

/// The sidecar document: what a program serving the model needs besides the graph.
fn sidecar(saved: &SavedModelDir, input: serde_json::Value, outputs: &[&str]) -> serde_json::Value {
    let pre = saved.saved.preprocessing.as_ref();
    json!({
        "format": "ringflow onnx export",
        "opset": OPSET,
        "input": input,
        "outputs": outputs,
        "classes": pre.and_then(|p| p.classes.as_ref()),
        "vocabulary": pre.and_then(|p| p.vocabulary.as_ref()).map(|v| v.tokens()),
        "preprocessing": pre,
        "job": saved.saved.spec.to_json_value(),
    })
}

/// The sidecar's top-level fields as `metadata_props` (`ringflow.<field>`, JSON values).
fn metadata(sidecar: &serde_json::Value) -> Vec<StringStringEntryProto> {
    let Some(fields) = sidecar.as_object() else {
        return Vec::new();
    };
    fields
        .iter()
        .map(|(k, v)| StringStringEntryProto {
            key: Some(format!("ringflow.{k}")),
            value: Some(v.to_string()),
        })
        .collect()
}
