//! Fused losses: cross-entropy with its softmax, binary cross-entropy with logits, and their
//! gradients.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use crate::backend::loss::LossOps;
use crate::backend::memory::MemoryOps;
use crate::error::Result;

impl LossOps for CudaStorage {
    fn cross_entropy(logits: &Self, targets: &Self) -> Result<(Self, Self)> {
        const OP: &str = "cross_entropy";
        let (n, c) = (logits.shape[0], logits.shape[1]);
        let (n64, c64) = (n as i64, c as i64);
        let mut rows = logits.alloc_like(&[n])?;
        let probs = logits.launch_new(OP, &[targets.device()], &logits.shape, |gpu, probs| {
            let (x, t) = (logits.buf(), targets.buf());
            let (p, r) = (probs.buf_mut(), rows.buf_mut());
            launch!(
                gpu,
                "cross_entropy_fwd",
                Gpu::warp_per_lane(n),
                &n64,
                &c64,
                x,
                t,
                p,
                r
            )
        })?;
        let scale = if n == 0 { 0.0 } else { 1.0 / n as f32 };
        let loss = rows.launch_new(OP, &[], &[], |_, loss| {
            rows.sum_lanes_into(loss, 1, n64, scale)
        })?;
        Ok((loss, probs))
    }

    fn cross_entropy_backward(probs: &Self, targets: &Self, g: &Self) -> Result<Self> {
        let operands = [targets.device(), g.device()];
        let (n, c) = (probs.shape[0] as i64, probs.shape[1] as i64);
        probs.launch_new(
            "cross_entropy backward",
            &operands,
            &probs.shape,
            |gpu, out| {
                let cfg = Gpu::elementwise(out.len);
                let (p, t, g, o) = (probs.buf(), targets.buf(), g.buf(), out.buf_mut());
                launch!(gpu, "cross_entropy_bwd", cfg, &n, &c, p, t, g, o)
            },
        )
    }

    /// One kernel for the terms, one for their mean.
    fn bce_with_logits(x: &Self, z: &Self) -> Result<Self> {
        const OP: &str = "binary_cross_entropy_with_logits";
        let n = x.n();
        let terms = x.launch_new(OP, &[z.device()], &x.shape, |gpu, terms| {
            let cfg = Gpu::elementwise(x.len);
            let (x, z, t) = (x.buf(), z.buf(), terms.buf_mut());
            launch!(gpu, "bce_terms", cfg, &n, x, z, t)
        })?;
        let scale = 1.0 / x.len.max(1) as f32;
        terms.launch_new(OP, &[], &[], |_, loss| {
            terms.sum_lanes_into(loss, 1, n, scale)
        })
    }

    /// One kernel.
    fn bce_with_logits_backward(x: &Self, z: &Self, g: &Self) -> Result<Self> {
        let operands = [z.device(), g.device()];
        let n = x.n();
        x.launch_new(
            "binary_cross_entropy_with_logits backward",
            &operands,
            &x.shape,
            |gpu, out| {
                let cfg = Gpu::elementwise(x.len);
                let (x, z, g, o) = (x.buf(), z.buf(), g.buf(), out.buf_mut());
                launch!(gpu, "bce_bwd", cfg, &n, x, z, g, o)
            },
        )
    }
}
