//! Random crops and flips of training images (`data.augment`), applied to a batch in place.
//!
//! `random_crop = p` pads each image with `p` zero pixels on every side and crops a window of
//! the original size at a uniformly random offset (torchvision's `RandomCrop(size, padding=p)`),
//! done here as a shift of each plane by up to `p` pixels with zeros filling what comes in
//! from outside; `horizontal_flip` then mirrors each image left to right with probability ½.
//! Both act on the features as the batch holds them (after `data.scale` and `normalize`, so
//! the padding is 0 there), with no allocation per image.
//!
//! The draws of a batch come from a generator seeded by the job's seed, the epoch and the
//! step, on a stream of the rank ([`streams::AUGMENT`]), and each image takes its draws in
//! its order in the batch: the same seed gives the same augmentation on every run and every
//! machine, and a resumed run augments its remaining steps as an uninterrupted one would.
//! Evaluation and prediction never augment.

use rand::RngExt;
use ringflow_core::spec::DataSpec;
use ringflow_ml::rng::{self, Rng, streams};

/// Where a batch is in the run, which decides its random draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPosition {
    /// The epoch (0-based).
    pub epoch: u64,
    /// The rank that trains on the batch.
    pub rank: usize,
    /// The step within the epoch.
    pub step: u64,
}

/// The augmentation of a job's training batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Augmenter {
    /// `[channels, height, width]` of each image.
    shape: [usize; 3],
    /// Pixels of zero padding on each side before the crop (0: no crop).
    crop: usize,
    /// Mirror half of the images.
    flip: bool,
    /// The job's seed.
    seed: u64,
}

impl Augmenter {
    /// The augmentation `data` asks for (`None` when it asks for none), drawn from `seed`.
    /// The spec was checked: augmentation comes with a 3-D example shape.
    pub fn new(data: &DataSpec, seed: u64) -> Option<Augmenter> {
        let augment = data.augment.as_ref()?;
        let &[c, h, w] = data.example_shape()?.as_slice() else {
            return None;
        };
        let does_something = augment.random_crop > 0 || augment.horizontal_flip;
        does_something.then_some(Augmenter {
            shape: [c, h, w],
            crop: augment.random_crop,
            flip: augment.horizontal_flip,
            seed,
        })
    }

    /// Crops and flips each of the `rows` images of `features` (`[rows, C, H, W]`, row-major)
    /// in place, with the draws of the batch at `at`.
    pub fn apply(&self, features: &mut [f32], rows: usize, at: BatchPosition) {
        let [c, h, w] = self.shape;
        let per_image = c * h * w;
        if per_image == 0 {
            return;
        }
        let mut rng = self.rng(at);
        let pad = self.crop as u32;
        for image in features.chunks_exact_mut(per_image).take(rows) {
            let (dy, dx) = if pad > 0 {
                let oy = rng.random_range(0..=2 * pad) as isize;
                let ox = rng.random_range(0..=2 * pad) as isize;
                (oy - pad as isize, ox - pad as isize)
            } else {
                (0, 0)
            };
            let mirror = self.flip && rng.random_bool(0.5);
            for plane in image.chunks_exact_mut(h * w) {
                shift_plane(plane, [h, w], dy, dx);
                if mirror {
                    for row in plane.chunks_exact_mut(w) {
                        row.reverse();
                    }
                }
            }
        }
    }

    /// The generator of the batch at `at`.
    fn rng(&self, at: BatchPosition) -> Rng {
        let seed = mix(self.seed ^ mix(at.epoch ^ mix(at.step)));
        rng::seeded(seed, streams::AUGMENT + ((at.rank as u64) << 32))
    }
}

