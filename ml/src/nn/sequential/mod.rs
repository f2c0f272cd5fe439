//! `kind = "sequential"`: a model given as a list of layers, so that a CNN or a ResNet needs no
//! Rust.
//!
//! ```toml
//! [model]
//! kind = "sequential"
//! layers = [
//!   { type = "conv2d", out_channels = 32, kernel = 3, padding = 1 },
//!   { type = "batch_norm" },
//!   { type = "relu" },
//!   { type = "max_pool2d", kernel = 2 },
//!   { type = "flatten" },
//!   { type = "linear" },   # no `out` on the last linear: model.classes outputs
//! ]
//! ```
//!
//! [`spec`] reads the layers ([`LayerSpec`]); [`infer`] resolves each against the shape it
//! receives, from `model.input` (one example's shape, which the driver fills in from
//! `data.shape` or the feature width) to the output; [`build`] makes the modules, the
//! [`ModelSummary`] and the [`ModelFootprint`] from the result. Parameters are named by the
//! layers' places, `layers.<i>.weight`, and inside a residual block `layers.<i>.layers.<j>.…`
//! and `layers.<i>.shortcut.<j>.…`.

mod build;
mod footprint;
mod infer;
mod planned;
mod sequence;
mod spec;

use serde::Serialize;
use serde_json::Value;

use crate::error::{MlError, Result};
use crate::nn::layers::Sequential;
use crate::nn::{
    DataFacts, ModelBuilder, ModelFootprint, ModelShape, ModelSpec, ModelSummary, Module,
    ParamBuilder, SequenceFacts, SequenceOutput,
};

pub use planned::{MAX_DIM, MAX_ELEMENTS, PlannedLayer, RecurrentCell, Resolved, batch_shape};
pub use spec::{
    AttentionSpec, BatchNormSpec, Conv2dSpec, DropoutSpec, EmbeddingSpec, LAYER_TYPES,
    LayerNormSpec, LayerSpec, LinearSpec, Padding, Pair, PoolSpec, PositionSpec, RecurrentSpec,
    ResidualSpec, SequencePoolSpec, TransformerSpec,
};

/// The most axes one example's input may have.
const MAX_INPUT_RANK: usize = 8;

/// The fields of a `kind = "sequential"` model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SequentialSpec {
    /// The shape of one example, e.g. `[1, 28, 28]` (the driver fills it in from the data when
    /// the spec leaves it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Vec<usize>>,
    /// Outputs of a last `linear` layer without `out` (the driver fills it in from the labels
    /// when the spec leaves it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
    /// Whether the examples are token sequences: `input = [max_length]` holds the longest, a
    /// batch is `[n, T]` padded to its longest sequence, and the model's output may be per
    /// step (`[T, classes]`, tagging) as well as per sequence (the driver sets it when the
    /// feature column is a sequence).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sequence: bool,
    /// The layers, first to last.
    pub layers: Vec<LayerSpec>,
}

/// A sequential model with every layer resolved: what the builder builds.
#[derive(Clone, Debug, PartialEq)]
pub struct SequentialPlan {
    /// One example's input shape.
    pub input: Vec<usize>,
    /// The layers with their output shapes and parameter counts.
    pub layers: Vec<PlannedLayer>,
    /// Outputs per example (per step, when `sequence` is per step).
    pub outputs: usize,
    /// For a sequence model, where it gives its outputs.
    pub sequence: Option<SequenceOutput>,
}

const KEYS: &str = "kind, input, classes, sequence, layers";

