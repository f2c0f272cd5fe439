//! Skipping the steps of depth whose `a` elements are all zero.
//!
//! A packed `a` panel holds, for each step of depth, one element of each of its rows. Where
//! all of them are zero (a pixel blank in each of a panel's images, a feature absent from each
//! of its rows; or, transposed, neighbouring pixels all blank in one image) the step adds
//! nothing to the tile, and the microkernel need not run it. After a block of `a` is packed,
//! [`BlockSteps::find`] scans each panel; a panel of which at least an eighth of the steps are
//! zero is compacted in place (its other steps moved to the front, in order) and runs only
//! those, reading the matching steps of `b` ([`Steps::Listed`]); denser panels run every step
//! as before. The sums are the same either way, since adding a zero product changes no sum,
//! with one exception that sparse products share: a zero of `a` against an infinite or NaN
//! element of `b` contributes nothing instead of NaN.
//!
//! The scan costs a dense block one AVX2 test per step of each panel, about an eighth of a
//! tile's single step; blocks that meet fewer than [`MIN_B_PANELS`] panels of `b`, whose
//! panels run few tiles each, are not scanned.

use std::cell::Cell;

use super::element::{PackedElement, borrow};
#[cfg(target_arch = "x86_64")]
use super::tokens::Avx2Fma;

/// The steps of one panel that hold a nonzero `a` element: increasing, each below the
/// panel's span (the invariant the microkernels' indexed reads of `b` rest on; only
/// [`StepList::compact`] builds one).
#[derive(Debug, Default)]
pub struct StepList {
    steps: Vec<u32>,
    span: usize,
}

impl StepList {
    /// The listed steps, increasing.
    pub fn steps(&self) -> &[u32] {
        &self.steps
    }

    /// Steps of the panel the list was taken from: every listed step is below it.
    pub fn span(&self) -> usize {
        self.span
    }

    /// When at least an eighth of the `steps` steps of `panel` (`MR` elements each) are
    /// zero, lists the others and moves them to the panel's front, in order, and returns
    /// true. Otherwise leaves the panel as it is.
    fn compact<P: PackedElement, const MR: usize>(
        &mut self,
        panel: &mut [P],
        steps: usize,
    ) -> bool {
        let (step_of, _) = panel[..steps * MR].as_chunks_mut::<MR>();
        if count_zero_steps(step_of) * 8 < steps {
            return false;
        }
        self.span = steps;
        self.steps.resize(steps, 0);
        let kept = compact_steps(step_of, &mut self.steps);
        self.steps.truncate(kept);
        true
    }
}

/// The steps of depth a tile runs: every step of its panels, or only those of a
/// [`StepList`], whose `a` panel was compacted to hold just them, in order (the others'
/// `a` elements are all zero).
#[derive(Clone, Copy, Debug)]
pub enum Steps<'a> {
    /// All of the panels' steps, in order.
    All(usize),
    /// The listed steps of the `b` panel, against consecutive steps of the `a` panel.
    Listed(&'a StepList),
}

impl Steps<'_> {
    /// Steps the kernel runs: the `a` panel's steps it reads.
    pub fn run(&self) -> usize {
        match self {
            Steps::All(steps) => *steps,
            Steps::Listed(list) => list.steps().len(),
        }
    }

    /// Steps the `b` panel spans.
    pub fn span(&self) -> usize {
        match self {
            Steps::All(steps) => *steps,
            Steps::Listed(list) => list.span(),
        }
    }
}

/// Moves the nonzero steps of `steps` to its front, in order, writing the index each came
/// from into `list` (as long as `steps`); returns how many there are. One pass without
/// branches on the data: every step is written to the next free place, which advances only
/// past a nonzero one (a place before the step being read, or the step itself).
fn compact_steps<P: PackedElement, const MR: usize>(
    steps: &mut [[P; MR]],
    list: &mut [u32],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if MR == 8
        && let Some(cpu) = Avx2Fma::detect()
    {
        return x86::compact_steps8(cpu, steps.as_flattened_mut(), list);
    }
    let mut kept = 0;
    for s in 0..steps.len() {
        let step = steps[s];
        steps[kept] = step;
        list[kept] = s as u32;
        kept += usize::from(!is_zero(&step));
    }
    kept
}

