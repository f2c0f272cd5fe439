//! Where a tensor's storage lives.
//!
//! Callers name a [`Device`] and never need `cfg`: when ringflow is built without the `cuda`
//! feature, [`Device::Cuda`] still exists and every attempt to use it returns a clear
//! [`MlError::Device`] instead of failing to compile.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};

/// A host buffer page-locked for a GPU's copies ([`Device::pin_host`]); unlocked on drop.
pub struct PinnedHost(#[allow(dead_code)] crate::backend::cuda::HostRegistration);

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

/// How well the pool is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AllocatorStats {
    /// Blocks requested.
    pub requests: u64,
    /// Requests served from the pool (no driver call).
    pub hits: u64,
    /// Bytes held in the pool, free for reuse.
    pub cached_bytes: u64,
}

impl AllocatorStats {
    /// The fraction of requests served from the pool.
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}

/// A compute device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Device {
    /// The host CPU: ndarray storage and the `gemm` crate's multithreaded GEMM.
    Cpu,
    /// The NVIDIA GPU with this ordinal (after `CUDA_VISIBLE_DEVICES`).
    Cuda(usize),
}

impl Device {
    /// Checks that the device can be used in this build and on this machine.
    pub fn check_available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => crate::backend::cuda::check_available(ordinal),
        }
    }

    /// The CUDA devices this process can use, in ordinal order: none in a build without the
    /// `cuda` feature, on a machine without the CUDA driver library, or without a GPU (after
    /// `CUDA_VISIBLE_DEVICES`). Never fails and never panics.
    pub fn cuda_devices() -> Vec<Device> {
        (0..crate::backend::cuda::device_count())
            .map(Device::Cuda)
            .collect()
    }

    /// Waits until everything queued on this device has run (nothing to wait for on the CPU).
    pub fn synchronize(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => crate::backend::cuda::synchronize(ordinal),
        }
    }

    /// Page-locks `buf` so that copies between it and this device run by DMA, asynchronously
    /// (`None` on the CPU, where there is nothing to copy). `buf` must stay allocated at the same
    /// address until the registration is dropped (or [forgotten](PinnedHost::forget)).
    pub fn pin_host(self, buf: &mut [f32]) -> Result<Option<PinnedHost>> {
        match self {
            Device::Cpu => Ok(None),
            Device::Cuda(ordinal) => crate::backend::cuda::HostRegistration::new(ordinal, buf)
                .map(|r| Some(PinnedHost(r))),
        }
    }

    /// The CUDA caching allocator's counters, for a GPU that is in use.
    pub fn allocator_stats(self) -> Option<AllocatorStats> {
        match self {
            Device::Cpu => None,
            Device::Cuda(ordinal) => crate::backend::cuda::allocator_stats(ordinal),
        }
    }

    /// True for [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// The device with its ordinal always spelled out (`cpu`, `cuda:0`, `cuda:1`), for logs that
    /// name the GPU a process uses; `Display` writes `cuda` for ordinal 0, as job specs do.
    pub fn full_name(self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(i) => format!("cuda:{i}"),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(0) => f.write_str("cuda"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = MlError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(Device::Cuda(i)),
                _ => Err(MlError::Device(format!(
                    "unknown device {other:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
                ))),
            },
        }
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for Device {
    type Error = MlError;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_round_trip_through_strings() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
        assert!("tpu".parse::<Device>().is_err());
    }
}
