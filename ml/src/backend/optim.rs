//! [`OptimOps`]: in-place optimizer updates with PyTorch's formulas (`torch.optim`); and the
//! [`Storage`] methods that dispatch to them.
//!
//! Every update has a default built from elementwise kernels, a pass over memory per term; the
//! CPU and CUDA backends override each with one fused pass.

use super::elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
use super::matmul::{MatmulOps, MatmulOptions};
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// Hyper-parameters of one SGD step.
#[derive(Clone, Copy, Debug)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (0 disables the buffer).
    pub momentum: f32,
    /// Dampening of the momentum's gradient term.
    pub dampening: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// True on the first step, when the momentum buffer is initialized with the gradient.
    pub first: bool,
}

impl SgdStep {
    /// A step without momentum or weight decay at learning rate `lr`: `p -= lr · g`.
    pub fn plain(lr: f32) -> Self {
        SgdStep {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            first: false,
        }
    }
}

/// Hyper-parameters of one Adagrad step.
#[derive(Clone, Copy, Debug)]
pub struct AdagradStep {
    /// Learning rate.
    pub lr: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

/// Hyper-parameters of one Adam or AdamW step.
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// L2 penalty (Adam) or decoupled decay (AdamW).
    pub weight_decay: f32,
    /// Decoupled weight decay (AdamW) instead of an L2 term in the gradient (Adam).
    pub decoupled: bool,
    /// The 1-based step number, for bias correction.
    pub step: u64,
}

impl AdamStep {
    /// `(lr / (1 - β₁ᵗ), √(1 - β₂ᵗ))`: the step size and the square root of the second moment's
    /// bias correction, computed on the host once per step by every backend alike.
    pub fn bias_corrections(&self) -> (f32, f32) {
        let bc1 = 1.0 - self.beta1.powi(self.step as i32);
        let bc2 = 1.0 - self.beta2.powi(self.step as i32);
        (self.lr / bc1, bc2.sqrt())
    }
}

/// Optimizer updates of a parameter `p` from its gradient `g` and state buffers, in place.
pub trait OptimOps: ElementwiseOps {
    /// One SGD step, with the momentum buffer when there is one. Default:
    /// [`sgd_from_primitives`].
    fn sgd_update(
        p: &mut Self,
        g: &Self,
        momentum: Option<&mut Self>,
        step: SgdStep,
    ) -> Result<()> {
        sgd_from_primitives(p, g, momentum, step)
    }

    /// One Adagrad step with accumulator `acc`. Default: [`adagrad_from_primitives`].
    fn adagrad_update(p: &mut Self, g: &Self, acc: &mut Self, step: AdagradStep) -> Result<()> {
        adagrad_from_primitives(p, g, acc, step)
    }

    /// One Adam or AdamW step with moments `m` and `v`. Default: [`adam_from_primitives`].
    fn adam_update(
        p: &mut Self,
        g: &Self,
        m: &mut Self,
        v: &mut Self,
        step: AdamStep,
    ) -> Result<()> {
        adam_from_primitives(p, g, m, v, step)
    }

    /// One plain SGD step (no momentum, no weight decay) for a 2-D weight `p` whose gradient is
    /// the product `op_a(a) · op_b(b)`: `p -= lr · op_a(a) · op_b(b)` without storing the
    /// gradient, rounded as [`OptimOps::sgd_update`] rounds the stored one. Default:
    /// [`sgd_product_from_primitives`]; the CPU backend writes the product onto `p` from its
    /// GEMM's registers.
    fn sgd_product_update(
        p: &mut Self,
        (a, transpose_a): (&Self, bool),
        (b, transpose_b): (&Self, bool),
        lr: f32,
    ) -> Result<()>
    where
        Self: MatmulOps,
    {
        sgd_product_from_primitives(p, (a, transpose_a), (b, transpose_b), lr)
    }
}

/// [`OptimOps::sgd_product_update`] as the product into a new array of `p`'s shape, then
/// [`OptimOps::sgd_update`] from it.
pub fn sgd_product_from_primitives<S: OptimOps + MatmulOps>(
    p: &mut S,
    (a, transpose_a): (&S, bool),
    (b, transpose_b): (&S, bool),
    lr: f32,
) -> Result<()> {
    let mut g = p.duplicate()?;
    S::matmul_into(
        &mut g,
        (a, b),
        MatmulOptions::transposed(transpose_a, transpose_b),
    )?;
    S::sgd_update(p, &g, None, SgdStep::plain(lr))
}

/// `g + weight_decay · p`, the gradient with its L2 term.
fn with_weight_decay<S: ElementwiseOps>(p: &S, g: &S, weight_decay: f32) -> Result<S> {
    g.binary(BinaryOp::Add, &p.affine(weight_decay, 0.0)?, p.shape())
}