/// Whether every element of a step is zero.
#[inline(always)]
fn is_zero<P: PackedElement, const MR: usize>(step: &[P; MR]) -> bool {
    step.iter().fold(0, |bits, x| bits | x.magnitude_bits()) == 0
}

/// How many of `steps` are zero: one AVX2 test per step of eight elements where the CPU has
/// AVX2 (the scan must cost a dense panel next to nothing), [`is_zero`] otherwise.
fn count_zero_steps<P: PackedElement, const MR: usize>(steps: &[[P; MR]]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if MR == 8
        && let Some(cpu) = Avx2Fma::detect()
    {
        return x86::count_zero_steps8(cpu, steps.as_flattened());
    }
    steps.iter().filter(|step| is_zero(step)).count()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::tokens::Avx2Fma;
    use super::PackedElement;

    /// [`super::count_zero_steps`] for steps of 8 elements, `panel` holding whole steps.
    pub fn count_zero_steps8<P: PackedElement>(cpu: Avx2Fma, panel: &[P]) -> usize {
        const { assert!(size_of::<P>() == 4, "packed elements are 32 bits") };
        let _ = cpu;
        // SAFETY: `cpu` proves AVX2; the pointer covers `panel.len() / 8` whole steps of 32
        // bytes, which `P` (plain 32-bit data, asserted above) may be read as.
        unsafe { count(panel.as_ptr().cast(), panel.len() / 8, P::MAGNITUDE) }
    }

    /// [`super::compact_steps`] for steps of 8 elements, `panel` holding whole steps and
    /// `list` a place for each.
    pub fn compact_steps8<P: PackedElement>(
        cpu: Avx2Fma,
        panel: &mut [P],
        list: &mut [u32],
    ) -> usize {
        const { assert!(size_of::<P>() == 4, "packed elements are 32 bits") };
        let _ = cpu;
        let steps = panel.len() / 8;
        assert!(list.len() >= steps, "a place in the list for each step");
        // SAFETY: `cpu` proves AVX2; the panel holds `steps` whole steps of 32 bytes of plain
        // 32-bit data (asserted above), uniquely borrowed, and the list a place for each.
        unsafe {
            compact(
                (panel.as_mut_ptr().cast(), steps, P::MAGNITUDE),
                list.as_mut_ptr(),
            )
        }
    }

    /// Moves the steps among `steps` 8-lane steps at `at` that have a bit of `magnitude`
    /// set to the front, in order, their indices to `list`; returns how many.
    ///
    /// # Safety
    /// AVX2 is available, `at` points at `steps * 8` writable 32-bit lanes and `list` at
    /// `steps` writable places.
    #[target_feature(enable = "avx2")]
    unsafe fn compact((at, steps, magnitude): (*mut u32, usize, u32), list: *mut u32) -> usize {
        let mask = _mm256_set1_epi32(magnitude as i32);
        let mut kept = 0;
        for s in 0..steps {
            // SAFETY: `kept <= s < steps`: both places lie within the panel and the list.
            unsafe {
                let step = _mm256_loadu_si256(at.add(8 * s).cast());
                _mm256_storeu_si256(at.add(8 * kept).cast(), step);
                *list.add(kept) = s as u32;
                kept += (_mm256_testz_si256(step, mask) == 0) as usize;
            }
        }
        kept
    }

    /// Steps among `steps` 8-lane steps at `at` whose lanes have no bit of `magnitude` set.
    ///
    /// # Safety
    /// AVX2 is available and `at` points at `steps * 8` readable 32-bit lanes.
    #[target_feature(enable = "avx2")]
    unsafe fn count(at: *const u32, steps: usize, magnitude: u32) -> usize {
        let mask = _mm256_set1_epi32(magnitude as i32);
        let mut zero = 0;
        for s in 0..steps {
            // SAFETY: step `s < steps` lies within what the caller promised readable.
            let step = unsafe { _mm256_loadu_si256(at.add(8 * s).cast()) };
            zero += _mm256_testz_si256(step, mask) as usize;
        }
        zero
    }
}

