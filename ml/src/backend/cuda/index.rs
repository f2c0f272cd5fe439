//! Layout kernels: axis permutations, concatenation, slices, row gathers and their scatter-add.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use super::layout::{contiguous_strides, strided};
use crate::backend::index::IndexOps;
use crate::backend::memory::MemoryOps;
use crate::error::Result;
use crate::shape::numel;

impl IndexOps for CudaStorage {
    fn permute(&self, axes: &[usize]) -> Result<Self> {
        let own = contiguous_strides(&self.shape);
        let shape: Vec<usize> = axes.iter().map(|&a| self.shape[a]).collect();
        let strides: Vec<i64> = axes.iter().map(|&a| own[a]).collect();
        self.strided_copy("permute", &shape, &strides)
    }

    /// One strided copy per part, into its place in the output.
    fn concat(parts: &[&Self], axis: usize) -> Result<Self> {
        let first = parts[0];
        for part in parts {
            first.on_same_gpu("concat", &[part.device()])?;
        }
        let mut shape = first.shape.clone();
        shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let mut out = first.alloc_like(&shape)?;
        let out_strides = contiguous_strides(&shape);
        let mut offset = 0usize;
        for part in parts {
            if part.len > 0 {
                let own = contiguous_strides(&part.shape);
                let s = strided("concat", &part.shape, &own, &out_strides)?;
                let (n, cfg) = (part.n(), Gpu::elementwise(part.len));
                let start = offset * out_strides[axis] as usize;
                let total = out.len;
                let mut dst = out.buf_mut().slice_mut(start..total);
                launch!(first.gpu, "strided_copy", cfg, &n, &s, part.buf(), &mut dst)?;
            }
            offset += part.shape[axis];
        }
        Ok(out)
    }

    fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        let strides = contiguous_strides(&self.shape);
        let mut shape = self.shape.clone();
        shape[axis] = len;
        self.launch_new("narrow", &[], &shape, |gpu, out| {
            let s = strided("narrow", &shape, &strides, &contiguous_strides(&shape))?;
            let (n, cfg) = (out.n(), Gpu::elementwise(out.len));
            let src = self.buf().slice(start * strides[axis] as usize..self.len);
            launch!(gpu, "strided_copy", cfg, &n, &s, &src, out.buf_mut())
        })
    }

    fn index_select(&self, indices: &Self) -> Result<Self> {
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(&self.shape[1..]);
        let rows = indices.n();
        let row_len = numel(&self.shape[1..]) as i64;
        self.launch_new("index_select", &[indices.device()], &shape, |gpu, out| {
            let cfg = Gpu::elementwise(out.len);
            let (t, i, o) = (self.buf(), indices.buf(), out.buf_mut());
            launch!(gpu, "index_select", cfg, &rows, &row_len, t, i, o)
        })
    }

    fn index_add(&mut self, indices: &Self, src: &Self) -> Result<()> {
        let operands = [indices.device(), src.device()];
        if src.len == 0 {
            return self.on_same_gpu("index_add", &operands);
        }
        let rows = indices.n();
        let row_len = numel(&self.shape[1..]) as i64;
        let cfg = Gpu::elementwise(src.len);
        self.launch_in_place("index_add", &operands, |gpu, dst| {
            launch!(
                gpu,
                "index_add",
                cfg,
                &rows,
                &row_len,
                dst,
                indices.buf(),
                src.buf()
            )
        })
    }
}
