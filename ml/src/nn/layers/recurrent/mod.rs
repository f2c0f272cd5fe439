//! Recurrent layers over `[batch, steps, features]` sequences of different lengths: [`Lstm`],
//! [`Gru`], and [`Bidirectional`] for either.
//!
//! Every layer projects the input of every step of every sequence in one GEMM (`[n·T, in] ×
//! [in, gates·H]`, with the bias), then [`scan`]s the steps: each is one GEMM (the recurrent
//! product `[n, H] × [H, gates·H]`, added to the step's projection) and one fused gate op
//! ([`Tensor::lstm_cell`], [`Tensor::gru_cell`]). Only real steps are computed: the batch runs
//! packed (as PyTorch's packed sequences), each step holding the sequences that still have a
//! real step, longest first (a reversed sequence from its last real step). The outputs at
//! padded steps are zeros, so a padded batch gives each sequence what it would get alone, and
//! padding gets no gradient.

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

/// How a batch runs packed: run step `p` holds the sequences still running at their `p`-th real
/// step (a reversed one counting from its last), longest first, so that a step's rows are one
/// contiguous block and a prefix of the previous step's. Only real steps are computed: padding
/// is never read, and its outputs are zeros.
struct Packing {
    /// The sequences by length, longest first (ties in batch order).
    sorted: Vec<usize>,
    /// Each sequence's place in `sorted`.
    place: Vec<usize>,
    /// Each sequence's number of real steps.
    lengths: Vec<usize>,
    /// The rows of each run step (from `n` down), one per step of the longest sequence.
    sizes: Vec<usize>,
    /// The first row of each run step.
    offsets: Vec<usize>,
    steps: usize,
    reverse: bool,
}

impl Packing {
    fn new(n: usize, steps: usize, lengths: Option<&[usize]>, reverse: bool) -> Packing {
        let lengths = lengths.map_or_else(|| vec![steps; n], <[usize]>::to_vec);
        let mut sorted: Vec<usize> = (0..n).collect();
        sorted.sort_by_key(|&r| std::cmp::Reverse(lengths[r]));
        let mut place = vec![0; n];
        for (k, &r) in sorted.iter().enumerate() {
            place[r] = k;
        }
        let longest = sorted.first().map_or(0, |&r| lengths[r]);
        let sizes: Vec<usize> = (0..longest)
            .map(|p| lengths.iter().filter(|&&l| l > p).count())
            .collect();
        let offsets = sizes
            .iter()
            .scan(0, |at, &size| Some(std::mem::replace(at, *at + size)))
            .collect();
        Packing {
            sorted,
            place,
            lengths,
            sizes,
            offsets,
            steps,
            reverse,
        }
    }

    /// The real steps of the batch: the packed rows.
    fn rows(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// The step of sequence `r` that run step `p` reads, or the run step that computes its step
    /// `p` (the same map both ways: the identity, or `p ↦ len − 1 − p` reversed).
    fn step(&self, r: usize, p: usize) -> usize {
        if self.reverse {
            self.lengths[r] - 1 - p
        } else {
            p
        }
    }

    /// `[rows]`: for each packed row, the row of the batch `[n·T, features]` it holds.
    fn gather(&self, device: Device) -> Result<Tensor> {
        let steps = self.steps;
        let rows: Vec<f32> = self
            .sizes
            .iter()
            .enumerate()
            .flat_map(|(p, &size)| {
                self.sorted[..size]
                    .iter()
                    .map(move |&r| (r * steps + self.step(r, p)) as f32)
            })
            .collect();
        let len = rows.len();
        Tensor::from_indices(rows, &[len], self.place.len() * steps, device)
    }

    /// `[n, T]`: for each step of each sequence, its packed row of the outputs, or the row of
    /// zeros after them (`rows`) for padding.
    fn scatter(&self, device: Device) -> Result<Tensor> {
        let (n, steps, zero) = (self.place.len(), self.steps, self.rows());
        let rows = (0..n)
            .flat_map(|r| {
                (0..steps).map(move |t| {
                    let row = if t < self.lengths[r] {
                        self.offsets[self.step(r, t)] + self.place[r]
                    } else {
                        zero
                    };
                    row as f32
                })
            })
            .collect();
        Tensor::from_indices(rows, &[n, steps], zero + 1, device)
    }
}

/// Projects the real steps of `x` (`[n, T, in]`, checked against `lengths`; `op` names the layer
/// in errors) with `w_input` and `bias` in one GEMM, packed (see [`Packing`]: one row gather,
/// which also reverses each sequence within its length when `reverse`), then [`scan`]s the steps
/// with `cell` and puts the outputs back in place (one gather, which also writes the zeros of
/// padded steps).
fn project_and_scan(
    op: &'static str,
    (x, lengths, reverse): (&Tensor, Option<&[usize]>, bool),
    (w_input, bias): (&Tensor, &Tensor),
    (hidden, states): (usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let [n, steps, inputs] = sequence_shape(op, x, lengths)?;
    let packing = Packing::new(n, steps, lengths, reverse);
    if packing.rows() == 0 {
        return Tensor::zeros(&[n, steps, hidden], x.device());
    }
    let projected = x
        .reshape(&[n * steps, inputs])?
        .index_select(&packing.gather(x.device())?)?
        .linear(w_input, bias)?;
    let outputs = scan(&projected.split(&packing.sizes)?, (hidden, states), cell)?;
    outputs.index_select(&packing.scatter(x.device())?)
}

/// Runs `cell` over the steps' projected inputs (`[rows, G]` each, every step's rows a prefix
/// of the previous step's) in order, from zero states of `[rows, hidden]` (`states` of them;
/// the first is the output): `cell(input, states)` gives the next states. The outputs of every
/// step one under the other, and a row of zeros under them: `[Σ rows + 1, hidden]`.
fn scan(
    inputs: &[Tensor],
    (hidden, states): (usize, usize),
    cell: impl Fn(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Tensor> {
    let Some(first) = inputs.first() else {
        return Err(MlError::invalid(
            "recurrent",
            "a scan needs at least one step",
        ));
    };
    let device = first.device();
    let zero = Tensor::zeros(&[first.shape()[0], hidden], device)?;
    let mut state = vec![zero; states];
    let mut outputs = Vec::with_capacity(inputs.len() + 1);
    for input in inputs {
        let rows = input.shape()[0];
        if rows < state[0].shape()[0] {
            state = state
                .iter()
                .map(|s| s.narrow(0, 0, rows))
                .collect::<Result<_>>()?;
        }
        state = cell(input, &state)?;
        outputs.push(state[0].clone());
    }
    outputs.push(Tensor::zeros(&[1, hidden], device)?);
    Tensor::concat(&outputs.iter().collect::<Vec<_>>(), 0)
}
