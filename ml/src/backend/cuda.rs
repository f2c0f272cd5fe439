//! The CUDA backend as seen from a build without the `cuda` feature.
//!
//! [`CudaStorage`] has no values, so every code path that would touch GPU memory is statically
//! unreachable, and [`check_available`] explains how to get a GPU-enabled build. Callers never
//! need `cfg`.

use crate::error::{MlError, Result};

/// Device memory of a tensor. Uninhabited in this build.
#[derive(Debug)]
pub enum CudaStorage {}

/// Always an error in this build: it names the feature that would enable CUDA.
pub fn check_available(ordinal: usize) -> Result<()> {
    Err(MlError::Device(format!(
        "device cuda:{ordinal} was requested, but this ringflow was built without CUDA support \
         (rebuild with `--features cuda`)"
    )))
}

/// No CUDA devices in this build.
pub fn device_count() -> usize {
    0
}
