//! Elementwise kernels: unary functions, their derivatives, and broadcasting binary operations.

use ndarray::{IxDyn, Zip};
use rayon::prelude::*;

use super::{CpuArray, PAR_MIN, par_filled, par_for, slice, slice_mut, zeros};
use crate::backend::elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
use crate::error::Result;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`, the standard normal density at 0.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// The scalar function behind a [`UnaryOp`].
#[inline(always)]
pub fn apply_unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Gelu => {
            let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            0.5 * x * (1.0 + u.tanh())
        }
        UnaryOp::GeluExact => 0.5 * x * (1.0 + libm::erff(x * FRAC_1_SQRT_2)),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Square => x * x,
    }
}

/// The logistic function, computed without overflow for large |x|.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `f'(x)` given the input `x` and the output `y = f(x)` (whichever is cheaper is used).
#[inline(always)]
fn derivative(op: UnaryOp, x: f32, y: f32) -> f32 {
    match op {
        UnaryOp::Neg => -1.0,
        UnaryOp::Exp => y,
        UnaryOp::Log => 1.0 / x,
        UnaryOp::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        UnaryOp::Tanh => 1.0 - y * y,
        UnaryOp::Sigmoid => y * (1.0 - y),
        UnaryOp::Gelu => {
            let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            let t = u.tanh();
            0.5 * (1.0 + t)
                + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        }
        // Φ(x) + x·φ(x), with Φ and φ the standard normal's distribution and density.
        UnaryOp::GeluExact => {
            0.5 * (1.0 + libm::erff(x * FRAC_1_SQRT_2)) + x * FRAC_1_SQRT_2PI * (-0.5 * x * x).exp()
        }
        UnaryOp::Sqrt => 0.5 / y,
        UnaryOp::Square => 2.0 * x,
    }
}

/// `op` over a slice, with the operation chosen once per slice so each loop is monomorphic.
fn unary_slice(op: UnaryOp, out: &mut [f32], x: &[f32]) {
    macro_rules! each {
        ($op:expr) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = apply_unary($op, v);
            }
        };
    }
    match op {
        UnaryOp::Neg => each!(UnaryOp::Neg),
        UnaryOp::Exp => each!(UnaryOp::Exp),
        UnaryOp::Log => each!(UnaryOp::Log),
        UnaryOp::Relu => each!(UnaryOp::Relu),
        UnaryOp::Tanh => each!(UnaryOp::Tanh),
        UnaryOp::Sigmoid => each!(UnaryOp::Sigmoid),
        UnaryOp::Gelu => each!(UnaryOp::Gelu),
        UnaryOp::GeluExact => each!(UnaryOp::GeluExact),
        UnaryOp::Sqrt => each!(UnaryOp::Sqrt),
        UnaryOp::Square => each!(UnaryOp::Square),
    }
}

/// `op(x)` elementwise.
pub fn unary(op: UnaryOp, x: &CpuArray) -> CpuArray {
    let xs = slice(x);
    par_filled(x.shape(), |o, r| unary_slice(op, o, &xs[r]))
}

/// The gradient with respect to `x` of `op(x)`, given the upstream gradient `grad`.
pub fn unary_backward(op: UnaryOp, x: &CpuArray, y: &CpuArray, grad: &CpuArray) -> CpuArray {
    let (xs, ys, gs) = (slice(x), slice(y), slice(grad));
    par_filled(x.shape(), |o, r| {
        let (x, y, g) = (&xs[r.clone()], &ys[r.clone()], &gs[r]);
        match op {
            // The common activation gets a branch-free loop of its own (zipped slices: no bounds
            // checks, so it vectorizes).
            UnaryOp::Relu => {
                for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
                    *o = if x > 0.0 { g } else { 0.0 };
                }
            }
            _ => {
                for (((o, &x), &y), &g) in o.iter_mut().zip(x).zip(y).zip(g) {
                    *o = g * derivative(op, x, y);
                }
            }
        }
    })
}

#[inline(always)]
fn apply_binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
    }
}

fn binary_slices(op: BinaryOp, out: &mut [f32], a: &[f32], b: &[f32]) {
    // One monomorphic loop per operation, so that each vectorizes.
    macro_rules! each {
        ($f:expr) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = $f(x, y);
            }
        };
    }
    match op {
        BinaryOp::Add => each!(|x: f32, y: f32| x + y),
        BinaryOp::Sub => each!(|x: f32, y: f32| x - y),
        BinaryOp::Mul => each!(|x: f32, y: f32| x * y),
        BinaryOp::Div => each!(|x: f32, y: f32| x / y),
    }
}

