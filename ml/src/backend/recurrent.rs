//! [`RecurrentOps`]: the gates of one step of a recurrent layer, LSTM and GRU (PyTorch's gate
//! order and formulas), forward and backward; and the [`Storage`] methods that dispatch to them.
//!
//! The matrix products of a step (the input's projection, the recurrent product) are GEMMs of
//! the caller; these methods take their results and do everything elementwise that follows, so a
//! step is one GEMM and one pass over the gates. Every method has a default built from
//! elementwise ops, slices and concatenations ([`lstm_cell_from_primitives`], ...); the CPU
//! (`cpu/recurrent.rs`) and CUDA (`cuda/recurrent.rs`) override them with one fused pass each.
//!
//! The forward pass also returns what its backward pass needs, so that the backward pass
//! evaluates no transcendental function again. Its layout is part of the contract (the defaults
//! and the fused kernels read each other's), `n` rows of blocks of `H` values:
//!
//! - LSTM: `[i, f, g, o, c_prev, tanh(c)]` (`[n, 6H]`), the activated gates, the previous cell
//!   state and the new one's hyperbolic tangent;
//! - GRU: `[r, z, c, u, h_prev]` (`[n, 5H]`), the activated reset and update gates, the
//!   candidate, the candidate's recurrent part `u = h_prev·W_hc + b_hc` (the one the reset gate
//!   multiplies) and the previous state.

use super::elementwise::{BinaryOp, UnaryOp};
use super::index::IndexOps;
use super::reduce::ReduceOps;
use super::storage::{Storage, dispatch};
use crate::error::{MlError, Result};

/// Blocks of `H` values per row of what the LSTM forward pass saves for its backward pass.
pub const LSTM_SAVED_BLOCKS: usize = 6;
/// Blocks of `H` values per row of what the GRU forward pass saves for its backward pass.
pub const GRU_SAVED_BLOCKS: usize = 5;

/// The gates of one recurrent step. Shapes are checked by every implementation (through
/// [`lstm_shapes`] and [`gru_shapes`]), so a wrong one is an error, never a panic.
pub trait RecurrentOps: IndexOps + ReduceOps {
    /// One LSTM step from the pre-activation gates `[n, 4H]` (input, forget, cell, output:
    /// the step's projected input plus `h_prev·W_h`) and the previous cell state `c_prev`
    /// `[n, H]`: `(h, c, saved)` with `c = σ(f)·c_prev + σ(i)·tanh(g)` and `h = σ(o)·tanh(c)`,
    /// and `saved` `[n, 6H]` as the [module documentation](self) lays out. Default:
    /// [`lstm_cell_from_primitives`].
    fn lstm_cell(gates: &Self, c_prev: &Self) -> Result<(Self, Self, Self)> {
        lstm_cell_from_primitives(gates, c_prev)
    }

    /// The gradients `(dgates [n, 4H], dc_prev [n, H])` of [`RecurrentOps::lstm_cell`] from
    /// what it saved and the gradients `dh`, `dc` (`[n, H]`) of its outputs. Default:
    /// [`lstm_cell_backward_from_primitives`].
    fn lstm_cell_backward(saved: &Self, dh: &Self, dc: &Self) -> Result<(Self, Self)> {
        lstm_cell_backward_from_primitives(saved, dh, dc)
    }

    /// One GRU step from the step's projected input `x_gates = x·W_x + b_x` and the recurrent
    /// product `h_gates = h_prev·W_h + b_h` (both `[n, 3H]`: reset, update, candidate) and the
    /// previous state `h_prev` `[n, H]`: `(h, saved)` with `r = σ(x_r + h_r)`,
    /// `z = σ(x_z + h_z)`, `c = tanh(x_c + r·h_c)`, `h = c + z·(h_prev − c)`, and `saved`
    /// `[n, 5H]` as the [module documentation](self) lays out. Default:
    /// [`gru_cell_from_primitives`].
    fn gru_cell(x_gates: &Self, h_gates: &Self, h_prev: &Self) -> Result<(Self, Self)> {
        gru_cell_from_primitives(x_gates, h_gates, h_prev)
    }

