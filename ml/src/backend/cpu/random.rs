//! A counter-based random generator: the `i`-th draw of a stream is a pure function of the
//! stream's seed and `i`, so a GPU kernel computes exactly the same numbers in parallel as this
//! loop does in order (the CUDA backend's `uniform_at` is the same arithmetic).

use super::{CpuArray, from_vec};
use crate::backend::random::RandomOps;
use crate::error::Result;
use crate::shape::numel;

/// The SplitMix64 finalizer: a bijective mix of 64 bits.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draw `i` of stream `seed`: uniform in `[0, 1)` with 24 bits of precision (exact in f32).
#[inline(always)]
pub fn uniform_at(seed: u64, i: u64) -> f32 {
    let z = mix64(seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    (z >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// An inverted-dropout mask: 0 with probability `p`, else `1 / (1 - p)`.
pub fn dropout_mask(shape: &[usize], p: f32, seed: u64) -> CpuArray {
    let keep = 1.0 / (1.0 - p);
    let data = (0..numel(shape) as u64)
        .map(|i| if uniform_at(seed, i) < p { 0.0 } else { keep })
        .collect();
    from_vec(shape, data)
}

impl RandomOps for CpuArray {
    fn dropout_mask(shape: &[usize], p: f32, seed: u64, (): ()) -> Result<Self> {
        Ok(dropout_mask(shape, p, seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_and_depend_on_the_seed() {
        let n = 100_000u64;
        let mean: f64 = (0..n).map(|i| uniform_at(7, i) as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&uniform_at(7, i))));
        assert_ne!(uniform_at(7, 0), uniform_at(8, 0));
        let kept = (0..n).filter(|&i| uniform_at(3, i) >= 0.25).count() as f64 / n as f64;
        assert!((kept - 0.75).abs() < 0.01, "kept {kept}");
    }
}
