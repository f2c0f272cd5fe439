//! The opening every GPU op shares, written once: the operands on this tensor's GPU, nothing
//! queued for an empty tensor, the device's handle, and the kernel's launch ([`launch!`]).

use cudarc::driver::CudaSlice;

use super::CudaStorage;
use super::device::Gpu;
use crate::device::{Device, mixed_devices};
use crate::error::{MlError, Result};

/// Launches kernel `$name` of `$gpu` over `$cfg` with the given arguments.
macro_rules! launch {
    ($gpu:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let gpu: &Gpu = &$gpu;
        let cfg = $cfg;
        let f = gpu.kernel($name)?;
        let mut builder = gpu.stream.launch_builder(f);
        $( builder.arg($arg); )+
        // SAFETY: the argument list matches the kernel's signature in kernels.cu (checked by
        // the conformance suite on a GPU), every buffer holds at least the elements the kernel
        // indexes (the callers size them from the shapes), every buffer is on this GPU (checked
        // by `CudaStorage::on_same_gpu`), and all work is ordered on one stream.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(|e| gpu.fail($name, e))
    }};
}
pub(super) use launch;

impl CudaStorage {
    /// Fails, naming `op` and both devices, unless every device in `operands` is this tensor's
    /// GPU: no kernel may read another device's memory.
    pub(super) fn on_same_gpu(&self, op: &'static str, operands: &[Device]) -> Result<()> {
        let own = Device::Cuda(self.gpu.ordinal);
        match operands.iter().find(|&&d| d != own) {
            Some(&other) => Err(mixed_devices(op, &[own, other])),
            None => Ok(()),
        }
    }

    /// A new tensor of `shape` on this tensor's GPU, written by `kernel` (given the GPU and the
    /// output): the operands are checked first, and nothing is queued for an empty output.
    pub(super) fn launch_new(
        &self,
        op: &'static str,
        operands: &[Device],
        shape: &[usize],
        kernel: impl FnOnce(&Gpu, &mut CudaStorage) -> Result<()>,
    ) -> Result<CudaStorage> {
        self.on_same_gpu(op, operands)?;
        let mut out = self.alloc_like(shape)?;
        if out.len > 0 {
            kernel(&self.gpu, &mut out)?;
        }
        Ok(out)
    }

    /// Runs `kernel` (given the GPU and this tensor's memory) to update this tensor in place:
    /// the operands are checked first, and nothing is queued for an empty tensor.
    pub(super) fn launch_in_place(
        &mut self,
        op: &'static str,
        operands: &[Device],
        kernel: impl FnOnce(&Gpu, &mut CudaSlice<f32>) -> Result<()>,
    ) -> Result<()> {
        self.on_same_gpu(op, operands)?;
        if self.len == 0 {
            return Ok(());
        }
        let CudaStorage { gpu, block, .. } = self;
        kernel(gpu, block.as_mut().expect("a block is held until drop"))
    }
}

/// `v` as a kernel's int argument.
pub(super) fn int(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        MlError::invalid(
            op,
            format!("size {v} is too large for the CUDA backend's kernels"),
        )
    })
}

/// Fails unless an operand's shape, `got`, is the one the geometry gives it, `want`.
pub(super) fn expect_shape(op: &'static str, got: &[usize], want: &[usize]) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(MlError::ShapeMismatch {
        op,
        lhs: got.to_vec(),
        rhs: want.to_vec(),
        reason: "differ: the first is the operand's, the second what the geometry describes",
    })
}
