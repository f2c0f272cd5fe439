//! The CUDA backend as seen from a build without the `cuda` feature.
//!
//! [`CudaStorage`] has no values, so every code path that would touch GPU memory is statically
//! unreachable, and [`check_available`] explains how to get a GPU-enabled build. It implements
//! the same backend traits as the real backend (`ops.rs`; only their required methods, so the
//! compiler lists what is missing when one is added), so that the dispatch in
//! [`super::Storage`] compiles the same way with and without the feature and callers never need
//! `cfg`.

mod ops;

use crate::backend::allocator::AllocatorStats;
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

/// A page-locked host buffer. Uninhabited in this build.
pub enum HostRegistration {}

impl HostRegistration {
    /// Always an error in this build.
    pub fn new(ordinal: usize, _: &mut [f32]) -> Result<HostRegistration> {
        unavailable(ordinal)
    }
}

/// Always an error in this build.
pub fn synchronize(ordinal: usize) -> Result<()> {
    unavailable(ordinal)
}

/// No allocator in this build.
pub fn allocator_stats(_: usize) -> Option<AllocatorStats> {
    None
}

/// No CUDA devices in this build.
pub fn device_count() -> usize {
    0
}

/// The error of [`check_available`], as any result type.
fn unavailable<T>(ordinal: usize) -> Result<T> {
    check_available(ordinal).map(|()| unreachable!("check_available always fails here"))
}
