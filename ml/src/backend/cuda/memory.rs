//! Allocation, copies between the host and the GPU, and reshapes.

use super::CudaStorage;
use super::device::Gpu;
use crate::backend::cpu::{self, CpuArray};
use crate::backend::memory::MemoryOps;
use crate::device::Device;
use crate::error::Result;

impl MemoryOps for CudaStorage {
    /// The CUDA ordinal.
    type Location = usize;

    fn zeros(shape: &[usize], ordinal: usize) -> Result<Self> {
        let gpu = Gpu::get(ordinal)?;
        let mut out = Self::alloc(&gpu, shape)?;
        if out.len > 0 {
            let n = out.len;
            let mut view = out.buf_mut().slice_mut(0..n);
            gpu.stream
                .memset_zeros(&mut view)
                .map_err(|e| gpu.fail("zeroing memory", e))?;
        }
        Ok(out)
    }

    fn from_host(a: CpuArray, ordinal: usize) -> Result<Self> {
        let gpu = Gpu::get(ordinal)?;
        let a = cpu::standard(a);
        let mut out = Self::alloc(&gpu, a.shape())?;
        out.copy_from_slice(cpu::slice(&a))?;
        Ok(out)
    }

    fn device(&self) -> Device {
        Device::Cuda(self.gpu.ordinal)
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Downloads the elements and waits for the device.
    fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        self.queue_copy_to_slice(dst)?;
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| self.gpu.fail("copying to the host", e))
    }

    /// Queues the download without waiting: `dst` holds the elements only after
    /// [`Device::synchronize`] (for page-locked `dst`; pageable memory is copied at once).
    fn queue_copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let view = self.buf().slice(0..self.len);
        self.gpu
            .stream
            .memcpy_dtoh(&view, &mut dst[..self.len])
            .map_err(|e| self.gpu.fail("copying to the host", e))
    }

    /// Queues the upload: from page-locked memory the copy runs asynchronously, so `src` must
    /// not change before [`Device::synchronize`].
    fn copy_from_slice(&mut self, src: &[f32]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let n = self.len;
        let gpu = self.gpu.clone();
        let mut view = self.buf_mut().slice_mut(0..n);
        gpu.stream
            .memcpy_htod(&src[..n], &mut view)
            .map_err(|e| gpu.fail("copying to the device", e))
    }

    fn duplicate(&self) -> Result<Self> {
        let mut out = self.alloc_like(&self.shape)?;
        self.copy_into(&mut out)?;
        Ok(out)
    }

    fn reshape(&self, shape: &[usize]) -> Result<Self> {
        let mut out = self.duplicate()?;
        out.shape = shape.to_vec();
        Ok(out)
    }
}
