//! Softmax and log-softmax along an axis.

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
use crate::error::Result;
use crate::shape::resolve_axis;
use crate::tensor::Tensor;

struct SoftmaxBackward {
    axis: usize,
    log: bool,
}

impl Backward for SoftmaxBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        out: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let gx = Storage::softmax_backward(&out.read(), g, self.axis, self.log)?;
        sink.add(&inputs[0], gx)
    }
}

impl Tensor {
    fn softmax_impl(&self, axis: isize, log: bool) -> Result<Tensor> {
        let axis = resolve_axis(
            if log { "log_softmax" } else { "softmax" },
            axis,
            self.rank(),
        )?;
        let out = self.read().softmax(axis, log)?;
        Ok(Tensor::from_op(out, &[self], SoftmaxBackward { axis, log }))
    }

    /// `exp(x) / Σ exp(x)` along `axis` (negative counts from the end), computed stably.
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_impl(axis, false)
    }

    /// `x - log Σ exp(x)` along `axis`, computed stably.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_impl(axis, true)
    }
}
