//! Max and average pooling over NCHW batches, forward and backward: the pooling half of
//! [`ConvOps`](crate::backend::conv::ConvOps) (the trait's `impl` is in `conv.rs`).
//!
//! One thread per output cell forward, one per input cell backward: the backward kernels gather
//! the gradients of the windows that cover their cell instead of scattering with atomics, so
//! overlapping windows sum in a fixed order (the CPU's) and every run gives the same bits.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::kernels::SlidingWindow;
use super::launch::{expect_shape, int, launch};
use crate::backend::conv::Pool2dGeometry;
use crate::backend::memory::MemoryOps;
use crate::error::Result;

/// The kernels' description of `p`, and its number of planes (`batch · channels`), once `p` is
/// checked.
fn window(op: &'static str, p: &Pool2dGeometry) -> Result<(SlidingWindow, i64)> {
    p.check(op)?;
    let [oh, ow] = p.out_size();
    let win = SlidingWindow {
        channels: int(op, p.channels)?,
        in_h: int(op, p.in_size[0])?,
        in_w: int(op, p.in_size[1])?,
        out_h: int(op, oh)?,
        out_w: int(op, ow)?,
        kernel_h: int(op, p.kernel[0])?,
        kernel_w: int(op, p.kernel[1])?,
        stride_h: int(op, p.stride[0])?,
        stride_w: int(op, p.stride[1])?,
        pad_h: int(op, p.padding[0])?,
        pad_w: int(op, p.padding[1])?,
        dil_h: 1,
        dil_w: 1,
    };
    Ok((win, (p.batch * p.channels) as i64))
}

/// Max pooling: the output and each window's winning cell (`h · W + w` in its plane).
pub(super) fn max_pool2d(
    x: &CudaStorage,
    p: &Pool2dGeometry,
) -> Result<(CudaStorage, CudaStorage)> {
    const OP: &str = "max_pool2d";
    let (win, planes) = window(OP, p)?;
    expect_shape(OP, &x.shape, &p.input_shape())?;
    let shape = p.output_shape();
    let mut argmax = x.alloc_like(&shape)?;
    let y = x.launch_new(OP, &[], &shape, |gpu, y| {
        let cfg = Gpu::elementwise(y.len);
        let (x, mut y, mut at) = (x.view(), y.view_mut(), argmax.view_mut());
        launch!(gpu, "max_pool_fwd", cfg, &planes, &win, &x, &mut y, &mut at)
    })?;
    Ok((y, argmax))
}

/// The input's gradient of max pooling: each cell gets the output gradients of the windows it
/// won.
pub(super) fn max_pool2d_backward(
    grad: &CudaStorage,
    argmax: &CudaStorage,
    p: &Pool2dGeometry,
) -> Result<CudaStorage> {
    const OP: &str = "max_pool2d backward";
    let (win, planes) = window(OP, p)?;
    expect_shape(OP, &grad.shape, &p.output_shape())?;
    expect_shape(OP, &argmax.shape, &p.output_shape())?;
    grad.launch_new(OP, &[argmax.device()], &p.input_shape(), |gpu, dx| {
        let cfg = Gpu::elementwise(dx.len);
        let (g, at, mut dx) = (grad.view(), argmax.view(), dx.view_mut());
        launch!(gpu, "max_pool_bwd", cfg, &planes, &win, &g, &at, &mut dx)
    })
}

/// Average pooling, padded cells not counted.
pub(super) fn avg_pool2d(x: &CudaStorage, p: &Pool2dGeometry) -> Result<CudaStorage> {
    const OP: &str = "avg_pool2d";
    let (win, planes) = window(OP, p)?;
    expect_shape(OP, &x.shape, &p.input_shape())?;
    x.launch_new(OP, &[], &p.output_shape(), |gpu, y| {
        let cfg = Gpu::elementwise(y.len);
        let (x, mut y) = (x.view(), y.view_mut());
        launch!(gpu, "avg_pool_fwd", cfg, &planes, &win, &x, &mut y)
    })
}

/// The input's gradient of average pooling: each window's output gradient spread evenly over
/// its counted cells.
pub(super) fn avg_pool2d_backward(grad: &CudaStorage, p: &Pool2dGeometry) -> Result<CudaStorage> {
    const OP: &str = "avg_pool2d backward";
    let (win, planes) = window(OP, p)?;
    expect_shape(OP, &grad.shape, &p.output_shape())?;
    grad.launch_new(OP, &[], &p.input_shape(), |gpu, dx| {
        let cfg = Gpu::elementwise(dx.len);
        let (g, mut dx) = (grad.view(), dx.view_mut());
        launch!(gpu, "avg_pool_bwd", cfg, &planes, &win, &g, &mut dx)
    })
}
