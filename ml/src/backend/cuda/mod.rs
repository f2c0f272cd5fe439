//! The CUDA backend: tensors in GPU memory, GEMM through cuBLAS, every other kernel compiled at
//! run time with NVRTC (see `kernels.cu`), and a caching allocator.
//!
//! cudarc loads `libcuda`, `libcublas` and `libnvrtc` when a device is first used, so this
//! backend builds on machines without CUDA; [`check_available`] says in one sentence what is
//! missing on a machine that cannot run it. Everything a device does is queued on its one stream
//! ([`device::Gpu`]): the host waits only when it reads values back ([`CudaStorage::to_host`],
//! [`CudaStorage::copy_to_slice`], [`CudaStorage::sum_squares`]).

mod alloc;
mod device;
mod kernels;
mod ops;
mod staging;

use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaSlice;

use device::Gpu;
pub use device::{check_available, device_count};
use kernels::{MAX_DIMS, Strided};
pub use staging::{HostRegistration, synchronize};

use crate::backend::cpu::{self, CpuArray};
use crate::device::{AllocatorStats, Device};
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
            .field("device", &self.device())
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
        // indexes (the callers size them from the shapes), and all work is ordered on one
        // stream.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(|e| gpu.fail($name, e))
    }};
}
pub(crate) use launch;

/// Row-major strides of `shape`, in elements.
fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut s = 1i64;
    for d in (0..shape.len()).rev() {
        strides[d] = s;
        s *= shape[d] as i64;
    }
    strides
}

/// A [`Strided`] over `dims` with operand strides `sa` and `sb`.
fn strided(op: &'static str, dims: &[usize], sa: &[i64], sb: &[i64]) -> Result<Strided> {
    if dims.len() > MAX_DIMS {
        return Err(MlError::invalid(
            op,
            format!(
                "the CUDA backend handles tensors of at most {MAX_DIMS} dimensions, not {}",
                dims.len()
            ),
        ));
    }
    let mut s = Strided {
        ndim: dims.len() as i32,
        ..Default::default()
    };
    for (d, &n) in dims.iter().enumerate() {
        s.dims[d] = i32::try_from(n).map_err(|_| {
            MlError::invalid(
                op,
                format!("dimension {n} is too large for the CUDA backend"),
            )
        })?;
        s.sa[d] = sa[d];
        s.sb[d] = sb[d];
    }
    Ok(s)
}

/// Strides of `shape` read as broadcast to `target` (0 along broadcast or missing dimensions).
fn broadcast_strides(shape: &[usize], target: &[usize]) -> Vec<i64> {
    let own = contiguous_strides(shape);
    let pad = target.len() - shape.len();
    (0..target.len())
        .map(|d| {
            if d < pad || shape[d - pad] == 1 {
                0
            } else {
                own[d - pad]
            }
        })
        .collect()
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

    /// Elements as an i64 kernel argument.
    fn n(&self) -> i64 {
        self.len as i64
    }

    fn same_gpu(&self, other: &CudaStorage, op: &'static str) -> Result<()> {
        if self.gpu.ordinal == other.gpu.ordinal {
            Ok(())
        } else {
            Err(MlError::Device(format!(
                "{op}: tensors on cuda:{} and cuda:{} cannot be combined; move them to one \
                 device first",
                self.gpu.ordinal, other.gpu.ordinal
            )))
        }
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        Device::Cuda(self.gpu.ordinal)
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Zeros of `shape` on device `ordinal`.
    pub fn zeros(shape: &[usize], ordinal: usize) -> Result<CudaStorage> {
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

    /// Uploads a standard-layout host array to device `ordinal`.
    pub fn from_host(a: &CpuArray, ordinal: usize) -> Result<CudaStorage> {
        let gpu = Gpu::get(ordinal)?;
        let mut out = Self::alloc(&gpu, a.shape())?;
        out.copy_from_slice(cpu::slice(a))?;
        Ok(out)
    }

    /// A host copy (waits for the device).
    pub fn to_host(&self) -> Result<CpuArray> {
        let mut data = vec![0.0; self.len];
        self.copy_to_slice(&mut data)?;
        Ok(cpu::from_vec(&self.shape, data))
    }

    /// Downloads the elements into `dst` (waits for the device).
    pub fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        self.queue_copy_to_slice(dst)?;
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| self.gpu.fail("copying to the host", e))
    }

    /// Queues the download of the elements into `dst` without waiting: `dst` holds them only
    /// after [`synchronize`] (for page-locked `dst`; pageable memory is copied at once).
    pub fn queue_copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let view = self.buf().slice(0..self.len);
        self.gpu
            .stream
            .memcpy_dtoh(&view, &mut dst[..self.len])
            .map_err(|e| self.gpu.fail("copying to the host", e))
    }

    /// Uploads `src` over the elements (queued: from page-locked memory the copy runs
    /// asynchronously, so `src` must not change before [`synchronize`]).
    pub fn copy_from_slice(&mut self, src: &[f32]) -> Result<()> {
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

    /// A copy on the same device.
    pub fn duplicate(&self) -> Result<CudaStorage> {
        let mut out = self.alloc_like(&self.shape)?;
        self.copy_into(&mut out)?;
        Ok(out)
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

    /// The same elements with a new shape.
    pub fn reshape(&self, shape: &[usize]) -> Result<CudaStorage> {
        let mut out = self.duplicate()?;
        out.shape = shape.to_vec();
        Ok(out)
    }
}