/// SplitMix64's finalizer: spreads every bit of `z` over the result.
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Moves the `[h, w]` plane so that pixel `(y, x)` takes the value at `(y + dy, x + dx)`,
/// zero where that is outside the plane: the window at offset `(p + dy, p + dx)` of the plane
/// padded by `p`. Rows are visited in the order that reads each source row before it is
/// overwritten.
fn shift_plane(plane: &mut [f32], [h, w]: [usize; 2], dy: isize, dx: isize) {
    if dy == 0 && dx == 0 {
        return;
    }
    let (hi, wi) = (h as isize, w as isize);
    // Columns x whose source x + dx lies inside the row.
    let x0 = (-dx).clamp(0, wi) as usize;
    let x1 = (wi - dx).clamp(0, wi) as usize;
    for i in 0..h {
        let y = if dy > 0 { i } else { h - 1 - i };
        let row = y * w;
        let sy = y as isize + dy;
        if !(0..hi).contains(&sy) || x0 >= x1 {
            plane[row..row + w].fill(0.0);
            continue;
        }
        let src = sy as usize * w;
        let from = (src as isize + x0 as isize + dx) as usize;
        plane.copy_within(from..from + (x1 - x0), row + x0);
        plane[row..row + x0].fill(0.0);
        plane[row + x1..row + w].fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `[channels, h, w]` image whose pixel values are 1, 2, 3, … in memory order.
    fn counting(c: usize, h: usize, w: usize) -> Vec<f32> {
        (1..=c * h * w).map(|v| v as f32).collect()
    }

    #[test]
    fn a_shift_is_a_window_of_the_zero_padded_plane() {
        // 1 2 3
        // 4 5 6
        // 7 8 9
        let shifted = |dy, dx| {
            let mut p = counting(1, 3, 3);
            shift_plane(&mut p, [3, 3], dy, dx);
            p
        };
        // The window one down and one left in the padded plane: (y, x) ← (y + 1, x − 1).
        assert_eq!(shifted(1, -1), [0., 4., 5., 0., 7., 8., 0., 0., 0.]);
        assert_eq!(shifted(-1, 1), [0., 0., 0., 2., 3., 0., 5., 6., 0.]);
        assert_eq!(shifted(0, 2), [3., 0., 0., 6., 0., 0., 9., 0., 0.]);
        assert_eq!(shifted(-2, 0), [0., 0., 0., 0., 0., 0., 1., 2., 3.]);
        assert_eq!(shifted(3, 0), [0.0; 9]);
        assert_eq!(shifted(0, -3), [0.0; 9]);
        assert_eq!(shifted(0, 0), counting(1, 3, 3));
        // A non-square plane: 2 × 4.
        let mut p = counting(1, 2, 4);
        shift_plane(&mut p, [2, 4], 1, 1);
        assert_eq!(p, [6., 7., 8., 0., 0., 0., 0., 0.]);
    }

    fn augmenter(crop: usize, flip: bool, shape: [usize; 3]) -> Augmenter {
        Augmenter {
            shape,
            crop,
            flip,
            seed: 42,
        }
    }

    const AT: BatchPosition = BatchPosition {
        epoch: 1,
        rank: 0,
        step: 3,
    };

    #[test]
    fn a_flip_mirrors_every_plane_of_an_image_alike() {
        let a = augmenter(0, true, [2, 2, 3]);
        let rows = 64;
        let mut batch: Vec<f32> = (0..rows).flat_map(|_| counting(2, 2, 3)).collect();
        a.apply(&mut batch, rows, AT);
        let mirrored = [3., 2., 1., 6., 5., 4., 9., 8., 7., 12., 11., 10.];
        let mut flipped = 0;
        for image in batch.chunks_exact(12) {
            if image == mirrored {
                flipped += 1;
            } else {
                assert_eq!(
                    image,
                    counting(2, 2, 3),
                    "an image is either mirrored or kept"
                );
            }
        }
        assert!((16..=48).contains(&flipped), "{flipped} of {rows} flipped");
    }

    #[test]
    fn crops_move_every_plane_of_an_image_alike_within_the_padding() {
        let a = augmenter(1, false, [3, 4, 4]);
        let rows = 200;
        let mut batch: Vec<f32> = (0..rows).flat_map(|_| counting(3, 4, 4)).collect();
        a.apply(&mut batch, rows, AT);
        let mut seen = std::collections::BTreeSet::new();
        for image in batch.chunks_exact(48) {
            // Find the shift: the one that makes the first plane; the others match it.
            let found = (-1..=1)
                .flat_map(|dy| (-1..=1).map(move |dx| (dy, dx)))
                .find(|&(dy, dx)| {
                    let mut expected = counting(3, 4, 4);
                    for plane in expected.chunks_exact_mut(16) {
                        shift_plane(plane, [4, 4], dy, dx);
                    }
                    expected == image
                });
            seen.insert(found.expect("every image is a shift of at most the padding"));
        }
        assert_eq!(
            seen.len(),
            9,
            "every offset of the 3 × 3 turns up: {seen:?}"
        );
    }

    #[test]
    fn the_same_seed_epoch_rank_and_step_give_the_same_batch() {
        let a = augmenter(2, true, [1, 5, 5]);
        let run = |at: BatchPosition, seed: u64| {
            let a = Augmenter { seed, ..a.clone() };
            let mut batch: Vec<f32> = (0..32).flat_map(|_| counting(1, 5, 5)).collect();
            a.apply(&mut batch, 32, at);
            batch
        };
        let first = run(AT, 42);
        assert_eq!(first, run(AT, 42));
        assert_ne!(first, run(AT, 43), "another seed");
        assert_ne!(
            first,
            run(BatchPosition { step: 4, ..AT }, 42),
            "another step"
        );
        assert_ne!(
            first,
            run(BatchPosition { epoch: 2, ..AT }, 42),
            "another epoch"
        );
        assert_ne!(
            first,
            run(BatchPosition { rank: 1, ..AT }, 42),
            "another rank"
        );
        // Images differ from one another within a batch.
        assert!(first.chunks_exact(25).any(|i| i != &first[..25]));
    }

    #[test]
    fn only_image_specs_with_something_to_do_augment() {
        let spec = |augment: &str, shape: &str| {
            let text = format!(
                "[data]\ntrain = \"t\"\nlabel = \"y\"\nfeatures = [\"x\"]\nshape = {shape}\n\
                 augment = {augment}\n[model]\nkind = \"mlp\"\n"
            );
            let spec = ringflow_core::spec::JobSpec::parse(&text, "j.toml".as_ref(), &[]);
            spec.unwrap().data
        };
        let a = Augmenter::new(&spec("{ random_crop = 2 }", "[3, 8, 9]"), 7).unwrap();
        assert_eq!(a, augmenter(2, false, [3, 8, 9]).with_seed(7));
        assert!(Augmenter::new(&spec("{}", "[3, 8, 9]"), 7).is_none());
    }

    impl Augmenter {
        fn with_seed(self, seed: u64) -> Augmenter {
            Augmenter { seed, ..self }
        }
    }
}
