//! The memory footprint of a planned sequential model ([`ModelFootprint`]): per example, what a
//! training step keeps for the backward pass and what it briefly adds on top, layer by layer.
//!
//! Most layers keep about their output (a few copies: a max pool's argmax, a dropout's mask, a
//! norm's intermediates). Sequence layers keep far more, and it is counted as the engine's ops
//! allocate it (`ml/tests/footprint.rs` holds the footprint within 1.5× of the heap a real
//! step takes, for a grid of kinds, depths and lengths):
//!
//! - a **recurrent** layer, per step, direction and stacked layer, keeps its gathered input,
//!   the projected gates and each step's gate pre-activations, the cell's saved activations
//!   (5 values per gate and unit in all) and its states and outputs (3 per unit); its backward
//!   briefly holds a step's gate and state gradients (gates + 2 per unit and direction); and
//!   each step, whatever the batch, has its own small tensors and backward-graph links (about
//!   2.4 KB an LSTM step, 1.6 KB a GRU step, per direction and stacked layer), which dominate
//!   a long sequence in a small batch;
//! - **self-attention** keeps about 20 values per feature and step (the projections, the heads'
//!   outputs and their gradients) and four `T × T` matrices per head (the scores, the attention
//!   weights and their gradients); inference holds two of them;
//! - a **Transformer encoder** block about 40 per feature and 6 per feed-forward unit and step,
//!   and six `T × T` matrices per head (with the attention dropout's mask and its output).

use crate::nn::ModelFootprint;
use crate::nn::sequential::planned::{PlannedLayer, RecurrentCell, Resolved};

/// The elements of `shape`.
fn numel(shape: &[usize]) -> u64 {
    shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64))
}

/// The values a model's footprint is counted from: what one example's forward pass keeps for
/// backward, summed over the layers, and the most any one layer briefly needs on top (a
/// convolution's unfolded input, `C/g·kh·kw·oh·ow`; a recurrent layer's step gradients), with
/// the widest output, the widest pair of consecutive outputs, and the largest attention scores
/// (which inference needs too).
#[derive(Default)]
struct FootprintCounts {
    kept: u64,
    per_batch: u64,
    scratch: u64,
    backward: u64,
    widest: u64,
    widest_pair: u64,
    scores: u64,
}

/// Values per output value most layers keep: the output, plus a max pool's argmax, a
/// dropout's mask, a batch norm's normalized input, a layer norm's intermediates.
fn copies(layer: &Resolved) -> u64 {
    match layer {
        Resolved::MaxPool2d(_) | Resolved::Dropout(_) | Resolved::BatchNorm { .. } => 2,
        Resolved::LayerNorm { .. } => 4,
        _ => 1,
    }
}

/// What a sequence layer with output `[T, …]` costs (see the module docs); `None` for other
/// layers.
struct SequenceCost {
    /// Values kept per example.
    kept: u64,
    /// Values its backward briefly adds per example.
    backward: u64,
    /// Values of the attention scores per example (which inference holds too).
    scores: u64,
    /// Values per batch, whatever its rows.
    per_batch: u64,
}

/// Values of one recurrent step's own tensors and graph links, whatever the batch, per
/// direction and stacked layer.
fn per_step_bookkeeping(cell: RecurrentCell) -> u64 {
    match cell {
        RecurrentCell::Lstm => 600,
        RecurrentCell::Gru => 400,
    }
}

