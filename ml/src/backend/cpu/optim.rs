//! In-place optimizer updates: one pass over each parameter, no allocation.
//!
//! The formulas are PyTorch's (`torch.optim`), so that a user can check a step by hand against
//! the documentation they already know.

use rayon::prelude::*;

use super::{CpuArray, PAR_CHUNK, PAR_MIN, gemm, slice, slice_mut};
use crate::backend::optim::{AdagradStep, AdamStep, OptimOps, SgdStep};
use crate::error::Result;

/// `p -= lr · d` with momentum and weight decay as in `torch.optim.SGD`.
pub fn sgd(p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>, s: SgdStep) {
    match buf {
        Some(b) if p.len() >= PAR_MIN => p
            .par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(b.par_chunks_mut(PAR_CHUNK))
            .for_each(|((p, g), b)| sgd_serial(p, g, Some(b), s)),
        None if p.len() >= PAR_MIN => p
            .par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .for_each(|(p, g)| sgd_serial(p, g, None, s)),
        buf => sgd_serial(p, g, buf, s),
    }
}

fn sgd_serial(p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>, s: SgdStep) {
    match buf {
        None => {
            for (p, &g) in p.iter_mut().zip(g) {
                let d = g + s.weight_decay * *p;
                *p -= s.lr * d;
            }
        }
        Some(buf) => {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                let d = g + s.weight_decay * *p;
                *b = if s.first {
                    d
                } else {
                    s.momentum * *b + (1.0 - s.dampening) * d
                };
                let step = if s.nesterov { d + s.momentum * *b } else { *b };
                *p -= s.lr * step;
            }
        }
    }
}

/// One Adagrad step: `acc += g²; p -= lr · g / (√acc + eps)` (weight decay added to `g`).
pub fn adagrad(p: &mut [f32], g: &[f32], acc: &mut [f32], lr: f32, eps: f32, weight_decay: f32) {
    if p.len() >= PAR_MIN {
        p.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(acc.par_chunks_mut(PAR_CHUNK))
            .for_each(|((p, g), a)| adagrad_serial(p, g, a, lr, eps, weight_decay));
    } else {
        adagrad_serial(p, g, acc, lr, eps, weight_decay);
    }
}

fn adagrad_serial(p: &mut [f32], g: &[f32], acc: &mut [f32], lr: f32, eps: f32, weight_decay: f32) {
    for ((p, &g), a) in p.iter_mut().zip(g).zip(acc.iter_mut()) {
        let d = g + weight_decay * *p;
        *a += d * d;
        *p -= lr * d / (a.sqrt() + eps);
    }
}

/// One Adam (or AdamW) step with bias correction, as in `torch.optim.Adam` / `AdamW`.
pub fn adam(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
    if p.len() >= PAR_MIN {
        p.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(m.par_chunks_mut(PAR_CHUNK))
            .zip(v.par_chunks_mut(PAR_CHUNK))
            .for_each(|(((p, g), m), v)| adam_serial(p, g, m, v, s));
    } else {
        adam_serial(p, g, m, v, s);
    }
}

fn adam_serial(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
    let (step_size, bc2_sqrt) = s.bias_corrections();
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let mut d = g;
        if s.decoupled {
            *p *= 1.0 - s.lr * s.weight_decay;
        } else {
            d += s.weight_decay * *p;
        }
        *m = s.beta1 * *m + (1.0 - s.beta1) * d;
        *v = s.beta2 * *v + (1.0 - s.beta2) * d * d;
        let denom = v.sqrt() / bc2_sqrt + s.eps;
        *p -= step_size * *m / denom;
    }
}

/// Each update in one fused pass over the parameter and its state.
impl OptimOps for CpuArray {
    fn sgd_update(
        p: &mut Self,
        g: &Self,
        momentum: Option<&mut Self>,
        step: SgdStep,
    ) -> Result<()> {
        sgd(slice_mut(p), slice(g), momentum.map(slice_mut), step);
        Ok(())
    }

    fn adagrad_update(p: &mut Self, g: &Self, acc: &mut Self, s: AdagradStep) -> Result<()> {
        let (p, acc) = (slice_mut(p), slice_mut(acc));
        adagrad(p, slice(g), acc, s.lr, s.eps, s.weight_decay);
        Ok(())
    }

    fn adam_update(p: &mut Self, g: &Self, m: &mut Self, v: &mut Self, s: AdamStep) -> Result<()> {
        adam(slice_mut(p), slice(g), slice_mut(m), slice_mut(v), s);
        Ok(())
    }

    /// The product written onto `p` times `-lr` by the GEMM ([`gemm::matmul_scaled_onto`]).
    fn sgd_product_update(
        p: &mut Self,
        (a, transpose_a): (&Self, bool),
        (b, transpose_b): (&Self, bool),
        lr: f32,
    ) -> Result<()> {
        let (a, b) = (gemm::mat_ref(a, transpose_a), gemm::mat_ref(b, transpose_b));
        let precision = crate::numerics::Numerics::current().matmul_precision;
        gemm::matmul_scaled_onto(slice_mut(p), (a, b), -lr, precision);
        Ok(())
    }
}
