//! Neural-network building blocks on top of the differentiable ops.
//!
//! A model is a tree of [`Module`]s whose parameters live in one [`ParamStore`] under stable,
//! dotted names (`layers.0.weight`). Names key checkpoints; the store's order (creation order)
//! fixes the order in which gradients are fused and all-reduced, identically on every executor.
//!
//! Stock layers: [`Linear`], [`Activation`], [`Dropout`], [`Embedding`], [`LayerNorm`],
//! [`Sequential`]; [`ModelSpec`] describes a whole model (`kind = "mlp"` is built in), and a
//! [`ModelRegistry`] maps further `kind`s to user code.

mod footprint;
mod layers;
mod model;
mod params;
mod registry;

pub use footprint::ModelFootprint;
pub use layers::{
    Activation, ActivationKind, Dropout, Embedding, Init, LayerNorm, Linear, Sequential,
};
pub use model::{Model, ModelSpec};
pub use params::{Param, ParamBuilder, ParamStore};
pub use registry::{MlpSpec, ModelBuilder, ModelRegistry, ModelShape};

use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// Per-call state of a forward pass: whether the model is training (dropout active) and the
/// random source for dropout masks.
pub struct Forward<'a> {
    /// True while training; false for evaluation and prediction.
    pub train: bool,
    /// The model's dropout generator.
    pub rng: &'a mut Rng,
}

/// A layer or a whole network.
pub trait Module: Send + Sync {
    /// Computes the output for a batch.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor>;
}
