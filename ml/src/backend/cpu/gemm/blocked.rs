//! The cache-blocked product of one destination rectangle on the calling thread (the loops of
//! Goto and van de Geijn, as BLIS runs them).
//!
//! For each block of [`NC`] columns and [`KC`] depth, `b`'s block is packed once (it then sits
//! in L3, and one 16-column panel of it, `KC × 16` floats, in L1); for each block of [`MC`]
//! rows, `a`'s block is packed (it then sits in L2) and the microkernel sweeps every 6 × 16
//! tile. Block sizes are split evenly, so that no block is a sliver. A rectangle of at most
//! [`MC`] rows packs `b` a few panels at a time instead ([`SHORT_CHUNK`]), since its packed
//! block would serve a single `a` block.

use std::cell::Cell;

use super::kernel_avx2::{Avx2Fma, MR, NR};
use super::pack::{Block, pack_a, pack_b, packed_a_len, packed_b_len, prefetch_block};
use super::view::{DstTile, Operand};

/// Largest depth of a packed block: a `b` panel (`KC × 16` floats, 16 KiB) fits the 32 KiB L1
/// of the cores this is tuned for next to the `a` panel in flight.
pub const KC: usize = 256;
/// Largest number of rows of a packed `a` block: `MC × KC` floats (144 KiB) stay in a 512 KiB
/// L2 beside the `b` panels streaming through.
pub const MC: usize = 144;
/// Largest number of columns of a packed `b` block: `KC × NC` floats (4 MiB) in L3.
pub const NC: usize = 4080;

