//! The cache-blocked product of one destination rectangle on the calling thread (the loops of
//! Goto and van de Geijn, as BLIS runs them), for any [`Microkernel`].
//!
//! For each block of `NC` columns and `KC` depth, `b`'s block is packed once (it then sits in
//! L3, and one panel of it in L1); for each block of `MC` rows, `a`'s block is packed (it then
//! sits in L2) and the microkernel sweeps every tile. Block sizes are split evenly, so that no
//! block is a sliver. A rectangle of at most `MC` rows packs `b` a few panels at a time instead
//! ([`short_chunk`]), since its packed block would serve a single `a` block. The f32 kernel's
//! blocks are [`KC`], [`MC`] and [`NC`].
use super::ahead::{Ahead, prefetch_block};
use super::element::PackedElement;
use super::microkernel::Microkernel;
use super::pack::Block;
use super::view::{DstTile, Onto, Operand};
use super::zero_steps::{BlockSteps, with_block_steps};

/// Largest depth of a packed f32 block: a `b` panel (`KC × 16` floats, 16 KiB) fits the 32 KiB
/// L1 of the cores this is tuned for next to the `a` panel in flight.
pub const KC: usize = 256;
/// Largest number of rows of a packed f32 `a` block: `MC × KC` floats (144 KiB) stay in a
/// 512 KiB L2 beside the `b` panels streaming through.
pub const MC: usize = 144;
/// Largest number of columns of a packed f32 `b` block: `KC × NC` floats (4 MiB) in L3.
pub const NC: usize = 4080;

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
/// on its own page, or 4 KiB apart on the same cache sets, where reading in place is slower
/// than packing, so they are packed whatever the rows.
pub const DIRECT_B_MAX_STRIDE: usize = 512;

/// Where the microkernel reads a block of `b` from.
#[derive(Clone, Copy)]
enum BSource<'a, P> {
    /// Packed panels, `steps × NR` each.
    Packed(&'a [P]),
    /// The operand itself from the block's first element, rows `ld` apart, for whole panels;
    /// the last, partial panel packed in `edge`.
    Direct {
        data: &'a [P],
        ld: usize,
        edge: &'a [P],
    },
}

impl<'a, P> BSource<'a, P> {
    /// Panel `jp` of `cols` columns over `steps` steps, for a kernel of `nr` columns: its
    /// elements and the distance between its steps.
    fn panel(self, jp: usize, (cols, nr): (usize, usize), steps: usize) -> (&'a [P], usize) {
        match self {
            BSource::Packed(buf) => (&buf[jp * steps * nr..(jp + 1) * steps * nr], nr),
            BSource::Direct { data, ld, .. } if cols == nr => (&data[jp * nr..], ld),
            BSource::Direct { edge, .. } => (edge, nr),
        }
    }
}

/// `a · b` written `onto` one rectangle (each later depth block's sums
/// [`Onto::after_first_block`]): `a` holds the rectangle's rows (`dst.rows() × k`), `b` its
/// columns (`k × dst.cols()`).
pub fn product<K: Microkernel>(
    cpu: K,
    dst: DstTile<'_>,
    a: &Operand<'_>,
    b: &Operand<'_>,
    onto: Onto,
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    debug_assert!(a.rows == m && b.rows == k && b.cols == n);
    let direct = b.col_stride == 1
        && m <= DIRECT_B_MAX_ROWS
        && b.row_stride <= DIRECT_B_MAX_STRIDE
        && K::in_place(b.data).is_some();
    K::Packed::with_buffers(|a_buf, b_buf| {
        with_block_steps(|steps| {
            let bufs = (a_buf, b_buf, steps);
            if m <= K::MC && !direct {
                short_product(cpu, dst, (a, b), bufs, onto);
            } else {
                long_product(cpu, dst, (a, b), bufs, (onto, direct));
            }
        })
    });
}

