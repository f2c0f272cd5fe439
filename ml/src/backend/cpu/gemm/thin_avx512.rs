//! An AVX-512 kernel for products of few rows (a recurrent step of a batch of 8, say) with a
//! row-major `b`: nothing is packed. Each pass keeps up to 8 rows × 32 columns of the
//! destination in sixteen 16-wide registers, loads two vectors of `b`'s row in place per step
//! of depth and broadcasts each row's element of `a` from wherever `a` lies (any strides). A 6 ×
//! 16 AVX2 tile would leave a third of its rows empty for 8 rows, and the `gemm` crate's
//! kernels fall short of OpenBLAS's on such products (`lstm.b8`, 8 × 128 × 512). A single row
//! (a recurrent step of one sequence) keeps 128 columns in eight registers instead, so that
//! enough independent sums are in flight to hide the multiply-adds' latency (`lstm.b1`, 1 ×
//! 128 × 512).
//!
//! Products of few columns (a classifier's last layer) with a row-major `a` are dot products
//! instead ([`Avx512::product_few_cols`]), where the `gemm` crate's kernels also fall short of
//! OpenBLAS's (`mlp.fwd.3`, 256 × 1024 × 10).
//!
//! Reachable only through [`Avx512`], a token that exists only after the CPU was seen to
//! support AVX-512F at run time.

use std::sync::OnceLock;

