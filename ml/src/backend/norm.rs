//! [`NormOps`]: per-channel passes over `[batch, channels, ...]` tensors: batch normalization,
//! forward and backward, and the per-channel sum (a convolution's bias gradient); and the
//! [`Storage`] methods that dispatch to them.
//!
//! Every method has a default built from elementwise ops and axis sums
//! ([`batch_norm_stats_from_primitives`], ...), so a backend needs no kernel of its own; the CPU
//! (`cpu/norm.rs`) and CUDA (`cuda/norm.rs`) override them with fused per-channel passes. A
//! channel's elements are every element with that index on axis 1:
//! `M = batch · (product of the axes after 1)` of them.

use super::elementwise::{BinaryOp, UnaryOp};
use super::reduce::ReduceOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// Per-channel normalization kernels. `x` is `[batch, channels, ...]` with at least two axes,
/// and the per-channel operands are `[channels]` (all checked by the caller).
pub trait NormOps: ReduceOps {
    /// The sum of each channel's elements, `[channels]` (a convolution's bias gradient).
    /// Default: [`channel_sum_from_primitives`].
    fn channel_sum(x: &Self) -> Result<Self> {
        channel_sum_from_primitives(x)
    }

    /// The per-channel mean and biased variance (`Σ (x − mean)² / M`), `[channels]` each.
    /// Default: [`batch_norm_stats_from_primitives`].
    fn batch_norm_stats(x: &Self) -> Result<(Self, Self)> {
        batch_norm_stats_from_primitives(x)
    }

    /// `(x − mean) / √(var + eps) · gamma + beta`, per channel. Default:
    /// [`batch_norm_from_primitives`].
    fn batch_norm(
        x: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        beta: &Self,
        eps: f32,
    ) -> Result<Self> {
        batch_norm_from_primitives(x, mean, var, gamma, beta, eps)
    }

    /// The gradients `(dx, dgamma, dbeta)` of [`NormOps::batch_norm`] from the output's gradient
    /// `grad`. With `batch_stats`, `mean` and `var` are the batch's own statistics and the input
    /// gradient flows through them too (training mode); otherwise they are constants (evaluation
    /// with running statistics). Default: [`batch_norm_backward_from_primitives`].
    fn batch_norm_backward(
        x: &Self,
        grad: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        eps: f32,
        batch_stats: bool,
    ) -> Result<(Self, Self, Self)> {
        batch_norm_backward_from_primitives(x, grad, mean, var, gamma, eps, batch_stats)
    }
}

/// `[batch, channels, rest]`: `x`'s shape with the axes after 1 merged (1 if there are none).
fn channel_view(shape: &[usize]) -> [usize; 3] {
    [shape[0], shape[1], shape[2..].iter().product()]
}

/// The per-channel sum of a `[batch, channels, rest]` tensor, as `[1, channels, 1]`.
fn channel_sum<S: ReduceOps>(x: &S) -> Result<S> {
    x.sum(Some(2), true)?.sum(Some(0), true)
}

/// A `[channels]` operand as `[1, channels, 1]`, to broadcast against `[batch, channels, rest]`.
fn per_channel<S: ReduceOps>(v: &S) -> Result<S> {
    v.reshape(&[1, v.shape()[0], 1])
}

/// [`NormOps::channel_sum`] as two axis sums.
pub fn channel_sum_from_primitives<S: ReduceOps>(x: &S) -> Result<S> {
    channel_sum(&x.reshape(&channel_view(x.shape()))?)?.reshape(&[x.shape()[1]])
}

/// [`NormOps::batch_norm_stats`] as axis sums: the mean, then the mean of squared deviations.
pub fn batch_norm_stats_from_primitives<S: ReduceOps>(x: &S) -> Result<(S, S)> {
    let view = channel_view(x.shape());
    let count = (view[0] * view[2]).max(1) as f32;
    let x3 = x.reshape(&view)?;
    let mean = channel_sum(&x3)?.affine(1.0 / count, 0.0)?;
    let centered = x3.binary(BinaryOp::Sub, &mean, &view)?;
    let var = channel_sum(&centered.unary(UnaryOp::Square)?)?.affine(1.0 / count, 0.0)?;
    Ok((mean.reshape(&[view[1]])?, var.reshape(&[view[1]])?))
}

