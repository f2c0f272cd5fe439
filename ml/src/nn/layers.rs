//! The stock layers.

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::tensor::Tensor;

/// How a layer's weights are initialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// He (Kaiming) uniform for ReLU-like activations, Glorot (Xavier) uniform otherwise.
    #[default]
    Auto,
    /// He uniform: `U(±√(6 / fan_in))`.
    He,
    /// Glorot uniform: `U(±√(6 / (fan_in + fan_out)))` (Keras' default).
    Glorot,
}

/// A fully connected layer `y = x·W + b` with `W` stored as `[in, out]` (so neither the forward
/// nor the backward pass copies a transpose).
pub struct Linear {
    /// `[in, out]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Tensor,
}

impl Linear {
    /// A layer with weights drawn by `init` (resolved for `activation`) and zero bias.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        inputs: usize,
        outputs: usize,
        init: Init,
        activation: Option<ActivationKind>,
    ) -> Result<Linear> {
        if inputs == 0 || outputs == 0 {
            return Err(MlError::spec(format!(
                "a linear layer needs at least one input and one output, not {inputs} → {outputs}"
            )));
        }
        let relu_like = matches!(
            activation,
            Some(ActivationKind::Relu) | Some(ActivationKind::Gelu)
        );
        let bound = match (init, relu_like) {
            (Init::He, _) | (Init::Auto, true) => (6.0 / inputs as f32).sqrt(),
            (Init::Glorot, _) | (Init::Auto, false) => (6.0 / (inputs + outputs) as f32).sqrt(),
        };
        let weight = b.uniform("weight", &[inputs, outputs], bound)?;
        let bias = b.constant("bias", &[outputs], 0.0)?;
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.linear(&self.weight, &self.bias)
    }
}

/// The elementwise nonlinearities a model spec can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ActivationKind {
    /// `max(x, 0)`
    #[default]
    Relu,
    /// hyperbolic tangent
    Tanh,
    /// logistic
    Sigmoid,
    /// GELU (tanh approximation)
    Gelu,
}

/// An activation as a layer.
pub struct Activation(pub ActivationKind);

impl Module for Activation {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        match self.0 {
            ActivationKind::Relu => x.relu(),
            ActivationKind::Tanh => x.tanh(),
            ActivationKind::Sigmoid => x.sigmoid(),
            ActivationKind::Gelu => x.gelu(),
        }
    }
}

/// Inverted dropout, active only while training.
pub struct Dropout {
    /// Probability of zeroing an element.
    pub p: f32,
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        if ctx.train && self.p > 0.0 {
            x.dropout(self.p, ctx.rng)
        } else {
            Ok(x.clone())
        }
    }
}

/// A lookup table of `vocab` vectors of size `dim`; the input holds integer ids.
pub struct Embedding {
    /// `[vocab, dim]`
    pub table: Tensor,
}

impl Embedding {
    /// A table initialized from `N(0, 1)` like `torch.nn.Embedding`.
    pub fn new(b: &mut ParamBuilder<'_>, vocab: usize, dim: usize) -> Result<Embedding> {
        let device = b.device();
        let init = Tensor::randn(&[vocab, dim], 1.0, b.rng(), device)?;
        Ok(Embedding {
            table: b.param("weight", init)?,
        })
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        self.table.index_select(ids)
    }
}

/// Normalization over the last axis with a learned scale and shift.
pub struct LayerNorm {
    /// `[dim]`, starts at 1
    pub gamma: Tensor,
    /// `[dim]`, starts at 0
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// A layer norm over vectors of size `dim`.
    pub fn new(b: &mut ParamBuilder<'_>, dim: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: b.constant("weight", &[dim], 1.0)?,
            beta: b.constant("bias", &[dim], 0.0)?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        let mean = x.mean(-1, true)?;
        let centered = x.sub(&mean)?;
        let var = centered.square()?.mean(-1, true)?;
        let std = var.add_scalar(self.eps)?.sqrt()?;
        centered.div(&std)?.mul(&self.gamma)?.add(&self.beta)
    }
}

/// Layers applied one after another.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer.
    pub fn push(&mut self, layer: impl Module + 'static) {
        self.layers.push(Box::new(layer));
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True if there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h, ctx)?;
        }
        Ok(h)
    }
}
