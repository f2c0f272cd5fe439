//! Reductions: sums over all elements, along one axis, or over the dimensions that
//! broadcasting expanded.

use rayon::prelude::*;

use super::elementwise::add_assign;
use super::{CpuArray, PAR_MIN, from_vec, slice, slice_mut};
use crate::backend::reduce::{ReduceOps, sum_to_shape_from_primitives};
use crate::error::Result;

/// The sum of all elements as a 0-dimensional array (accumulated in f64).
pub fn sum_all(x: &CpuArray) -> CpuArray {
    let s: f64 = slice(x).iter().map(|&v| v as f64).sum();
    from_vec(&[], vec![s as f32])
}

/// The sum along `axis`, keeping it as a dimension of size 1 when `keepdim`.
pub fn sum_axis(x: &CpuArray, axis: usize, keepdim: bool) -> CpuArray {
    let shape = x.shape();
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![0.0f32; outer * inner];
    let xs = slice(x);
    for o in 0..outer {
        let dst = &mut out[o * inner..(o + 1) * inner];
        for l in 0..len {
            let src = &xs[(o * len + l) * inner..(o * len + l + 1) * inner];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += s;
            }
        }
    }
    let mut out_shape: Vec<usize> = shape.to_vec();
    if keepdim {
        out_shape[axis] = 1;
    } else {
        out_shape.remove(axis);
    }
    from_vec(&out_shape, out)
}

/// The sum of squares of all elements, in f64 (for gradient norms).
pub fn sum_squares(x: &CpuArray) -> f64 {
    slice(x).iter().map(|&v| (v as f64) * (v as f64)).sum()
}

/// Columns per block when summing a matrix's rows.
const COLUMN_BLOCK: usize = 128;

/// Sums `x` into `dst` (or adds it, when `accumulate`) where the shapes are equal or `dst` is a
/// bias (`[rows, n]` summed to `[n]` or `[1, n]`); returns false, leaving `dst` untouched, for
/// any other broadcast.
pub fn sum_to_shape_fast_paths(x: &CpuArray, dst: &mut CpuArray, accumulate: bool) -> bool {
    let target: Vec<usize> = dst.shape().to_vec();
    let last = target.last().copied().unwrap_or(1);
    let same = x.shape() == target.as_slice();
    let bias = x.ndim() >= 1
        && x.shape().last() == Some(&last)
        && dst.len() == last
        && target.iter().rev().skip(1).all(|&d| d == 1);
    if !same && !bias {
        return false;
    }
    if !accumulate {
        slice_mut(dst).fill(0.0);
    }
    if same {
        add_assign(dst, x);
        return true;
    }
    // Each thread owns a block of columns and sums it over all rows, in row order.
    let xs = slice(x);
    let columns = |(block, cols): (usize, &mut [f32])| {
        let (start, width) = (block * COLUMN_BLOCK, cols.len());
        for row in xs.chunks_exact(last.max(1)) {
            for (acc, &v) in cols.iter_mut().zip(&row[start..start + width]) {
                *acc += v;
            }
        }
    };
    let d = slice_mut(dst);
    if xs.len() >= PAR_MIN {
        d.par_chunks_mut(COLUMN_BLOCK).enumerate().for_each(columns);
    } else {
        d.chunks_mut(COLUMN_BLOCK).enumerate().for_each(columns);
    }
    true
}

impl ReduceOps for CpuArray {
    fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Self> {
        Ok(match axis {
            None => sum_all(self),
            Some(axis) => sum_axis(self, axis, keepdim),
        })
    }

    fn sum_squares(&self) -> Result<f64> {
        Ok(sum_squares(self))
    }

    /// The bias and same-shape cases in one parallel pass; the general case by axis sums.
    fn sum_to_shape_into(&self, dst: &mut Self, accumulate: bool) -> Result<()> {
        if sum_to_shape_fast_paths(self, dst, accumulate) {
            Ok(())
        } else {
            sum_to_shape_from_primitives(self, dst, accumulate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::zeros;

    #[test]
    fn sums_along_each_axis() {
        let x = from_vec(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(slice(&sum_axis(&x, 0, false)), &[5., 7., 9.]);
        assert_eq!(slice(&sum_axis(&x, 1, false)), &[6., 15.]);
        assert_eq!(sum_axis(&x, 1, true).shape(), &[2, 1]);
        assert_eq!(slice(&sum_all(&x)), &[21.]);
        let e = ReduceOps::expand_axis(&sum_axis(&x, 1, false), 1, 3, false).unwrap();
        assert_eq!(slice(&e), &[6., 6., 6., 15., 15., 15.]);
    }

    #[test]
    fn bias_reduction() {
        let a = from_vec(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let mut d = zeros(&[3]);
        ReduceOps::sum_to_shape_into(&a, &mut d, false).unwrap();
        assert_eq!(slice(&d), &[5., 7., 9.]);
        let mut col = zeros(&[2, 1]);
        ReduceOps::sum_to_shape_into(&a, &mut col, false).unwrap();
        assert_eq!(slice(&col), &[6., 15.]);
    }
}
