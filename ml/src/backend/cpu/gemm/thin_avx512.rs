//! An AVX-512 kernel for products of few rows (a recurrent step of a batch of 8, say) with a
//! row-major `b`: nothing is packed. Each pass keeps up to 8 rows × 32 columns of the
//! destination in sixteen 16-wide registers, loads two vectors of `b`'s row in place per step
//! of depth and broadcasts each row's element of `a` from wherever `a` lies (any strides). A 6 ×
//! 16 AVX2 tile would leave a third of its rows empty for 8 rows, and the `gemm` crate reaches
//! about 88 GFLOP/s on `lstm.b8` (8 × 128 × 512) where OpenBLAS reaches 104.
//!
//! Reachable only through [`Avx512`], a token that exists only after the CPU was seen to
//! support AVX-512F at run time.

use std::sync::OnceLock;

use super::view::{DstTile, Operand};

/// Most rows one pass keeps in registers.
pub const ROWS: usize = 8;
/// Columns one pass keeps in registers (two 16-wide vectors).
pub const COLS: usize = 32;

/// Proof that the running CPU has AVX-512F: the only way to call the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

impl Avx512 {
    /// The token, when this CPU supports AVX-512F (detected once, then cached).
    pub fn detect() -> Option<Self> {
        static DETECTED: OnceLock<bool> = OnceLock::new();
        let yes = *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx512f")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        });
        yes.then_some(Avx512(()))
    }

    /// `dst = a · b` (or `+=` when `accumulate`) on the calling thread, where `b` is read row
    /// by row in place (`b.col_stride == 1`, which the caller checks) and `a` with any strides.
    pub fn product(self, mut dst: DstTile<'_>, a: &Operand<'_>, b: &Operand<'_>, accumulate: bool) {
        let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
        assert!(
            a.rows == m && b.rows == k && b.cols == n && b.col_stride == 1,
            "the operands match the destination and b's rows are contiguous"
        );
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        let last = |op: &Operand<'_>| (op.rows - 1) * op.row_stride + (op.cols - 1) * op.col_stride;
        assert!(
            last(a) < a.data.len() && last(b) < b.data.len(),
            "the operands' elements lie in their storage"
        );
        // Rows in passes of at most ROWS, split evenly (13 rows: 7 and 6).
        let passes = m.div_ceil(ROWS);
        for pass in 0..passes {
            let (row, end) = (m * pass / passes, m * (pass + 1) / passes);
            for col in (0..n).step_by(COLS) {
                let cols = COLS.min(n - col);
                let tile = dst.sub(row, col, end - row, cols);
                let a_start = row * a.row_stride;
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `self` exists only when AVX-512F was detected; rows row..end of `a`
                // and columns col..col + cols of `b` lie in their storage over all k steps
                // (asserted above), and `tile` is this pass's part of the destination.
                unsafe {
                    let a = (&a.data[a_start..], a.row_stride, a.col_stride);
                    let b = (&b.data[col..], b.row_stride);
                    match end - row {
                        1 => x86::pass::<1>(tile, k, a, b, accumulate),
                        2 => x86::pass::<2>(tile, k, a, b, accumulate),
                        3 => x86::pass::<3>(tile, k, a, b, accumulate),
                        4 => x86::pass::<4>(tile, k, a, b, accumulate),
                        5 => x86::pass::<5>(tile, k, a, b, accumulate),
                        6 => x86::pass::<6>(tile, k, a, b, accumulate),
                        7 => x86::pass::<7>(tile, k, a, b, accumulate),
                        _ => x86::pass::<ROWS>(tile, k, a, b, accumulate),
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ROWS;
    use crate::backend::cpu::gemm::DstTile;

    /// One pass: `tile` (`R` rows, at most [`super::COLS`] columns) `=` or `+=` `a`'s rows
    /// times `b`'s columns.
    ///
    /// # Safety
    /// AVX-512F is available; `tile` has `R <= ROWS` rows; row `r < R` of `a` has its `k`
    /// elements at `a[r * a_rs + p * a_cs]`, `b` holds `tile.cols()` elements from each
    /// `p * ldb`, and `tile` is writable as its rows, columns and row stride describe.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pass<const R: usize>(
        tile: DstTile<'_>,
        k: usize,
        (a, a_rs, a_cs): (&[f32], usize, usize),
        (b, ldb): (&[f32], usize),
        accumulate: bool,
    ) {
        let (rows, cols, ld, c) = (tile.rows(), tile.cols(), tile.ld(), tile.ptr());
        let lanes = |from: usize| -> __mmask16 {
            let live = cols.saturating_sub(from).min(16);
            ((1u32 << live) - 1) as __mmask16
        };
        let (mask0, mask1) = (lanes(0), lanes(16));
        debug_assert!(rows == R && R <= ROWS);
        let mut row_ptr = [a.as_ptr(); ROWS];
        for (r, ptr) in row_ptr.iter_mut().enumerate().take(R) {
            *ptr = a.as_ptr().wrapping_add(r * a_rs);
        }
        let mut acc = [_mm512_setzero_ps(); 2 * ROWS];
        let mut bp = b.as_ptr();
        for p in 0..k {
            // SAFETY: step p < k of b's row holds the tile's columns (masked past them) and
            // each row pointer's element p lies in `a` (see the function's contract).
            unsafe {
                let b0 = _mm512_maskz_loadu_ps(mask0, bp);
                let b1 = _mm512_maskz_loadu_ps(mask1, bp.wrapping_add(16));
                for r in 0..R {
                    let ar = _mm512_set1_ps(*row_ptr[r].add(p * a_cs));
                    acc[2 * r] = _mm512_fmadd_ps(ar, b0, acc[2 * r]);
                    acc[2 * r + 1] = _mm512_fmadd_ps(ar, b1, acc[2 * r + 1]);
                }
            }
            bp = bp.wrapping_add(ldb);
        }
        for (r, pair) in acc.chunks_exact(2).take(R).enumerate() {
            // SAFETY: row r < rows of the tile holds `cols` elements from c + r * ld; the masks
            // cover exactly those.
            unsafe {
                let row = c.add(r * ld);
                // Past the tile's columns when it has 16 or fewer: masked off, never touched.
                let high = row.wrapping_add(16);
                let (mut lo, mut hi) = (pair[0], pair[1]);
                if accumulate {
                    lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(mask0, row));
                    hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(mask1, high));
                }
                _mm512_mask_storeu_ps(row, mask0, lo);
                _mm512_mask_storeu_ps(high, mask1, hi);
            }
        }
    }
}
