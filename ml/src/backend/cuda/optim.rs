//! Fused optimizer updates: one kernel per parameter and step, updating the parameter and its
//! state in place.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use crate::backend::memory::MemoryOps;
use crate::backend::optim::{AdagradStep, AdamStep, OptimOps, SgdStep};
use crate::error::Result;

/// The op name in errors about the operands of an update.
const OP: &str = "optimizer step";

/// Each update as one fused kernel.
impl OptimOps for CudaStorage {
    fn sgd_update(p: &mut Self, g: &Self, momentum: Option<&mut Self>, s: SgdStep) -> Result<()> {
        let (n, cfg) = (p.n(), Gpu::elementwise(p.len));
        let Some(b) = momentum else {
            return p.launch_in_place(OP, &[g.device()], |gpu, p| {
                launch!(
                    gpu,
                    "sgd_plain",
                    cfg,
                    &n,
                    p,
                    g.buf(),
                    &s.lr,
                    &s.weight_decay
                )
            });
        };
        let (nesterov, first) = (s.nesterov as i32, s.first as i32);
        p.launch_in_place(OP, &[g.device(), b.device()], |gpu, p| {
            launch!(
                gpu,
                "sgd_momentum",
                cfg,
                &n,
                p,
                g.buf(),
                b.buf_mut(),
                &s.lr,
                &s.momentum,
                &s.dampening,
                &s.weight_decay,
                &nesterov,
                &first
            )
        })
    }

    fn adagrad_update(p: &mut Self, g: &Self, acc: &mut Self, s: AdagradStep) -> Result<()> {
        let (n, cfg) = (p.n(), Gpu::elementwise(p.len));
        p.launch_in_place(OP, &[g.device(), acc.device()], |gpu, p| {
            let (g, a) = (g.buf(), acc.buf_mut());
            launch!(
                gpu,
                "adagrad",
                cfg,
                &n,
                p,
                g,
                a,
                &s.lr,
                &s.eps,
                &s.weight_decay
            )
        })
    }

    /// The bias corrections are computed on the host, as the CPU backend computes them.
    fn adam_update(p: &mut Self, g: &Self, m: &mut Self, v: &mut Self, s: AdamStep) -> Result<()> {
        let (step_size, bc2_sqrt) = s.bias_corrections();
        let decoupled = s.decoupled as i32;
        let (n, cfg) = (p.n(), Gpu::elementwise(p.len));
        p.launch_in_place(OP, &[g.device(), m.device(), v.device()], |gpu, p| {
            launch!(
                gpu,
                "adam",
                cfg,
                &n,
                p,
                g.buf(),
                m.buf_mut(),
                v.buf_mut(),
                &s.lr,
                &s.beta1,
                &s.beta2,
                &s.eps,
                &s.weight_decay,
                &decoupled,
                &step_size,
                &bc2_sqrt
            )
        })
    }
}
