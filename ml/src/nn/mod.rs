//! Neural-network building blocks on top of the differentiable ops.
//!
//! A model is a tree of [`Module`]s whose parameters live in one [`ParamStore`] under stable,
//! dotted names (`layers.0.weight`). Names key checkpoints; the store's order (creation order)
//! fixes the order in which gradients are fused and all-reduced, identically on every executor.
//! Non-trainable state (a batch norm's running statistics) lives in the same store as
//! *buffers*, saved with the parameters but never trained.
//!
//! Stock layers ([`layers`]): [`Linear`], [`Conv2d`], [`BatchNorm`], [`LayerNorm`],
//! [`MaxPool2d`], [`AvgPool2d`], [`GlobalAvgPool2d`], [`Flatten`], [`Activation`], [`Dropout`],
//! [`Embedding`], [`Residual`], [`Sequential`], the sequence layers [`Lstm`], [`Gru`],
//! [`Bidirectional`] and [`SequencePool`], and the attention layers [`MultiHeadAttention`],
//! [`TransformerEncoder`] and [`PositionEmbedding`]. [`ModelSpec`] describes a whole model:
//! `kind = "mlp"` and `kind = "sequential"` (a list of layers, [`sequential`]) are built in, and
//! a [`ModelRegistry`] maps further `kind`s to user code. [`ModelSummary`] is the Keras-style
//! table of a model's layers.

mod footprint;
pub mod init;
pub mod layers;
mod mlp;
mod model;
mod params;
pub mod pattern;
mod registry;
pub mod sequential;
mod summary;

pub use footprint::ModelFootprint;
pub use layers::{
    Activation, ActivationKind, AvgPool2d, BatchNorm, BiGru, BiLstm, Bidirectional, Conv2d,
    Conv2dConfig, Dropout, Embedding, Flatten, GlobalAvgPool2d, Gru, Init, LayerNorm, Linear, Lstm,
    MaxPool2d, MultiHeadAttention, PositionEmbedding, PositionKind, Recurrent, Residual,
    SequencePool, SequencePoolKind, Sequential, TransformerEncoder,
};
pub use mlp::MlpSpec;
pub use model::{Model, ModelSpec};
pub use params::{Param, ParamBuilder, ParamStore, TorchLayout};
pub use pattern::NamePattern;
pub use registry::{
    DataFacts, ModelBuilder, ModelRegistry, ModelShape, SequenceFacts, SequenceOutput, UnknownFact,
};
pub use sequential::{LayerSpec, SequentialSpec};
pub use summary::{ModelSummary, SummaryRow, thousands};

use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// Per-call state of a forward pass: whether the model is training (dropout active, batch
/// norm using and updating batch statistics), the random source for dropout masks, and for a
/// batch of sequences padded to one length, each sequence's real length.
pub struct Forward<'a> {
    /// True while training; false for evaluation and prediction.
    pub train: bool,
    /// The model's dropout generator.
    pub rng: &'a mut Rng,
    /// For a sequence batch `[n, T, ...]`: the real steps of each of the `n` sequences (each at
    /// most `T`; the rest is padding that sequence layers skip). `None`: every step is real.
    pub lengths: Option<&'a [usize]>,
}

impl<'a> Forward<'a> {
    /// A pass over a batch whose every step is real.
    pub fn new(train: bool, rng: &'a mut Rng) -> Forward<'a> {
        Forward {
            train,
            rng,
            lengths: None,
        }
    }
}

/// A layer or a whole network.
pub trait Module: Send + Sync {
    /// Computes the output for a batch.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor>;
}