/// Panels of `b` a block of `a` must meet for its scan to pay: the scan costs about one
/// cycle a step of a panel, a tile eight (8 × 32 on AVX-512), so against fewer panels it
/// would cost more than 3% of a dense block (as on `gemm_bench`'s lenet2.fwd, 64 × 800 × 64,
/// whose blocks meet two panels and run slower scanned).
pub const MIN_B_PANELS: usize = 4;

/// Which steps each panel of a packed `a` block runs.
#[derive(Debug, Default)]
pub struct BlockSteps {
    /// One list per panel, kept between blocks for their storage.
    lists: Vec<StepList>,
    /// Whether each panel of the current block runs its list (else every step).
    listed: Vec<bool>,
    /// Steps of every panel of the current block.
    steps: usize,
}

impl BlockSteps {
    /// Scans the `panels` panels of a packed block (`steps` steps of `mr` elements each,
    /// one after the other in `a`), compacting those with enough zero steps, when the block
    /// meets `b_panels` panels of `b` (at least [`MIN_B_PANELS`]; else every panel runs
    /// every step).
    pub fn find<P: PackedElement>(
        &mut self,
        a: &mut [P],
        (mr, steps, panels): (usize, usize, usize),
        b_panels: usize,
    ) {
        self.steps = steps;
        self.listed.clear();
        if b_panels < MIN_B_PANELS {
            self.listed.resize(panels, false);
            return;
        }
        if self.lists.len() < panels {
            self.lists.resize_with(panels, StepList::default);
        }
        let chunks = a.chunks_exact_mut(steps * mr).take(panels);
        for (panel, list) in chunks.zip(&mut self.lists) {
            let listed = match mr {
                6 => list.compact::<P, 6>(panel, steps),
                8 => list.compact::<P, 8>(panel, steps),
                _ => false,
            };
            self.listed.push(listed);
        }
    }

    /// Steps of every panel of the current block, listed or not.
    pub fn span(&self) -> usize {
        self.steps
    }

    /// The steps panel `panel` of the current block runs.
    pub fn of(&self, panel: usize) -> Steps<'_> {
        if self.listed[panel] {
            Steps::Listed(&self.lists[panel])
        } else {
            Steps::All(self.steps)
        }
    }
}

thread_local! {
    /// This thread's step lists, kept between products.
    static BLOCK_STEPS: Cell<BlockSteps> = Cell::new(BlockSteps::default());
}

