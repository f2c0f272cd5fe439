//! Where a tensor's storage lives: [`Device`], a plain identifier.
//!
//! Callers name a [`Device`] and never need `cfg`: when ringflow is built without the `cuda`
//! feature, [`Device::Cuda`] still exists and every attempt to use it returns a clear
//! [`MlError::Device`] instead of failing to compile. What a device can do (whether it can be
//! used, which GPUs exist, waiting for queued work, page-locked host buffers, allocator counters)
//! is answered by the backends, in [`crate::backend::devices`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};

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

/// The error for tensors on different devices combined by `op`, naming the first device of
/// `devices` and the first that differs from it: the one place this sentence is written, for the
/// checks of the autodiff ops, of [`crate::backend::Storage`]'s dispatch and of the CUDA backend.
pub(crate) fn mixed_devices(op: &str, devices: &[Device]) -> MlError {
    let first = devices.first().copied().unwrap_or(Device::Cpu);
    let other = devices
        .iter()
        .copied()
        .find(|&d| d != first)
        .unwrap_or(first);
    MlError::Device(format!(
        "{op}: tensors on {first} and {other} cannot be combined; move them to one device first"
    ))
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
