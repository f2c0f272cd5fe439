//! Sums and means over all elements or one axis.

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
use crate::error::Result;
use crate::shape::resolve_axis;
use crate::tensor::Tensor;

/// Backward of a sum (scaled by `scale`, 1/n for a mean): spreads the gradient back over the
/// reduced elements.
struct SumBackward {
    axis: Option<usize>,
    keepdim: bool,
    scale: f32,
}

impl Backward for SumBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let x = &inputs[0];
        let spread = match self.axis {
            None => g.broadcast_to(x.shape())?,
            Some(axis) => g.expand_axis(axis, x.shape()[axis], self.keepdim)?,
        };
        let spread = if self.scale == 1.0 {
            spread
        } else {
            spread.affine(self.scale, 0.0)?
        };
        sink.add(x, spread)
    }
}

impl Tensor {
    fn reduce(
        &self,
        axis: Option<isize>,
        keepdim: bool,
        mean: bool,
        name: &'static str,
    ) -> Result<Tensor> {
        let axis = match axis {
            Some(a) => Some(resolve_axis(name, a, self.rank())?),
            None => None,
        };
        let count = match axis {
            Some(a) => self.shape()[a],
            None => self.numel(),
        };
        let scale = if mean { 1.0 / count.max(1) as f32 } else { 1.0 };
        let mut out = self.read().sum(axis, keepdim)?;
        if mean {
            out.scale(scale)?;
        }
        Ok(Tensor::from_op(
            out,
            &[self],
            SumBackward {
                axis,
                keepdim,
                scale,
            },
        ))
    }

    /// The sum of all elements, as a 0-dimensional tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce(None, false, false, "sum")
    }

    /// The mean of all elements, as a 0-dimensional tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce(None, false, true, "mean")
    }

    /// The sum along `axis` (negative counts from the end), keeping it as size 1 if `keepdim`.
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(Some(axis), keepdim, false, "sum")
    }

    /// The mean along `axis` (negative counts from the end), keeping it as size 1 if `keepdim`.
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(Some(axis), keepdim, true, "mean")
    }
}