impl SequentialSpec {
    /// Reads the fields of a `kind = "sequential"` spec; errors name the key or layer.
    pub fn from_spec(spec: &ModelSpec) -> Result<SequentialSpec> {
        if let Some(k) = spec
            .params
            .keys()
            .find(|k| !["input", "classes", "sequence", "layers"].contains(&k.as_str()))
        {
            return Err(MlError::spec(format!(
                "model: unknown key `{k}` for kind = \"sequential\"; its keys are {KEYS}"
            )));
        }
        let input = match spec.params.get("input") {
            None => None,
            Some(v) => Some(read_input(v)?),
        };
        let classes = match spec.params.get("classes") {
            None => None,
            Some(v) => Some(read_count("model.classes", v)?),
        };
        let sequence = match spec.params.get("sequence") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(MlError::spec(format!(
                    "model.sequence must be true or false, not {other}"
                )));
            }
        };
        let layers = spec.params.get("layers").ok_or_else(|| {
            MlError::spec("model.layers is missing: a sequential model is a list of layers")
        })?;
        let layers = LayerSpec::parse_list("model.layers", layers)?;
        if layers.is_empty() {
            return Err(MlError::spec(
                "model.layers is empty: a sequential model needs at least one layer",
            ));
        }
        Ok(SequentialSpec {
            input,
            classes,
            sequence,
            layers,
        })
    }

    /// This spec as a `[model]` table (`kind = "sequential"`).
    pub fn to_model_spec(&self) -> ModelSpec {
        let value = serde_json::to_value(self).expect("a sequential spec serializes");
        ModelSpec::new("sequential", value).expect("a sequential spec is a table")
    }

    /// True when the last layer is a `linear` without `out`, whose outputs are
    /// `model.classes`.
    pub fn needs_classes(&self) -> bool {
        matches!(self.layers.last(), Some(LayerSpec::Linear(l)) if l.out.is_none())
    }

    /// Resolves every layer against the shape it receives; errors name the layer by path and
    /// type with both shapes.
    pub fn plan(&self) -> Result<SequentialPlan> {
        let input = self.input.clone().ok_or_else(|| {
            MlError::spec(
                "model.input is not set: give the shape of one example (e.g. input = [1, 28, \
                 28]); the driver sets it from data.shape, data.image or the feature width",
            )
        })?;
        let list = infer::ListAt {
            path: "model.layers",
            name: "layers",
            local: "layers",
            after: None,
            classes: Some(self.classes),
            sequence: self.sequence,
        };
        let (layers, output) = infer::infer_list(list, &self.layers, &input)?;
        let Some(last) = layers.last() else {
            return Err(MlError::spec(
                "model.layers is empty: a sequential model needs at least one layer",
            ));
        };
        let (outputs, sequence) = match (output.as_slice(), self.sequence) {
            (&[n], false) => (n, None),
            (&[n], true) => (n, Some(SequenceOutput::PerSequence)),
            (&[_, n], true) => (n, Some(SequenceOutput::PerStep)),
            (other, true) => {
                return Err(MlError::spec(format!(
                    "{} ({}) is the last layer and gives {}, but a sequence model's output \
                     must be [n, steps, outputs] (one per token) or [n, outputs] (one per \
                     sequence, e.g. after a sequence_pool)",
                    last.path,
                    last.kind,
                    batch_shape(other)
                )));
            }
            (other, false) => {
                return Err(MlError::spec(format!(
                    "{} ({}) is the last layer and gives {}, but a model's output must be flat \
                     [n, outputs]: end with {{ type = \"flatten\" }} or {{ type = \
                     \"global_avg_pool2d\" }} and a linear layer",
                    last.path,
                    last.kind,
                    batch_shape(other)
                )));
            }
        };
        if let Some(classes) = self.classes
            && classes != outputs
        {
            return Err(MlError::spec(format!(
                "model.classes = {classes}, but the last layer, {} ({}), gives {outputs} outputs",
                last.path, last.kind
            )));
        }
        let parameters = layers.iter().fold(0u64, |a, l| a.saturating_add(l.params));
        if parameters > MAX_ELEMENTS {
            return Err(MlError::spec(format!(
                "model has {parameters} parameters, more than the 2^31 ringflow builds"
            )));
        }
        Ok(SequentialPlan {
            input,
            layers,
            outputs,
            sequence,
        })
    }
}

/// `model.input`: a non-empty list of sizes in `1..=MAX_DIM`, at most [`MAX_INPUT_RANK`]
/// long, with at most [`MAX_ELEMENTS`] values together.
fn read_input(v: &Value) -> Result<Vec<usize>> {
    let bad = || {
        MlError::spec(format!(
            "model.input must be the shape of one example, a list of 1 to {MAX_INPUT_RANK} \
             sizes between 1 and {MAX_DIM} (e.g. [1, 28, 28]), not {v}"
        ))
    };
    let items = v.as_array().ok_or_else(bad)?;
    if items.is_empty() || items.len() > MAX_INPUT_RANK {
        return Err(bad());
    }
    let dims = items
        .iter()
        .map(|d| {
            d.as_u64()
                .filter(|&d| (1..=MAX_DIM as u64).contains(&d))
                .map(|d| d as usize)
                .ok_or_else(bad)
        })
        .collect::<Result<Vec<usize>>>()?;
    let n = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
    if n > MAX_ELEMENTS {
        return Err(bad());
    }
    Ok(dims)
}

fn read_count(key: &str, v: &Value) -> Result<usize> {
    v.as_u64()
        .filter(|&n| (1..=MAX_DIM as u64).contains(&n))
        .map(|n| n as usize)
        .ok_or_else(|| {
            MlError::spec(format!(
                "{key} must be a whole number between 1 and {MAX_DIM}, not {v}"
            ))
        })
}

impl SequentialPlan {
    /// The model's input shape and outputs.
    pub fn shape(&self) -> ModelShape {
        ModelShape {
            input: self.input.clone(),
            outputs: self.outputs,
            sequence: self.sequence,
        }
    }

    /// The Keras-style table of the layers.
    pub fn summary(&self) -> ModelSummary {
        build::summary(&self.input, &self.layers)
    }

    /// What the model needs in memory.
    pub fn footprint(&self) -> ModelFootprint {
        footprint::footprint(&self.input, &self.layers)
    }

    /// Creates the parameters through `params` and returns the network.
    pub fn build(&self, params: &mut ParamBuilder<'_>) -> Result<Sequential> {
        build::build_list(&self.layers, params)
    }
}

/// The builder of `kind = "sequential"`.
pub struct SequentialBuilder;

