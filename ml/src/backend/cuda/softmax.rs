//! Softmax and log-softmax along an axis, one warp per lane, and their backward pass.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use super::layout::split_at_axis;
use crate::backend::memory::MemoryOps;
use crate::backend::softmax::SoftmaxOps;
use crate::error::Result;

impl SoftmaxOps for CudaStorage {
    fn softmax(&self, axis: usize, log: bool) -> Result<Self> {
        let (outer, len, inner) = split_at_axis(&self.shape, axis);
        let log = log as i32;
        self.launch_new("softmax", &[], &self.shape, |gpu, out| {
            let cfg = Gpu::warp_per_lane((outer * inner) as usize);
            let (x, o) = (self.buf(), out.buf_mut());
            launch!(gpu, "softmax_fwd", cfg, &outer, &len, &inner, &log, x, o)
        })
    }

    /// One kernel, a warp per lane.
    fn softmax_backward(y: &Self, g: &Self, axis: usize, log: bool) -> Result<Self> {
        let (outer, len, inner) = split_at_axis(&y.shape, axis);
        let log = log as i32;
        y.launch_new("softmax backward", &[g.device()], &y.shape, |gpu, out| {
            let cfg = Gpu::warp_per_lane((outer * inner) as usize);
            let (y, g, o) = (y.buf(), g.buf(), out.buf_mut());
            launch!(gpu, "softmax_bwd", cfg, &outer, &len, &inner, &log, y, g, o)
        })
    }
}
