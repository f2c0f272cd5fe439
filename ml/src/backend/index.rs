//! [`IndexOps`]: axis permutations, concatenation, slices, row gathers and their scatter-add;
//! and the [`Storage`] methods that dispatch to them.

use super::memory::MemoryOps;
use super::storage::{Lift, Storage, dispatch};
use crate::device::mixed_devices;
use crate::error::Result;

/// Layout and indexing kernels. Axes, shapes and indices were checked by the caller.
pub trait IndexOps: MemoryOps {
    /// The axes reordered (`axes[i]` is the input axis that becomes axis `i`).
    fn permute(&self, axes: &[usize]) -> Result<Self>;

    /// Joins `parts` (at least one) along `axis`.
    fn concat(parts: &[&Self], axis: usize) -> Result<Self>;

    /// The slice `start..start + len` along `axis`.
    fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self>;

    /// Rows of `self` picked by `indices` (integer values carried as f32): the result has shape
    /// `indices.shape() ++ self.shape()[1..]`.
    fn index_select(&self, indices: &Self) -> Result<Self>;

    /// `self[indices[j]] += src[j]` row by row (the backward of [`IndexOps::index_select`]).
    fn index_add(&mut self, indices: &Self, src: &Self) -> Result<()>;
}

impl Storage {
    /// The axes reordered.
    pub fn permute(&self, axes: &[usize]) -> Result<Storage> {
        dispatch!((x = self) => IndexOps::permute(x, axes))
    }

    /// Joins storages along `axis` (shapes checked by the caller).
    pub fn concat(parts: &[&Storage], axis: usize) -> Result<Storage> {
        let host: Option<Vec<_>> = parts.iter().map(|p| p.as_cpu()).collect();
        if let Some(host) = host {
            return IndexOps::concat(&host, axis).map(Lift::lift);
        }
        let gpu: Option<Vec<_>> = parts
            .iter()
            .map(|p| match p {
                Storage::Cuda(c) => Some(c),
                Storage::Cpu(_) => None,
            })
            .collect();
        match gpu {
            Some(gpu) => IndexOps::concat(&gpu, axis).map(Lift::lift),
            None => {
                let devices: Vec<_> = parts.iter().map(|p| p.device()).collect();
                Err(mixed_devices("concat", &devices))
            }
        }
    }

    /// The slice `start..start + len` along `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Storage> {
        dispatch!((x = self) => IndexOps::narrow(x, axis, start, len))
    }

    /// Rows of `self` picked by `indices` (range-checked by the caller).
    pub fn index_select(&self, indices: &Storage) -> Result<Storage> {
        dispatch!("index_select", (t = self, i = indices) => IndexOps::index_select(t, i))
    }

    /// `self[indices[j]] += src[j]` row by row.
    pub fn index_add(&mut self, indices: &Storage, src: &Storage) -> Result<()> {
        dispatch!("index_add", (d = self, i = indices, s = src) => IndexOps::index_add(d, i, s))
    }
}
