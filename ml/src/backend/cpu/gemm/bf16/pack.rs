//! Packing into panels of bfloat16 pairs: step `p` of a panel of `width` rows holds, for each
//! row `r`, one 32-bit lane with the row's elements at depth `2p` (low half) and `2p + 1`
//! (high half), each rounded to bfloat16; a missing last element of an odd depth, and rows
//! past the operand's edge, are zeros. A `b` panel is packed as the `a` panel of the rows of
//! `b`'s transpose (see [`super::Avx512Bf16`]'s `pack_b`).
//!
//! Two layouts are vectorized: rows contiguous along the depth (a row-major `a`, a transposed
//! `b`: 32 elements of each of 16 rows become 16 lanes, turned into 16 steps by a transpose) and rows
//! contiguous across the panel (a transposed `a`, a row-major `b`: two runs of a step become
//! one vector of lanes by a conversion and a word shuffle). Other strides go element by element.

use super::super::pack::{Block, check_block};
use super::super::view::Operand;
use super::Avx512Bf16;

/// `x` rounded to the nearest bfloat16 value (ties to even), as the bits of that value. NaNs
/// stay NaNs (quiet), infinities stay infinite, and finite values too large round to infinity.
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let ties_to_even = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(ties_to_even) >> 16) as u16
}

/// `x` rounded to the nearest bfloat16 value (ties to even), as an f32.
pub fn round_to_bf16(x: f32) -> f32 {
    f32::from_bits(u32::from(bf16_bits(x)) << 16)
}

/// Packs `block` of `op` (rows × depth) into `out` as panels of `width` rows.
pub fn pack_panels(cpu: Avx512Bf16, out: &mut [u32], op: &Operand<'_>, block: Block, width: usize) {
    check_block(op, block);
    let steps = block.cols.div_ceil(2);
    let panels = block.rows.div_ceil(width);
    for (panel, dst) in out.chunks_exact_mut(width * steps).take(panels).enumerate() {
        let first = block.row + panel * width;
        let live = width.min(block.rows - panel * width);
        let rows = Rows {
            start: first * op.row_stride + block.col * op.col_stride,
            live,
            depth: block.cols,
            row_stride: op.row_stride,
            col_stride: op.col_stride,
        };
        pack_panel(cpu, dst, op.data, rows, width);
    }
}

/// The rows of one panel in the operand's storage.
#[derive(Clone, Copy, Debug)]
struct Rows {
    /// Where the panel's first row starts, at the block's first step of depth.
    start: usize,
    /// Rows of the operand in the panel (the others are padding).
    live: usize,
    /// Steps of depth (columns of the block).
    depth: usize,
    /// Distance between the panel's rows.
    row_stride: usize,
    /// Distance between steps of depth along a row.
    col_stride: usize,
}

/// Packs one panel (`dst`: `depth.div_ceil(2)` steps of `width` lanes). `cpu` proves the
/// vector instructions the two common layouts use.
fn pack_panel(cpu: Avx512Bf16, dst: &mut [u32], data: &[f32], rows: Rows, width: usize) {
    let _ = cpu;
    #[cfg(target_arch = "x86_64")]
    {
        if rows.col_stride == 1 {
            // SAFETY: the token proves AVX-512F/BW/VL and BF16; `pack_panels` checked that
            // every element of the block lies in `data`, and `dst` holds the panel.
            unsafe { x86::along_depth(dst, data, rows, width) };
            return;
        }
        if rows.row_stride == 1 {
            // SAFETY: as above.
            unsafe { x86::across_rows(dst, data, rows, width) };
            return;
        }
    }
    pack_panel_by_element(dst, data, rows, width);
}

