//! The layers of a `kind = "sequential"` spec as written: [`LayerSpec`] and each type's keys,
//! read from the spec's JSON form with errors that name the layer by its path
//! (`model.layers[2].layers[1] (conv2d): unknown key …`, `model.layers[0].out (linear): expected
//! a whole number of 0 or more, not a table`).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::{MlError, Result};
use crate::nn::{ActivationKind, Init, PositionKind, SequencePoolKind};

/// A `[height, width]` pair written as one integer (both the same) or `[h, w]`: a kernel,
/// stride or dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair(pub [usize; 2]);

impl Pair {
    /// Both sides `n`.
    pub fn square(n: usize) -> Pair {
        Pair([n, n])
    }

    fn one() -> Pair {
        Pair::square(1)
    }
}

impl Serialize for Pair {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let [h, w] = self.0;
        if h == w {
            s.serialize_u64(h as u64)
        } else {
            self.0.serialize(s)
        }
    }
}

/// Reads an integer, `[h, w]`, or (when `words`) `"same"`/`"valid"`.
struct PairVisitor {
    words: bool,
}

impl<'de> Visitor<'de> for PairVisitor {
    type Value = Padding;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.words {
            f.write_str("an integer, [height, width], \"same\" or \"valid\"")
        } else {
            f.write_str("an integer or [height, width]")
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Padding, E> {
        let v = usize::try_from(v).map_err(|_| E::custom(format!("{v} is too large")))?;
        Ok(Padding::Explicit(Pair::square(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Padding, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Padding, E> {
        match v {
            "same" if self.words => Ok(Padding::Same),
            "valid" if self.words => Ok(Padding::Explicit(Pair::square(0))),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Padding, A::Error> {
        let h: usize = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let w: usize = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(3, &self));
        }
        Ok(Padding::Explicit(Pair([h, w])))
    }
}

impl<'de> Deserialize<'de> for Pair {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Pair, D::Error> {
        match d.deserialize_any(PairVisitor { words: false })? {
            Padding::Explicit(p) => Ok(p),
            Padding::Same => Err(de::Error::custom("expected an integer or [height, width]")),
        }
    }
}

/// A convolution's zero padding: `[top/bottom, left/right]` cells on each side, or `"same"`
/// (as much as keeps the output the input's size at stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// The output has the input's height and width (stride 1 only).
    Same,
    /// This many zero cells on each side.
    Explicit(Pair),
}

impl Default for Padding {
    fn default() -> Padding {
        Padding::Explicit(Pair::square(0))
    }
}

impl Serialize for Padding {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Padding::Same => s.serialize_str("same"),
            Padding::Explicit(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Padding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Padding, D::Error> {
        d.deserialize_any(PairVisitor { words: true })
    }
}

fn yes() -> bool {
    true
}

fn one() -> usize {
    1
}

fn default_eps() -> f32 {
    1e-5
}

fn default_momentum() -> f32 {
    0.1
}

fn default_dropout() -> f32 {
    0.5
}

/// `{ type = "conv2d", out_channels, kernel, stride = 1, padding = 0, dilation = 1, groups = 1,
/// bias = true, init = "auto" }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2dSpec {
    /// Output channels (filters).
    pub out_channels: usize,
    /// Kernel size.
    pub kernel: Pair,
    /// Stride.
    #[serde(default = "Pair::one")]
    pub stride: Pair,
    /// Zero padding on each side, or `"same"`.
    #[serde(default)]
    pub padding: Padding,
    /// Spacing of the kernel's taps.
    #[serde(default = "Pair::one")]
    pub dilation: Pair,
    /// Channel groups (`groups = in_channels = out_channels`: depthwise).
    #[serde(default = "one")]
    pub groups: usize,
    /// Whether to add a bias per output channel.
    #[serde(default = "yes")]
    pub bias: bool,
    /// Weight initialization.
    #[serde(default)]
    pub init: Init,
}

/// `{ type = "batch_norm", eps = 1e-5, momentum = 0.1 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchNormSpec {
    /// Added to the variance.
    #[serde(default = "default_eps")]
    pub eps: f32,
    /// Weight of each batch in the running statistics.
    #[serde(default = "default_momentum")]
    pub momentum: f32,
}

/// `{ type = "max_pool2d" | "avg_pool2d", kernel, stride = kernel, padding = 0 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// Window size.
    pub kernel: Pair,
    /// Step between windows (default: the kernel, so windows do not overlap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<Pair>,
    /// Implicit padding on each side, at most half the kernel.
    #[serde(default = "Pair::zero")]
    pub padding: Pair,
}

impl Pair {
    fn zero() -> Pair {
        Pair::square(0)
    }
}

/// `{ type = "linear", out, bias = true, init = "auto" }`; `out` may be left out on the last
/// layer, which then has `model.classes` outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearSpec {
    /// Outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<usize>,
    /// Whether to add a bias.
    #[serde(default = "yes")]
    pub bias: bool,
    /// Weight initialization.
    #[serde(default)]
    pub init: Init,
}

/// `{ type = "dropout", p = 0.5 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropoutSpec {
    /// Probability of zeroing an element while training.
    #[serde(default = "default_dropout")]
    pub p: f32,
}