/// `a op b` with broadcasting; `out_shape` is the broadcast shape (checked by the caller).
pub fn binary(op: BinaryOp, a: &CpuArray, b: &CpuArray, out_shape: &[usize]) -> CpuArray {
    if a.shape() == out_shape && b.shape() == out_shape {
        let (xs, ys) = (slice(a), slice(b));
        return par_filled(out_shape, |o, r| {
            binary_slices(op, o, &xs[r.clone()], &ys[r])
        });
    }
    let mut out = zeros(out_shape);
    // A row vector against a matrix (a bias): loop over rows of contiguous slices.
    let last = out_shape.last().copied().unwrap_or(1);
    if last > 0 && a.shape() == out_shape && b.len() == last && b.shape().last() == Some(&last) {
        let bs = slice(b);
        let rows_per_chunk = (super::PAR_CHUNK / last).max(1);
        let per_rows = |(orows, arows): (&mut [f32], &[f32])| {
            for (orow, arow) in orows.chunks_exact_mut(last).zip(arows.chunks_exact(last)) {
                binary_slices(op, orow, arow, bs);
            }
        };
        let (o, x) = (slice_mut(&mut out), slice(a));
        if o.len() >= PAR_MIN {
            o.par_chunks_mut(rows_per_chunk * last)
                .zip(x.par_chunks(rows_per_chunk * last))
                .for_each(per_rows);
        } else {
            per_rows((o, x));
        }
        return out;
    }
    let shape = IxDyn(out_shape);
    let av = a
        .broadcast(shape.clone())
        .expect("caller checked broadcasting");
    let bv = b.broadcast(shape).expect("caller checked broadcasting");
    Zip::from(&mut out)
        .and(&av)
        .and(&bv)
        .for_each(|o, &x, &y| *o = apply_binary(op, x, y));
    out
}

/// `x * mul + add` elementwise.
pub fn affine(x: &CpuArray, mul: f32, add: f32) -> CpuArray {
    let xs = slice(x);
    par_filled(x.shape(), |o, r| {
        for (o, &v) in o.iter_mut().zip(&xs[r]) {
            *o = v * mul + add;
        }
    })
}

/// `dst += src` (same shape).
pub fn add_assign(dst: &mut CpuArray, src: &CpuArray) {
    let ss = slice(src);
    par_for(slice_mut(dst), |d, r| {
        for (d, &s) in d.iter_mut().zip(&ss[r]) {
            *d += s;
        }
    });
}

/// Broadcasts `x` to `shape` as a new contiguous array. When `x` only gains leading axes (a
/// bias repeated down the rows), the result is `x`'s elements copied once per row.
pub fn broadcast_to(x: &CpuArray, shape: &[usize]) -> CpuArray {
    let rank = x.ndim();
    let repeats_rows = rank <= shape.len() && shape[shape.len() - rank..] == *x.shape();
    if repeats_rows && !x.is_empty() {
        let xs = slice(x);
        let rows = shape[..shape.len() - rank].iter().product::<usize>();
        let mut data = Vec::with_capacity(rows * xs.len());
        for _ in 0..rows {
            data.extend_from_slice(xs);
        }
        return super::from_vec(shape, data);
    }
    let view = x
        .broadcast(IxDyn(shape))
        .expect("caller checked broadcasting");
    view.as_standard_layout().into_owned()
}

impl ElementwiseOps for CpuArray {
    fn unary(&self, op: UnaryOp) -> Result<Self> {
        Ok(unary(op, self))
    }

    fn unary_backward(op: UnaryOp, x: &Self, y: &Self, grad: &Self) -> Result<Self> {
        Ok(unary_backward(op, x, y, grad))
    }

    fn binary(&self, op: BinaryOp, rhs: &Self, out_shape: &[usize]) -> Result<Self> {
        Ok(binary(op, self, rhs, out_shape))
    }

    fn affine(&self, mul: f32, add: f32) -> Result<Self> {
        Ok(affine(self, mul, add))
    }

    fn add_assign(&mut self, other: &Self) -> Result<()> {
        add_assign(self, other);
        Ok(())
    }

    fn fill(&mut self, value: f32) -> Result<()> {
        slice_mut(self).fill(value);
        Ok(())
    }

    /// In place, one pass.
    fn scale(&mut self, factor: f32) -> Result<()> {
        slice_mut(self).iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        Ok(broadcast_to(self, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::from_vec;

    #[test]
    fn bias_broadcast() {
        let a = from_vec(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let b = from_vec(&[3], vec![10., 20., 30.]);
        let s = binary(BinaryOp::Add, &a, &b, &[2, 3]);
        assert_eq!(slice(&s), &[11., 22., 33., 14., 25., 36.]);
    }

    #[test]
    fn general_broadcast() {
        let a = from_vec(&[2, 1], vec![1., 2.]);
        let b = from_vec(&[1, 3], vec![10., 20., 30.]);
        let s = binary(BinaryOp::Mul, &a, &b, &[2, 3]);
        assert_eq!(slice(&s), &[10., 20., 30., 20., 40., 60.]);
    }

    #[test]
    fn sigmoid_is_stable_at_the_extremes() {
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
    }
}