    /// The gradients `(dx_gates [n, 3H], dh_gates [n, 3H], dh_prev [n, H])` of
    /// [`RecurrentOps::gru_cell`] from what it saved and the gradient `dh` of its output
    /// (`dh_prev` is the direct part, `dh·z`; the part through `h_gates` is the caller's GEMM).
    /// Default: [`gru_cell_backward_from_primitives`].
    fn gru_cell_backward(saved: &Self, dh: &Self) -> Result<(Self, Self, Self)> {
        gru_cell_backward_from_primitives(saved, dh)
    }
}

/// An error of `op` naming the shapes it was given.
fn shapes_error(op: &'static str, what: &str, shapes: &[&[usize]]) -> MlError {
    MlError::invalid(op, format!("{what}: got {shapes:?}"))
}

/// The hidden size `H` of an LSTM step's operands, or an error naming them: `gates` `[n, 4H]`
/// and `c_prev` `[n, H]` for the forward pass (`backward` false), `saved` `[n, 6H]` and the
/// gradients `[n, H]` for the backward pass.
pub fn lstm_shapes(backward: bool, wide: &[usize], narrow: &[&[usize]]) -> Result<usize> {
    let (op, blocks, what) = if backward {
        let what = "needs saved values [n, 6H] and gradients [n, H]";
        ("lstm_cell backward", LSTM_SAVED_BLOCKS, what)
    } else {
        (
            "lstm_cell",
            4,
            "needs gates [n, 4H] and a cell state [n, H]",
        )
    };
    block_shapes(op, what, (wide, blocks), narrow)
}

/// The hidden size `H` of a GRU step's operands, or an error naming them: `x_gates` and
/// `h_gates` `[n, 3H]` and `h_prev` `[n, H]` for the forward pass (`backward` false), `saved`
/// `[n, 5H]` and `dh` `[n, H]` for the backward pass.
pub fn gru_shapes(backward: bool, wide: &[&[usize]], narrow: &[usize]) -> Result<usize> {
    let (op, blocks, what) = if backward {
        (
            "gru_cell backward",
            GRU_SAVED_BLOCKS,
            "needs saved values [n, 5H] and a gradient [n, H]",
        )
    } else {
        (
            "gru_cell",
            3,
            "needs gates [n, 3H] from the input and the state, and a state [n, H]",
        )
    };
    let first = wide.first().copied().unwrap_or(&[]);
    let hidden = block_shapes(op, what, (first, blocks), &[narrow])?;
    if wide.iter().any(|w| *w != first) {
        let mut shapes = wide.to_vec();
        shapes.push(narrow);
        return Err(shapes_error(op, what, &shapes));
    }
    Ok(hidden)
}

/// `H` where `wide` is `[n, blocks·H]` and every `narrow` is `[n, H]` (`H` may be 0 only with
/// `n` rows of nothing), or an error of `op` saying `what` it needs.
fn block_shapes(
    op: &'static str,
    what: &str,
    (wide, blocks): (&[usize], usize),
    narrow: &[&[usize]],
) -> Result<usize> {
    let fits = |hidden: usize| {
        wide.len() == 2
            && wide[1] == blocks * hidden
            && narrow.iter().all(|s| *s == [wide[0], hidden])
    };
    match narrow.first() {
        Some(s) if s.len() == 2 && fits(s[1]) => Ok(s[1]),
        _ => {
            let mut shapes = vec![wide];
            shapes.extend_from_slice(narrow);
            Err(shapes_error(op, what, &shapes))
        }
    }
}

/// Block `k` (`[n, H]`) of a `[n, blocks·H]` operand.
fn block<S: IndexOps>(x: &S, k: usize, hidden: usize) -> Result<S> {
    x.narrow(1, k * hidden, hidden)
}

