//! Recurrent layers over `[batch, steps, features]` sequences of different lengths: [`Lstm`],
//! [`Gru`], and [`Bidirectional`] for either.
//!
//! Every layer projects the input of every step of every sequence in one GEMM (`[n·T, in] ×
//! [in, gates·H]`, with the bias), then [`scan`]s the steps: each adds the recurrent product
//! (`[n, H] × [H, gates·H]`) and applies the gates. A step at or past a sequence's length
//! neither changes that sequence's state nor produces output (zeros there), so a padded batch
//! gives each sequence what it would get alone, and padding gets no gradient. The gates are
//! built from the engine's ops, so every device runs them.

mod gru;
mod lstm;

pub use gru::Gru;
pub use lstm::Lstm;

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module};
use crate::tensor::Tensor;

/// A layer that reads a sequence batch step by step.
pub trait Recurrent: Send + Sync {
    /// The outputs `[n, T, hidden]` of `x` (`[n, T, in]`). `lengths` (one per sequence, each
    /// at most `T`) mark the real steps, `None` meaning all; `reverse` runs each sequence from
    /// its last real step to its first.
    fn run(&self, x: &Tensor, lengths: Option<&[usize]>, reverse: bool) -> Result<Tensor>;
}

/// Two layers, one reading each sequence forwards and one backwards, their outputs side by
/// side: `[n, T, 2·hidden]` (the forward direction's units first).
pub struct Bidirectional<R> {
    /// The forward direction.
    pub forward: R,
    /// The backward direction.
    pub backward: R,
}

/// A bidirectional LSTM.
pub type BiLstm = Bidirectional<Lstm>;
/// A bidirectional GRU.
pub type BiGru = Bidirectional<Gru>;

impl<R: Recurrent> Bidirectional<R> {
    /// Both directions' outputs `[n, T, 2·hidden]`; see [`Recurrent::run`] for `lengths`.
    pub fn run(&self, x: &Tensor, lengths: Option<&[usize]>) -> Result<Tensor> {
        let ahead = self.forward.run(x, lengths, false)?;
        let behind = self.backward.run(x, lengths, true)?;
        Tensor::concat(&[&ahead, &behind], 2)
    }
}

impl<R: Recurrent> Module for Bidirectional<R> {
    /// Over the real steps [`Forward::lengths`] gives.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, ctx.lengths)
    }
}

/// The hidden size of a layer's weights `[in, gates·H]`, `[H, gates·H]` and biases `[gates·H]`,
/// or an error (naming `op`) with the shapes that do not fit together.
fn hidden_of(
    op: &'static str,
    gates: usize,
    (w_input, w_hidden): (&Tensor, &Tensor),
    biases: &[&Tensor],
) -> Result<usize> {
    let hidden = w_hidden.shape().first().copied().unwrap_or(0);
    let width = gates * hidden;
    let fits = w_input.rank() == 2
        && w_input.shape()[1] == width
        && w_hidden.shape() == [hidden, width]
        && biases.iter().all(|b| b.shape() == [width]);
    if hidden == 0 || !fits {
        let biases: Vec<&[usize]> = biases.iter().map(|b| b.shape()).collect();
        return Err(MlError::invalid(
            op,
            format!(
                "weights {:?} and {:?} with biases {biases:?} are not [in, {gates}H], [H, {gates}H] and \
                 [{gates}H]",
                w_input.shape(),
                w_hidden.shape(),
            ),
        ));
    }
    Ok(hidden)
}

/// `[n, T, features]` of a sequence batch, after checking `lengths` against it (`op` names the
/// layer in errors). Shared by every layer that reads sequence batches.
pub(crate) fn sequence_shape(
    op: &'static str,
    x: &Tensor,
    lengths: Option<&[usize]>,
) -> Result<[usize; 3]> {
    let &[n, steps, features] = x.shape() else {
        return Err(MlError::invalid(
            op,
            format!("the input {:?} is not [batch, steps, features]", x.shape()),
        ));
    };
    if let Some(lengths) = lengths {
        if lengths.len() != n {
            return Err(MlError::invalid(
                op,
                format!("{} lengths for a batch of {n} sequences", lengths.len()),
            ));
        }
        if let Some((row, &len)) = lengths.iter().enumerate().find(|(_, l)| **l > steps) {
            return Err(MlError::invalid(
                op,
                format!("sequence {row} is {len} steps long, but the batch has {steps} steps"),
            ));
        }
    }
    Ok([n, steps, features])
}

/// `[n, 1]`: 1 for the sequences still running at `step`, 0 for those already over; `None`
/// when all are running (nothing to mask).
fn step_mask(lengths: Option<&[usize]>, step: usize, like: &Tensor) -> Result<Option<Tensor>> {
    let Some(lengths) = lengths else {
        return Ok(None);
    };
    if lengths.iter().all(|&l| l > step) {
        return Ok(None);
    }
    let real: Vec<f32> = lengths
        .iter()
        .map(|&l| if l > step { 1.0 } else { 0.0 })
        .collect();
    Tensor::from_vec(real, &[lengths.len(), 1], like.device()).map(Some)
}

/// Projects every step of `x` (`[n, T, in]`, checked against `lengths`; `op` names the layer in
/// errors) with `w_input` and `bias` in one GEMM, then [`scan`]s the steps with `cell`.
fn project_and_scan(
    op: &'static str,
    (x, lengths, reverse): (&Tensor, Option<&[usize]>, bool),
    (w_input, bias): (&Tensor, &Tensor),
    (hidden, states): (usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let [n, steps, inputs] = sequence_shape(op, x, lengths)?;
    let width = bias.numel();
    let projected = x
        .reshape(&[n * steps, inputs])?
        .linear(w_input, bias)?
        .reshape(&[n, steps, width])?;
    scan(&projected, (lengths, reverse), (hidden, states), cell)
}

/// Runs `cell` over the steps of `projected` (`[n, T, G]`, each step's projected input) in
/// order (or reversed), from zero states of `[n, hidden]` (`states` of them; the first is the
/// output). `cell(input, states)` gives the next states. Where a sequence is over, its states
/// stay and its output is zero. The outputs `[n, T, hidden]`.
fn scan(
    projected: &Tensor,
    (lengths, reverse): (Option<&[usize]>, bool),
    (hidden, states): (usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let &[n, steps, width] = projected.shape() else {
        return Err(MlError::invalid(
            "recurrent",
            format!("projected inputs {:?} are not [n, T, G]", projected.shape()),
        ));
    };
    let zero = Tensor::zeros(&[n, hidden], projected.device())?;
    let mut state = vec![zero; states];
    let mut outputs: Vec<Option<Tensor>> = vec![None; steps];
    let order: Vec<usize> = if reverse {
        (0..steps).rev().collect()
    } else {
        (0..steps).collect()
    };
    for step in order {
        let input = projected.narrow(1, step, 1)?.reshape(&[n, width])?;
        let next = cell(&input, &state)?;
        let out = match step_mask(lengths, step, projected)? {
            None => {
                state = next;
                state[0].clone()
            }
            Some(real) => {
                let out = next[0].mul(&real)?;
                for (s, new) in state.iter_mut().zip(&next) {
                    *s = s.add(&new.sub(s)?.mul(&real)?)?;
                }
                out
            }
        };
        outputs[step] = Some(out.reshape(&[n, 1, hidden])?);
    }
    let outputs: Vec<Tensor> = outputs.into_iter().flatten().collect();
    Tensor::concat(&outputs.iter().collect::<Vec<_>>(), 1)
}
