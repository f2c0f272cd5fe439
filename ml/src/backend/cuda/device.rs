//! One GPU as the backend sees it: a context, the stream every kernel runs on, a cuBLAS handle,
//! the compiled kernels and the caching allocator, created on first use and kept for the life of
//! the process.
//!
//! cudarc panics when a CUDA library is missing, so [`Gpu::get`] first checks that the driver,
//! cuBLAS and NVRTC libraries can be loaded and turns each failure into one sentence that names
//! the library and the device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig};

use super::alloc::Allocator;
use super::kernels::Kernels;
use super::unusable::{Unusable, step};
use crate::error::{MlError, Result};

/// Threads per block of the elementwise kernels.
pub const BLOCK: u32 = 256;
/// At most this many blocks: grid-stride loops cover the rest.
const MAX_BLOCKS: u64 = 65_535 * 32;

/// A GPU in use.
pub struct Gpu {
    /// The CUDA ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The stream every kernel, copy and GEMM of this device is queued on.
    pub stream: Arc<CudaStream>,
    /// Freed blocks, reused by size class.
    pub pool: Allocator,
    blas: Mutex<CudaBlas>,
    kernels: Kernels,
    /// One double for reductions whose result the host reads (sum of squares).
    scratch: Mutex<CudaSlice<f64>>,
    _ctx: Arc<CudaContext>,
}

/// Devices opened so far, or why one could not be opened.
type Registry = Mutex<HashMap<usize, std::result::Result<Arc<Gpu>, Unusable>>>;

fn registry() -> &'static Registry {
    static DEVICES: OnceLock<Registry> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The libraries the backend loads, each checked before cudarc touches it.
fn missing_library() -> Option<&'static str> {
    // SAFETY: these only try to dlopen the library by its usual names.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Some("the CUDA driver library (libcuda.so; is the NVIDIA driver installed?)");
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Some("cuBLAS (libcublas.so; add its directory to LD_LIBRARY_PATH)");
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Some("NVRTC (libnvrtc.so; add its directory to LD_LIBRARY_PATH)");
        }
    }
    None
}

/// How many CUDA devices the driver reports (0 when a library is missing or on any error).
pub fn device_count() -> usize {
    if missing_library().is_some() {
        return 0;
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// Opens device `ordinal` (or returns why it cannot be used).
pub fn check_available(ordinal: usize) -> Result<()> {
    Gpu::get(ordinal).map(|_| ())
}

fn device_error(ordinal: usize, message: impl std::fmt::Display) -> MlError {
    MlError::Device(format!("device cuda:{ordinal} cannot be used: {message}"))
}

impl Gpu {
    /// The open device `ordinal`, opening it on first use.
    pub fn get(ordinal: usize) -> Result<Arc<Gpu>> {
        let mut devices = registry().lock().unwrap_or_else(|p| p.into_inner());
        let entry = devices
            .entry(ordinal)
            .or_insert_with(|| Gpu::open(ordinal).map(Arc::new));
        entry.clone().map_err(|m| device_error(ordinal, m))
    }

    fn open(ordinal: usize) -> std::result::Result<Gpu, Unusable> {
        if let Some(library) = missing_library() {
            return Err(Unusable::MissingLibrary { library });
        }
        let count = CudaContext::device_count().map_err(|e| Unusable::DriverFailed {
            reason: e.to_string(),
        })?;
        let count = count.max(0) as usize;
        if ordinal >= count {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            return Err(Unusable::NoSuchDevice { count, visible });
        }
        let ctx = CudaContext::new(ordinal).map_err(step("create a context"))?;
        // One stream per device orders every kernel, copy and reuse of a pooled block, so the
        // per-allocation events cudarc would record for multi-stream use are not needed.
        // SAFETY: nothing is allocated on this context yet, and all work goes to `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(step("create a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(step("start cuBLAS"))?;
        let kernels = Kernels::compile(&ctx)?;
        let scratch = stream.alloc_zeros::<f64>(1).map_err(step("allocate"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        tracing::info!("cuda:{ordinal} is {name}; kernels compiled with NVRTC");
        Ok(Gpu {
            ordinal,
            stream,
            pool: Allocator::new(ordinal),
            blas: Mutex::new(blas),
            kernels,
            scratch: Mutex::new(scratch),
            _ctx: ctx,
        })
    }

    /// A kernel by name.
    pub fn kernel(&self, name: &'static str) -> Result<&CudaFunction> {
        self.kernels.get(name).ok_or_else(|| {
            device_error(
                self.ordinal,
                format!("kernel {name} is missing from the module"),
            )
        })
    }

    /// The cuBLAS handle (one caller at a time).
    pub fn blas(&self) -> MutexGuard<'_, CudaBlas> {
        self.blas.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reduction scratch double.
    pub fn scratch(&self) -> MutexGuard<'_, CudaSlice<f64>> {
        self.scratch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A driver, cuBLAS or launch failure as an [`MlError`] naming this device.
    pub fn fail(&self, what: &str, e: impl std::fmt::Display) -> MlError {
        device_error(self.ordinal, format!("{what} failed: {e}"))
    }

    /// A grid-stride launch over `n` elements.
    pub fn elementwise(n: usize) -> LaunchConfig {
        let blocks = (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One warp per lane, for `lanes` lanes.
    pub fn warp_per_lane(lanes: usize) -> LaunchConfig {
        let warps_per_block = (BLOCK / 32) as u64;
        let blocks = (lanes as u64).div_ceil(warps_per_block).max(1) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One block per row, for `rows` rows.
    pub fn block_per_row(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((rows as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}
