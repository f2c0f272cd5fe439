//! Splitting a product across the threads of the current rayon pool.
//!
//! The destination is cut into one rectangle per thread, along its longer side first (a grid
//! when there are many threads), each a whole number of microkernel tiles; every rectangle is
//! then an independent blocked product on its own thread, packing only the rows of `a` and the
//! columns of `b` it needs. No thread waits on another until the end. The split is static, as
//! suits an executor that owns its cores: a core that another process keeps busy slows its
//! rectangle, and the product with it.

use super::blocked;
use super::microkernel::Microkernel;
use super::view::{DstTile, Operand, Start};

/// Multiply-adds below which a product stays on the calling thread: waking the pool's threads
/// costs microseconds, the time of about this much work on one core (the `gemm` crate's own
/// threshold is of the same order).
pub const PARALLEL_MIN_MACS: usize = 1 << 19;

/// How many rectangles to cut along the rows and along the columns for `threads` threads:
/// as many rectangles as threads where the product has that many tiles, and among those the
/// grid whose rectangles pack the least (`m / rows + n / cols` per unit of depth), for tiles
/// of `mr × nr`.
pub fn grid(m: usize, n: usize, threads: usize, (mr, nr): (usize, usize)) -> (usize, usize) {
    let (row_max, col_max) = (m.div_ceil(mr).max(1), n.div_ceil(nr).max(1));
    (1..=threads.min(row_max))
        .map(|rows| (rows, (threads / rows).min(col_max)))
        .min_by_key(|&(rows, cols)| {
            let packed = m.div_ceil(rows) + n.div_ceil(cols);
            (std::cmp::Reverse(rows * cols), packed)
        })
        .unwrap_or((1, 1))
}

/// `dst = start + a · b` on the current rayon pool, one rectangle per thread, each started
/// (see [`Start::prepare`]) by the thread that multiplies into it.
pub fn product<K: Microkernel>(
    cpu: K,
    mut dst: DstTile<'_>,
    a: &Operand<'_>,
    b: &Operand<'_>,
    start: Start<'_>,
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    let threads = rayon::current_num_threads();
    if threads <= 1 || m * n * k < PARALLEL_MIN_MACS {
        let onto = start.prepare(&mut dst);
        return blocked::product(cpu, dst, a, b, onto);
    }
    let (row_parts, col_parts) = grid(m, n, threads, (K::MR, K::NR));
    let mut rects = Vec::with_capacity(row_parts * col_parts);
    let mut rest = dst;
    for (row, rows) in parts(m, row_parts, K::MR) {
        let (band, below) = rest.split_rows(rows);
        rest = below;
        let mut right = band;
        for (col, cols) in parts(n, col_parts, K::NR) {
            let (rect, after) = right.split_cols(cols);
            right = after;
            rects.push((row, col, rect));
        }
    }
    rayon::scope(|s| {
        for (row, col, mut rect) in rects {
            let a = rows_of(a, row, rect.rows());
            let b = rows_of(&b.t(), col, rect.cols()).t();
            let start = start.columns(col, rect.cols());
            s.spawn(move |_| {
                let onto = start.prepare(&mut rect);
                blocked::product(cpu, rect, &a, &b, onto)
            });
        }
    });
}

/// `len` cut into `count` near-equal parts, each a multiple of `unit` but the last.
fn parts(len: usize, count: usize, unit: usize) -> impl Iterator<Item = (usize, usize)> {
    let units = len.div_ceil(unit);
    let count = count.clamp(1, units.max(1));
    (0..count).map(move |i| {
        let start = (units * i / count * unit).min(len);
        let end = (units * (i + 1) / count * unit).min(len);
        (start, end - start)
    })
}

/// Logical rows `row..row + rows` of `op`, as an operand of its own.
fn rows_of<'a>(op: &Operand<'a>, row: usize, rows: usize) -> Operand<'a> {
    assert!(
        row + rows <= op.rows,
        "a band of rows lies inside its operand"
    );
    let start = (row * op.row_stride).min(op.data.len());
    Operand {
        data: &op.data[start..],
        rows,
        ..*op
    }
}