/// `σ(x)·(1 − σ(x))` from `s = σ(x)`.
fn sigmoid_slope<S: ReduceOps>(s: &S) -> Result<S> {
    s.binary(BinaryOp::Mul, &s.affine(-1.0, 1.0)?, s.shape())
}

/// `1 − tanh²(x)` from `t = tanh(x)`.
fn tanh_slope<S: ReduceOps>(t: &S) -> Result<S> {
    t.unary(UnaryOp::Square)?.affine(-1.0, 1.0)
}

/// `a · b` elementwise (same shapes).
fn mul<S: ReduceOps>(a: &S, b: &S) -> Result<S> {
    a.binary(BinaryOp::Mul, b, a.shape())
}

/// `a + b` elementwise (same shapes).
fn add<S: ReduceOps>(a: &S, b: &S) -> Result<S> {
    a.binary(BinaryOp::Add, b, a.shape())
}

/// [`RecurrentOps::lstm_cell`] as slices, activations, products and a concatenation.
pub fn lstm_cell_from_primitives<S: RecurrentOps>(gates: &S, c_prev: &S) -> Result<(S, S, S)> {
    let hidden = lstm_shapes(false, gates.shape(), &[c_prev.shape()])?;
    let gate = |k: usize, op: UnaryOp| block(gates, k, hidden)?.unary(op);
    let (i, f) = (gate(0, UnaryOp::Sigmoid)?, gate(1, UnaryOp::Sigmoid)?);
    let (g, o) = (gate(2, UnaryOp::Tanh)?, gate(3, UnaryOp::Sigmoid)?);
    let c = add(&mul(&f, c_prev)?, &mul(&i, &g)?)?;
    let tanh_c = c.unary(UnaryOp::Tanh)?;
    let h = mul(&o, &tanh_c)?;
    let saved = S::concat(&[&i, &f, &g, &o, c_prev, &tanh_c], 1)?;
    Ok((h, c, saved))
}

/// [`RecurrentOps::lstm_cell_backward`] as slices, products and a concatenation:
/// `dc' = dc + dh·o·(1 − tanh²c)`, then `di = dc'·g·σ'`, `df = dc'·c_prev·σ'`,
/// `dg = dc'·i·(1 − g²)`, `do = dh·tanh(c)·σ'` and `dc_prev = dc'·f`.
pub fn lstm_cell_backward_from_primitives<S: RecurrentOps>(
    saved: &S,
    dh: &S,
    dc: &S,
) -> Result<(S, S)> {
    let hidden = lstm_shapes(true, saved.shape(), &[dh.shape(), dc.shape()])?;
    let part = |k: usize| block(saved, k, hidden);
    let (i, f, g, o) = (part(0)?, part(1)?, part(2)?, part(3)?);
    let (c_prev, tanh_c) = (part(4)?, part(5)?);
    let dc = add(dc, &mul(&mul(dh, &o)?, &tanh_slope(&tanh_c)?)?)?;
    let di = mul(&mul(&dc, &g)?, &sigmoid_slope(&i)?)?;
    let df = mul(&mul(&dc, &c_prev)?, &sigmoid_slope(&f)?)?;
    let dg = mul(&mul(&dc, &i)?, &tanh_slope(&g)?)?;
    let d_o = mul(&mul(dh, &tanh_c)?, &sigmoid_slope(&o)?)?;
    let dgates = S::concat(&[&di, &df, &dg, &d_o], 1)?;
    Ok((dgates, mul(&dc, &f)?))
}

