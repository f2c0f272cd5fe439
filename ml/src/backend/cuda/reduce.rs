//! Reductions: sums over all elements, along an axis or over broadcast dimensions, the sum of
//! squares the host reads back, and the repetition along an axis that undoes a sum.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use super::layout::{contiguous_strides, split_at_axis, strided};
use crate::backend::elementwise::ElementwiseOps;
use crate::backend::memory::MemoryOps;
use crate::backend::reduce::ReduceOps;
use crate::error::Result;
use crate::shape::numel;

impl CudaStorage {
    /// `out[r] = scale · Σ self[r, :]` over `rows` contiguous rows of `len`.
    pub(super) fn sum_lanes_into(
        &self,
        out: &mut CudaStorage,
        rows: i64,
        len: i64,
        scale: f32,
    ) -> Result<()> {
        let cfg = Gpu::block_per_row(rows as usize);
        let (x, o) = (self.buf(), out.buf_mut());
        launch!(self.gpu, "sum_lanes", cfg, &rows, &len, &scale, x, o)
    }

    /// Sums `self` into `dst` over the dimensions where `dst` (its shape padded with leading
    /// 1s) has size 1 and `self` has not.
    fn sum_broadcast_into(&self, dst: &mut CudaStorage, accumulate: bool) -> Result<()> {
        const OP: &str = "broadcast reduction";
        if dst.len == 0 {
            return self.on_same_gpu(OP, &[dst.device()]);
        }
        let acc = accumulate as i32;
        let x = &self.shape;
        let pad = x.len() - dst.shape.len();
        let target: Vec<usize> = std::iter::repeat_n(1, pad)
            .chain(dst.shape.iter().copied())
            .collect();
        // Leading dimensions summed away and the rest kept whole: [rows, cols] down to [cols].
        let split = (0..=x.len())
            .find(|&k| target[k..] == x[k..])
            .unwrap_or(x.len());
        if target[..split].iter().all(|&d| d == 1) {
            let rows = numel(&x[..split]) as i64;
            let cols = numel(&x[split..]) as i64;
            let cfg = Gpu::elementwise(cols as usize);
            return dst.launch_in_place(OP, &[self.device()], |gpu, d| {
                launch!(gpu, "sum_rows", cfg, &rows, &cols, self.buf(), d, &acc)
            });
        }
        let flags: Vec<i64> = (0..x.len())
            .map(|d| i64::from(target[d] == 1 && x[d] != 1))
            .collect();
        let s = strided(OP, x, &contiguous_strides(x), &flags)?;
        let (n_out, cfg) = (dst.n(), Gpu::elementwise(dst.len));
        let reduced = (self.len / dst.len.max(1)) as i64;
        dst.launch_in_place(OP, &[self.device()], |gpu, d| {
            let x = self.buf();
            launch!(gpu, "sum_to_shape", cfg, &n_out, &reduced, &s, x, d, &acc)
        })
    }
}

impl ReduceOps for CudaStorage {
    fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Self> {
        let Some(axis) = axis else {
            return self.launch_new("sum", &[], &[], |_, out| {
                self.sum_lanes_into(out, 1, self.n(), 1.0)
            });
        };
        let (outer, len, inner) = split_at_axis(&self.shape, axis);
        let mut shape = self.shape.clone();
        if keepdim {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        self.launch_new("sum", &[], &shape, |gpu, out| {
            if inner == 1 {
                return self.sum_lanes_into(out, outer, len, 1.0);
            }
            let cfg = Gpu::elementwise(out.len);
            let (x, o) = (self.buf(), out.buf_mut());
            launch!(gpu, "sum_axis", cfg, &outer, &len, &inner, x, o)
        })
    }

    /// Waits for the device to read the result.
    fn sum_squares(&self) -> Result<f64> {
        if self.len == 0 {
            return Ok(0.0);
        }
        let n = self.n();
        let mut scratch = self.gpu.scratch();
        launch!(
            self.gpu,
            "sum_squares",
            Gpu::block_per_row(1),
            &n,
            self.buf(),
            &mut *scratch
        )?;
        let mut host = [0.0f64];
        self.gpu
            .stream
            .memcpy_dtoh(&*scratch, &mut host)
            .and_then(|()| self.gpu.stream.synchronize())
            .map_err(|e| self.gpu.fail("reading a reduction", e))?;
        Ok(host[0])
    }

    /// One kernel: a sum over rows for a bias, a strided sum otherwise.
    fn sum_to_shape_into(&self, dst: &mut Self, accumulate: bool) -> Result<()> {
        if self.shape != dst.shape {
            return self.sum_broadcast_into(dst, accumulate);
        }
        if accumulate {
            dst.add_assign(self)
        } else {
            self.on_same_gpu("broadcast reduction", &[dst.device()])?;
            self.copy_into(dst)
        }
    }

    /// One strided copy, without the reshape.
    fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<Self> {
        let mut source = self.shape.clone();
        if !keepdim {
            source.insert(axis, 1);
        }
        let mut strides = contiguous_strides(&source);
        strides[axis] = 0;
        let mut shape = source;
        shape[axis] = len;
        self.strided_copy("expand", &shape, &strides)
    }
}
