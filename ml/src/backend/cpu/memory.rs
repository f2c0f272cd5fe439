//! The CPU's storage is the host array itself: creating it, copying it and reshaping it.

use ndarray::ArrayBase;

use super::{CpuArray, from_vec, slice, slice_mut, standard, zeros};
use crate::backend::memory::MemoryOps;
use crate::device::Device;
use crate::error::Result;

impl MemoryOps for CpuArray {
    type Location = ();

    fn zeros(shape: &[usize], (): ()) -> Result<Self> {
        Ok(zeros(shape))
    }

    fn from_host(a: CpuArray, (): ()) -> Result<Self> {
        Ok(standard(a))
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn shape(&self) -> &[usize] {
        ArrayBase::shape(self)
    }

    fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        dst.copy_from_slice(slice(self));
        Ok(())
    }

    fn copy_from_slice(&mut self, src: &[f32]) -> Result<()> {
        slice_mut(self).copy_from_slice(src);
        Ok(())
    }

    fn duplicate(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn reshape(&self, shape: &[usize]) -> Result<Self> {
        Ok(from_vec(shape, slice(self).to_vec()))
    }

    /// The array itself, cloned.
    fn to_host(&self) -> Result<CpuArray> {
        Ok(self.clone())
    }
}
