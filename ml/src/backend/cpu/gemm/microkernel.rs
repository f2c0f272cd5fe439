//! [`Microkernel`]: what the blocked product (`blocked.rs`) and its threading (`threading.rs`)
//! need from a register-blocked kernel — its tile, its cache blocks and the packing that
//! feeds it — so that one set of loops drives every kernel: the f32 AVX2 kernel, and the
//! bf16 kernels of `bf16/` whose packed panels hold pairs of bfloat16 values.

use super::pack::Block;
use super::view::{DstTile, Onto, Operand};
pub use super::zero_steps::Steps;

use super::element::PackedElement;

/// A register-blocked microkernel with its packing.
///
/// A packed `a` panel holds [`Microkernel::steps`] steps of [`Microkernel::MR`] elements, a
/// packed `b` panel as many steps of [`Microkernel::NR`]; a step covers
/// [`Microkernel::DEPTH_PER_STEP`] columns of `a` (rows of `b`). Panels past the block's
/// edge are zero-padded, so the kernel always runs whole tiles and writes only the live part.
pub trait Microkernel: Copy + Send + Sync + 'static {
    /// An element of a packed panel.
    type Packed: PackedElement;
    /// Rows of a tile (and of a packed `a` panel).
    const MR: usize;
    /// Columns of a tile (and of a packed `b` panel).
    const NR: usize;
    /// Columns of `a` (rows of `b`) one packed step covers.
    const DEPTH_PER_STEP: usize;
    /// Largest depth of a packed block: one `b` panel fits L1 beside the `a` panel in flight.
    /// The blocked product reads it through [`Microkernel::kc`].
    const KC: usize;
    /// Largest number of rows of a packed `a` block, which stays in L2.
    const MC: usize;
    /// Largest number of columns of a packed `b` block, which stays in L3.
    const NC: usize;

    /// Largest depth of a packed block on this CPU: [`Microkernel::KC`] unless the kernel
    /// sizes it to the cache it found (the AVX-512 kernel does).
    fn kc(self) -> usize {
        Self::KC
    }

    /// Packed steps for `depth` columns of `a` (rows of `b`).
    fn steps(depth: usize) -> usize {
        depth.div_ceil(Self::DEPTH_PER_STEP)
    }

    /// Packs `block` of `a` (rows × depth) into `out` as panels of [`Microkernel::MR`] rows.
    fn pack_a(self, out: &mut [Self::Packed], a: &Operand<'_>, block: Block);

    /// Packs `block` of `b` (depth × cols) into `out` as panels of [`Microkernel::NR`] columns.
    fn pack_b(self, out: &mut [Self::Packed], b: &Operand<'_>, block: Block);

    /// `a_panel · b_panel` over `steps` packed steps, written `onto` the tile; the `b` panel's
    /// steps lie `b_step` elements apart. Writes only the tile's rows and columns.
    fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[Self::Packed],
        b_panel: (&[Self::Packed], usize),
        tile: DstTile<'_>,
        onto: Onto,
    );

    /// A row-major `b`'s elements as this kernel's panels, when it can read them where they
    /// lie instead of packing them. None by default: only a kernel whose packed element is
    /// the operand's own f32 can.
    fn in_place(_b: &[f32]) -> Option<&[Self::Packed]> {
        None
    }

    /// Elements a block of `a` takes once packed (rows rounded up to whole panels).
    fn packed_a_len(rows: usize, depth: usize) -> usize {
        rows.div_ceil(Self::MR) * Self::MR * Self::steps(depth)
    }

    /// Elements a block of `b` takes once packed (columns rounded up to whole panels).
    fn packed_b_len(depth: usize, cols: usize) -> usize {
        cols.div_ceil(Self::NR) * Self::NR * Self::steps(depth)
    }
}

/// Checks what a microkernel's tile function relies on: `a_panel` holds the steps it runs, of
/// `mr` elements each, `b_panel` every step of the panel, `nr` elements each, `b_step` apart,
/// and the tile fits the kernel's `mr × nr`. After this, the kernel reads and writes without
/// further checks.
pub fn check_tile<P>(
    steps: Steps<'_>,
    (a_panel, mr): (&[P], usize),
    (b_panel, b_step, nr): (&[P], usize, usize),
    tile: &DstTile<'_>,
) {
    let (run, span) = (steps.run(), steps.span());
    assert!(a_panel.len() >= run * mr, "the a panel holds its steps");
    assert!(
        span == 0 || b_panel.len() >= (span - 1) * b_step + nr,
        "the b panel holds its steps"
    );
    assert!(
        tile.rows() <= mr && tile.cols() <= nr,
        "a tile fits the microkernel"
    );
}

