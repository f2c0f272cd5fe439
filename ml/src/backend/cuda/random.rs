//! Random tensors generated on the device by the counter-based generator the CPU backend uses
//! ([`crate::backend::cpu::random::uniform_at`]), so both draw the same numbers.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use crate::backend::random::RandomOps;
use crate::error::Result;

impl RandomOps for CudaStorage {
    fn dropout_mask(shape: &[usize], p: f32, seed: u64, ordinal: usize) -> Result<Self> {
        let gpu = Gpu::get(ordinal)?;
        let mut out = Self::alloc(&gpu, shape)?;
        if out.len > 0 {
            let (n, keep, cfg) = (out.n(), 1.0 / (1.0 - p), Gpu::elementwise(out.len));
            launch!(
                gpu,
                "dropout_mask",
                cfg,
                &n,
                &p,
                &keep,
                &seed,
                out.buf_mut()
            )?;
        }
        Ok(out)
    }
}