/// [`OptimOps::sgd_update`] from elementwise ops: `d = g + λp`; `b = d` on the first step, else
/// `b = μb + (1 - τ)d`; `p -= lr · (d + μb)` with Nesterov momentum, `p -= lr · b` without, and
/// `p -= lr · d` without a buffer.
pub fn sgd_from_primitives<S: ElementwiseOps>(
    p: &mut S,
    g: &S,
    momentum: Option<&mut S>,
    s: SgdStep,
) -> Result<()> {
    let d = with_weight_decay(p, g, s.weight_decay)?;
    let direction = match momentum {
        None => d,
        Some(b) => {
            if s.first {
                b.fill(0.0)?;
                b.add_assign(&d)?;
            } else {
                b.scale(s.momentum)?;
                b.add_assign(&d.affine(1.0 - s.dampening, 0.0)?)?;
            }
            if s.nesterov {
                d.binary(BinaryOp::Add, &b.affine(s.momentum, 0.0)?, p.shape())?
            } else {
                b.duplicate()?
            }
        }
    };
    p.add_assign(&direction.affine(-s.lr, 0.0)?)
}

/// [`OptimOps::adagrad_update`] from elementwise ops: `d = g + λp; acc += d²;
/// p -= lr · d / (√acc + ε)`.
pub fn adagrad_from_primitives<S: ElementwiseOps>(
    p: &mut S,
    g: &S,
    acc: &mut S,
    s: AdagradStep,
) -> Result<()> {
    let d = with_weight_decay(p, g, s.weight_decay)?;
    acc.add_assign(&d.unary(UnaryOp::Square)?)?;
    let denom = acc.unary(UnaryOp::Sqrt)?.affine(1.0, s.eps)?;
    let step = d.binary(BinaryOp::Div, &denom, p.shape())?;
    p.add_assign(&step.affine(-s.lr, 0.0)?)
}

/// [`OptimOps::adam_update`] from elementwise ops: `p *= 1 - lr·λ` (AdamW) or `d = g + λp`
/// (Adam); `m = β₁m + (1 - β₁)d; v = β₂v + (1 - β₂)d²;
/// p -= lr / (1 - β₁ᵗ) · m / (√v / √(1 - β₂ᵗ) + ε)`.
pub fn adam_from_primitives<S: ElementwiseOps>(
    p: &mut S,
    g: &S,
    m: &mut S,
    v: &mut S,
    s: AdamStep,
) -> Result<()> {
    let (step_size, bc2_sqrt) = s.bias_corrections();
    let decayed;
    let d = if s.decoupled {
        p.scale(1.0 - s.lr * s.weight_decay)?;
        g
    } else {
        decayed = with_weight_decay(p, g, s.weight_decay)?;
        &decayed
    };
    m.scale(s.beta1)?;
    m.add_assign(&d.affine(1.0 - s.beta1, 0.0)?)?;
    v.scale(s.beta2)?;
    v.add_assign(&d.unary(UnaryOp::Square)?.affine(1.0 - s.beta2, 0.0)?)?;
    let denom = v.unary(UnaryOp::Sqrt)?.affine(1.0 / bc2_sqrt, s.eps)?;
    let step = m.binary(BinaryOp::Div, &denom, p.shape())?;
    p.add_assign(&step.affine(-step_size, 0.0)?)
}

impl Storage {
    /// One SGD step on parameter `p` from gradient `g`, with the momentum buffer when there is
    /// one.
    pub fn sgd_update(
        p: &mut Storage,
        g: &Storage,
        momentum: Option<&mut Storage>,
        step: SgdStep,
    ) -> Result<()> {
        match momentum {
            None => dispatch!("optimizer step", (p = p, g = g) =>
                OptimOps::sgd_update(p, g, None, step)),
            Some(b) => dispatch!("optimizer step", (p = p, g = g, b = b) =>
                OptimOps::sgd_update(p, g, Some(b), step)),
        }
    }

    /// One plain SGD step for a 2-D weight whose gradient is `op_a(a) · op_b(b)`:
    /// `p -= lr · op_a(a) · op_b(b)`, the gradient never stored (shapes checked by the caller).
    pub fn sgd_product_update(
        p: &mut Storage,
        (a, transpose_a): (&Storage, bool),
        (b, transpose_b): (&Storage, bool),
        lr: f32,
    ) -> Result<()> {
        dispatch!("optimizer step", (p = p, a = a, b = b) =>
            OptimOps::sgd_product_update(p, (a, transpose_a), (b, transpose_b), lr))
    }

    /// One Adagrad step on `p` with accumulator `acc`.
    pub fn adagrad_update(
        p: &mut Storage,
        g: &Storage,
        acc: &mut Storage,
        step: AdagradStep,
    ) -> Result<()> {
        dispatch!("optimizer step", (p = p, g = g, a = acc) =>
            OptimOps::adagrad_update(p, g, a, step))
    }

    /// One Adam or AdamW step on `p` with moments `m` and `v`.
    pub fn adam_update(
        p: &mut Storage,
        g: &Storage,
        m: &mut Storage,
        v: &mut Storage,
        step: AdamStep,
    ) -> Result<()> {
        dispatch!("optimizer step", (p = p, g = g, m = m, v = v) =>
            OptimOps::adam_update(p, g, m, v, step))
    }
}
