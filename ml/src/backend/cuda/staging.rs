//! Page-locked host buffers for gradient staging.
//!
//! Copies between the GPU and pageable host memory go through a driver bounce buffer and block
//! the host; registered (page-locked) memory is copied by DMA, asynchronously and at full PCIe
//! speed. The executors register their gradient buckets once, so every step's device-to-host
//! and host-to-device copies of gradients run at that speed.

use std::sync::Arc;

use cudarc::driver::sys;

use super::device::Gpu;
use crate::error::Result;

/// A host buffer page-locked for device `ordinal`'s copies; unregistered on drop.
pub struct HostRegistration {
    gpu: Arc<Gpu>,
    ptr: usize,
}

impl HostRegistration {
    /// Page-locks `buf` (it must stay allocated, at the same address, until this is dropped or
    /// forgotten).
    pub fn new(ordinal: usize, buf: &mut [f32]) -> Result<HostRegistration> {
        let gpu = Gpu::get(ordinal)?;
        let ptr = buf.as_mut_ptr();
        gpu.stream
            .context()
            .bind_to_thread()
            .map_err(|e| gpu.fail("binding the context", e))?;
        // SAFETY: `ptr` points at `size_of_val(buf)` bytes the caller keeps allocated while the
        // registration lives; flags 0 is a plain page-locking.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), std::mem::size_of_val(buf), 0) }
            .result()
            .map_err(|e| gpu.fail("page-locking a host buffer", e))?;
        Ok(HostRegistration {
            gpu,
            ptr: ptr as usize,
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.gpu.stream.context().bind_to_thread().is_ok() {
            // SAFETY: `ptr` was registered by `new` and its memory is still allocated (the
            // contract of `new`). A failure only leaves the pages locked.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// Waits for everything queued on device `ordinal`.
pub fn synchronize(ordinal: usize) -> Result<()> {
    let gpu = Gpu::get(ordinal)?;
    gpu.stream
        .synchronize()
        .map_err(|e| gpu.fail("synchronizing", e))
}