thread_local! {
    /// This thread's packing buffers for `a` and `b`, kept between products. Taken out while
    /// in use, so a nested product on the same thread (rayon runs other jobs while waiting)
    /// simply gets fresh ones.
    static BUFFERS: Cell<(Vec<f32>, Vec<f32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// `len` evenly split into parts of at most `max`, each a multiple of `unit` but the last:
/// the (start, len) of every part.
pub fn even_parts(len: usize, max: usize, unit: usize) -> impl Iterator<Item = (usize, usize)> {
    let parts = len.div_ceil(max).max(1);
    let size = len.div_ceil(parts).div_ceil(unit) * unit;
    (0..len)
        .step_by(size.max(1))
        .map(move |start| (start, size.min(len - start)))
}

/// Rows up to which a product reads a row-major `b` where it lies instead of packing it: the
/// few 6-row panels of a short `a` reuse each `b` panel too little to repay its copy, and the
/// panel's lines stay in L1/L2 between them.
pub const DIRECT_B_MAX_ROWS: usize = 96;

/// Largest row stride (elements) of a `b` read in place. Wider rows put every step of a panel
/// on its own page, or 4 KiB apart on the same cache sets (a 1024-wide `b` ran at 0.55× the
/// packed speed), so they are packed whatever the rows.
pub const DIRECT_B_MAX_STRIDE: usize = 512;

/// Where the microkernel reads a block of `b` from.
#[derive(Clone, Copy)]
enum BSource<'a> {
    /// Packed panels, `kc × NR` each.
    Packed(&'a [f32]),
    /// The operand itself from the block's first element, rows `ld` apart, for whole panels;
    /// the last, partial panel packed in `edge`.
    Direct {
        data: &'a [f32],
        ld: usize,
        edge: &'a [f32],
    },
}

impl<'a> BSource<'a> {
    /// Panel `jp` of `cols` columns over `kc` steps: its elements and the distance between
    /// its steps.
    fn panel(self, jp: usize, cols: usize, kc: usize) -> (&'a [f32], usize) {
        match self {
            BSource::Packed(buf) => (&buf[jp * kc * NR..(jp + 1) * kc * NR], NR),
            BSource::Direct { data, ld, .. } if cols == NR => (&data[jp * NR..], ld),
            BSource::Direct { edge, .. } => (edge, NR),
        }
    }
}

/// `dst = a · b` (or `+=` when `accumulate`) for one rectangle: `a` holds the rectangle's rows
/// (`dst.rows() × k`), `b` its columns (`k × dst.cols()`).
pub fn product(
    cpu: Avx2Fma,
    mut dst: DstTile<'_>,
    a: &Operand<'_>,
    b: &Operand<'_>,
    accumulate: bool,
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    debug_assert!(a.rows == m && b.rows == k && b.cols == n);
    let direct = b.col_stride == 1 && m <= DIRECT_B_MAX_ROWS && b.row_stride <= DIRECT_B_MAX_STRIDE;
    let (mut a_buf, mut b_buf) = BUFFERS.with(Cell::take);
    if m <= MC && !direct {
        short_product(cpu, dst, (a, b), (&mut a_buf, &mut b_buf), accumulate);
        BUFFERS.with(|cell| cell.set((a_buf, b_buf)));
        return;
    }
    for (col, nc) in even_parts(n, NC, NR) {
        for (depth, kc) in even_parts(k, KC, 1) {
            let overwrite = depth == 0 && !accumulate;
            let source = if direct {
                let whole = nc / NR * NR;
                let edge = Block {
                    row: depth,
                    col: col + whole,
                    rows: kc,
                    cols: nc - whole,
                };
                grow(&mut b_buf, packed_b_len(kc, edge.cols));
                pack_b(cpu, &mut b_buf, b, edge);
                let start = depth * b.row_stride + col;
                BSource::Direct {
                    data: &b.data[start..],
                    ld: b.row_stride,
                    edge: &b_buf,
                }
            } else {
                let block = Block {
                    row: depth,
                    col,
                    rows: kc,
                    cols: nc,
                };
                grow(&mut b_buf, packed_b_len(kc, nc));
                pack_b(cpu, &mut b_buf, b, block);
                BSource::Packed(&b_buf)
            };
            for (row, mc) in even_parts(m, MC, MR) {
                grow(&mut a_buf, packed_a_len(mc, kc));
                let block = Block {
                    row,
                    col: depth,
                    rows: mc,
                    cols: kc,
                };
                pack_a(cpu, &mut a_buf, a, block);
                let mut tiles = dst.sub(row, col, mc, nc);
                sweep(cpu, &mut tiles, kc, (&a_buf, source), overwrite);
            }
        }
    }
    BUFFERS.with(|cell| cell.set((a_buf, b_buf)));
}

/// Columns of `b` packed at a time by [`short_product`]: four panels, whose packed copy
/// (`KC × 64` floats, 64 KiB at most) is still in L1/L2 when the microkernel reads it.
pub const SHORT_CHUNK: usize = 4 * NR;

/// The product of a rectangle of at most [`MC`] rows, whose every packed `b` element serves
/// only `m` multiply-adds: packing `b` there costs a fifth of the time or more when `b` comes
/// from memory (an im2col matrix of 7 MB, say), so it is packed a few panels at a time, each
/// chunk swept while its copy is hot and the next one's rows prefetched meanwhile (OpenBLAS
/// does the same), instead of one [`NC`]-wide block that goes out to L3 before it is read.
fn short_product(
    cpu: Avx2Fma,
    mut dst: DstTile<'_>,
    (a, b): (&Operand<'_>, &Operand<'_>),
    (a_buf, b_buf): (&mut Vec<f32>, &mut Vec<f32>),
    accumulate: bool,
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    for (depth, kc) in even_parts(k, KC, 1) {
        let overwrite = depth == 0 && !accumulate;
        grow(a_buf, packed_a_len(m, kc));
        let a_block = Block {
            row: 0,
            col: depth,
            rows: m,
            cols: kc,
        };
        pack_a(cpu, a_buf, a, a_block);
        let chunk = |col: usize| Block {
            row: depth,
            col,
            rows: kc,
            cols: SHORT_CHUNK.min(n - col),
        };
        prefetch_block(b, chunk(0));
        for col in (0..n).step_by(SHORT_CHUNK) {
            let block = chunk(col);
            if col + SHORT_CHUNK < n {
                prefetch_block(b, chunk(col + SHORT_CHUNK));
            }
            grow(b_buf, packed_b_len(kc, block.cols));
            pack_b(cpu, b_buf, b, block);
            let mut tiles = dst.sub(0, col, m, block.cols);
            sweep(
                cpu,
                &mut tiles,
                kc,
                (a_buf, BSource::Packed(b_buf)),
                overwrite,
            );
        }
    }
}

/// Every microkernel tile of one packed `a` block times one block of `b`: a `b` panel stays
/// in L1 while the `a` panels stream from L2.
fn sweep(
    cpu: Avx2Fma,
    block: &mut DstTile<'_>,
    kc: usize,
    (a, b): (&[f32], BSource<'_>),
    overwrite: bool,
) {
    let (mc, nc) = (block.rows(), block.cols());
    for jp in 0..nc.div_ceil(NR) {
        let (col, cols) = (jp * NR, NR.min(nc - jp * NR));
        let b_panel = b.panel(jp, cols, kc);
        for (ip, a_panel) in a.chunks_exact(kc * MR).take(mc.div_ceil(MR)).enumerate() {
            let (row, rows) = (ip * MR, MR.min(mc - ip * MR));
            let tile = block.sub(row, col, rows, cols);
            cpu.tile(kc, a_panel, b_panel, tile, overwrite);
        }
    }
}

/// Makes `buf` at least `len` long.
fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}