fn sequence_cost(layer: &Resolved, output: &[usize]) -> Option<SequenceCost> {
    let steps = *output.first()? as u64;
    let per_step = |values: u64| values.saturating_mul(steps);
    // `T × T` matrices, one per head.
    let scores = |heads: usize, copies: u64| {
        (heads as u64)
            .saturating_mul(steps)
            .saturating_mul(steps)
            .saturating_mul(copies)
    };
    match *layer {
        Resolved::Recurrent {
            cell,
            inputs,
            hidden,
            layers,
            bidirectional,
            ..
        } => {
            let gates: u64 = match cell {
                RecurrentCell::Lstm => 4,
                RecurrentCell::Gru => 3,
            };
            let (dirs, hidden) = (1 + u64::from(bidirectional), hidden as u64);
            let (mut kept, mut width) = (0u64, inputs as u64);
            for _ in 0..layers {
                let layer = (5 * gates + 3).saturating_mul(hidden).saturating_add(width);
                kept = kept.saturating_add(dirs.saturating_mul(layer));
                width = dirs * hidden;
            }
            let transient = dirs.saturating_mul(gates + 2).saturating_mul(hidden);
            let cells = dirs.saturating_mul(layers as u64);
            Some(SequenceCost {
                kept: per_step(kept),
                backward: per_step(transient),
                scores: 0,
                per_batch: per_step(cells.saturating_mul(per_step_bookkeeping(cell))),
            })
        }
        Resolved::MultiHeadAttention { dim, heads, .. } => {
            let kept = per_step(20u64.saturating_mul(dim as u64)).saturating_add(scores(heads, 4));
            Some(SequenceCost {
                kept,
                backward: 0,
                scores: scores(heads, 2),
                per_batch: 0,
            })
        }
        Resolved::TransformerEncoder { dim, heads, ff, .. } => {
            let values = (40u64.saturating_mul(dim as u64)).saturating_add(6 * ff as u64);
            let kept = per_step(values).saturating_add(scores(heads, 6));
            Some(SequenceCost {
                kept,
                backward: 0,
                scores: scores(heads, 2),
                per_batch: 0,
            })
        }
        _ => None,
    }
}

/// Adds `layers`, whose input has the shape `input`, to `t` (a residual block's layers too).
fn count_values(layers: &[PlannedLayer], input: &[usize], t: &mut FootprintCounts) {
    let mut before = input;
    let mut previous = numel(input);
    for layer in layers {
        let out = numel(&layer.output);
        match sequence_cost(&layer.layer, &layer.output) {
            Some(cost) => {
                t.kept = t.kept.saturating_add(cost.kept);
                t.backward = t.backward.max(cost.backward);
                t.scores = t.scores.max(cost.scores);
                t.per_batch = t.per_batch.saturating_add(cost.per_batch);
            }
            None => {
                t.kept = t
                    .kept
                    .saturating_add(out.saturating_mul(copies(&layer.layer)))
            }
        }
        if let Resolved::Conv2d(c) = &layer.layer {
            let per_out = (c.in_channels / c.options.groups.max(1)) as u64
                * (c.kernel[0] * c.kernel[1]) as u64;
            let positions = numel(&layer.output[1..]);
            t.scratch = t.scratch.max(per_out.saturating_mul(positions));
        }
        if let Resolved::Residual { body, shortcut } = &layer.layer {
            // The block's layers start from its input, the shape before it.
            count_values(body, before, t);
            if let Some(s) = shortcut {
                count_values(s, before, t);
            }
        }
        t.widest = t.widest.max(out);
        t.widest_pair = t.widest_pair.max(previous.saturating_add(out));
        previous = out;
        before = &layer.output;
    }
}

/// The memory footprint of a model with this input and these layers (see
/// [`ModelFootprint`]).
pub fn footprint(input: &[usize], layers: &[PlannedLayer]) -> ModelFootprint {
    let mut t = FootprintCounts::default();
    count_values(layers, input, &mut t);
    let parameters = layers.iter().fold(0u64, |a, l| a.saturating_add(l.params));
    let first = numel(input);
    let last = layers.last().map_or(first, |l| numel(&l.output));
    ModelFootprint {
        parameters,
        // The input, every kept output, the loss's probabilities, the gradients of about two
        // layer outputs in flight, and the most one layer needs briefly on top.
        activations_per_row: first
            .saturating_add(t.kept)
            .saturating_add(last)
            .saturating_add(t.widest.saturating_mul(2))
            .saturating_add(t.scratch.max(t.backward)),
        inference_per_row: first
            .saturating_add(t.widest_pair)
            .saturating_add(t.scratch.max(t.scores)),
        activations_per_batch: t.per_batch,
    }
}
