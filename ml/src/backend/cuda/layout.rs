//! Strided views of row-major tensors, for the kernels that read one tensor through another's
//! layout: broadcasts, permutations, slices and broadcast reductions.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::kernels::{MAX_DIMS, Strided};
use super::launch::launch;
use crate::error::{MlError, Result};

/// Row-major strides of `shape`, in elements.
pub(super) fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut s = 1i64;
    for d in (0..shape.len()).rev() {
        strides[d] = s;
        s *= shape[d] as i64;
    }
    strides
}

/// A [`Strided`] over `dims` with operand strides `sa` and `sb`.
pub(super) fn strided(op: &'static str, dims: &[usize], sa: &[i64], sb: &[i64]) -> Result<Strided> {
    if dims.len() > MAX_DIMS {
        return Err(MlError::invalid(
            op,
            format!(
                "the CUDA backend handles tensors of at most {MAX_DIMS} dimensions, not {}",
                dims.len()
            ),
        ));
    }
    let mut s = Strided {
        ndim: dims.len() as i32,
        ..Default::default()
    };
    for (d, &n) in dims.iter().enumerate() {
        s.dims[d] = i32::try_from(n).map_err(|_| {
            MlError::invalid(
                op,
                format!("dimension {n} is too large for the CUDA backend"),
            )
        })?;
        s.sa[d] = sa[d];
        s.sb[d] = sb[d];
    }
    Ok(s)
}

/// Strides of `shape` read as broadcast to `target` (0 along broadcast or missing dimensions).
pub(super) fn broadcast_strides(shape: &[usize], target: &[usize]) -> Vec<i64> {
    let own = contiguous_strides(shape);
    let pad = target.len() - shape.len();
    (0..target.len())
        .map(|d| {
            if d < pad || shape[d - pad] == 1 {
                0
            } else {
                own[d - pad]
            }
        })
        .collect()
}

/// `(outer, len, inner)` around `axis`: the lanes of a softmax or an axis sum.
pub(super) fn split_at_axis(shape: &[usize], axis: usize) -> (i64, i64, i64) {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    (outer as i64, shape[axis] as i64, inner as i64)
}

impl CudaStorage {
    /// Copies `self` through a strided view into a new contiguous tensor of `shape`.
    pub(super) fn strided_copy(
        &self,
        op: &'static str,
        shape: &[usize],
        src_strides: &[i64],
    ) -> Result<CudaStorage> {
        self.launch_new(op, &[], shape, |gpu, out| {
            let s = strided(op, shape, src_strides, &contiguous_strides(shape))?;
            let n = out.n();
            launch!(
                gpu,
                "strided_copy",
                Gpu::elementwise(out.len),
                &n,
                &s,
                self.buf(),
                out.buf_mut()
            )
        })
    }
}
