//! Softmax and log-softmax along an axis, and their backward passes.

use super::{CpuArray, slice, slice_mut, zeros};
use crate::backend::softmax::SoftmaxOps;
use crate::error::Result;

/// Calls `f(offset, stride)` for every lane of length `shape[axis]` of a standard-layout array.
fn for_each_lane(shape: &[usize], axis: usize, mut f: impl FnMut(usize, usize)) {
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    for o in 0..outer {
        for i in 0..inner {
            f(o * len * inner + i, inner);
        }
    }
}

/// `softmax(x)` or, with `log`, `log_softmax(x)` along `axis` (max-subtracted, stable).
pub fn softmax(x: &CpuArray, axis: usize, log: bool) -> CpuArray {
    let shape = x.shape().to_vec();
    let len = shape[axis];
    let mut out = zeros(&shape);
    let xs = slice(x);
    let os = slice_mut(&mut out);
    for_each_lane(&shape, axis, |start, stride| {
        let at = |j: usize| start + j * stride;
        let mut max = f32::NEG_INFINITY;
        for j in 0..len {
            max = max.max(xs[at(j)]);
        }
        let mut sum = 0.0f32;
        for j in 0..len {
            let e = (xs[at(j)] - max).exp();
            os[at(j)] = e;
            sum += e;
        }
        if log {
            let log_sum = sum.ln() + max;
            for j in 0..len {
                os[at(j)] = xs[at(j)] - log_sum;
            }
        } else {
            let inv = 1.0 / sum;
            for j in 0..len {
                os[at(j)] *= inv;
            }
        }
    });
    out
}

/// The gradient of softmax (or log-softmax) given its output `y` and the upstream gradient `g`:
/// `y * (g - Σ g·y)` for softmax, `g - exp(y) · Σ g` for log-softmax.
pub fn softmax_backward(y: &CpuArray, g: &CpuArray, axis: usize, log: bool) -> CpuArray {
    let shape = y.shape().to_vec();
    let len = shape[axis];
    let mut out = zeros(&shape);
    let (ys, gs) = (slice(y), slice(g));
    let os = slice_mut(&mut out);
    for_each_lane(&shape, axis, |start, stride| {
        let at = |j: usize| start + j * stride;
        if log {
            let total: f32 = (0..len).map(|j| gs[at(j)]).sum();
            for j in 0..len {
                os[at(j)] = gs[at(j)] - ys[at(j)].exp() * total;
            }
        } else {
            let dot: f32 = (0..len).map(|j| gs[at(j)] * ys[at(j)]).sum();
            for j in 0..len {
                os[at(j)] = ys[at(j)] * (gs[at(j)] - dot);
            }
        }
    });
    out
}

impl SoftmaxOps for CpuArray {
    fn softmax(&self, axis: usize, log: bool) -> Result<Self> {
        Ok(softmax(self, axis, log))
    }

    /// One pass per lane.
    fn softmax_backward(y: &Self, grad: &Self, axis: usize, log: bool) -> Result<Self> {
        Ok(softmax_backward(y, grad, axis, log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::from_vec;

    #[test]
    fn rows_sum_to_one_even_for_huge_logits() {
        let x = from_vec(&[2, 3], vec![1000., 1001., 1002., -5., 0., 5.]);
        let y = softmax(&x, 1, false);
        for row in slice(&y).chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert!(row.iter().all(|v| v.is_finite()));
        }
        let l = softmax(&x, 1, true);
        assert!(slice(&l).iter().all(|v| v.is_finite()));
    }

    #[test]
    fn softmax_along_the_first_axis() {
        let x = from_vec(&[2, 2], vec![0., 1., 0., 1.]);
        let y = softmax(&x, 0, false);
        assert_eq!(slice(&y), &[0.5, 0.5, 0.5, 0.5]);
    }
}