/// Asks for the rows of a destination tile now, so that they are in L1 when a microkernel
/// writes its sums (a hint: nothing is read, and a prefetch never faults).
#[inline(always)]
pub fn prefetch_tile(tile: &DstTile<'_>) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..tile.rows() {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let row = tile.ptr().wrapping_add(r * tile.ld());
        // SAFETY: SSE is part of x86-64; a prefetch of any address is harmless.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(row.cast::<i8>());
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(tile.cols() - 1).cast::<i8>());
        }
    }
}

/// Runs `step` over the packed steps of depth `steps` names, four at a time: `step(a, b)`
/// with `a` at a step's `mr` elements of the `a` panel and `b` at its elements of the `b`
/// panel, whose steps lie `b_step` apart. Inlined into the microkernel that calls it, so
/// `step` (a closure of that kernel) keeps the kernel's target features.
#[inline(always)]
pub fn for_each_step<T>(
    steps: Steps<'_>,
    (a, mr): (*const T, usize),
    (b, b_step): (*const T, usize),
    step: impl FnMut(*const T, *const T),
) {
    match steps {
        Steps::All(steps) => each_step(steps, (a, mr), (b, b_step), step),
        Steps::Listed(list) => each_listed_step(list.steps(), (a, mr), (b, b_step), step),
    }
}

/// [`for_each_step`] over every step.
#[inline(always)]
fn each_step<T>(
    steps: usize,
    (mut a, mr): (*const T, usize),
    (mut b, b_step): (*const T, usize),
    mut step: impl FnMut(*const T, *const T),
) {
    for _ in 0..steps / 4 {
        step(a, b);
        step(a.wrapping_add(mr), b.wrapping_add(b_step));
        step(a.wrapping_add(2 * mr), b.wrapping_add(2 * b_step));
        step(a.wrapping_add(3 * mr), b.wrapping_add(3 * b_step));
        a = a.wrapping_add(4 * mr);
        b = b.wrapping_add(4 * b_step);
    }
    for _ in 0..steps % 4 {
        step(a, b);
        a = a.wrapping_add(mr);
        b = b.wrapping_add(b_step);
    }
}

/// [`for_each_step`] over the listed steps of `b`, against consecutive steps of `a`.
#[inline(always)]
fn each_listed_step<T>(
    list: &[u32],
    (mut a, mr): (*const T, usize),
    (b, b_step): (*const T, usize),
    mut step: impl FnMut(*const T, *const T),
) {
    let at = |s: u32| b.wrapping_add(s as usize * b_step);
    let mut quads = list.chunks_exact(4);
    for q in &mut quads {
        step(a, at(q[0]));
        step(a.wrapping_add(mr), at(q[1]));
        step(a.wrapping_add(2 * mr), at(q[2]));
        step(a.wrapping_add(3 * mr), at(q[3]));
        a = a.wrapping_add(4 * mr);
    }
    for &s in quads.remainder() {
        step(a, at(s));
        a = a.wrapping_add(mr);
    }
}

/// Masked writing of the AVX-512 kernels' sums, whose rows are whole 16-lane vectors.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    use super::{DstTile, Onto};

    /// A mask of the first `n` lanes of a 16-lane vector (all of them from 16 on).
    #[inline(always)]
    pub fn first_lanes(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// Writes `sums` (`V` vectors for each row, 16 columns each) `onto` the tile's live rows
    /// and columns through masked loads and stores: lanes past the tile's columns and rows
    /// past its rows are neither read nor written.
    ///
    /// Inlined into the kernel that calls it (a call would first spill the accumulators), so
    /// it carries no target features of its own.
    ///
    /// # Safety
    /// AVX-512F is available and the caller is compiled for it; `tile` is writable as its
    /// rows, columns and row stride describe, and has at most `16 * V` columns.
    #[inline(always)]
    pub unsafe fn store_sums<const V: usize>(sums: &[[__m512; V]], tile: &DstTile<'_>, onto: Onto) {
        let (rows, cols, ld, c) = (tile.rows(), tile.cols(), tile.ld(), tile.ptr());
        let masks: [__mmask16; V] =
            std::array::from_fn(|v| first_lanes(cols.saturating_sub(16 * v)));
        for (r, row) in sums.iter().take(rows).enumerate() {
            for (v, (&sum, &mask)) in row.iter().zip(&masks).enumerate() {
                let out = c.wrapping_add(r * ld + 16 * v);
                // SAFETY: the mask keeps only columns below `cols` of row `r < rows`, which
                // the caller promises writable; masked-off lanes are not accessed.
                unsafe {
                    let total = match onto {
                        Onto::Overwrite => sum,
                        Onto::Add => _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, out)),
                        Onto::AddScaled(factor) => {
                            let scaled = _mm512_mul_ps(sum, _mm512_set1_ps(factor));
                            _mm512_add_ps(scaled, _mm512_maskz_loadu_ps(mask, out))
                        }
                    };
                    _mm512_mask_storeu_ps(out, mask, total);
                }
            }
        }
    }
}
