//! The AVX-512 f32 microkernel: one 8 × 32 tile of the destination from a packed 8-row panel
//! of `a` and a packed 32-column panel of `b`.
//!
//! Sixteen 16-wide accumulators (8 rows × 2 vectors) stay in registers for the whole depth;
//! each step loads two vectors of `b`, broadcasts eight elements of `a` and issues sixteen
//! fused multiply-adds. On cores whose FMA units are 512 bits wide (AMD Zen 5, Intel server
//! cores with two FMA ports) that is twice the multiply-adds per instruction and per cycle of
//! the 6 × 16 AVX2 kernel; on cores that split 512-bit vectors in two (Zen 4) it runs at the
//! AVX2 kernel's rate with half the instructions. Eight rows divide the row counts layers
//! have (batches of 64 or 256, 32 or 64 channels) where six leave a partial panel. Edge tiles
//! are written with masked stores. Reachable only through [`Avx512Fma`], a token that exists
//! only after the CPU was seen to support AVX-512F (and the AVX2 and FMA its packing uses).

use super::DstTile;
use super::l1_cache::l1_data_bytes;
use super::microkernel::{Microkernel, Steps, check_tile};
use super::pack::{self, Block};
use super::thin_avx512::Avx512;
use super::tokens::Avx2Fma;
use super::view::{Onto, Operand};

/// Rows of the destination tile (and of a packed `a` panel).
pub const MR: usize = 8;
/// Columns of the destination tile (and of a packed `b` panel).
pub const NR: usize = 32;

/// Largest depth of a packed block where the L1 data cache holds 32 KiB (Zen 4, Intel server
/// cores before Ice Lake): a `b` panel (`KC × 32` floats, 24 KiB) stays in L1 beside the `a`
/// panel in flight (6 KiB).
pub const KC: usize = 192;
/// Largest depth of a packed block where the L1 data cache holds [`LARGE_L1`] or more (Zen 5,
/// Intel cores since Ice Lake): a 32 KiB `b` panel beside an 8 KiB `a` panel. Fewer depth
/// blocks mean fewer passes over the destination and fewer tile loads and stores than at
/// [`KC`].
pub const KC_LARGE_L1: usize = 256;
/// The L1 data cache from which the kernel blocks its depth by [`KC_LARGE_L1`].
pub const LARGE_L1: usize = 48 << 10;
/// Largest number of rows of a packed `a` block: `MC × KC` floats (192 or 256 KiB) stay in L2
/// beside the `b` panels streaming through.
pub const MC: usize = 256;
/// Largest number of columns of a packed `b` block: `KC × NC` floats (3 MiB) in L3.
pub const NC: usize = 4096;

/// Proof that the running CPU has AVX-512F, AVX2 and FMA: the only way to call the kernel.
/// It carries the depth of the packed blocks for this CPU's L1 data cache.
#[derive(Clone, Copy, Debug)]
pub struct Avx512Fma {
    base: Avx2Fma,
    depth: usize,
}

impl Avx512Fma {
    /// The token, when this CPU supports AVX-512F besides AVX2 and FMA (both detected once,
    /// then cached), blocking its depth for the L1 data cache CPUID reports (see
    /// [`Avx512Fma::for_l1`]).
    pub fn detect() -> Option<Self> {
        let base = Avx512::detect().and(Avx2Fma::detect())?;
        Some(Avx512Fma { base, depth: KC }.for_l1(l1_data_bytes()))
    }

    /// The same token blocking its depth for an L1 data cache of `bytes`: by [`KC_LARGE_L1`]
    /// where it holds [`LARGE_L1`] or more, by [`KC`] where it is smaller or unknown.
    pub fn for_l1(self, bytes: Option<usize>) -> Self {
        let depth = match bytes {
            Some(bytes) if bytes >= LARGE_L1 => KC_LARGE_L1,
            _ => KC,
        };
        Avx512Fma { depth, ..self }
    }
}

impl Microkernel for Avx512Fma {
    type Packed = f32;
    const MR: usize = MR;
    const NR: usize = NR;
    const DEPTH_PER_STEP: usize = 1;
    const KC: usize = KC;
    const MC: usize = MC;
    const NC: usize = NC;

    fn kc(self) -> usize {
        self.depth
    }

    fn pack_a(self, out: &mut [f32], a: &Operand<'_>, block: Block) {
        pack::pack_a::<MR>(self.base, out, a, block);
    }

    fn pack_b(self, out: &mut [f32], b: &Operand<'_>, block: Block) {
        pack::pack_b::<NR>(self.base, out, b, block);
    }

    fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[f32],
        b_panel: (&[f32], usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        let (b_panel, b_step) = b_panel;
        check_tile(steps, (a_panel, MR), (b_panel, b_step, NR), &tile);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` exists only when AVX-512F was detected on this CPU; the panels hold
        // `steps` steps (checked above) and `tile` covers its rows × cols with its row stride,
        // uniquely borrowed for the call.
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

    fn in_place(b: &[f32]) -> Option<&[f32]> {
        Some(b)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::MR;
    use crate::backend::cpu::gemm::DstTile;
    use crate::backend::cpu::gemm::microkernel::x86::store_sums;
    use crate::backend::cpu::gemm::microkernel::{Steps, for_each_step, prefetch_tile};
    use crate::backend::cpu::gemm::view::Onto;

    /// The microkernel: accumulates in registers, then writes its sums onto the tile's live
    /// rows and columns with masked loads and stores ([`store_sums`]).
    ///
    /// # Safety
    /// AVX-512F is available; `a` points at `steps.run()` steps of `MR` readable elements
    /// and `b` at `steps.span()` runs of `NR`, `b_step` apart; `tile` is writable as its
    /// rows, columns and row stride describe.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(
        steps: Steps<'_>,
        a: *const f32,
        (b, b_step): (*const f32, usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        prefetch_tile(&tile);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        // One step of depth; called only with `a` at a step's MR elements and `b` at its NR.
        let step = |a: *const f32, b: *const f32| {
            // SAFETY: `for_each_step` passes a step's MR elements at `a` and NR at `b`, within
            // the panels' promised lengths.
            unsafe {
                let b0 = _mm512_loadu_ps(b);
                let b1 = _mm512_loadu_ps(b.add(16));
                for (r, sums) in acc.iter_mut().enumerate() {
                    let ar = _mm512_set1_ps(*a.add(r));
                    sums[0] = _mm512_fmadd_ps(ar, b0, sums[0]);
                    sums[1] = _mm512_fmadd_ps(ar, b1, sums[1]);
                }
            }
        };
        for_each_step(steps, (a, MR), (b, b_step), step);
        // SAFETY: AVX-512F is enabled here; the caller promises the tile writable.
        unsafe { store_sums(&acc, &tile, onto) };
    }
}
