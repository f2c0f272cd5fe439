//! Direct convolution kernels for convolutions with one input channel per group: depthwise ones
//! (MobileNet's, with any channel multiplier) and those of a single input channel (a first layer
//! on grey images). Unrolling their input (`conv.rs`) would copy it `kernel_h · kernel_w` times
//! for products only `kernel_h · kernel_w` deep, so each output cell reads its taps directly.
//! Both gradients gather (no atomics): the input's one thread per input cell, the weight's one
//! block per weight summing in double, so every run gives the same bits.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::kernels::SlidingWindow;
use super::launch::launch;
use crate::error::Result;

/// A convolution of `batch` images with one input channel per group and `mult` output channels
/// per input channel, as the direct kernels take it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Direct {
    /// The window (`channels`: input channels).
    pub win: SlidingWindow,
    /// Images.
    pub batch: i64,
    /// Output channels per input channel.
    pub mult: i32,
}

impl Direct {
    /// `y = conv(x, w)` into `y` (output-shaped).
    pub fn forward(&self, x: &CudaStorage, w: &CudaStorage, y: &mut CudaStorage) -> Result<()> {
        let (cfg, Direct { win, batch, mult }) = (Gpu::elementwise(y.len), *self);
        let (x, w, gpu) = (x.view(), w.view(), y.gpu.clone());
        let mut y = y.view_mut();
        launch!(
            gpu,
            "conv_direct_fwd",
            cfg,
            &batch,
            &win,
            &mult,
            &x,
            &w,
            &mut y
        )
    }

    /// The input's gradient into `dx` (input-shaped), from the output's, `grad`.
    pub fn backward_input(
        &self,
        grad: &CudaStorage,
        w: &CudaStorage,
        dx: &mut CudaStorage,
    ) -> Result<()> {
        let (cfg, Direct { win, batch, mult }) = (Gpu::elementwise(dx.len), *self);
        let (g, w, gpu) = (grad.view(), w.view(), dx.gpu.clone());
        let mut dx = dx.view_mut();
        launch!(
            gpu,
            "conv_direct_bwd_input",
            cfg,
            &batch,
            &win,
            &mult,
            &g,
            &w,
            &mut dx
        )
    }

    /// `dw (=|+=)` the weight's gradient from the input `x` and the output's gradient `grad`.
    pub fn backward_weight(
        &self,
        x: &CudaStorage,
        grad: &CudaStorage,
        dw: &mut CudaStorage,
        accumulate: bool,
    ) -> Result<()> {
        let (cfg, Direct { win, batch, mult }) = (Gpu::block_per_row(dw.len), *self);
        let (x, g, gpu, acc) = (x.view(), grad.view(), dw.gpu.clone(), i32::from(accumulate));
        let mut dw = dw.view_mut();
        launch!(
            gpu,
            "conv_direct_bwd_weight",
            cfg,
            &batch,
            &win,
            &mult,
            &x,
            &g,
            &mut dw,
            &acc
        )
    }
}
