//! The CUDA backend: tensors in GPU memory, GEMM through cuBLAS, every other kernel compiled at
//! run time with NVRTC (see `kernels.cu`), and a caching allocator.
//!
//! cudarc loads `libcuda`, `libcublas` and `libnvrtc` when a device is first used, so this
//! backend builds on machines without CUDA; [`check_available`] says in one sentence what is
//! missing on a machine that cannot run it. Everything a device does is queued on its one stream
//! (`device.rs`): the host waits only when it reads values back (a copy to the host, a sum
//! of squares).
//!
//! [`CudaStorage`] implements the backend traits one kind per file, as the CPU backend does
//! (`elementwise.rs`, `reduce.rs`, `matmul.rs`, `conv.rs` with `pool.rs`, `norm.rs`,
//! `softmax.rs`, `loss.rs`, `index.rs`, `random.rs`, `optim.rs`, and `memory.rs` for allocation
//! and copies). Every op opens the same way, through `launch.rs`: operands on this GPU, nothing
//! queued for an empty tensor, the device's handle, then the kernel's launch.

mod alloc;
mod conv;
mod conv_direct;
mod device;
mod elementwise;
mod index;
mod kernels;
mod launch;
mod layout;
mod loss;
mod matmul;
mod memory;
mod norm;
mod optim;
mod pool;
mod random;
mod recurrent;
mod reduce;
mod softmax;
mod staging;
mod unusable;

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use device::Gpu;
pub use device::{check_available, device_count};
pub use staging::{HostRegistration, synchronize};

use crate::backend::allocator::AllocatorStats;
use crate::device::Device;
use crate::error::{MlError, Result};
use crate::shape::numel;

/// The stream every operation of device `ordinal` is queued on, for libraries that queue work
/// beside ringflow's (NCCL): work queued there is ordered with the tensor engine's.
pub fn stream(ordinal: usize) -> Result<Arc<cudarc::driver::CudaStream>> {
    Ok(Gpu::get(ordinal)?.stream.clone())
}

/// The caching allocator's counters for device `ordinal`, if it has been opened.
pub fn allocator_stats(ordinal: usize) -> Option<AllocatorStats> {
    Gpu::get(ordinal).ok().map(|g| g.pool.stats())
}

/// A tensor's elements in the memory of one GPU: dense, row-major f32.
///
/// The memory is a block of the device's caching allocator, returned to it on drop.
pub struct CudaStorage {
    gpu: Arc<Gpu>,
    shape: Vec<usize>,
    len: usize,
    block: Option<CudaSlice<f32>>,
}

impl fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStorage")
            .field("device", &Device::Cuda(self.gpu.ordinal))
            .field("shape", &self.shape)
            .finish()
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.gpu.pool.give_back(block);
        }
    }
}

impl CudaStorage {
    /// Uninitialized storage of `shape` on `gpu` (every caller writes all of it).
    fn alloc(gpu: &Arc<Gpu>, shape: &[usize]) -> Result<CudaStorage> {
        let len = numel(shape);
        let block = gpu.pool.take(&gpu.stream, len).map_err(|e| {
            if alloc::out_of_memory(&e) {
                MlError::Device(format!(
                    "cuda:{} is out of memory: {:.1} MiB more could not be allocated, after \
                     returning every cached block to the driver (a smaller train.batch_size or \
                     model may fit)",
                    gpu.ordinal,
                    (len * 4) as f64 / (1 << 20) as f64
                ))
            } else {
                gpu.fail(&format!("allocating {len} floats"), e)
            }
        })?;
        Ok(CudaStorage {
            gpu: gpu.clone(),
            shape: shape.to_vec(),
            len,
            block: Some(block),
        })
    }

    /// Uninitialized storage of `shape` on the same device.
    fn alloc_like(&self, shape: &[usize]) -> Result<CudaStorage> {
        Self::alloc(&self.gpu, shape)
    }

    fn buf(&self) -> &CudaSlice<f32> {
        self.block.as_ref().expect("a block is held until drop")
    }

    fn buf_mut(&mut self) -> &mut CudaSlice<f32> {
        self.block.as_mut().expect("a block is held until drop")
    }

    /// The tensor's elements (the block may hold more).
    fn view(&self) -> CudaView<'_, f32> {
        self.buf().slice(0..self.len)
    }

    /// The tensor's elements, to write (the block may hold more).
    fn view_mut(&mut self) -> CudaViewMut<'_, f32> {
        let n = self.len;
        self.buf_mut().slice_mut(0..n)
    }

    /// Elements as an i64 kernel argument.
    fn n(&self) -> i64 {
        self.len as i64
    }

    /// Copies the elements over `dst`'s (same element count), on the device.
    fn copy_into(&self, dst: &mut CudaStorage) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let n = self.len;
        let src = self.buf().slice(0..n);
        let mut to = dst.buf_mut().slice_mut(0..n);
        self.gpu
            .stream
            .memcpy_dtod(&src, &mut to)
            .map_err(|e| self.gpu.fail("copying on the device", e))
    }

    /// The device address of the elements, for libraries that take raw pointers (NCCL).
    pub fn device_address(&mut self) -> u64 {
        let block = self.block.as_mut().expect("a block is held until drop");
        let (ptr, _unused_without_event_tracking) =
            cudarc::driver::DevicePtrMut::device_ptr_mut(block, &self.gpu.stream);
        ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a tensor without elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