/// `(x − mean) / √(var + eps)` in `[batch, channels, rest]` layout, and `√(var + eps)` as
/// `[1, channels, 1]`.
fn normalized<S: ReduceOps>(x: &S, mean: &S, var: &S, eps: f32) -> Result<(S, S)> {
    let view = channel_view(x.shape());
    let std = per_channel(var)?.affine(1.0, eps)?.unary(UnaryOp::Sqrt)?;
    let centered = x
        .reshape(&view)?
        .binary(BinaryOp::Sub, &per_channel(mean)?, &view)?;
    Ok((centered.binary(BinaryOp::Div, &std, &view)?, std))
}

/// [`NormOps::batch_norm`] as broadcasting elementwise ops.
pub fn batch_norm_from_primitives<S: ReduceOps>(
    x: &S,
    mean: &S,
    var: &S,
    gamma: &S,
    beta: &S,
    eps: f32,
) -> Result<S> {
    let view = channel_view(x.shape());
    let (xhat, _) = normalized(x, mean, var, eps)?;
    xhat.binary(BinaryOp::Mul, &per_channel(gamma)?, &view)?
        .binary(BinaryOp::Add, &per_channel(beta)?, &view)?
        .reshape(x.shape())
}

/// [`NormOps::batch_norm_backward`] as broadcasting elementwise ops and axis sums:
/// `dbeta = Σ dy`, `dgamma = Σ dy·x̂`, and `dx = γ/σ · (dy − dbeta/M − x̂ · dgamma/M)` with batch
/// statistics, `γ/σ · dy` without.
pub fn batch_norm_backward_from_primitives<S: ReduceOps>(
    x: &S,
    grad: &S,
    mean: &S,
    var: &S,
    gamma: &S,
    eps: f32,
    batch_stats: bool,
) -> Result<(S, S, S)> {
    let view = channel_view(x.shape());
    let channels = [view[1]];
    let (xhat, std) = normalized(x, mean, var, eps)?;
    let dy = grad.reshape(&view)?;
    let dbeta = channel_sum(&dy)?;
    let dgamma = channel_sum(&dy.binary(BinaryOp::Mul, &xhat, &view)?)?;
    let scale = per_channel(gamma)?.binary(BinaryOp::Div, &std, &[1, view[1], 1])?;
    let dy = if batch_stats {
        let count = (view[0] * view[2]).max(1) as f32;
        let shift = dbeta.affine(1.0 / count, 0.0)?;
        let slope = dgamma.affine(1.0 / count, 0.0)?;
        dy.binary(BinaryOp::Sub, &shift, &view)?.binary(
            BinaryOp::Sub,
            &xhat.binary(BinaryOp::Mul, &slope, &view)?,
            &view,
        )?
    } else {
        dy
    };
    let dx = dy
        .binary(BinaryOp::Mul, &scale, &view)?
        .reshape(x.shape())?;
    Ok((dx, dgamma.reshape(&channels)?, dbeta.reshape(&channels)?))
}

impl Storage {
    /// The sum of each channel's elements of a `[batch, channels, ...]` tensor, `[channels]`.
    pub fn channel_sum(x: &Storage) -> Result<Storage> {
        dispatch!((x = x) => NormOps::channel_sum(x))
    }

    /// The per-channel mean and biased variance of a `[batch, channels, ...]` tensor.
    pub fn batch_norm_stats(x: &Storage) -> Result<(Storage, Storage)> {
        dispatch!((x = x) => NormOps::batch_norm_stats(x))
    }

    /// `(x − mean) / √(var + eps) · gamma + beta`, per channel.
    pub fn batch_norm(
        x: &Storage,
        mean: &Storage,
        var: &Storage,
        gamma: &Storage,
        beta: &Storage,
        eps: f32,
    ) -> Result<Storage> {
        dispatch!("batch_norm", (x = x, m = mean, v = var, g = gamma, b = beta) =>
            NormOps::batch_norm(x, m, v, g, b, eps))
    }

    /// `(dx, dgamma, dbeta)` of [`Storage::batch_norm`]; see [`NormOps::batch_norm_backward`].
    pub fn batch_norm_backward(
        x: &Storage,
        grad: &Storage,
        mean: &Storage,
        var: &Storage,
        gamma: &Storage,
        eps: f32,
        batch_stats: bool,
    ) -> Result<(Storage, Storage, Storage)> {
        dispatch!("batch_norm backward", (x = x, d = grad, m = mean, v = var, g = gamma) =>
            NormOps::batch_norm_backward(x, d, m, v, g, eps, batch_stats))
    }
}
