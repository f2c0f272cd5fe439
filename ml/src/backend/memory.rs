//! [`MemoryOps`]: what every backend starts from: storage created on one of its devices, copied
//! to and from the host, and its shape; and the [`Storage`] methods that dispatch to it.

use std::fmt;

use ndarray::{ArrayD, IxDyn};

use super::cpu::CpuArray;
use super::cuda::CudaStorage;
use super::storage::{Lift, Storage, dispatch};
use crate::device::Device;
use crate::error::Result;
use crate::shape::numel;

/// Storage of a tensor on one device of a backend: dense, row-major f32.
pub trait MemoryOps: Sized + fmt::Debug {
    /// Which device of the backend: `()` for the host, the ordinal for a GPU.
    type Location: Copy;

    /// Zeros of `shape` at `at`.
    fn zeros(shape: &[usize], at: Self::Location) -> Result<Self>;

    /// Host data of any layout, moved to `at` (no copy on the CPU when it is standard layout).
    fn from_host(a: ArrayD<f32>, at: Self::Location) -> Result<Self>;

    /// The device holding the data.
    fn device(&self) -> Device;

    /// The dimensions.
    fn shape(&self) -> &[usize];

    /// Copies the elements into `dst` (row-major; the caller checked the length), waiting for the
    /// device.
    fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()>;

    /// Overwrites the elements from `src` (row-major; the caller checked the length). A GPU
    /// copy from page-locked memory is only queued: `src` must not change before
    /// [`Device::synchronize`].
    fn copy_from_slice(&mut self, src: &[f32]) -> Result<()>;

    /// A copy on the same device.
    fn duplicate(&self) -> Result<Self>;

    /// A copy with a new shape of the same element count (checked by the caller).
    fn reshape(&self, shape: &[usize]) -> Result<Self>;

    /// Like [`MemoryOps::copy_to_slice`], but a GPU copy into page-locked memory may only be
    /// queued: `dst` holds the values after [`Device::synchronize`]. Default: the copy, waited
    /// for.
    fn queue_copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        self.copy_to_slice(dst)
    }

    /// A host copy of the data. Default: [`MemoryOps::copy_to_slice`] into a new array.
    fn to_host(&self) -> Result<ArrayD<f32>> {
        let mut data = vec![0.0; numel(self.shape())];
        self.copy_to_slice(&mut data)?;
        Ok(ArrayD::from_shape_vec(IxDyn(self.shape()), data).expect("one value per element"))
    }
}

impl Storage {
    /// Zeros of this shape on `device`.
    pub fn zeros(shape: &[usize], device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => <CpuArray as MemoryOps>::zeros(shape, ()).map(Lift::lift),
            Device::Cuda(i) => <CudaStorage as MemoryOps>::zeros(shape, i).map(Lift::lift),
        }
    }

    /// Uploads host data to `device` (no copy for the CPU).
    pub fn from_host(a: ArrayD<f32>, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => <CpuArray as MemoryOps>::from_host(a, ()).map(Lift::lift),
            Device::Cuda(i) => <CudaStorage as MemoryOps>::from_host(a, i).map(Lift::lift),
        }
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(a) => MemoryOps::device(a),
            Storage::Cuda(c) => MemoryOps::device(c),
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        match self {
            Storage::Cpu(a) => MemoryOps::shape(a),
            Storage::Cuda(c) => MemoryOps::shape(c),
        }
    }

    /// A host copy of the data (a download from a GPU).
    pub fn to_host(&self) -> Result<ArrayD<f32>> {
        match self {
            Storage::Cpu(a) => MemoryOps::to_host(a),
            Storage::Cuda(c) => MemoryOps::to_host(c),
        }
    }

    /// Copies the elements into `dst` (row-major; the caller checked the length).
    pub fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        dispatch!((x = self) => MemoryOps::copy_to_slice(x, dst))
    }

    /// Like [`Storage::copy_to_slice`], but a GPU copy into page-locked memory is only queued:
    /// `dst` holds the values after [`Device::synchronize`].
    pub fn queue_copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        dispatch!((x = self) => MemoryOps::queue_copy_to_slice(x, dst))
    }

    /// Overwrites the elements from `src` (row-major; the caller checked the length). A GPU
    /// copy from page-locked memory is only queued: `src` must not change before
    /// [`Device::synchronize`].
    pub fn copy_from_slice(&mut self, src: &[f32]) -> Result<()> {
        dispatch!((x = self) => MemoryOps::copy_from_slice(x, src))
    }

    /// A copy on the same device.
    pub fn duplicate(&self) -> Result<Storage> {
        dispatch!((x = self) => MemoryOps::duplicate(x))
    }

    /// The same elements with a new shape (element count checked by the caller).
    pub fn reshape(&self, shape: &[usize]) -> Result<Storage> {
        dispatch!((x = self) => MemoryOps::reshape(x, shape))
    }
}
