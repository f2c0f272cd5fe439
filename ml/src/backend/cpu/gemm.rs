//! Matrix products through the `gemm` crate.

use gemm::Parallelism;
use rayon::prelude::*;

use super::{CpuArray, slice, slice_mut};
use crate::backend::matmul::MatmulOps;
use crate::error::Result;

/// A row-major matrix operand, possibly read transposed.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    /// The stored elements, row-major `rows × cols` of the *stored* matrix.
    pub data: &'a [f32],
    /// Rows of the stored matrix.
    pub rows: usize,
    /// Columns of the stored matrix.
    pub cols: usize,
    /// Read the matrix transposed (no copy: only the strides change).
    pub transposed: bool,
}

impl<'a> MatRef<'a> {
    /// A `rows × cols` row-major matrix, read as stored.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            transposed: false,
        }
    }

    /// The same matrix, read transposed.
    pub fn t(self) -> Self {
        MatRef {
            transposed: !self.transposed,
            ..self
        }
    }

    /// Rows and columns as the product sees them.
    pub fn logical_dims(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (row stride, column stride) of the logical matrix.
    fn strides(&self) -> (isize, isize) {
        if self.transposed {
            (1, self.cols as isize)
        } else {
            (self.cols as isize, 1)
        }
    }
}

/// `dst (m×n) = a (m×k) · b (k×n)`, or `dst += a · b` when `accumulate` is set.
///
/// `dst` is row-major and contiguous. Large products run on all threads of the current rayon
/// pool (the executor sizes it to its `--cores`); `gemm` itself stays single-threaded below its
/// threading threshold.
pub fn matmul_into(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, accumulate: bool) {
    gemm_into(dst, a, b, accumulate, Parallelism::Rayon(0));
}

/// [`matmul_into`] on the calling thread only: for the many small products of a loop that is
/// itself parallel (a convolution's images).
pub fn matmul_into_serial(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, accumulate: bool) {
    gemm_into(dst, a, b, accumulate, Parallelism::None);
}

/// [`matmul_into`] with the given threading.
fn gemm_into(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let (m, k) = a.logical_dims();
    let (k2, n) = b.logical_dims();
    assert_eq!(k, k2, "caller checked the inner dimensions");
    assert_eq!(dst.len(), m * n, "caller sized the destination");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    // SAFETY: the pointers cover m×k, k×n and m×n elements with the given strides (checked by
    // the assertions above and by the callers' shape checks), `dst` does not alias `a` or `b`
    // (it is a unique borrow), and f32 is one of gemm's supported element types.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// A 2-D array as a GEMM operand.
fn mat_ref(x: &CpuArray, transposed: bool) -> MatRef<'_> {
    MatRef {
        data: slice(x),
        rows: x.shape()[0],
        cols: x.shape()[1],
        transposed,
    }
}

impl MatmulOps for CpuArray {
    fn matmul_into(
        dst: &mut Self,
        a: &Self,
        transpose_a: bool,
        b: &Self,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        let (a, b) = (mat_ref(a, transpose_a), mat_ref(b, transpose_b));
        matmul_into(slice_mut(dst), a, b, accumulate);
        Ok(())
    }

    fn bmm_into(
        dst: &mut Self,
        a: &Self,
        transpose_a: bool,
        b: &Self,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        let entry = |x: &CpuArray| (x.shape()[0], x.shape()[1], x.shape()[2]);
        let ((batch, a_rows, a_cols), (_, b_rows, b_cols)) = (entry(a), entry(b));
        let out = dst.shape()[1] * dst.shape()[2];
        if batch == 0 || out == 0 {
            return Ok(());
        }
        let (a_data, b_data) = (slice(a), slice(b));
        let operands = |i: usize| {
            let (a_len, b_len) = (a_rows * a_cols, b_rows * b_cols);
            let a = MatRef::new(&a_data[i * a_len..(i + 1) * a_len], a_rows, a_cols);
            let b = MatRef::new(&b_data[i * b_len..(i + 1) * b_len], b_rows, b_cols);
            let a = if transpose_a { a.t() } else { a };
            (a, if transpose_b { b.t() } else { b })
        };
        let dst = slice_mut(dst);
        // Enough entries to keep every thread busy: one single-threaded product per entry, in
        // parallel; otherwise one entry after the other, each on every thread.
        if batch > 1 && batch >= rayon::current_num_threads() {
            dst.par_chunks_mut(out).enumerate().for_each(|(i, c)| {
                let (a, b) = operands(i);
                matmul_into_serial(c, a, b, accumulate);
            });
        } else {
            for (i, c) in dst.chunks_mut(out).enumerate() {
                let (a, b) = operands(i);
                matmul_into(c, a, b, accumulate);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    out[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        out
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut t = vec![0.0; x.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = x[r * cols + c];
            }
        }
        t
    }

    #[test]
    fn products_match_the_definition_in_every_orientation() {
        let (m, k, n) = (37, 53, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let want = naive(&a, &b, m, k, n);
        let at = transpose(&a, m, k);
        let bt = transpose(&b, k, n);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (ad, ar, ac) = if ta { (&at, k, m) } else { (&a, m, k) };
            let (bd, br, bc) = if tb { (&bt, n, k) } else { (&b, k, n) };
            let mut dst = vec![1.0; m * n];
            matmul_into(
                &mut dst,
                MatRef {
                    data: ad,
                    rows: ar,
                    cols: ac,
                    transposed: ta,
                },
                MatRef {
                    data: bd,
                    rows: br,
                    cols: bc,
                    transposed: tb,
                },
                false,
            );
            assert_eq!(dst, want, "transposes {ta} {tb}");
            matmul_into(
                &mut dst,
                MatRef {
                    data: ad,
                    rows: ar,
                    cols: ac,
                    transposed: ta,
                },
                MatRef {
                    data: bd,
                    rows: br,
                    cols: bc,
                    transposed: tb,
                },
                true,
            );
            let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
            assert_eq!(dst, twice, "accumulating, transposes {ta} {tb}");
        }
    }
}
