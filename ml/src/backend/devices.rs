//! What can be asked of a [`Device`], answered by its backend: whether it can be used, which GPUs
//! exist, waiting for queued work, page-locked host buffers and allocator counters.

use super::allocator::AllocatorStats;
use super::cuda;
use crate::device::Device;
use crate::error::Result;

/// A host buffer page-locked for a GPU's copies ([`Device::pin_host`]); unlocked on drop.
pub struct PinnedHost(#[allow(dead_code)] cuda::HostRegistration);

impl PinnedHost {
    /// Leaves the pages locked instead of unlocking them: for a buffer that was freed while
    /// registered (unlocking an address that may now belong to someone else would be wrong).
    pub fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for PinnedHost {
    /// Unlocks the pages (the registration inside does the work; without the `cuda` feature no
    /// value exists).
    fn drop(&mut self) {}
}

impl Device {
    /// Checks that the device can be used in this build and on this machine.
    pub fn check_available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => cuda::check_available(ordinal),
        }
    }

    /// The CUDA devices this process can use, in ordinal order: none in a build without the
    /// `cuda` feature, on a machine without the CUDA driver library, or without a GPU (after
    /// `CUDA_VISIBLE_DEVICES`). Never fails and never panics.
    pub fn cuda_devices() -> Vec<Device> {
        (0..cuda::device_count()).map(Device::Cuda).collect()
    }

    /// Waits until everything queued on this device has run (nothing to wait for on the CPU).
    pub fn synchronize(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => cuda::synchronize(ordinal),
        }
    }

    /// Page-locks `buf` so that copies between it and this device run by DMA, asynchronously
    /// (`None` on the CPU, where there is nothing to copy). `buf` must stay allocated at the same
    /// address until the registration is dropped (or [forgotten](PinnedHost::forget)).
    pub fn pin_host(self, buf: &mut [f32]) -> Result<Option<PinnedHost>> {
        match self {
            Device::Cpu => Ok(None),
            Device::Cuda(ordinal) => {
                cuda::HostRegistration::new(ordinal, buf).map(|r| Some(PinnedHost(r)))
            }
        }
    }

    /// The CUDA caching allocator's counters, for a GPU that is in use.
    pub fn allocator_stats(self) -> Option<AllocatorStats> {
        match self {
            Device::Cpu => None,
            Device::Cuda(ordinal) => cuda::allocator_stats(ordinal),
        }
    }
}
