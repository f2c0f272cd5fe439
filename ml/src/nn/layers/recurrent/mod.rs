//! Recurrent layers over `[batch, steps, features]` sequences of different lengths: [`Lstm`],
//! [`Gru`], and [`Bidirectional`] for either.
//!
//! Every layer projects the input of every step of every sequence in one GEMM (`[n·T, in] ×
//! [in, gates·H]`, with the bias), then [`scan`]s the steps: each is one GEMM (the recurrent
//! product `[n, H] × [H, gates·H]`, added to the step's projection) and one fused gate op
//! ([`Tensor::lstm_cell`], [`Tensor::gru_cell`]). Each sequence runs its real steps first (a
//! reversed one from its last real step), so its padding comes after them and never reaches
//! them; the outputs at padded steps are zeros, so a padded batch gives each sequence what it
//! would get alone, and padding gets no gradient.

mod gru;
mod lstm;

pub use gru::Gru;
pub use lstm::Lstm;

use crate::device::Device;
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

/// Where each step of each sequence is read and written when a batch runs time-major: step
/// `p` of the run reads, for sequence `r`, its step `p` (or, reversed, `len − 1 − p`) while `p`
/// is below its length, and its own padding after that (run after every real step, so it never
/// reaches a real one).
struct StepOrder {
    n: usize,
    steps: usize,
    lengths: Vec<usize>,
    reverse: bool,
}

impl StepOrder {
    fn new(n: usize, steps: usize, lengths: Option<&[usize]>, reverse: bool) -> StepOrder {
        let lengths = lengths.map_or_else(|| vec![steps; n], <[usize]>::to_vec);
        StepOrder {
            n,
            steps,
            lengths,
            reverse,
        }
    }

    /// The step of sequence `r` that run step `p` reads (an involution on the real steps).
    fn source(&self, r: usize, p: usize) -> usize {
        let len = self.lengths[r];
        if self.reverse && p < len {
            len - 1 - p
        } else {
            p
        }
    }

    /// `[T·n]`: the row of the batch `[n·T, features]` that row `p·n + r` of the time-major
    /// batch holds.
    fn gather(&self, device: Device) -> Result<Tensor> {
        let (n, steps) = (self.n, self.steps);
        let rows = (0..steps)
            .flat_map(|p| (0..n).map(move |r| (r * steps + self.source(r, p)) as f32))
            .collect();
        Tensor::from_indices(rows, &[steps * n], n * steps, device)
    }

    /// `[n, T]`: for each step of each sequence, the row of the time-major outputs
    /// `[T·n + 1, H]` that holds it; the last row (zeros) for padding.
    fn scatter(&self, device: Device) -> Result<Tensor> {
        let (n, steps) = (self.n, self.steps);
        let rows = (0..n)
            .flat_map(|r| {
                (0..steps).map(move |t| {
                    let row = if t < self.lengths[r] {
                        self.source(r, t) * n + r
                    } else {
                        steps * n
                    };
                    row as f32
                })
            })
            .collect();
        Tensor::from_indices(rows, &[n, steps], steps * n + 1, device)
    }
}

/// Projects every step of `x` (`[n, T, in]`, checked against `lengths`; `op` names the layer in
/// errors) with `w_input` and `bias` in one GEMM, then [`scan`]s the steps with `cell`. The
/// batch is reordered time-major first (one row gather, which also reverses each sequence
/// within its length when `reverse`), so that a step's rows are one contiguous block, and back
/// at the end (one gather that also writes the zeros of padded steps).
fn project_and_scan(
    op: &'static str,
    (x, lengths, reverse): (&Tensor, Option<&[usize]>, bool),
    (w_input, bias): (&Tensor, &Tensor),
    (hidden, states): (usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let [n, steps, inputs] = sequence_shape(op, x, lengths)?;
    if n == 0 || steps == 0 {
        return Tensor::zeros(&[n, steps, hidden], x.device());
    }
    let order = StepOrder::new(n, steps, lengths, reverse);
    let projected = x
        .reshape(&[n * steps, inputs])?
        .index_select(&order.gather(x.device())?)?
        .linear(w_input, bias)?;
    let outputs = scan(&projected.chunk(steps)?, (n, hidden, states), cell)?;
    outputs.index_select(&order.scatter(x.device())?)
}

/// Runs `cell` over the steps' projected inputs (`[n, G]` each) in order, from zero states of
/// `[n, hidden]` (`states` of them; the first is the output): `cell(input, states)` gives the
/// next states. The outputs of every step one under the other, and a row of zeros under them:
/// `[T·n + 1, hidden]`.
fn scan(
    inputs: &[Tensor],
    (n, hidden, states): (usize, usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let device = inputs.first().map_or(Device::Cpu, Tensor::device);
    let zero = Tensor::zeros(&[n, hidden], device)?;
    let mut state = vec![zero; states];
    let mut outputs = Vec::with_capacity(inputs.len() + 1);
    for input in inputs {
        state = cell(input, &state)?;
        outputs.push(state[0].clone());
    }
    outputs.push(Tensor::zeros(&[1, hidden], device)?);
    Tensor::concat(&outputs.iter().collect::<Vec<_>>(), 0)
}