impl SequentialBuilder {
    fn plan(spec: &ModelSpec) -> Result<SequentialPlan> {
        SequentialSpec::from_spec(spec)?.plan()
    }
}

impl ModelBuilder for SequentialBuilder {
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape> {
        Ok(Self::plan(spec)?.shape())
    }

    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>> {
        Ok(Box::new(Self::plan(spec)?.build(params)?))
    }

    fn footprint(&self, spec: &ModelSpec) -> Result<Option<ModelFootprint>> {
        Ok(Some(Self::plan(spec)?.footprint()))
    }

    fn summary(&self, spec: &ModelSpec) -> Result<Option<ModelSummary>> {
        Ok(Some(Self::plan(spec)?.summary()))
    }

    /// Fills in `input` from the data's example shape (or feature width) and, for a last
    /// linear without `out`, `classes` from the labels; then checks the whole model.
    fn resolve(&self, spec: &ModelSpec, facts: &DataFacts) -> Result<ModelSpec> {
        let seq = SequentialSpec::from_spec(spec)?;
        let mut out = spec.clone();
        if let Some(sequence) = &facts.sequence {
            return resolve_sequence(&seq, out, facts, sequence);
        }
        match (&seq.input, &facts.example_shape, &facts.feature_width) {
            (Some(given), Some(data), _) if given != data => {
                return Err(MlError::spec(format!(
                    "model.input = {given:?} but the data's examples have shape {data:?} \
                     ({}); leave model.input out to take the data's",
                    facts.example_shape_from
                )));
            }
            (Some(_), _, _) => {}
            (None, Some(shape), _) => {
                out.params.insert("input".into(), serde_json::json!(shape));
            }
            (None, None, Ok(width)) => {
                out.params
                    .insert("input".into(), serde_json::json!([width]));
            }
            (None, None, Err(why)) => {
                return Err(MlError::spec(format!(
                    "model.input is not set and {why}: set data.shape (e.g. [1, 28, 28]) or \
                     model.input"
                )));
            }
        }
        fill_classes(&seq, &mut out, facts)?;
        SequentialSpec::from_spec(&out)?.plan()?;
        Ok(out)
    }
}

/// For a last linear without `out`, `classes` from the labels.
fn fill_classes(seq: &SequentialSpec, out: &mut ModelSpec, facts: &DataFacts) -> Result<()> {
    if seq.classes.is_some() || !seq.needs_classes() {
        return Ok(());
    }
    match &facts.outputs {
        Ok(n) => {
            out.params.insert("classes".into(), serde_json::json!(n));
            Ok(())
        }
        Err(why) => Err(MlError::spec(format!(
            "model.classes is not set and {why}: set model.classes to the number of classes \
             (or give the last linear layer its `out`)"
        ))),
    }
}

/// Completes the spec of a model of token sequences: `input = [max_length]`, `sequence =
/// true`, each top-level embedding's `vocab` from the vocabulary, `classes` from the labels;
/// then checks that the model gives its outputs where the labels are (per token or per
/// sequence).
fn resolve_sequence(
    seq: &SequentialSpec,
    mut out: ModelSpec,
    facts: &DataFacts,
    sequence: &SequenceFacts,
) -> Result<ModelSpec> {
    let input = vec![sequence.max_length];
    if let Some(given) = &seq.input
        && *given != input
    {
        return Err(MlError::spec(format!(
            "model.input = {given:?}, but the examples are token sequences of up to \
             data.max_length = {} steps; leave model.input out",
            sequence.max_length
        )));
    }
    out.params.insert("input".into(), serde_json::json!(input));
    out.params.insert("sequence".into(), Value::Bool(true));
    if let (Some(vocab), Some(Value::Array(layers))) =
        (sequence.vocab, out.params.get_mut("layers"))
    {
        for layer in layers.iter_mut().filter_map(Value::as_object_mut) {
            let embedding = layer.get("type") == Some(&Value::from("embedding"));
            if embedding && !layer.contains_key("vocab") {
                layer.insert("vocab".into(), serde_json::json!(vocab));
            }
        }
    }
    fill_classes(seq, &mut out, facts)?;
    let plan = SequentialSpec::from_spec(&out)?.plan()?;
    let last = plan
        .layers
        .last()
        .map(|l| format!("{} ({})", l.path, l.kind));
    let last = last.unwrap_or_default();
    match (plan.sequence, sequence.per_step) {
        (Some(SequenceOutput::PerSequence), true) => Err(MlError::spec(format!(
            "the labels are one per token, but the model's last layer, {last}, gives one \
             output per sequence: leave out the sequence_pool (or label whole sequences)"
        ))),
        (Some(SequenceOutput::PerStep), false) => Err(MlError::spec(format!(
            "the labels are one per sequence, but the model's last layer, {last}, gives an \
             output at every step: pool the steps first with {{ type = \"sequence_pool\" }}"
        ))),
        _ => Ok(out),
    }
}

#[cfg(test)]
mod sequence_tests;
#[cfg(test)]
mod tests;
