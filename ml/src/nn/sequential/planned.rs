//! What shape inference decides, shared by the inference of every kind of layer
//! ([`super::infer`], [`super::sequence`]), the builder and the footprint: a layer resolved
//! against its input ([`Resolved`], [`PlannedLayer`]), a layer's place in the spec while it is
//! inferred ([`At`]) and the bounds every size is held to. A leaf: it imports no other file of
//! the sequential model.

use crate::error::{MlError, Result};
use crate::nn::layers::Conv2dConfig;
use crate::nn::{ActivationKind, Init, PositionKind, SequencePoolKind};
use crate::ops::Pool2dOptions;

/// The largest size a spec may give anything: channels, widths, kernels, strides, dimensions.
pub const MAX_DIM: usize = 1 << 24;
/// The most values a model may have in its parameters, or one example in one layer's output.
pub const MAX_ELEMENTS: u64 = 1 << 31;
/// A layer resolved against its input: what to build.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// A convolution.
    Conv2d(Conv2dConfig),
    /// A batch norm over `channels`.
    BatchNorm {
        /// Channels (axis 1 of the batch).
        channels: usize,
        /// Added to the variance.
        eps: f32,
        /// Weight of each batch in the running statistics.
        momentum: f32,
    },
    /// An elementwise nonlinearity.
    Activation(ActivationKind),
    /// Max pooling.
    MaxPool2d(Pool2dOptions),
    /// Average pooling.
    AvgPool2d(Pool2dOptions),
    /// Mean over each channel's plane.
    GlobalAvgPool2d,
    /// One flat vector per example.
    Flatten,
    /// A fully connected layer.
    Linear {
        /// Inputs.
        inputs: usize,
        /// Outputs.
        outputs: usize,
        /// Whether it has a bias.
        bias: bool,
        /// Weight initialization.
        init: Init,
        /// The nonlinearity that follows it.
        activation: Option<ActivationKind>,
    },
    /// Dropout with this probability.
    Dropout(f32),
    /// Layer norm over the last axis of size `dim`.
    LayerNorm {
        /// Size of the last axis.
        dim: usize,
        /// Added to the variance.
        eps: f32,
    },
    /// An embedding table.
    Embedding {
        /// Ids.
        vocab: usize,
        /// Vector size.
        dim: usize,
    },
    /// A recurrent layer, or a stack of them.
    Recurrent {
        /// LSTM or GRU.
        cell: RecurrentCell,
        /// Features of each step in.
        inputs: usize,
        /// Hidden units of each direction.
        hidden: usize,
        /// Layers stacked.
        layers: usize,
        /// Whether each layer reads both ways.
        bidirectional: bool,
        /// Dropout between stacked layers.
        dropout: f32,
    },
    /// Pooling over each sequence's real steps.
    SequencePool(SequencePoolKind),
    /// Self-attention over `dim` features.
    MultiHeadAttention {
        /// Features of each step.
        dim: usize,
        /// Heads.
        heads: usize,
        /// Dropout on the attention weights.
        dropout: f32,
    },
    /// A Transformer encoder block.
    TransformerEncoder {
        /// Features of each step.
        dim: usize,
        /// Heads.
        heads: usize,
        /// Feed-forward units.
        ff: usize,
        /// Dropout.
        dropout: f32,
        /// The feed-forward's nonlinearity.
        activation: ActivationKind,
    },
    /// Position vectors.
    PositionEmbedding {
        /// Sinusoidal or learned.
        kind: PositionKind,
        /// Positions (the longest sequence).
        max_length: usize,
        /// Features of each step.
        dim: usize,
    },
    /// A skip connection.
    Residual {
        /// The block's layers.
        body: Vec<PlannedLayer>,
        /// The shortcut's layers, if any.
        shortcut: Option<Vec<PlannedLayer>>,
    },
}

/// The cell of a recurrent layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecurrentCell {
    /// Long short-term memory.
    Lstm,
    /// Gated recurrent unit.
    Gru,
}

/// A layer of a sequential model with everything shape inference learned about it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedLayer {
    /// Where the spec holds it, for messages: `model.layers[4].layers[1]`.
    pub path: String,
    /// The prefix of its parameters' names: `layers.4.layers.1`.
    pub name: String,
    /// That prefix within its list's owner: `layers.1` (inside the block `layers.4`).
    pub local: String,
    /// Its `type`.
    pub kind: &'static str,
    /// The shape of one example's output (without the batch axis).
    pub output: Vec<usize>,
    /// Trainable values (its children's, for a residual block).
    pub params: u64,
    /// Non-trainable values (batch norm's running statistics).
    pub buffers: u64,
    /// What to build.
    pub layer: Resolved,
}

/// `[n, 64, 7, 7]`: a per-example shape as the batch the layer sees.
pub fn batch_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    if dims.is_empty() {
        "[n]".into()
    } else {
        format!("[n, {}]", dims.join(", "))
    }
}

/// One layer's place: path, name, what follows, and whether it is the model's last.
pub(super) struct At<'a> {
    pub(super) path: String,
    pub(super) name: String,
    pub(super) local: String,
    pub(super) kind: &'static str,
    pub(super) follows: Option<ActivationKind>,
    /// `Some(classes)` for the model's last layer.
    pub(super) classes: Option<Option<usize>>,
    pub(super) sequence: bool,
    pub(super) input: &'a [usize],
}

impl At<'_> {
    /// `model.layers[3] (conv2d)`.
    pub(super) fn label(&self) -> String {
        format!("{} ({})", self.path, self.kind)
    }

    pub(super) fn error(&self, message: impl std::fmt::Display) -> MlError {
        MlError::spec(format!("{} {message}", self.label()))
    }

    pub(super) fn planned(
        &self,
        output: Vec<usize>,
        params: u64,
        layer: Resolved,
    ) -> Result<PlannedLayer> {
        check_elements(self, &output)?;
        Ok(PlannedLayer {
            path: self.path.clone(),
            name: self.name.clone(),
            local: self.local.clone(),
            kind: self.kind,
            output,
            params,
            buffers: 0,
            layer,
        })
    }
}

/// Refuses a layer output too large to hold for one example.
fn check_elements(at: &At<'_>, output: &[usize]) -> Result<()> {
    let n = output.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
    if n > MAX_ELEMENTS {
        return Err(at.error(format!(
            "would give {} values per example ({}), more than the 2^31 ringflow allows",
            n,
            batch_shape(output)
        )));
    }
    Ok(())
}

/// Checks that every named size lies in `min..=MAX_DIM`.
pub(super) fn check_sizes(at: &At<'_>, sizes: &[(&str, usize)], min: usize) -> Result<()> {
    for &(key, v) in sizes {
        if v < min || v > MAX_DIM {
            return Err(at.error(format!(
                "has {key} = {v}; it must be between {min} and {MAX_DIM}"
            )));
        }
    }
    Ok(())
}