/// [`product`] by whole blocks of `b`: packed once per block of [`Microkernel::NC`] columns
/// and [`Microkernel::kc`] depth, or read in place (`direct`). While the microkernel sweeps a
/// block, the next `a` block and a share of the next `b` block are asked for ([`Ahead`]).
fn long_product<K: Microkernel>(
    cpu: K,
    mut dst: DstTile<'_>,
    (a, b): (&Operand<'_>, &Operand<'_>),
    (a_buf, b_buf, steps): Buffers<'_, K>,
    (onto, direct): (Onto, bool),
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    let row_blocks = || even_parts(m, K::MC, K::MR);
    let first_rows = row_blocks().next().map_or(0, |(_, mc)| mc);
    let a_block = |row, rows, (col, cols)| Block {
        row,
        col,
        rows,
        cols,
    };
    let mut b_blocks = even_parts(n, K::NC, K::NR)
        .flat_map(|(col, nc)| {
            let depths = even_parts(k, cpu.kc(), K::DEPTH_PER_STEP);
            depths.map(move |(row, rows)| Block {
                row,
                col,
                rows,
                cols: nc,
            })
        })
        .peekable();
    while let Some(block) = b_blocks.next() {
        let next_b = b_blocks.peek().copied();
        let ((col, nc), (depth, kc)) = ((block.col, block.cols), (block.row, block.rows));
        let onto = block_onto(onto, depth);
        let whole = if direct { nc / K::NR * K::NR } else { 0 };
        let packed = Block {
            col: col + whole,
            cols: nc - whole,
            ..block
        };
        grow(b_buf, K::packed_b_len(kc, packed.cols));
        cpu.pack_b(b_buf, b, packed);
        let source = match K::in_place(b.data) {
            Some(data) if direct => BSource::Direct {
                data: &data[depth * b.row_stride + col..],
                ld: b.row_stride,
                edge: b_buf,
            },
            _ => BSource::Packed(b_buf),
        };
        let parts = row_blocks().count();
        let mut rows = row_blocks().enumerate().peekable();
        while let Some((part, (row, mc))) = rows.next() {
            let next_a = match rows.peek() {
                Some(&(_, (row, mc))) => Some(a_block(row, mc, (depth, kc))),
                None => next_b.map(|b| a_block(0, first_rows, (b.row, b.rows))),
            };
            let tile_count = nc.div_ceil(K::NR) * mc.div_ceil(K::MR);
            let mut ahead = [
                Ahead::part(a, next_a, (0, 1), tile_count),
                Ahead::part(b, next_b, (part, parts), tile_count),
            ];
            grow(a_buf, K::packed_a_len(mc, kc));
            cpu.pack_a(a_buf, a, a_block(row, mc, (depth, kc)));
            steps.find(
                a_buf,
                (K::MR, K::steps(kc), mc.div_ceil(K::MR)),
                nc.div_ceil(K::NR),
            );
            let mut tiles = dst.sub(row, col, mc, nc);
            sweep(cpu, &mut tiles, (a_buf, steps), source, (onto, &mut ahead));
        }
    }
}

/// Columns of `b` packed at a time by [`short_product`]: four panels, whose packed copy
/// (64 KiB at most) is still in L1/L2 when the microkernel reads it.
pub fn short_chunk<K: Microkernel>() -> usize {
    4 * K::NR
}

