//! The AVX2 + FMA microkernel: one 6 × 16 tile of the destination from a packed 6-row panel of
//! `a` and a packed 16-column panel of `b`.
//!
//! Twelve 8-wide accumulators (6 rows × 2 vectors) stay in registers for the whole `k` loop;
//! each step loads two vectors of `b`, broadcasts six elements of `a` and issues twelve fused
//! multiply-adds, which keeps both FMA pipes of a Zen or Haswell core busy. The kernel is only
//! reachable through [`Avx2Fma`], a token that exists only after the CPU was seen to support
//! both features at run time, so one binary runs everywhere and fast where it can.

use super::DstTile;
use super::blocked::{KC, MC, NC};
use super::microkernel::{Microkernel, Steps, check_tile};
use super::pack::{self, Block};
use super::tokens::Avx2Fma;
use super::view::{Onto, Operand};

/// Rows of the destination tile (and of a packed `a` panel).
pub const MR: usize = 6;
/// Columns of the destination tile (and of a packed `b` panel).
pub const NR: usize = 16;

impl Avx2Fma {
    /// `a_panel · b_panel` over `steps`, written `onto` the tile, where `a_panel`
    /// holds a group of [`MR`] elements for each step run and `b_panel` a group of [`NR`]
    /// for each step of its span, `b_step` apart ([`NR`] when packed, the operand's row stride
    /// when read in place). Only the tile's own rows and columns are written; the panels are
    /// zero-padded past them.
    pub fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[f32],
        (b_panel, b_step): (&[f32], usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        check_tile(steps, (a_panel, MR), (b_panel, b_step, NR), &tile);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` exists only when AVX2 and FMA were detected on this CPU; the panels
        // hold their steps (checked above) and `tile` covers its rows × cols with its row
        // stride, uniquely borrowed for the call (a `DstTile` is handed to one caller at a time).
        unsafe {
            x86::tile(
                steps,
                a_panel.as_ptr(),
                (b_panel.as_ptr(), b_step),
                tile,
                onto,
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("the token exists only on x86_64");
    }
}

impl Microkernel for Avx2Fma {
    type Packed = f32;
    const MR: usize = MR;
    const NR: usize = NR;
    const DEPTH_PER_STEP: usize = 1;
    const KC: usize = KC;
    const MC: usize = MC;
    const NC: usize = NC;

    fn pack_a(self, out: &mut [f32], a: &Operand<'_>, block: Block) {
        pack::pack_a::<MR>(self, out, a, block);
    }

    fn pack_b(self, out: &mut [f32], b: &Operand<'_>, block: Block) {
        pack::pack_b::<NR>(self, out, b, block);
    }

    fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[f32],
        b_panel: (&[f32], usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        Avx2Fma::tile(self, steps, a_panel, b_panel, tile, onto);
    }

    fn in_place(b: &[f32]) -> Option<&[f32]> {
        Some(b)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};
    use crate::backend::cpu::gemm::DstTile;
    use crate::backend::cpu::gemm::microkernel::{Steps, for_each_step, prefetch_tile};
    use crate::backend::cpu::gemm::view::Onto;

    /// The microkernel. Accumulates in registers, then writes the tile: straight to memory when
    /// it is a whole 6 × 16 tile, through a stack buffer for the edges.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `a` points at `steps.run()` steps of `MR` readable
    /// elements and `b` at `steps.span()` runs of `NR`, `b_step` apart; `tile` is writable as
    /// described by its rows, columns and row stride.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        steps: Steps<'_>,
        a: *const f32,
        (b, b_step): (*const f32, usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        prefetch_tile(&tile);
        let (rows, cols, ld, c) = (tile.rows(), tile.cols(), tile.ld(), tile.ptr());
        let mut acc = [_mm256_setzero_ps(); 2 * MR];
        // One step of depth; called only with `a` at a step's MR elements and `b` at its NR.
        let step = |a: *const f32, b: *const f32| {
            // SAFETY: `for_each_step` passes a step's MR elements at `a` and NR at `b`, within
            // the panels' promised lengths.
            unsafe {
                let b0 = _mm256_loadu_ps(b);
                let b1 = _mm256_loadu_ps(b.add(8));
                for r in 0..MR {
                    let ar = _mm256_broadcast_ss(&*a.add(r));
                    acc[2 * r] = _mm256_fmadd_ps(ar, b0, acc[2 * r]);
                    acc[2 * r + 1] = _mm256_fmadd_ps(ar, b1, acc[2 * r + 1]);
                }
            }
        };
        for_each_step(steps, (a, MR), (b, b_step), step);
        if rows == MR && cols == NR {
            for (r, pair) in acc.chunks_exact(2).enumerate() {
                // SAFETY: a whole tile: row r's 16 elements lie at c + r * ld.
                unsafe {
                    let row = c.add(r * ld);
                    _mm256_storeu_ps(row, meet(pair[0], row, onto));
                    _mm256_storeu_ps(row.add(8), meet(pair[1], row.add(8), onto));
                }
            }
            return;
        }
        let mut buf = [0.0f32; MR * NR];
        for (r, pair) in acc.chunks_exact(2).enumerate() {
            // SAFETY: buf holds MR rows of NR elements.
            unsafe {
                _mm256_storeu_ps(buf.as_mut_ptr().add(r * NR), pair[0]);
                _mm256_storeu_ps(buf.as_mut_ptr().add(r * NR + 8), pair[1]);
            }
        }
        for (r, row) in buf.chunks_exact(NR).take(rows).enumerate() {
            for (j, &v) in row[..cols].iter().enumerate() {
                // SAFETY: r < rows and j < cols, inside the tile.
                unsafe {
                    let out = c.add(r * ld + j);
                    *out = match onto {
                        Onto::Overwrite => v,
                        Onto::Add => *out + v,
                        Onto::AddScaled(factor) => *out + v * factor,
                    };
                }
            }
        }
    }

    /// `sums` as they are to be stored `onto` the 8 elements at `out`.
    ///
    /// # Safety
    /// AVX is available and the caller is compiled for it; unless `onto` overwrites, `out`
    /// points at 8 readable elements.
    #[inline(always)]
    unsafe fn meet(sums: __m256, out: *const f32, onto: Onto) -> __m256 {
        // SAFETY: the caller promises `out` readable where it is read.
        unsafe {
            match onto {
                Onto::Overwrite => sums,
                Onto::Add => _mm256_add_ps(sums, _mm256_loadu_ps(out)),
                Onto::AddScaled(factor) => {
                    let scaled = _mm256_mul_ps(sums, _mm256_set1_ps(factor));
                    _mm256_add_ps(scaled, _mm256_loadu_ps(out))
                }
            }
        }
    }
}