/// Runs `f` on this thread's [`BlockSteps`]. Taken out while in use, so a nested product on
/// the same thread (rayon runs other jobs while waiting) gets fresh ones.
pub fn with_block_steps<R>(f: impl FnOnce(&mut BlockSteps) -> R) -> R {
    BLOCK_STEPS.with(|cell| borrow(cell, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panel of `steps` steps of 8 lanes whose step `s` is zero when `zero(s)`.
    fn panel(steps: usize, zero: impl Fn(usize) -> bool) -> Vec<f32> {
        (0..steps * 8)
            .map(|i| {
                if zero(i / 8) {
                    -0.0
                } else {
                    (i % 8) as f32 - 3.5
                }
            })
            .collect()
    }

    #[test]
    fn a_sparse_panel_runs_only_its_nonzero_steps_moved_to_its_front() {
        let mut a = panel(40, |s| s % 3 == 1);
        let original = a.clone();
        let mut steps = BlockSteps::default();
        steps.find(&mut a, (8, 40, 1), MIN_B_PANELS);
        let Steps::Listed(list) = steps.of(0) else {
            panic!("a third of the steps are zero");
        };
        let want: Vec<u32> = (0..40).filter(|s| s % 3 != 1).collect();
        assert_eq!((list.steps(), list.span()), (&want[..], 40));
        for (i, &s) in want.iter().enumerate() {
            let s = s as usize;
            assert_eq!(a[i * 8..i * 8 + 8], original[s * 8..s * 8 + 8]);
        }
    }

    #[test]
    fn a_panel_with_fewer_than_an_eighth_zero_steps_runs_every_step_unchanged() {
        for (zero_steps, listed) in [(4, false), (5, true)] {
            let mut a = panel(40, |s| s < zero_steps);
            let original = a.clone();
            let mut steps = BlockSteps::default();
            steps.find(&mut a, (8, 40, 1), MIN_B_PANELS);
            assert_eq!(matches!(steps.of(0), Steps::Listed(_)), listed);
            if !listed {
                assert_eq!(a, original);
                assert!(matches!(steps.of(0), Steps::All(40)));
            }
        }
    }

    #[test]
    fn each_panel_of_a_block_is_judged_on_its_own() {
        let mut a = panel(16, |_| false);
        a.extend(panel(16, |s| s >= 8));
        a.extend(panel(16, |_| true));
        let mut steps = BlockSteps::default();
        steps.find(&mut a, (8, 16, 3), MIN_B_PANELS);
        assert!(matches!(steps.of(0), Steps::All(16)));
        let runs = |p| match steps.of(p) {
            Steps::Listed(list) => list.steps().len(),
            Steps::All(_) => usize::MAX,
        };
        assert_eq!((runs(1), runs(2)), (8, 0));
    }

    #[test]
    fn a_block_meeting_few_b_panels_is_not_scanned() {
        let mut a = panel(40, |s| s % 2 == 0);
        let original = a.clone();
        let mut steps = BlockSteps::default();
        steps.find(&mut a, (8, 40, 1), MIN_B_PANELS - 1);
        assert!(matches!(steps.of(0), Steps::All(40)));
        assert_eq!(a, original);
    }

    /// Six-lane panels (the AVX2 kernel's) are scanned without the 8-lane test.
    #[test]
    fn six_lane_panels_are_compacted_too() {
        let mut a: Vec<f32> = (0..60)
            .map(|i| if (i / 6) % 2 == 0 { 0.0 } else { 1.0 })
            .collect();
        let mut steps = BlockSteps::default();
        steps.find(&mut a, (6, 10, 1), MIN_B_PANELS);
        let Steps::Listed(list) = steps.of(0) else {
            panic!("half of the steps are zero");
        };
        assert_eq!(list.steps(), &[1, 3, 5, 7, 9]);
        assert!(a[..30].iter().all(|&x| x == 1.0));
    }

    /// A bf16 pair is zero only when both halves are (either sign); one live half keeps the
    /// step.
    #[test]
    fn a_pair_is_zero_only_when_both_halves_are() {
        let mut a = vec![0u32; 8 * 8];
        a[3 * 8 + 5] = 0x8000_8000;
        a[5 * 8 + 2] = 0x0000_3f80;
        a[6 * 8] = 0x3f80_0000;
        let mut steps = BlockSteps::default();
        steps.find(&mut a, (8, 8, 1), MIN_B_PANELS);
        let Steps::Listed(list) = steps.of(0) else {
            panic!("most steps are zero");
        };
        assert_eq!(list.steps(), &[5, 6]);
    }

    #[test]
    fn the_vector_count_matches_the_portable_one() {
        let values = [0.0, -0.0, 1.0, f32::MIN_POSITIVE, -1e-40, f32::NAN];
        let steps: Vec<[f32; 8]> = (0..500usize)
            .map(|s| {
                std::array::from_fn(|l| {
                    if (s * 31 + l * 7) % 11 < 9 {
                        0.0
                    } else {
                        values[(s + l) % 6]
                    }
                })
            })
            .collect();
        let portable = steps.iter().filter(|step| is_zero(step)).count();
        assert!(portable > 0 && portable < steps.len());
        assert_eq!(count_zero_steps(&steps), portable);
    }
}
