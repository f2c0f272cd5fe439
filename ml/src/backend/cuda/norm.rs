//! The per-channel sum in one kernel (one block per channel, in double), and batch
//! normalization in fused per-channel kernels ([`NormOps`]'s overrides): the statistics
//! in one read of the input, one block per channel summing in double; the normalization in one
//! elementwise pass; the backward pass as one per-channel reduction (`Σ dy`, `Σ dy·(x − mean)`,
//! and the coefficients of the input's gradient) and one elementwise pass. The arithmetic is the
//! CPU's (`cpu/norm.rs`), so the two agree to rounding; in place of the defaults' dozen kernels
//! and temporaries, two kernels per pass and one temporary of three floats per channel.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use crate::backend::memory::MemoryOps;
use crate::backend::norm::NormOps;
use crate::error::Result;

/// `[batch, channels, rest]`: the shape with the axes after 1 merged, as kernel arguments.
fn channel_view(shape: &[usize]) -> [i64; 3] {
    [shape[0], shape[1], shape[2..].iter().product()].map(|d| d as i64)
}

impl NormOps for CudaStorage {
    /// One block per channel.
    fn channel_sum(x: &Self) -> Result<Self> {
        let [batch, channels, rest] = channel_view(&x.shape);
        x.launch_new("channel_sum", &[], &[x.shape[1]], |gpu, out| {
            let cfg = Gpu::block_per_row(channels as usize);
            let (x, mut out) = (x.view(), out.view_mut());
            launch!(
                gpu,
                "channel_sum",
                cfg,
                &batch,
                &channels,
                &rest,
                &x,
                &mut out
            )
        })
    }

    /// One block per channel.
    fn batch_norm_stats(x: &Self) -> Result<(Self, Self)> {
        let [batch, channels, rest] = channel_view(&x.shape);
        let mut var = x.alloc_like(&[x.shape[1]])?;
        let mean = x.launch_new("batch_norm", &[], &[x.shape[1]], |gpu, mean| {
            let cfg = Gpu::block_per_row(channels as usize);
            let (x, mut mean, mut var) = (x.view(), mean.view_mut(), var.view_mut());
            launch!(
                gpu, "bn_stats", cfg, &batch, &channels, &rest, &x, &mut mean, &mut var
            )
        })?;
        Ok((mean, var))
    }

    /// One elementwise pass.
    fn batch_norm(
        x: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        beta: &Self,
        eps: f32,
    ) -> Result<Self> {
        let [_, channels, rest] = channel_view(&x.shape);
        let operands = [mean.device(), var.device(), gamma.device(), beta.device()];
        x.launch_new("batch_norm", &operands, &x.shape, |gpu, out| {
            let (n, cfg) = (out.n(), Gpu::elementwise(out.len));
            let (x, m, v) = (x.view(), mean.view(), var.view());
            let (g, b, mut out) = (gamma.view(), beta.view(), out.view_mut());
            launch!(
                gpu,
                "bn_forward",
                cfg,
                &n,
                &channels,
                &rest,
                &x,
                &m,
                &v,
                &g,
                &b,
                &eps,
                &mut out
            )
        })
    }

    /// A per-channel reduction, then one elementwise pass.
    fn batch_norm_backward(
        x: &Self,
        grad: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        eps: f32,
        batch_stats: bool,
    ) -> Result<(Self, Self, Self)> {
        const OP: &str = "batch_norm backward";
        let [batch, channels, rest] = channel_view(&x.shape);
        let operands = [grad.device(), mean.device(), var.device(), gamma.device()];
        x.on_same_gpu(OP, &operands)?;
        let c = x.shape[1];
        let (mut dgamma, mut dbeta) = (x.alloc_like(&[c])?, x.alloc_like(&[c])?);
        let mut coeffs = x.alloc_like(&[3 * c])?;
        if c > 0 {
            let flag = i32::from(batch_stats);
            let cfg = Gpu::block_per_row(c);
            let (xs, dy, m, v, g) = (x.view(), grad.view(), mean.view(), var.view(), gamma.view());
            let (mut dg, mut db, mut k) = (dgamma.view_mut(), dbeta.view_mut(), coeffs.view_mut());
            launch!(
                x.gpu,
                "bn_backward_sums",
                cfg,
                &batch,
                &channels,
                &rest,
                &xs,
                &dy,
                &m,
                &v,
                &g,
                &eps,
                &flag,
                &mut dg,
                &mut db,
                &mut k
            )?;
        }
        let dx = x.launch_new(OP, &[], &x.shape, |gpu, dx| {
            let (n, cfg) = (dx.n(), Gpu::elementwise(dx.len));
            let (k, xs, dy, mut dx) = (coeffs.view(), x.view(), grad.view(), dx.view_mut());
            launch!(
                gpu,
                "bn_backward_dx",
                cfg,
                &n,
                &channels,
                &rest,
                &k,
                &xs,
                &dy,
                &mut dx
            )
        })?;
        Ok((dx, dgamma, dbeta))
    }
}