/// `{ type = "layer_norm", eps = 1e-5 }`: normalization over each example's last axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerNormSpec {
    /// Added to the variance.
    #[serde(default = "default_eps")]
    pub eps: f32,
}

/// `{ type = "embedding", vocab, dim }`: integer ids in, one `dim`-vector per id out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingSpec {
    /// Number of distinct ids (ids run from 0 to `vocab − 1`); the driver sets it from the
    /// vocabulary of a string sequence column when the spec leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
    /// Size of each vector.
    pub dim: usize,
}

/// `{ type = "lstm" | "gru", hidden, layers = 1, bidirectional = false, dropout = 0 }`: a
/// recurrent layer (or a stack of `layers`) over `[n, T, features]`, the output at every step:
/// `[n, T, hidden]`, or `[n, T, 2·hidden]` when bidirectional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecurrentSpec {
    /// Hidden units (of each direction).
    pub hidden: usize,
    /// Layers stacked, each reading the previous one's outputs.
    #[serde(default = "one")]
    pub layers: usize,
    /// Whether each layer also reads the sequences backwards, its outputs beside the forward
    /// ones.
    #[serde(default)]
    pub bidirectional: bool,
    /// Dropout between stacked layers while training (PyTorch's `dropout`).
    #[serde(default)]
    pub dropout: f32,
}

/// `{ type = "sequence_pool", reduce = "mean" | "max" }`: `[n, T, features]` → `[n,
/// features]` over each sequence's real steps (for sequence classification).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequencePoolSpec {
    /// The mean (default) or the maximum of each feature.
    #[serde(default = "default_reduce")]
    pub reduce: SequencePoolKind,
}

fn default_reduce() -> SequencePoolKind {
    SequencePoolKind::Mean
}

/// `{ type = "multi_head_attention", heads, dropout = 0 }`: self-attention over `[n, T, dim]`
/// (padded steps are no keys), `dim` a multiple of `heads`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionSpec {
    /// Attention heads.
    pub heads: usize,
    /// Dropout on the attention weights while training.
    #[serde(default)]
    pub dropout: f32,
}

/// `{ type = "transformer_encoder", heads, ff, dropout = 0.1, activation = "relu" }`: one
/// post-norm Transformer encoder block (PyTorch's `nn.TransformerEncoderLayer`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Attention heads.
    pub heads: usize,
    /// Hidden units of the feed-forward.
    pub ff: usize,
    /// Dropout after the attention, inside the feed-forward and after it.
    #[serde(default = "default_transformer_dropout")]
    pub dropout: f32,
    /// The feed-forward's nonlinearity, `"relu"` or `"gelu"`.
    #[serde(default = "default_ff_activation")]
    pub activation: ActivationKind,
}

fn default_transformer_dropout() -> f32 {
    0.1
}

fn default_ff_activation() -> ActivationKind {
    ActivationKind::Relu
}

/// `{ type = "position_embedding", kind = "sinusoidal" | "learned" }`: adds each step's
/// position vector to `[n, T, dim]` (fixed sines and cosines, or a learned table of
/// `max_length` rows).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PositionSpec {
    /// Sinusoidal (default) or learned.
    #[serde(default = "default_position_kind")]
    pub kind: PositionKind,
}

fn default_position_kind() -> PositionKind {
    PositionKind::Sinusoidal
}

/// `{ type = "residual", layers = [...], shortcut = [...] }`: the layers' output plus the
/// input (or the shortcut's output).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResidualSpec {
    /// The block's layers.
    pub layers: Vec<LayerSpec>,
    /// What the input goes through before it is added (when the layers change its shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shortcut: Option<Vec<LayerSpec>>,
}