/// The product of a rectangle of at most [`Microkernel::MC`] rows, whose every packed `b`
/// element serves only `m` multiply-adds: packing `b` there takes a large share of the time
/// when `b` comes from memory (an im2col matrix of 7 MB, say), so it is packed a few panels at
/// a time, each chunk swept while its copy is hot (OpenBLAS does the same), instead of one wide
/// block that goes out to L3 before it is read. While a chunk is swept, the next chunk's rows
/// (the next depth's first chunk after the last) and a share of the next depth's `a` are asked
/// for ([`Ahead`]), so that memory is read while the microkernel works.
fn short_product<K: Microkernel>(
    cpu: K,
    mut dst: DstTile<'_>,
    (a, b): (&Operand<'_>, &Operand<'_>),
    (a_buf, b_buf, steps): Buffers<'_, K>,
    onto: Onto,
) {
    let (m, n, k) = (dst.rows(), dst.cols(), a.cols);
    let chunk_cols = short_chunk::<K>();
    let chunks = n.div_ceil(chunk_cols);
    let b_chunk = |(row, rows): (usize, usize), col: usize| Block {
        row,
        col,
        rows,
        cols: chunk_cols.min(n - col),
    };
    let a_block = |(col, cols): (usize, usize)| Block {
        row: 0,
        col,
        rows: m,
        cols,
    };
    let mut depths = even_parts(k, cpu.kc(), K::DEPTH_PER_STEP).peekable();
    if let Some(&first) = depths.peek() {
        prefetch_block(b, b_chunk(first, 0));
    }
    while let Some((depth, kc)) = depths.next() {
        let next_depth = depths.peek().copied();
        let onto = block_onto(onto, depth);
        grow(a_buf, K::packed_a_len(m, kc));
        cpu.pack_a(a_buf, a, a_block((depth, kc)));
        let a_steps = (K::MR, K::steps(kc), m.div_ceil(K::MR));
        steps.find(a_buf, a_steps, n.div_ceil(K::NR));
        for (c, col) in (0..n).step_by(chunk_cols).enumerate() {
            let block = b_chunk((depth, kc), col);
            let next_b = match col + chunk_cols {
                next if next < n => Some(b_chunk((depth, kc), next)),
                _ => next_depth.map(|depth| b_chunk(depth, 0)),
            };
            let tile_count = block.cols.div_ceil(K::NR) * m.div_ceil(K::MR);
            let next_a = next_depth.map(a_block);
            let mut ahead = [
                Ahead::part(b, next_b, (0, 1), tile_count),
                Ahead::part(a, next_a, (c, chunks), tile_count),
            ];
            grow(b_buf, K::packed_b_len(kc, block.cols));
            cpu.pack_b(b_buf, b, block);
            let mut tiles = dst.sub(0, col, m, block.cols);
            let source = BSource::Packed(&b_buf[..]);
            sweep(cpu, &mut tiles, (a_buf, steps), source, (onto, &mut ahead));
        }
    }
}

/// Every microkernel tile of one packed `a` block (whose panels run the steps `steps` lists)
/// times one block of `b`: a `b` panel stays in L1 while the `a` panels stream from L2.
/// Before every tile, each of `ahead` asks for its next share of lines (a few at a time: a
/// burst of prefetches overflows the core's queue of misses, and most of them are dropped).
fn sweep<K: Microkernel>(
    cpu: K,
    block: &mut DstTile<'_>,
    (a, steps): (&[K::Packed], &BlockSteps),
    b: BSource<'_, K::Packed>,
    (onto, ahead): (Onto, &mut [Ahead<'_>; 2]),
) {
    let (mc, nc) = (block.rows(), block.cols());
    let span = steps.span();
    for jp in 0..nc.div_ceil(K::NR) {
        let (col, cols) = (jp * K::NR, K::NR.min(nc - jp * K::NR));
        let b_panel = b.panel(jp, (cols, K::NR), span);
        let a_panels = a.chunks_exact(span * K::MR).take(mc.div_ceil(K::MR));
        for (ip, a_panel) in a_panels.enumerate() {
            let (row, rows) = (ip * K::MR, K::MR.min(mc - ip * K::MR));
            let tile = block.sub(row, col, rows, cols);
            ahead.iter_mut().for_each(Ahead::step);
            cpu.tile(steps.of(ip), a_panel, b_panel, tile, onto);
        }
    }
}

/// How the sums of the depth block starting at `depth` meet the destination, for a product
/// written `onto` it.
fn block_onto(onto: Onto, depth: usize) -> Onto {
    if depth == 0 {
        onto
    } else {
        onto.after_first_block()
    }
}

/// A thread's buffers for packed `a` and `b` blocks, and its step lists.
type Buffers<'a, K> = (
    &'a mut Vec<<K as Microkernel>::Packed>,
    &'a mut Vec<<K as Microkernel>::Packed>,
    &'a mut BlockSteps,
);

/// Makes `buf` at least `len` long.
fn grow<P: Copy + Default>(buf: &mut Vec<P>, len: usize) {
    if buf.len() < len {
        buf.resize(len, P::default());
    }
}
