//! [`SoftmaxOps`]: softmax and log-softmax along an axis and their backward pass; and the
//! [`Storage`] methods that dispatch to them.

use super::elementwise::{BinaryOp, UnaryOp};
use super::reduce::ReduceOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// Softmax kernels (the axis was checked by the caller).
pub trait SoftmaxOps: ReduceOps {
    /// Softmax (or log-softmax) along `axis`, computed stably.
    fn softmax(&self, axis: usize, log: bool) -> Result<Self>;

    /// Backward of softmax (or log-softmax) from its output `y`. Default:
    /// [`softmax_backward_from_primitives`].
    fn softmax_backward(y: &Self, grad: &Self, axis: usize, log: bool) -> Result<Self> {
        softmax_backward_from_primitives(y, grad, axis, log)
    }
}

/// [`SoftmaxOps::softmax_backward`] from elementwise ops and an axis sum: `y · (g - Σ g·y)` for
/// softmax, `g - exp(y) · Σ g` for log-softmax.
pub fn softmax_backward_from_primitives<S: ReduceOps>(
    y: &S,
    grad: &S,
    axis: usize,
    log: bool,
) -> Result<S> {
    let shape = y.shape().to_vec();
    if log {
        let total = grad.sum(Some(axis), true)?;
        let spread = y
            .unary(UnaryOp::Exp)?
            .binary(BinaryOp::Mul, &total, &shape)?;
        grad.binary(BinaryOp::Sub, &spread, &shape)
    } else {
        let dot = grad
            .binary(BinaryOp::Mul, y, &shape)?
            .sum(Some(axis), true)?;
        let centered = grad.binary(BinaryOp::Sub, &dot, &shape)?;
        y.binary(BinaryOp::Mul, &centered, &shape)
    }
}

impl Storage {
    /// Softmax (or log-softmax) along `axis`.
    pub fn softmax(&self, axis: usize, log: bool) -> Result<Storage> {
        dispatch!((x = self) => SoftmaxOps::softmax(x, axis, log))
    }

    /// Backward of softmax (or log-softmax) from its output `y`.
    pub fn softmax_backward(
        y: &Storage,
        grad: &Storage,
        axis: usize,
        log: bool,
    ) -> Result<Storage> {
        dispatch!("softmax backward", (y = y, g = grad) =>
            SoftmaxOps::softmax_backward(y, g, axis, log))
    }
}