/// One entry of `model.layers`, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LayerSpec {
    /// A 2-D convolution.
    Conv2d(Conv2dSpec),
    /// Batch normalization.
    BatchNorm(BatchNormSpec),
    /// `max(x, 0)`.
    Relu,
    /// GELU (tanh approximation).
    Gelu,
    /// GELU, exact (with the error function).
    GeluExact,
    /// Hyperbolic tangent.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// Max pooling.
    MaxPool2d(PoolSpec),
    /// Average pooling.
    AvgPool2d(PoolSpec),
    /// The mean of each channel: `[C, H, W]` → `[C]`.
    GlobalAvgPool2d,
    /// One flat vector per example.
    Flatten,
    /// A fully connected layer.
    Linear(LinearSpec),
    /// Dropout while training.
    Dropout(DropoutSpec),
    /// Normalization over the last axis.
    LayerNorm(LayerNormSpec),
    /// A lookup table of vectors.
    Embedding(EmbeddingSpec),
    /// Long short-term memory over the steps of a sequence.
    Lstm(RecurrentSpec),
    /// A gated recurrent unit over the steps of a sequence.
    Gru(RecurrentSpec),
    /// The mean or maximum over each sequence's real steps.
    SequencePool(SequencePoolSpec),
    /// Multi-head self-attention.
    MultiHeadAttention(AttentionSpec),
    /// A Transformer encoder block.
    TransformerEncoder(TransformerSpec),
    /// Position vectors added to each step.
    PositionEmbedding(PositionSpec),
    /// A skip connection around a list of layers.
    Residual(ResidualSpec),
}

/// The `type` names, in the order the docs list them.
pub const LAYER_TYPES: &[&str] = &[
    "conv2d",
    "batch_norm",
    "relu",
    "gelu",
    "gelu_exact",
    "tanh",
    "sigmoid",
    "max_pool2d",
    "avg_pool2d",
    "global_avg_pool2d",
    "flatten",
    "linear",
    "dropout",
    "layer_norm",
    "embedding",
    "lstm",
    "gru",
    "sequence_pool",
    "multi_head_attention",
    "transformer_encoder",
    "position_embedding",
    "residual",
];

