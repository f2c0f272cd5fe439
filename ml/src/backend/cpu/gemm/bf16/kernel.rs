//! The AVX512_BF16 microkernel: one 8 × 32 tile of the destination from a packed 8-row panel
//! of `a` and a packed 32-column panel of `b`, both of bfloat16 pairs.
//!
//! Sixteen 16-wide f32 accumulators (8 rows × 2 vectors) stay in registers for the whole
//! depth; each packed step loads two vectors of `b` (32 columns × 2 steps of depth), broadcasts
//! each row's pair of `a` and issues two `vdpbf16ps`, each of which adds two products per
//! lane. The tile is written with masked stores, so edge tiles need no buffer. Eight rows
//! rather than twelve (24 accumulators also fit the 32 registers): the layers' row counts are
//! mostly multiples of 8 (32 or 64 channels, batches of 64 or 256), of which twelve rows would
//! leave the last panel partly empty.

use super::super::microkernel::{Steps, check_tile};
use super::super::view::{DstTile, Onto};
use super::Avx512Bf16;

/// Rows of the destination tile (and of a packed `a` panel).
pub const MR: usize = 8;
/// Columns of the destination tile (and of a packed `b` panel).
pub const NR: usize = 32;

/// `a_panel · b_panel` over `steps` packed steps, written `onto` the tile, where
/// `a_panel` holds a group of [`MR`] pairs for each step run and `b_panel` a group of [`NR`]
/// for each step of its span, `b_step` apart. Only the tile's own rows and columns are
/// written.
pub fn tile(
    cpu: Avx512Bf16,
    steps: Steps<'_>,
    a_panel: &[u32],
    (b_panel, b_step): (&[u32], usize),
    tile: DstTile<'_>,
    onto: Onto,
) {
    check_tile(steps, (a_panel, MR), (b_panel, b_step, NR), &tile);
    let _ = cpu;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `cpu` exists only when AVX-512F/BW/VL and BF16 were detected on this CPU; the
    // panels hold their steps (checked above) and `tile` covers its rows × cols with its row
    // stride, uniquely borrowed for the call.
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};
    use crate::backend::cpu::gemm::microkernel::x86::store_sums;
    use crate::backend::cpu::gemm::microkernel::{Steps, for_each_step, prefetch_tile};
    use crate::backend::cpu::gemm::view::{DstTile, Onto};

    /// Sixteen lanes of bfloat16 pairs, as the dot-product instruction takes them.
    #[inline(always)]
    fn pairs(v: __m512i) -> __m512bh {
        // SAFETY: a bit cast between two 512-bit vector types.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// The microkernel.
    ///
    /// # Safety
    /// AVX-512F/BW/VL and BF16 are available; `a` points at `steps.run()` steps of `MR`
    /// readable lanes and `b` at `steps.span()` runs of `NR`, `b_step` apart; `tile` is
    /// writable as its rows, columns and row stride describe.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn tile(
        steps: Steps<'_>,
        a: *const u32,
        (b, b_step): (*const u32, usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        prefetch_tile(&tile);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        // One packed step; called only with `a` at a step's MR lanes and `b` at its NR.
        let step = |a: *const u32, b: *const u32| {
            // SAFETY: `for_each_step` passes a step's MR lanes at `a` and NR at `b`, within
            // the panels' promised lengths.
            unsafe {
                let b0 = pairs(_mm512_loadu_si512(b.cast()));
                let b1 = pairs(_mm512_loadu_si512(b.add(16).cast()));
                for (r, sums) in acc.iter_mut().enumerate() {
                    let ar = pairs(_mm512_set1_epi32(*a.add(r) as i32));
                    sums[0] = _mm512_dpbf16_ps(sums[0], ar, b0);
                    sums[1] = _mm512_dpbf16_ps(sums[1], ar, b1);
                }
            }
        };
        for_each_step(steps, (a, MR), (b, b_step), step);
        // SAFETY: AVX-512F is enabled here; the caller promises the tile writable.
        unsafe { store_sums(&acc, &tile, onto) };
    }

    const _: () = assert!(NR == 32, "two 16-lane vectors per row");
}