/// [`pack_panel`] one element at a time, for any strides.
fn pack_panel_by_element(dst: &mut [u32], data: &[f32], rows: Rows, width: usize) {
    let at = |r: usize, d: usize| {
        if r < rows.live && d < rows.depth {
            data[rows.start + r * rows.row_stride + d * rows.col_stride]
        } else {
            0.0
        }
    };
    for (p, step) in dst.chunks_exact_mut(width).enumerate() {
        for (r, lane) in step.iter_mut().enumerate() {
            let (lo, hi) = (at(r, 2 * p), at(r, 2 * p + 1));
            *lane = u32::from(bf16_bits(lo)) | (u32::from(bf16_bits(hi)) << 16);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Rows;
    use crate::backend::cpu::gemm::microkernel::x86::first_lanes as first;

    /// 32 f32 values as 16 lanes of bfloat16 pairs, `lo` giving the lanes' low halves'
    /// source order: the result's words are `lo[0..16]` then `hi[0..16]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn words(lo: __m512, hi: __m512) -> __m512i {
        // SAFETY: a bit cast between two 512-bit vector types.
        unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
    }

    /// Rows contiguous along the depth, 16 rows and 32 steps of depth at a time: each row's
    /// run becomes one vector of 16 lanes (one per packed step), and a 16 × 16 transpose turns
    /// the rows' vectors into the steps' vectors.
    ///
    /// # Safety
    /// AVX-512F/BW/VL and BF16 are available; the rows' elements lie in `data`; `dst` holds
    /// `depth.div_ceil(2)` steps of `width` lanes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn along_depth(dst: &mut [u32], data: &[f32], rows: Rows, width: usize) {
        let steps = rows.depth.div_ceil(2);
        assert!(dst.len() >= steps * width, "the panel holds its steps");
        for group in (0..width).step_by(16) {
            let lanes = first(width - group);
            for d in (0..rows.depth).step_by(32) {
                let left = rows.depth - d;
                let mut runs = [_mm512_setzero_si512(); 16];
                for (r, run) in runs.iter_mut().enumerate() {
                    if group + r >= rows.live.min(width) {
                        break;
                    }
                    let at = rows.start + (group + r) * rows.row_stride + d;
                    let row = data.as_ptr().wrapping_add(at);
                    // SAFETY: the masked loads read only the row's elements d..depth, which lie
                    // in `data`.
                    unsafe {
                        let lo = _mm512_maskz_loadu_ps(first(left), row);
                        let hi = _mm512_maskz_loadu_ps(first(left.saturating_sub(16)), row.add(16));
                        *run = words(lo, hi);
                    }
                }
                let by_step = transpose16(runs);
                for (i, step) in by_step.iter().take(left.div_ceil(2).min(16)).enumerate() {
                    // SAFETY: step d/2 + i < steps, lanes group.. of it, masked to the width.
                    unsafe {
                        let out = dst.as_mut_ptr().add((d / 2 + i) * width + group);
                        _mm512_mask_storeu_epi32(out.cast(), lanes, *step);
                    }
                }
            }
        }
    }

    /// The transpose of 16 vectors of 16 lanes: lane `c` of vector `r` becomes lane `r` of
    /// vector `c`. Interleaves lanes, then pairs of lanes, then 128-bit quarters twice.
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // u[4g + j], quarter q: column 4q + j of rows 4g..4g + 4.
        let mut u = [_mm512_setzero_si512(); 16];
        for g in (0..16).step_by(4) {
            u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
            u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
            u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
            u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
        }
        let mut out = [_mm512_setzero_si512(); 16];
        for j in 0..4 {
            let even = _mm512_shuffle_i32x4::<0x88>(u[j], u[4 + j]);
            let even_hi = _mm512_shuffle_i32x4::<0x88>(u[8 + j], u[12 + j]);
            let odd = _mm512_shuffle_i32x4::<0xDD>(u[j], u[4 + j]);
            let odd_hi = _mm512_shuffle_i32x4::<0xDD>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_i32x4::<0x88>(even, even_hi);
            out[8 + j] = _mm512_shuffle_i32x4::<0xDD>(even, even_hi);
            out[4 + j] = _mm512_shuffle_i32x4::<0x88>(odd, odd_hi);
            out[12 + j] = _mm512_shuffle_i32x4::<0xDD>(odd, odd_hi);
        }
        out
    }

    /// Rows contiguous across the panel: each step's two runs of depth (`2p` and `2p + 1`)
    /// are converted together and interleaved into 16 lanes at a time.
    ///
    /// # Safety
    /// As for [`along_depth`]; `rows.row_stride` is 1.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn across_rows(dst: &mut [u32], data: &[f32], rows: Rows, width: usize) {
        let steps = rows.depth.div_ceil(2);
        assert!(dst.len() >= steps * width, "the panel holds its steps");
        // Word i of the result: word i / 2 of `lo`'s run when even, of `hi`'s (at 16) when odd.
        let interleave = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        for p in 0..steps {
            let (d0, d1) = (2 * p, 2 * p + 1);
            for r in (0..width).step_by(16) {
                let live = rows.live.saturating_sub(r);
                let run = |d: usize| {
                    let ptr = data
                        .as_ptr()
                        .wrapping_add(rows.start + d * rows.col_stride + r);
                    let mask = if d < rows.depth { first(live) } else { 0 };
                    // SAFETY: the mask covers only live rows of an existing step, which lie
                    // in `data`.
                    unsafe { _mm512_maskz_loadu_ps(mask, ptr) }
                };
                let pairs = _mm512_permutexvar_epi16(interleave, words(run(d0), run(d1)));
                // SAFETY: lanes r..r + 16 of step p, masked to the panel's width.
                unsafe {
                    let out = dst.as_mut_ptr().add(p * width + r).cast::<i32>();
                    _mm512_mask_storeu_epi32(out, first(width - r), pairs);
                }
            }
        }
    }
}
