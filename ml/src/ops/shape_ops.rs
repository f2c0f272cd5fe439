//! Layout ops: reshape, transpose/permute, concat, narrow.

use crate::autodiff::{Backward, GradSink, MultiBackward};
use crate::backend::Storage;
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::shape::{numel, resolve_axis};
use crate::tensor::Tensor;

struct ReshapeBackward;

impl Backward for ReshapeBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let x = &inputs[0];
        sink.add(x, g.reshape(x.shape())?)
    }
}

struct PermuteBackward(Vec<usize>);

impl Backward for PermuteBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let mut inverse = vec![0; self.0.len()];
        for (i, &a) in self.0.iter().enumerate() {
            inverse[a] = i;
        }
        sink.add(&inputs[0], g.permute(&inverse)?)
    }
}

struct ConcatBackward(usize);

impl Backward for ConcatBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let mut start = 0;
        for x in inputs {
            let len = x.shape()[self.0];
            if sink.wants(x) {
                sink.add(x, g.narrow(self.0, start, len)?)?;
            }
            start += len;
        }
        Ok(())
    }
}

struct NarrowBackward {
    axis: usize,
    start: usize,
}

impl Backward for NarrowBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let x = &inputs[0];
        let (axis, start) = (self.axis, self.start);
        let total = x.shape()[axis];
        let len = g.shape()[axis];
        let mut parts: Vec<Storage> = Vec::new();
        let zeros_of = |n: usize| {
            let mut shape = x.shape().to_vec();
            shape[axis] = n;
            Storage::zeros(&shape, x.device())
        };
        if start > 0 {
            parts.push(zeros_of(start)?);
        }
        parts.push(g.duplicate()?);
        if start + len < total {
            parts.push(zeros_of(total - start - len)?);
        }
        let refs: Vec<&Storage> = parts.iter().collect();
        sink.add(x, Storage::concat(&refs, axis)?)
    }
}

/// The gradients of a tensor's parts along axis 0 (`sizes` rows each), concatenated back (zeros
/// for a part that got none).
struct SplitBackward {
    sizes: Vec<usize>,
}

impl MultiBackward for SplitBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        grads: &[Option<Storage>],
        sink: &mut GradSink,
    ) -> Result<()> {
        let x = &inputs[0];
        let zeros: Vec<Storage> = grads
            .iter()
            .zip(&self.sizes)
            .filter(|(g, _)| g.is_none())
            .map(|(_, &rows)| {
                let mut shape = x.shape().to_vec();
                shape[0] = rows;
                Storage::zeros(&shape, x.device())
            })
            .collect::<Result<_>>()?;
        let mut fill = zeros.iter();
        let parts: Vec<&Storage> = grads
            .iter()
            .filter_map(|g| g.as_ref().or_else(|| fill.next()))
            .collect();
        sink.add(x, Storage::concat(&parts, 0)?)
    }
}

impl Tensor {
    /// The same elements in a new shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(MlError::ShapeMismatch {
                op: "reshape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
                reason: "have different element counts",
            });
        }
        let out = self.read().reshape(shape)?;
        Ok(Tensor::from_op(out, &[self], ReshapeBackward))
    }

    /// The axes reordered: axis `i` of the result is axis `axes[i]` of `self`.
    pub fn permute(&self, axes: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        let valid = axes.len() == self.rank()
            && axes
                .iter()
                .all(|&a| a < seen.len() && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(MlError::invalid(
                "permute",
                format!(
                    "{axes:?} is not a permutation of the {} axes of shape {:?}",
                    self.rank(),
                    self.shape()
                ),
            ));
        }
        let out = self.read().permute(axes)?;
        Ok(Tensor::from_op(
            out,
            &[self],
            PermuteBackward(axes.to_vec()),
        ))
    }

    /// Swaps two axes (negative counts from the end); `x.transpose(0, 1)` for a matrix.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let a = resolve_axis("transpose", a, self.rank())?;
        let b = resolve_axis("transpose", b, self.rank())?;
        let mut axes: Vec<usize> = (0..self.rank()).collect();
        axes.swap(a, b);
        self.permute(&axes)
    }

    /// Joins tensors along `axis`; all other dimensions must agree.
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| MlError::invalid("concat", "needs at least one tensor"))?;
        same_device("concat", tensors)?;
        let axis = resolve_axis("concat", axis, first.rank())?;
        for t in &tensors[1..] {
            let agree = t.rank() == first.rank()
                && (0..t.rank()).all(|d| d == axis || t.shape()[d] == first.shape()[d]);
            if !agree {
                return Err(MlError::ShapeMismatch {
                    op: "concat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    reason: "differ outside the concatenation axis",
                });
            }
        }
        let guards: Vec<_> = tensors.iter().map(|t| t.read()).collect();
        let refs: Vec<&Storage> = guards.iter().map(|g| &**g).collect();
        let out = Storage::concat(&refs, axis)?;
        drop(guards);
        Ok(Tensor::from_op(out, tensors, ConcatBackward(axis)))
    }

    /// The slice `start..start + len` along `axis`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let axis = resolve_axis("narrow", axis, self.rank())?;
        if start
            .checked_add(len)
            .is_none_or(|end| end > self.shape()[axis])
        {
            return Err(MlError::invalid(
                "narrow",
                format!(
                    "{start}..{start}+{len} is outside axis {axis} of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let out = self.read().narrow(axis, start, len)?;
        Ok(Tensor::from_op(
            out,
            &[self],
            NarrowBackward { axis, start },
        ))
    }

    /// `self` cut along axis 0 into consecutive parts of `sizes` rows, which must add up to its
    /// first axis (PyTorch's `split` with a list of sizes): a recurrent layer's projected inputs,
    /// one part per step. One op for all the parts, whose backward pass concatenates their
    /// gradients once.
    pub fn split(&self, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let rows = self.shape().first().copied();
        if rows != Some(sizes.iter().sum()) {
            return Err(MlError::invalid(
                "split",
                format!(
                    "parts of {sizes:?} rows do not add up to axis 0 of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let x = self.read();
        let mut start = 0;
        let mut parts = Vec::with_capacity(sizes.len());
        for &len in sizes {
            parts.push(x.narrow(0, start, len)?);
            start += len;
        }
        drop(x);
        let backward = SplitBackward {
            sizes: sizes.to_vec(),
        };
        Tensor::from_multi_op(parts, &[self], backward)
    }
}
