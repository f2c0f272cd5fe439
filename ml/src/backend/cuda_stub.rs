//! The CUDA backend as seen from a build without the `cuda` feature.
//!
//! [`CudaStorage`] has no values, so every code path that would touch GPU memory is statically
//! unreachable, and [`check_available`] explains how to get a GPU-enabled build. The methods
//! mirror the real backend's one for one, so that the dispatch in [`super::Storage`] compiles
//! the same way with and without the feature and callers never need `cfg`.

#![allow(missing_docs)]

use super::{AdagradStep, AdamStep, BinaryOp, SgdStep, UnaryOp};
use crate::backend::cpu::CpuArray;
use crate::device::Device;
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
    pub fn new(ordinal: usize, _: &mut [f32]) -> Result<HostRegistration> {
        unavailable(ordinal)
    }
}

/// Always an error in this build.
pub fn synchronize(ordinal: usize) -> Result<()> {
    unavailable(ordinal)
}

/// No allocator in this build.
pub fn allocator_stats(_: usize) -> Option<crate::device::AllocatorStats> {
    None
}

/// No CUDA devices in this build.
pub fn device_count() -> usize {
    0
}

fn unavailable<T>(ordinal: usize) -> Result<T> {
    check_available(ordinal).map(|()| unreachable!("check_available always fails here"))
}

impl CudaStorage {
    pub fn device(&self) -> Device {
        match *self {}
    }
    pub fn shape(&self) -> &[usize] {
        match *self {}
    }
    pub fn zeros(_: &[usize], ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
    pub fn from_host(_: &CpuArray, ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
    pub fn dropout_mask(_: &[usize], _: f32, _: u64, ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
    pub fn to_host(&self) -> Result<CpuArray> {
        match *self {}
    }
    pub fn copy_to_slice(&self, _: &mut [f32]) -> Result<()> {
        match *self {}
    }
    pub fn queue_copy_to_slice(&self, _: &mut [f32]) -> Result<()> {
        match *self {}
    }
    pub fn copy_from_slice(&mut self, _: &[f32]) -> Result<()> {
        match *self {}
    }
    pub fn duplicate(&self) -> Result<Self> {
        match *self {}
    }
    pub fn unary(&self, _: UnaryOp) -> Result<Self> {
        match *self {}
    }
    pub fn unary_backward(_: UnaryOp, x: &Self, _: &Self, _: &Self) -> Result<Self> {
        match *x {}
    }
    pub fn binary(&self, _: BinaryOp, _: &Self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    pub fn affine(&self, _: f32, _: f32) -> Result<Self> {
        match *self {}
    }
    pub fn add_assign(&mut self, _: &Self) -> Result<()> {
        match *self {}
    }
    pub fn fill(&mut self, _: f32) -> Result<()> {
        match *self {}
    }
    pub fn scale(&mut self, _: f32) -> Result<()> {
        match *self {}
    }
    pub fn sum_to_shape_into(&self, _: &mut Self, _: bool) -> Result<()> {
        match *self {}
    }
    pub fn broadcast_to(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    pub fn sum(&self, _: Option<usize>, _: bool) -> Result<Self> {
        match *self {}
    }
    pub fn expand_axis(&self, _: usize, _: usize, _: bool) -> Result<Self> {
        match *self {}
    }
    pub fn sum_squares(&self) -> Result<f64> {
        match *self {}
    }
    pub fn matmul_into(d: &mut Self, _: &Self, _: bool, _: &Self, _: bool, _: bool) -> Result<()> {
        match *d {}
    }
    pub fn softmax(&self, _: usize, _: bool) -> Result<Self> {
        match *self {}
    }
    pub fn softmax_backward(y: &Self, _: &Self, _: usize, _: bool) -> Result<Self> {
        match *y {}
    }
    pub fn cross_entropy(x: &Self, _: &Self) -> Result<(Self, Self)> {
        match *x {}
    }
    pub fn cross_entropy_backward(p: &Self, _: &Self, _: &Self) -> Result<Self> {
        match *p {}
    }
    pub fn bce_with_logits(x: &Self, _: &Self) -> Result<Self> {
        match *x {}
    }
    pub fn bce_with_logits_backward(x: &Self, _: &Self, _: &Self) -> Result<Self> {
        match *x {}
    }
    pub fn reshape(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    pub fn permute(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    pub fn concat(parts: &[&Self], _: usize) -> Result<Self> {
        match *parts[0] {}
    }
    pub fn narrow(&self, _: usize, _: usize, _: usize) -> Result<Self> {
        match *self {}
    }
    pub fn index_select(&self, _: &Self) -> Result<Self> {
        match *self {}
    }
    pub fn index_add(&mut self, _: &Self, _: &Self) -> Result<()> {
        match *self {}
    }
    pub fn sgd_update(p: &mut Self, _: &Self, _: Option<&mut Self>, _: SgdStep) -> Result<()> {
        match *p {}
    }
    pub fn adagrad_update(p: &mut Self, _: &Self, _: &mut Self, _: AdagradStep) -> Result<()> {
        match *p {}
    }
    pub fn adam_update(
        p: &mut Self,
        _: &Self,
        _: &mut Self,
        _: &mut Self,
        _: AdamStep,
    ) -> Result<()> {
        match *p {}
    }
}
