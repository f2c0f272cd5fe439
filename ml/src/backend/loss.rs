//! [`LossOps`]: fused, numerically stable losses and their gradients; and the [`Storage`]
//! methods that dispatch to them.

use super::elementwise::{BinaryOp, UnaryOp};
use super::reduce::ReduceOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;
use crate::shape::numel;

/// Loss kernels. Shapes and class indices were checked by the caller.
pub trait LossOps: ReduceOps {
    /// Mean cross-entropy of `logits` (`[n, classes]`) against class indices `targets` (`[n]`),
    /// and the softmax probabilities the backward pass needs.
    fn cross_entropy(logits: &Self, targets: &Self) -> Result<(Self, Self)>;

    /// Gradient of the mean cross-entropy with respect to the logits, `(p - onehot) · g / n`,
    /// scaled by the one-element `grad` (read on the device: no synchronization).
    fn cross_entropy_backward(probs: &Self, targets: &Self, grad: &Self) -> Result<Self>;

    /// Mean binary cross-entropy with logits. Default: [`bce_with_logits_from_primitives`].
    fn bce_with_logits(logits: &Self, targets: &Self) -> Result<Self> {
        bce_with_logits_from_primitives(logits, targets)
    }

    /// Gradient of [`LossOps::bce_with_logits`] with respect to the logits, scaled by the
    /// one-element `grad`. Default: [`bce_with_logits_backward_from_primitives`].
    fn bce_with_logits_backward(logits: &Self, targets: &Self, grad: &Self) -> Result<Self> {
        bce_with_logits_backward_from_primitives(logits, targets, grad)
    }
}

/// [`LossOps::bce_with_logits`] from elementwise ops and a sum, in the stable form
/// `mean(max(x, 0) - x·z + log(1 + e^-|x|))` (`|x| = max(x, 0) + max(-x, 0)`).
pub fn bce_with_logits_from_primitives<S: ReduceOps>(x: &S, z: &S) -> Result<S> {
    let shape = x.shape().to_vec();
    let positive = x.unary(UnaryOp::Relu)?;
    let negative = x.unary(UnaryOp::Neg)?.unary(UnaryOp::Relu)?;
    let magnitude = positive.binary(BinaryOp::Add, &negative, &shape)?;
    let softplus = magnitude
        .unary(UnaryOp::Neg)?
        .unary(UnaryOp::Exp)?
        .affine(1.0, 1.0)?
        .unary(UnaryOp::Log)?;
    let terms = positive
        .binary(BinaryOp::Sub, &x.binary(BinaryOp::Mul, z, &shape)?, &shape)?
        .binary(BinaryOp::Add, &softplus, &shape)?;
    terms
        .sum(None, false)?
        .affine(1.0 / numel(&shape).max(1) as f32, 0.0)
}

/// [`LossOps::bce_with_logits_backward`] from elementwise ops: `(σ(x) - z) · g / n`.
pub fn bce_with_logits_backward_from_primitives<S: ReduceOps>(x: &S, z: &S, grad: &S) -> Result<S> {
    let shape = x.shape().to_vec();
    x.unary(UnaryOp::Sigmoid)?
        .binary(BinaryOp::Sub, z, &shape)?
        .binary(BinaryOp::Mul, grad, &shape)?
        .affine(1.0 / numel(&shape).max(1) as f32, 0.0)
}

impl Storage {
    /// Mean cross-entropy and the softmax probabilities (targets range-checked by the caller).
    pub fn cross_entropy(logits: &Storage, targets: &Storage) -> Result<(Storage, Storage)> {
        dispatch!("cross_entropy", (x = logits, t = targets) => LossOps::cross_entropy(x, t))
    }

    /// Gradient of the mean cross-entropy with respect to the logits, scaled by the one-element
    /// `grad` (read on the device: no synchronization).
    pub fn cross_entropy_backward(
        probs: &Storage,
        targets: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        dispatch!("cross_entropy backward", (p = probs, t = targets, g = grad) =>
            LossOps::cross_entropy_backward(p, t, g))
    }

    /// Mean binary cross-entropy with logits.
    pub fn bce_with_logits(logits: &Storage, targets: &Storage) -> Result<Storage> {
        dispatch!("binary_cross_entropy_with_logits", (x = logits, z = targets) =>
            LossOps::bce_with_logits(x, z))
    }

    /// Gradient of [`Storage::bce_with_logits`] with respect to the logits, scaled by the
    /// one-element `grad`.
    pub fn bce_with_logits_backward(
        logits: &Storage,
        targets: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        const OP: &str = "binary_cross_entropy_with_logits backward";
        dispatch!(OP, (x = logits, z = targets, g = grad) =>
            LossOps::bce_with_logits_backward(x, z, g))
    }
}
