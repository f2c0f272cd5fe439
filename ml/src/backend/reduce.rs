//! [`ReduceOps`]: sums over all elements, one axis or the dimensions broadcasting expanded, and
//! the repetition that undoes an axis sum; and the [`Storage`] methods that dispatch to them.

use super::elementwise::ElementwiseOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// Reduction kernels. Axes and shapes were checked by the caller.
pub trait ReduceOps: ElementwiseOps {
    /// The sum of all elements (0-dimensional) or along `axis`, keeping it as a dimension of
    /// size 1 when `keepdim`.
    fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Self>;

    /// The sum of squares of all elements, accumulated in f64 (for gradient norms; waits for the
    /// device).
    fn sum_squares(&self) -> Result<f64>;

    /// Sums `self` over its broadcast dimensions into `dst` (adding when `accumulate`). Default:
    /// [`sum_to_shape_from_primitives`].
    fn sum_to_shape_into(&self, dst: &mut Self, accumulate: bool) -> Result<()> {
        sum_to_shape_from_primitives(self, dst, accumulate)
    }

    /// Repeats a reduced tensor along `axis` to length `len` (the backward of an axis sum).
    /// Default: [`expand_axis_from_primitives`].
    fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<Self> {
        expand_axis_from_primitives(self, axis, len, keepdim)
    }
}

/// [`ReduceOps::sum_to_shape_into`] as axis sums: the leading dimensions `x` has beyond `dst`'s
/// are summed away, then every dimension where `dst` has size 1 and `x` has not; the result is
/// added to `dst` (or replaces it).
pub fn sum_to_shape_from_primitives<S: ReduceOps>(
    x: &S,
    dst: &mut S,
    accumulate: bool,
) -> Result<()> {
    let target = dst.shape().to_vec();
    let mut reduced: Option<S> = None;
    for _ in target.len()..x.shape().len() {
        let next = reduced.as_ref().unwrap_or(x).sum(Some(0), false)?;
        reduced = Some(next);
    }
    for (axis, &size) in target.iter().enumerate() {
        let current = reduced.as_ref().unwrap_or(x);
        if size == 1 && current.shape()[axis] != 1 {
            reduced = Some(current.sum(Some(axis), true)?);
        }
    }
    if !accumulate {
        dst.fill(0.0)?;
    }
    dst.add_assign(reduced.as_ref().unwrap_or(x))
}

/// [`ReduceOps::expand_axis`] as a broadcast of the reduced tensor, its axis reinserted with
/// size 1 when it was dropped.
pub fn expand_axis_from_primitives<S: ReduceOps>(
    x: &S,
    axis: usize,
    len: usize,
    keepdim: bool,
) -> Result<S> {
    let mut source = x.shape().to_vec();
    if !keepdim {
        source.insert(axis, 1);
    }
    let mut shape = source.clone();
    shape[axis] = len;
    if keepdim {
        x.broadcast_to(&shape)
    } else {
        x.reshape(&source)?.broadcast_to(&shape)
    }
}

impl Storage {
    /// The sum of all elements (0-dimensional) or along `axis`.
    pub fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Storage> {
        dispatch!((x = self) => ReduceOps::sum(x, axis, keepdim))
    }

    /// The sum of squares of all elements.
    pub fn sum_squares(&self) -> Result<f64> {
        dispatch!((x = self) => ReduceOps::sum_squares(x))
    }

    /// Sums `self` over its broadcast dimensions into `dst` (adding when `accumulate`).
    pub fn sum_to_shape_into(&self, dst: &mut Storage, accumulate: bool) -> Result<()> {
        dispatch!("broadcast reduction", (x = self, d = dst) =>
            ReduceOps::sum_to_shape_into(x, d, accumulate))
    }

    /// Repeats a reduced tensor along `axis` to length `len` (backward of an axis sum).
    pub fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<Storage> {
        dispatch!((x = self) => ReduceOps::expand_axis(x, axis, len, keepdim))
    }
}
