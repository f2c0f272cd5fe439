//! [`RandomOps`]: random tensors drawn from the counter-based generator every backend shares
//! ([`super::cpu::random::uniform_at`]); and the [`Storage`] method that dispatches to them.

use super::cpu::CpuArray;
use super::cuda::CudaStorage;
use super::memory::MemoryOps;
use super::storage::{Lift, Storage};
use crate::device::Device;
use crate::error::Result;

/// Random kernels. Every backend draws the same numbers for the same seed.
pub trait RandomOps: MemoryOps {
    /// An inverted-dropout mask of `shape` at `at`: element `i` is 0 when
    /// `uniform_at(seed, i) < p` and `1 / (1 - p)` otherwise.
    fn dropout_mask(shape: &[usize], p: f32, seed: u64, at: Self::Location) -> Result<Self>;
}

impl Storage {
    /// An inverted-dropout mask of `shape` on `device`: each element is 0 with probability `p`
    /// and `1 / (1 - p)` otherwise, drawn from the counter-based generator
    /// [`uniform_at`](super::cpu::random::uniform_at)`(seed, i)`, so every device draws the same
    /// mask.
    pub fn dropout_mask(shape: &[usize], p: f32, seed: u64, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => {
                <CpuArray as RandomOps>::dropout_mask(shape, p, seed, ()).map(Lift::lift)
            }
            Device::Cuda(i) => {
                <CudaStorage as RandomOps>::dropout_mask(shape, p, seed, i).map(Lift::lift)
            }
        }
    }
}