/// [`RecurrentOps::gru_cell`] as slices, activations, products and a concatenation.
pub fn gru_cell_from_primitives<S: RecurrentOps>(
    x_gates: &S,
    h_gates: &S,
    h_prev: &S,
) -> Result<(S, S)> {
    let hidden = gru_shapes(false, &[x_gates.shape(), h_gates.shape()], h_prev.shape())?;
    let (x, h) = (|k| block(x_gates, k, hidden), |k| block(h_gates, k, hidden));
    let r = add(&x(0)?, &h(0)?)?.unary(UnaryOp::Sigmoid)?;
    let z = add(&x(1)?, &h(1)?)?.unary(UnaryOp::Sigmoid)?;
    let u = h(2)?;
    let c = add(&x(2)?, &mul(&r, &u)?)?.unary(UnaryOp::Tanh)?;
    let shape = h_prev.shape();
    let step = h_prev.binary(BinaryOp::Sub, &c, shape)?;
    let out = add(&c, &mul(&z, &step)?)?;
    let saved = S::concat(&[&r, &z, &c, &u, h_prev], 1)?;
    Ok((out, saved))
}

/// [`RecurrentOps::gru_cell_backward`] as slices, products and concatenations:
/// `dc' = dh·(1 − z)·(1 − c²)`, `dr' = dc'·u·σ'(r)` and `dz' = dh·(h_prev − c)·σ'(z)`; then
/// `dx_gates = [dr', dz', dc']`, `dh_gates = [dr', dz', dc'·r]` and `dh_prev = dh·z`.
pub fn gru_cell_backward_from_primitives<S: RecurrentOps>(saved: &S, dh: &S) -> Result<(S, S, S)> {
    let hidden = gru_shapes(true, &[saved.shape()], dh.shape())?;
    let part = |k: usize| block(saved, k, hidden);
    let (r, z, c, u, h_prev) = (part(0)?, part(1)?, part(2)?, part(3)?, part(4)?);
    let shape = dh.shape();
    let dc = mul(&mul(dh, &z.affine(-1.0, 1.0)?)?, &tanh_slope(&c)?)?;
    let dr = mul(&mul(&dc, &u)?, &sigmoid_slope(&r)?)?;
    let step = h_prev.binary(BinaryOp::Sub, &c, shape)?;
    let dz = mul(&mul(dh, &step)?, &sigmoid_slope(&z)?)?;
    let dx_gates = S::concat(&[&dr, &dz, &dc], 1)?;
    let dh_gates = S::concat(&[&dr, &dz, &mul(&dc, &r)?], 1)?;
    Ok((dx_gates, dh_gates, mul(dh, &z)?))
}

impl Storage {
    /// One LSTM step's `(h, c, saved)`; see [`RecurrentOps::lstm_cell`].
    pub fn lstm_cell(gates: &Storage, c_prev: &Storage) -> Result<(Storage, Storage, Storage)> {
        dispatch!("lstm_cell", (g = gates, c = c_prev) => RecurrentOps::lstm_cell(g, c))
    }

    /// `(dgates, dc_prev)`; see [`RecurrentOps::lstm_cell_backward`].
    pub fn lstm_cell_backward(
        saved: &Storage,
        dh: &Storage,
        dc: &Storage,
    ) -> Result<(Storage, Storage)> {
        dispatch!("lstm_cell backward", (s = saved, h = dh, c = dc) =>
            RecurrentOps::lstm_cell_backward(s, h, c))
    }

    /// One GRU step's `(h, saved)`; see [`RecurrentOps::gru_cell`].
    pub fn gru_cell(
        x_gates: &Storage,
        h_gates: &Storage,
        h_prev: &Storage,
    ) -> Result<(Storage, Storage)> {
        dispatch!("gru_cell", (x = x_gates, g = h_gates, h = h_prev) =>
            RecurrentOps::gru_cell(x, g, h))
    }

    /// `(dx_gates, dh_gates, dh_prev)`; see [`RecurrentOps::gru_cell_backward`].
    pub fn gru_cell_backward(saved: &Storage, dh: &Storage) -> Result<(Storage, Storage, Storage)> {
        dispatch!("gru_cell backward", (s = saved, h = dh) =>
            RecurrentOps::gru_cell_backward(s, h))
    }
}