impl LayerSpec {
    /// The layer's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            LayerSpec::Conv2d(_) => "conv2d",
            LayerSpec::BatchNorm(_) => "batch_norm",
            LayerSpec::Relu => "relu",
            LayerSpec::Gelu => "gelu",
            LayerSpec::GeluExact => "gelu_exact",
            LayerSpec::Tanh => "tanh",
            LayerSpec::Sigmoid => "sigmoid",
            LayerSpec::MaxPool2d(_) => "max_pool2d",
            LayerSpec::AvgPool2d(_) => "avg_pool2d",
            LayerSpec::GlobalAvgPool2d => "global_avg_pool2d",
            LayerSpec::Flatten => "flatten",
            LayerSpec::Linear(_) => "linear",
            LayerSpec::Dropout(_) => "dropout",
            LayerSpec::LayerNorm(_) => "layer_norm",
            LayerSpec::Embedding(_) => "embedding",
            LayerSpec::Lstm(_) => "lstm",
            LayerSpec::Gru(_) => "gru",
            LayerSpec::SequencePool(_) => "sequence_pool",
            LayerSpec::MultiHeadAttention(_) => "multi_head_attention",
            LayerSpec::TransformerEncoder(_) => "transformer_encoder",
            LayerSpec::PositionEmbedding(_) => "position_embedding",
            LayerSpec::Residual(_) => "residual",
        }
    }

    /// Reads a list of layers at `path` (e.g. `model.layers`) from its JSON form.
    pub fn parse_list(path: &str, value: &Value) -> Result<Vec<LayerSpec>> {
        let Value::Array(items) = value else {
            return Err(MlError::spec(format!(
                "{path} must be a list of layers ({{ type = \"...\", ... }}), not {value}"
            )));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| LayerSpec::parse(&format!("{path}[{i}]"), item))
            .collect()
    }

    /// Reads the layer at `path` from its JSON form (a table with a `type`).
    pub fn parse(path: &str, value: &Value) -> Result<LayerSpec> {
        let Value::Object(table) = value else {
            return Err(MlError::spec(format!(
                "{path} must be a table like {{ type = \"relu\" }}, not {value}"
            )));
        };
        let mut keys = table.clone();
        let kind = match keys.remove("type") {
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(MlError::spec(format!(
                    "{path}.type must be a string such as \"conv2d\", not {other}"
                )));
            }
            None => {
                return Err(MlError::spec(format!(
                    "{path} has no `type`; the types are {}",
                    LAYER_TYPES.join(", ")
                )));
            }
        };
        let at = format!("{path} ({kind})");
        let fields = || no_keys(&at, &keys);
        Ok(match kind.as_str() {
            "conv2d" => LayerSpec::Conv2d(read((path, kind.as_str()), &keys)?),
            "batch_norm" => LayerSpec::BatchNorm(read((path, kind.as_str()), &keys)?),
            "relu" => fields().map(|_| LayerSpec::Relu)?,
            "gelu" => fields().map(|_| LayerSpec::Gelu)?,
            "gelu_exact" => fields().map(|_| LayerSpec::GeluExact)?,
            "tanh" => fields().map(|_| LayerSpec::Tanh)?,
            "sigmoid" => fields().map(|_| LayerSpec::Sigmoid)?,
            "max_pool2d" => LayerSpec::MaxPool2d(read((path, kind.as_str()), &keys)?),
            "avg_pool2d" => LayerSpec::AvgPool2d(read((path, kind.as_str()), &keys)?),
            "global_avg_pool2d" => fields().map(|_| LayerSpec::GlobalAvgPool2d)?,
            "flatten" => fields().map(|_| LayerSpec::Flatten)?,
            "linear" => LayerSpec::Linear(read((path, kind.as_str()), &keys)?),
            "dropout" => LayerSpec::Dropout(read((path, kind.as_str()), &keys)?),
            "layer_norm" => LayerSpec::LayerNorm(read((path, kind.as_str()), &keys)?),
            "embedding" => LayerSpec::Embedding(read((path, kind.as_str()), &keys)?),
            "lstm" => LayerSpec::Lstm(read((path, kind.as_str()), &keys)?),
            "gru" => LayerSpec::Gru(read((path, kind.as_str()), &keys)?),
            "sequence_pool" => LayerSpec::SequencePool(read((path, kind.as_str()), &keys)?),
            "multi_head_attention" => {
                LayerSpec::MultiHeadAttention(read((path, kind.as_str()), &keys)?)
            }
            "transformer_encoder" => {
                LayerSpec::TransformerEncoder(read((path, kind.as_str()), &keys)?)
            }
            "position_embedding" => {
                LayerSpec::PositionEmbedding(read((path, kind.as_str()), &keys)?)
            }
            "residual" => LayerSpec::Residual(parse_residual(path, &at, &keys)?),
            other => {
                return Err(MlError::spec(format!(
                    "{path} has type {other:?}, which is not a layer type; the types are {}",
                    LAYER_TYPES.join(", ")
                )));
            }
        })
    }
}

/// A layer type's keys (without `type`) read into its spec struct; the error names the key
/// at `path` and the layer's `kind`.
fn read<T: serde::de::DeserializeOwned>(
    (path, kind): (&str, &str),
    keys: &Map<String, Value>,
) -> Result<T> {
    crate::settings::from_json(path, &Value::Object(keys.clone()))
        .map_err(|e| MlError::spec(format!("{} ({kind}): {}", e.key, e.message)))
}

/// An error unless a layer type that takes no keys has none.
fn no_keys(at: &str, keys: &Map<String, Value>) -> Result<()> {
    match keys.keys().next() {
        None => Ok(()),
        Some(k) => Err(MlError::spec(format!(
            "{at}: unknown key `{k}`; this layer takes no keys besides `type`"
        ))),
    }
}

fn parse_residual(path: &str, at: &str, keys: &Map<String, Value>) -> Result<ResidualSpec> {
    if let Some(k) = keys.keys().find(|k| *k != "layers" && *k != "shortcut") {
        return Err(MlError::spec(format!(
            "{at}: unknown key `{k}` (expected one of: layers, shortcut)"
        )));
    }
    let layers = keys
        .get("layers")
        .ok_or_else(|| MlError::spec(format!("{at}: `layers` is required")))?;
    let layers = LayerSpec::parse_list(&format!("{path}.layers"), layers)?;
    if layers.is_empty() {
        return Err(MlError::spec(format!(
            "{at}: `layers` is empty; a residual block needs at least one layer"
        )));
    }
    let shortcut = keys
        .get("shortcut")
        .map(|s| LayerSpec::parse_list(&format!("{path}.shortcut"), s))
        .transpose()?;
    Ok(ResidualSpec { layers, shortcut })
}
