//! Differentiable operations on [`Tensor`]s.
//!
//! Each file holds one family of ops: the forward computation (a [`Storage`] kernel) and the
//! [`Backward`] implementation that knows its derivative. They are methods on `Tensor`, as in
//! PyTorch: `x.matmul(&w)?.add(&b)?.relu()?`.
//!
//! [`Storage`]: crate::backend::Storage
//! [`Backward`]: crate::autodiff

mod arith;
mod conv;
mod dropout;
mod index;
mod matmul;
mod norm;
mod pool;
mod recurrent;
mod reduce;
mod shape_ops;
mod softmax;
mod unary;

pub use conv::Conv2dOptions;
pub use norm::{BatchNormMode, BatchStats};
pub use pool::Pool2dOptions;

use crate::device::mixed_devices;
use crate::error::{MlError, Result};
use crate::tensor::Tensor;

/// Fails unless every tensor is on the same device.
pub(crate) fn same_device(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    if let Some(first) = tensors.first() {
        for t in &tensors[1..] {
            if t.device() != first.device() {
                return Err(mixed_devices(op, &[first.device(), t.device()]));
            }
        }
    }
    Ok(())
}

/// Checks that every element of an index tensor is an integer in `0..limit`.
pub(crate) fn check_indices(
    op: &'static str,
    what: &str,
    indices: &Tensor,
    limit: usize,
) -> Result<()> {
    if indices
        .index_limit()
        .is_some_and(|checked| checked <= limit)
    {
        return Ok(());
    }
    for (i, &v) in indices.to_vec().iter().enumerate() {
        if !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < limit) {
            return Err(MlError::invalid(
                op,
                format!("{what} {v} at position {i} is not an integer in 0..{limit}"),
            ));
        }
    }
    Ok(())
}
