//! Dense layers: [`Linear`], [`Activation`], [`Dropout`], [`Embedding`], and the weight
//! initializations ([`Init`]).

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder, TorchLayout};
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

impl Init {
    /// The bound `b` of the uniform distribution `U(±b)` for weights with `fan_in` inputs and
    /// `fan_out` outputs per unit; `Auto` is He when `relu_like` (the layer feeds a ReLU or
    /// GELU), Glorot otherwise.
    pub fn bound(self, fan_in: usize, fan_out: usize, relu_like: bool) -> f32 {
        match (self, relu_like) {
            (Init::He, _) | (Init::Auto, true) => (6.0 / fan_in.max(1) as f32).sqrt(),
            (Init::Glorot, _) | (Init::Auto, false) => {
                (6.0 / (fan_in + fan_out).max(1) as f32).sqrt()
            }
        }
    }
}

/// A fully connected layer `y = x·W + b` with `W` stored as `[in, out]` (so neither the forward
/// nor the backward pass copies a transpose).
pub struct Linear {
    /// `[in, out]`
    pub weight: Tensor,
    /// `[out]`, or `None` for a layer without bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with weights drawn by `init` (resolved for `activation`, the nonlinearity that
    /// follows it) and a zero bias.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        inputs: usize,
        outputs: usize,
        init: Init,
        activation: Option<ActivationKind>,
    ) -> Result<Linear> {
        Linear::with_bias(b, inputs, outputs, init, activation, true)
    }

    /// Like [`Linear::new`], with a bias only when `bias` (a layer followed by a batch norm
    /// needs none).
    pub fn with_bias(
        b: &mut ParamBuilder<'_>,
        inputs: usize,
        outputs: usize,
        init: Init,
        activation: Option<ActivationKind>,
        bias: bool,
    ) -> Result<Linear> {
        if inputs == 0 || outputs == 0 {
            return Err(MlError::spec(format!(
                "a linear layer needs at least one input and one output, not {inputs} → {outputs}"
            )));
        }
        let relu_like = activation.is_some_and(ActivationKind::is_relu_like);
        let bound = init.bound(inputs, outputs, relu_like);
        let device = b.device();
        let init = Tensor::uniform(&[inputs, outputs], -bound, bound, b.rng(), device)?;
        // PyTorch's `nn.Linear.weight` is `[out, in]`.
        let weight = b.param_as("weight", init, TorchLayout::Transposed)?;
        let bias = if bias {
            Some(b.constant("bias", &[outputs], 0.0)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    /// `[n, in]` → `[n, out]`; a batch with more axes, `[n, T, in]`, maps its last axis (every
    /// step of every sequence through one product, as Keras's `Dense` does).
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let flat = match shape.as_slice() {
            [_, _, _, ..] => {
                let inputs = shape[shape.len() - 1];
                &x.reshape(&[shape.iter().product::<usize>() / inputs.max(1), inputs])?
            }
            _ => x,
        };
        let y = match &self.bias {
            Some(bias) => flat.linear(&self.weight, bias)?,
            None => flat.matmul(&self.weight)?,
        };
        if shape.len() <= 2 {
            return Ok(y);
        }
        let mut out = shape;
        *out.last_mut().expect("3 or more axes") = y.shape()[1];
        y.reshape(&out)
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
    /// GELU, tanh approximation (PyTorch's `nn.GELU(approximate="tanh")`)
    Gelu,
    /// GELU, exact with the error function (PyTorch's `nn.GELU()`, Keras's `gelu`)
    GeluExact,
}

impl ActivationKind {
    /// True for ReLU and both GELUs, whose layers start best from He initialization.
    pub fn is_relu_like(self) -> bool {
        matches!(
            self,
            ActivationKind::Relu | ActivationKind::Gelu | ActivationKind::GeluExact
        )
    }

    /// The name a spec uses: `"relu"`, `"tanh"`, `"sigmoid"`, `"gelu"`, `"gelu_exact"`.
    pub fn name(self) -> &'static str {
        match self {
            ActivationKind::Relu => "relu",
            ActivationKind::Tanh => "tanh",
            ActivationKind::Sigmoid => "sigmoid",
            ActivationKind::Gelu => "gelu",
            ActivationKind::GeluExact => "gelu_exact",
        }
    }
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
            ActivationKind::GeluExact => x.gelu_exact(),
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
