//! Fused, numerically stable loss kernels.

use super::elementwise::sigmoid;
use super::{CpuArray, from_vec, slice, slice_mut, zeros};
use crate::backend::loss::LossOps;
use crate::error::Result;

/// Mean cross-entropy of `logits` (`[n, classes]`) against integer class `targets` (`[n]`, class
/// indices carried as f32). Returns the scalar loss and the softmax probabilities that the
/// backward pass needs. Targets were range-checked by the caller.
pub fn cross_entropy(logits: &CpuArray, targets: &CpuArray) -> (CpuArray, CpuArray) {
    let n = logits.shape()[0];
    let c = logits.shape()[1];
    let mut probs = zeros(logits.shape());
    let (xs, ts) = (slice(logits), slice(targets));
    let ps = slice_mut(&mut probs);
    let mut total = 0.0f64;
    for i in 0..n {
        let row = &xs[i * c..(i + 1) * c];
        let prow = &mut ps[i * c..(i + 1) * c];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (p, &x) in prow.iter_mut().zip(row) {
            *p = (x - max).exp();
            sum += *p;
        }
        let inv = 1.0 / sum;
        for p in prow.iter_mut() {
            *p *= inv;
        }
        let t = ts[i] as usize;
        total += (sum.ln() + max - row[t]) as f64;
    }
    let mean = if n == 0 { 0.0 } else { total / n as f64 };
    (from_vec(&[], vec![mean as f32]), probs)
}

/// The gradient of [`cross_entropy`] with respect to the logits: `(p - onehot) · g / n`.
pub fn cross_entropy_backward(probs: &CpuArray, targets: &CpuArray, g: f32) -> CpuArray {
    let n = probs.shape()[0];
    let c = probs.shape()[1];
    let mut out = probs.clone();
    let scale = if n == 0 { 0.0 } else { g / n as f32 };
    let os = slice_mut(&mut out);
    for (i, &t) in slice(targets).iter().enumerate() {
        os[i * c + t as usize] -= 1.0;
    }
    for v in os.iter_mut() {
        *v *= scale;
    }
    out
}

/// Mean binary cross-entropy of `logits` against targets in [0, 1], in the stable form
/// `max(x, 0) - x·z + log(1 + exp(-|x|))`.
pub fn bce_with_logits(logits: &CpuArray, targets: &CpuArray) -> CpuArray {
    let xs = slice(logits);
    let zs = slice(targets);
    let total: f64 = xs
        .iter()
        .zip(zs)
        .map(|(&x, &z)| (x.max(0.0) - x * z + (-x.abs()).exp().ln_1p()) as f64)
        .sum();
    let n = xs.len().max(1);
    from_vec(&[], vec![(total / n as f64) as f32])
}

/// The gradient of [`bce_with_logits`] with respect to the logits: `(σ(x) - z) · g / n`.
pub fn bce_with_logits_backward(logits: &CpuArray, targets: &CpuArray, g: f32) -> CpuArray {
    let n = logits.len().max(1) as f32;
    let mut out = zeros(logits.shape());
    for ((o, &x), &z) in slice_mut(&mut out)
        .iter_mut()
        .zip(slice(logits))
        .zip(slice(targets))
    {
        *o = (sigmoid(x) - z) * g / n;
    }
    out
}

/// The value of a one-element array (an upstream gradient).
fn scalar(a: &CpuArray) -> f32 {
    slice(a).first().copied().unwrap_or(0.0)
}

impl LossOps for CpuArray {
    fn cross_entropy(logits: &Self, targets: &Self) -> Result<(Self, Self)> {
        Ok(cross_entropy(logits, targets))
    }

    fn cross_entropy_backward(probs: &Self, targets: &Self, grad: &Self) -> Result<Self> {
        Ok(cross_entropy_backward(probs, targets, scalar(grad)))
    }

    /// One pass, accumulated in f64.
    fn bce_with_logits(logits: &Self, targets: &Self) -> Result<Self> {
        Ok(bce_with_logits(logits, targets))
    }

    /// One pass.
    fn bce_with_logits_backward(logits: &Self, targets: &Self, grad: &Self) -> Result<Self> {
        Ok(bce_with_logits_backward(logits, targets, scalar(grad)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_of_uniform_logits_is_log_classes() {
        let logits = from_vec(&[2, 4], vec![0.0; 8]);
        let targets = from_vec(&[2], vec![1.0, 3.0]);
        let (loss, _) = cross_entropy(&logits, &targets);
        assert!((slice(&loss)[0] - 4f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn cross_entropy_survives_huge_logits() {
        let logits = from_vec(&[1, 2], vec![1e4, -1e4]);
        let targets = from_vec(&[1], vec![1.0]);
        let (loss, _) = cross_entropy(&logits, &targets);
        assert!((slice(&loss)[0] - 2e4).abs() < 1.0);
    }

    #[test]
    fn bce_matches_the_naive_formula_where_that_is_stable() {
        let x = from_vec(&[2], vec![0.3, -1.2]);
        let z = from_vec(&[2], vec![1.0, 0.0]);
        let naive = |x: f32, z: f32| -(z * sigmoid(x).ln() + (1.0 - z) * (1.0 - sigmoid(x)).ln());
        let want = (naive(0.3, 1.0) + naive(-1.2, 0.0)) / 2.0;
        assert!((slice(&bce_with_logits(&x, &z))[0] - want).abs() < 1e-6);
    }
}