use super::blocked::even_parts;
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

    /// `dst = a · b` (or `+=` when `accumulate`), where `b` is read row by row in place
    /// (`b.col_stride == 1`, which the caller checks) and `a` with any strides. Columns are
    /// split across the pool's threads when `threaded` and the product is large enough.
    pub fn product(
        self,
        dst: DstTile<'_>,
        a: &Operand<'_>,
        b: &Operand<'_>,
        accumulate: bool,
        threaded: bool,
    ) {
        let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
        // A single row reads each element of `b` once: past L2 it waits on memory, which a
        // second core's share of the columns doubles.
        let min_macs = if m == 1 {
            ROW_PARALLEL_MIN_MACS
        } else {
            DOT_PARALLEL_MIN_MACS
        };
        let parts = if threaded && m * n * k >= min_macs {
            rayon::current_num_threads().min(n / COLS)
        } else {
            1
        };
        if parts <= 1 {
            return self.product_serial(dst, a, b, accumulate);
        }
        assert!(b.cols == n && b.col_stride == 1, "b's rows are contiguous");
        let width = n.div_ceil(parts).div_ceil(COLS) * COLS;
        rayon::scope(|s| {
            let mut rest = dst;
            let mut col = 0;
            while col < n {
                let cols = width.min(n - col);
                let (part, after) = rest.split_cols(cols);
                rest = after;
                let b = Operand {
                    data: &b.data[col..],
                    cols,
                    ..*b
                };
                s.spawn(move |_| self.product_serial(part, a, &b, accumulate));
                col += cols;
            }
        });
    }

    /// [`Avx512::product`] on the calling thread.
    fn product_serial(
        self,
        mut dst: DstTile<'_>,
        a: &Operand<'_>,
        b: &Operand<'_>,
        accumulate: bool,
    ) {
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
        if m == 1 {
            return self.row_times_b(dst, a, b, accumulate);
        }
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

    /// [`Avx512::product_serial`] for a single row (a recurrent step of one sequence): passes
    /// of [`ROW_COLS`] columns, so that eight independent sums hide the multiply-adds' latency
    /// (a pass of [`COLS`] has only two, too few to keep the FMA units busy on one row).
    /// The caller checked the operands.
    fn row_times_b(self, mut dst: DstTile<'_>, a: &Operand<'_>, b: &Operand<'_>, accumulate: bool) {
        let (n, k) = (dst.cols(), a.cols);
        for col in (0..n).step_by(ROW_COLS) {
            let tile = dst.sub(0, col, 1, ROW_COLS.min(n - col));
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self` exists only when AVX-512F was detected; `a`'s row and columns
            // col.. of `b` lie in their storage over all k steps (checked by the caller), and
            // `tile` is this pass's part of the destination.
            unsafe {
                let a = (a.data, a.col_stride);
                x86::row_pass(tile, k, a, (&b.data[col..], b.row_stride), accumulate);
            }
        }
    }
}

/// Columns one pass over a single row keeps in registers (eight 16-wide vectors).
pub const ROW_COLS: usize = 128;

/// Multiply-adds from which a single-row product is split across the pool's threads: `b` is
/// then 2 MiB or more, which one core reads from memory rather than from its caches, so a
/// second core's share of the columns adds its own bandwidth (see [`Avx512::product`]).
pub const ROW_PARALLEL_MIN_MACS: usize = 1 << 19;

/// Rows of `a` one dot-product pass of [`Avx512::product_few_cols`] reads together.
const DOT_ROWS: usize = 4;
/// Most columns of `b` one dot-product pass reads together (ten columns: two passes of five).
const DOT_COLS: usize = 5;

/// Most passes of [`DOT_COLS`] columns the dot products make (15 columns).
const DOT_GROUPS: usize = 3;

/// Depth of one block of the dot products: 4 rows and 5 columns of it (36 KiB at 1024) would
/// not stay in a 32 KiB L1 between the two column passes; 256 (9 KiB) do.
const DOT_KC: usize = 256;

/// Multiply-adds below which a thin product stays on the calling thread: below them, waking the
/// pool takes about as long as the half of the work it would take over. 64 × 1024 × 10 (0.7 M)
/// stays on one thread; 256 × 1024 × 10 (2.6 M, a classifier's last layer at batch 256) and
/// larger products split.
pub const DOT_PARALLEL_MIN_MACS: usize = 1 << 21;

impl Avx512 {
    /// `dst = a · b` (or `+=`) for a product of few columns (a classifier's last layer, 256 ×
    /// 1024 × 10): `a`'s rows must be contiguous (`a.col_stride == 1`, which the caller
    /// checks); `b`'s columns are copied out contiguous once (`n × k`, small), then each
    /// element is a dot product of a row and a column, 4 rows × 5 columns at a time in 16-wide
    /// registers, over blocks of [`DOT_KC`] steps. Rows are split across the pool's threads
    /// when `threaded` and the product is large enough.
    pub fn product_few_cols(
        self,
        dst: &mut [f32],
        a: &Operand<'_>,
        b: &Operand<'_>,
        accumulate: bool,
        threaded: bool,
    ) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        assert!(
            b.rows == k && dst.len() == m * n && a.col_stride == 1 && n <= DOT_GROUPS * DOT_COLS,
            "the operands match the destination and a's rows are contiguous"
        );
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        assert!(
            (m - 1) * a.row_stride + k <= a.data.len()
                && (k - 1) * b.row_stride + (n - 1) * b.col_stride < b.data.len(),
            "the operands' elements lie in their storage"
        );
        // One cache line more than `k` between columns: with `k` a multiple of 1024 they would
        // all start 4 KiB apart, on the same L1 sets as each other and as `a`'s rows.
        let stride = k.next_multiple_of(16) + 16;
        let mut columns = vec![0.0f32; n * stride];
        if b.row_stride == 1 {
            // A transposed `b`: each column is contiguous already.
            for (j, column) in columns.chunks_exact_mut(stride).enumerate() {
                let from = j * b.col_stride;
                column[..k].copy_from_slice(&b.data[from..from + k]);
            }
        } else {
            // Row by row, each read once front to back and dealt out to the columns.
            let width = (n - 1) * b.col_stride + 1;
            for p in 0..k {
                let row = &b.data[p * b.row_stride..p * b.row_stride + width];
                for j in 0..n {
                    columns[j * stride + p] = row[j * b.col_stride];
                }
            }
        }
        let rows_of = |first: usize, out: &mut [f32]| {
            let rows = out.len() / n;
            for row in (0..rows).step_by(DOT_ROWS) {
                let live = DOT_ROWS.min(rows - row);
                let start = (first + row) * a.row_stride;
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F was detected (`self`); `live` rows of `k` elements lie from
                // `start` in `a` (asserted above), `columns` holds `n` columns of `k`, `stride`
                // apart, and rows row..row + live of `out` hold `n` elements.
                unsafe {
                    x86::dots(
                        (&a.data[start..], a.row_stride, live),
                        (&columns, stride, n),
                        k,
                        (&mut out[row * n..], n),
                        accumulate,
                    );
                }
            }
        };
        let parts = if threaded && m * n * k >= DOT_PARALLEL_MIN_MACS {
            rayon::current_num_threads().min(m.div_ceil(DOT_ROWS))
        } else {
            1
        };
        if parts <= 1 {
            return rows_of(0, dst);
        }
        let rows_per_part = m.div_ceil(parts).div_ceil(DOT_ROWS) * DOT_ROWS;
        use rayon::prelude::*;
        dst.par_chunks_mut(rows_per_part * n)
            .enumerate()
            .for_each(|(i, out)| rows_of(i * rows_per_part, out));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ROWS;
    use crate::backend::cpu::gemm::DstTile;
    use crate::backend::cpu::gemm::microkernel::x86::{first_lanes, store_sums};
    use crate::backend::cpu::gemm::view::Onto;

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
        let (rows, cols) = (tile.rows(), tile.cols());
        let (mask0, mask1) = (first_lanes(cols), first_lanes(cols.saturating_sub(16)));
        debug_assert!(rows == R && R <= ROWS);
        let mut row_ptr = [a.as_ptr(); ROWS];
        for (r, ptr) in row_ptr.iter_mut().enumerate().take(R) {
            *ptr = a.as_ptr().wrapping_add(r * a_rs);
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        let mut bp = b.as_ptr();
        for p in 0..k {
            // SAFETY: step p < k of b's row holds the tile's columns (masked past them) and
            // each row pointer's element p lies in `a` (see the function's contract).
            unsafe {
                let b0 = _mm512_maskz_loadu_ps(mask0, bp);
                let b1 = _mm512_maskz_loadu_ps(mask1, bp.wrapping_add(16));
                for r in 0..R {
                    let ar = _mm512_set1_ps(*row_ptr[r].add(p * a_cs));
                    acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
                }
            }
            bp = bp.wrapping_add(ldb);
        }
        // SAFETY: AVX-512F is enabled here; the tile is writable (the function's contract).
        unsafe { store_sums(&acc[..R], &tile, Onto::accumulating(accumulate)) };
    }

    /// One pass over a single row: `tile` (1 row, at most [`super::ROW_COLS`] columns) `=` or
    /// `+=` `a`'s row times `b`'s columns, in eight independent 16-wide sums.
    ///
    /// # Safety
    /// AVX-512F is available; `a` has its `k` elements at `a[p * a_cs]`, `b` holds
    /// `tile.cols()` elements from each `p * ldb`, and `tile` is writable as its columns say.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row_pass(
        tile: DstTile<'_>,
        k: usize,
        (a, a_cs): (&[f32], usize),
        (b, ldb): (&[f32], usize),
        accumulate: bool,
    ) {
        const VECTORS: usize = super::ROW_COLS / 16;
        let cols = tile.cols();
        let masks: [__mmask16; VECTORS] =
            std::array::from_fn(|v| first_lanes(cols.saturating_sub(16 * v)));
        let mut acc = [_mm512_setzero_ps(); VECTORS];
        let mut bp = b.as_ptr();
        for p in 0..k {
            // SAFETY: element p of `a`'s row and the tile's columns of b's row p (masked past
            // them) lie in the operands (the function's contract).
            unsafe {
                let ar = _mm512_set1_ps(*a.as_ptr().add(p * a_cs));
                for (v, sum) in acc.iter_mut().enumerate() {
                    let bv = _mm512_maskz_loadu_ps(masks[v], bp.wrapping_add(16 * v));
                    *sum = _mm512_fmadd_ps(ar, bv, *sum);
                }
            }
            bp = bp.wrapping_add(ldb);
        }
        // SAFETY: AVX-512F is enabled here; the tile is writable (the function's contract).
        unsafe { store_sums(&[acc], &tile, Onto::accumulating(accumulate)) };
    }

    /// `out[r][j] (+)= a_r · column_j` for `rows <= DOT_ROWS` rows of `a` (`a_ld` apart) and
    /// `cols <= DOT_GROUPS * DOT_COLS` columns of `k` contiguous elements (`c_ld` apart); `out`
    /// rows `ld` apart. Runs over blocks of DOT_KC steps, each block's rows of `a` read from L1
    /// by every pass of DOT_COLS columns; the passes' sums wait in memory between blocks and are
    /// reduced once at the end.
    ///
    /// # Safety
    /// AVX-512F is available; `a` holds `(rows - 1) * a_ld + k` elements, `columns` holds
    /// `(cols - 1) * c_ld + k`, and `out` holds `(rows - 1) * ld + cols`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dots(
        (a, a_ld, rows): (&[f32], usize, usize),
        (columns, c_ld, cols): (&[f32], usize, usize),
        k: usize,
        (out, ld): (&mut [f32], usize),
        accumulate: bool,
    ) {
        use super::{DOT_COLS, DOT_GROUPS, DOT_KC, DOT_ROWS, even_parts};
        debug_assert!(
            (1..=DOT_ROWS).contains(&rows) && (1..=DOT_GROUPS * DOT_COLS).contains(&cols)
        );
        debug_assert!((rows - 1) * a_ld + k <= a.len() && (cols - 1) * c_ld + k <= columns.len());
        // Rows past the live ones repeat the last: computed, never stored.
        let a_ptr: [*const f32; DOT_ROWS] =
            std::array::from_fn(|r| a.as_ptr().wrapping_add(r.min(rows - 1) * a_ld));
        let groups = cols.div_ceil(DOT_COLS);
        let mut sums = [[_mm512_setzero_ps(); DOT_ROWS * DOT_COLS]; DOT_GROUPS];
        for (depth, kc) in even_parts(k, DOT_KC, 16) {
            for (g, acc) in sums.iter_mut().enumerate().take(groups) {
                let (col, end) = (cols * g / groups, cols * (g + 1) / groups);
                // Columns past the pass's live ones repeat its last: computed, never stored.
                let c_ptr: [*const f32; DOT_COLS] = std::array::from_fn(|j| {
                    columns.as_ptr().wrapping_add((col + j).min(end - 1) * c_ld)
                });
                // SAFETY: steps depth..depth + kc of every row and column lie in their slices.
                unsafe { block(acc, &a_ptr, &c_ptr, depth, kc) };
            }
        }
        for (g, acc) in sums.iter().enumerate().take(groups) {
            let (col, end) = (cols * g / groups, cols * (g + 1) / groups);
            for r in 0..rows {
                for j in col..end {
                    let sum = _mm512_reduce_add_ps(acc[r * DOT_COLS + j - col]);
                    let slot = &mut out[r * ld + j];
                    *slot = if accumulate { *slot + sum } else { sum };
                }
            }
        }
    }

    /// Steps `depth..depth + kc` of the dot products of `a`'s rows and the columns, added to
    /// `acc` (row-major, DOT_ROWS × DOT_COLS vectors of partial sums).
    ///
    /// # Safety
    /// AVX-512F is available and every pointer has those steps' elements.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block(
        acc: &mut [__m512; super::DOT_ROWS * super::DOT_COLS],
        a: &[*const f32; super::DOT_ROWS],
        c: &[*const f32; super::DOT_COLS],
        depth: usize,
        kc: usize,
    ) {
        let mut regs = *acc;
        let mut p = depth;
        while p < depth + kc {
            let live = (depth + kc - p).min(16);
            let mask = first_lanes(live);
            // SAFETY: elements p..p + live of every row and column lie in their storage (the
            // function's contract); the mask keeps the loads to them.
            unsafe {
                let av: [__m512; super::DOT_ROWS] =
                    std::array::from_fn(|r| _mm512_maskz_loadu_ps(mask, a[r].add(p)));
                for (j, column) in c.iter().enumerate() {
                    let bv = _mm512_maskz_loadu_ps(mask, column.add(p));
                    for (r, &x) in av.iter().enumerate() {
                        let at = r * super::DOT_COLS + j;
                        regs[at] = _mm512_fmadd_ps(x, bv, regs[at]);
                    }
                }
            }
            p += live;
        }
        *acc = regs;
    }
}
