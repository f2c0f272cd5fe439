//! Packing: copies a block of an operand into the panel order the microkernel reads
//! contiguously, zero-padding the last panel, whatever the operand's strides (this is where
//! transposed operands are handled).
//!
//! `a` blocks become panels of `MR` rows: step `p` of a panel holds the panel's rows at column
//! `p`. `b` blocks become panels of `NR` columns: step `p` holds the panel's columns at row `p`.
//! Both are const parameters, so the 6 × 16 AVX2 kernel and the 8 × 32 AVX-512 kernel share
//! this code; the transposing copies run on AVX2 (`pack_avx2.rs`), which both kernels' CPUs have.

use super::tokens::Avx2Fma;
use super::view::Operand;

/// A block of an operand: logical rows `row..row + rows`, columns `col..col + cols`.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// First logical row.
    pub row: usize,
    /// First logical column.
    pub col: usize,
    /// Rows in the block.
    pub rows: usize,
    /// Columns in the block.
    pub cols: usize,
}

/// Checks that every element of `block` lies inside `op`'s storage; after this, the packing
/// loops index without further checks.
pub fn check_block(op: &Operand<'_>, block: Block) {
    assert!(
        block.row + block.rows <= op.rows && block.col + block.cols <= op.cols,
        "a packed block lies inside its operand"
    );
    if block.rows > 0 && block.cols > 0 {
        let last = (block.row + block.rows - 1) * op.row_stride
            + (block.col + block.cols - 1) * op.col_stride;
        assert!(
            last < op.data.len(),
            "a packed block's elements lie in the operand's storage"
        );
    }
}

/// Packs `block` of `a` (rows × depth) into `out` as panels of `MR` rows.
pub fn pack_a<const MR: usize>(cpu: Avx2Fma, out: &mut [f32], a: &Operand<'_>, block: Block) {
    check_block(a, block);
    let depth = block.cols;
    let out = &mut out[..block.rows.div_ceil(MR) * MR * depth];
    // The whole panels of a transposed `a` (each column of the block contiguous in memory).
    let whole = if a.row_stride == 1 && a.col_stride != 1 {
        block.rows / MR
    } else {
        0
    };
    let (by_columns, rest) = out.split_at_mut(whole * MR * depth);
    if whole > 0 {
        let first = block.row + block.col * a.col_stride;
        let group = (RUN_PIECE_BYTES / (MR * size_of::<f32>())).max(1);
        deal_runs::<MR>(by_columns, a.data, (first, a.col_stride), (depth, group));
    }
    for (i, dst) in rest.chunks_exact_mut(MR * depth).enumerate() {
        let first = (whole + i) * MR;
        let live = MR.min(block.rows - first);
        let start = (block.row + first) * a.row_stride + block.col * a.col_stride;
        if live == MR && a.col_stride == 1 {
            cpu.pack_a_rows::<MR>(dst, &a.data[start..], a.row_stride, depth);
            continue;
        }
        if live < MR {
            dst.fill(0.0);
        }
        for r in 0..live {
            let base = (block.row + first + r) * a.row_stride + block.col * a.col_stride;
            for p in 0..depth {
                let src = base + p * a.col_stride;
                debug_assert!(src < a.data.len() && p * MR + r < dst.len());
                // SAFETY: `check_block` proved every element of the block in bounds (src is
                // one of them) and dst holds depth steps of MR elements.
                unsafe { *dst.get_unchecked_mut(p * MR + r) = *a.data.get_unchecked(src) };
            }
        }
    }
}

/// Bytes of each column of a transposed `a` read at a time when packing its whole panels:
/// a group of panels spanning four cache lines of every column. One panel at a time would read
/// half a line of each column, the other half left for the next panel (long gone from L1,
/// whose sets a 4 KiB column stride all maps to one); all panels at once would write to 32
/// panels 8 KiB apart, which share L1 sets too (`mlp.dw.2` of `gemm_bench` is such a product).
const RUN_PIECE_BYTES: usize = 256;

/// Whole panels of `W` elements from contiguous runs of memory, one run a step: run `p`
/// starts at `first + p * stride` and holds step `p` of every panel in `out`, one after the
/// other (the rows of a row-major `b`, the columns of a transposed `a`). The panels are filled
/// `group` at a time: the group's piece of each run is read front to back and dealt out `W`
/// elements per panel. `depth` and `group` are at least 1.
fn deal_runs<const W: usize>(
    out: &mut [f32],
    data: &[f32],
    (first, stride): (usize, usize),
    (depth, group): (usize, usize),
) {
    let panel_len = depth * W;
    for (g, panels) in out.chunks_mut(group * panel_len).enumerate() {
        let width = panels.len() / depth;
        for p in 0..depth {
            let start = first + p * stride + g * group * W;
            let run = &data[start..start + width];
            for (panel, chunk) in run.chunks_exact(W).enumerate() {
                let at = panel * panel_len + p * W;
                panels[at..at + W].copy_from_slice(chunk);
            }
        }
    }
}

/// Packs `block` of `b` (depth × cols) into `out` as panels of `NR` columns.
pub fn pack_b<const NR: usize>(cpu: Avx2Fma, out: &mut [f32], b: &Operand<'_>, block: Block) {
    check_block(b, block);
    let depth = block.rows;
    let out = &mut out[..block.cols.div_ceil(NR) * NR * depth];
    let whole = if b.col_stride == 1 {
        block.cols / NR
    } else {
        0
    };
    let (by_rows, rest) = out.split_at_mut(whole * NR * depth);
    if whole > 0 {
        let first = block.row * b.row_stride + block.col;
        deal_runs::<NR>(by_rows, b.data, (first, b.row_stride), (depth, whole));
    }
    for (i, dst) in rest.chunks_exact_mut(NR * depth).enumerate() {
        let first = (whole + i) * NR;
        let live = NR.min(block.cols - first);
        let col = block.col + first;
        if b.col_stride == 1 {
            pack_b_rows::<NR>(dst, b, block.row, col, live);
        } else if live == NR && b.row_stride == 1 {
            let start = block.row + col * b.col_stride;
            cpu.pack_b_columns::<NR>(dst, &b.data[start..], b.col_stride, depth);
        } else {
            pack_b_strided::<NR>(dst, b, block.row, col, live);
        }
    }
}

/// The partial `b` panel of a row-major `b`: a copy of `live` elements per step.
fn pack_b_rows<const NR: usize>(
    dst: &mut [f32],
    b: &Operand<'_>,
    row: usize,
    col: usize,
    live: usize,
) {
    for (p, step) in dst.chunks_exact_mut(NR).enumerate() {
        let start = (row + p) * b.row_stride + col;
        step[..live].copy_from_slice(&b.data[start..start + live]);
        step[live..].fill(0.0);
    }
}

/// One `b` panel read with a column stride (a transposed `b`): column by column, each a
/// contiguous run in memory when the row stride is 1.
fn pack_b_strided<const NR: usize>(
    dst: &mut [f32],
    b: &Operand<'_>,
    row: usize,
    col: usize,
    live: usize,
) {
    let depth = dst.len() / NR;
    if live < NR {
        dst.fill(0.0);
    }
    for j in 0..live {
        let base = row * b.row_stride + (col + j) * b.col_stride;
        for p in 0..depth {
            let src = base + p * b.row_stride;
            debug_assert!(src < b.data.len() && p * NR + j < dst.len());
            // SAFETY: `pack_b` checked every element of the block in bounds (src is one of
            // them) and dst holds depth steps of NR elements.
            unsafe { *dst.get_unchecked_mut(p * NR + j) = *b.data.get_unchecked(src) };
        }
    }
}
