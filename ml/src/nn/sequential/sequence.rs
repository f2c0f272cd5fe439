//! Shape inference of the layers that read sequences `[T, features]` (one example's shape; the
//! batch is `[n, T, features]` with `T` the batch's longest sequence): recurrent layers,
//! pooling over the steps, attention, Transformer encoder blocks and position embeddings.

use crate::error::Result;
use crate::nn::PositionKind;
use crate::nn::sequential::planned::{
    At, PlannedLayer, RecurrentCell, Resolved, batch_shape, check_sizes,
};
use crate::nn::sequential::spec::{
    AttentionSpec, PositionSpec, RecurrentSpec, SequencePoolSpec, TransformerSpec,
};

/// The most layers one recurrent entry may stack.
const MAX_STACK: usize = 64;

/// `[T, features]` of the layer's input, or the error saying it needs a sequence.
fn steps_and_features(at: &At<'_>) -> Result<[usize; 2]> {
    match at.input {
        &[t, f] => Ok([t, f]),
        other => Err(at.error(format!(
            "needs a sequence input [n, steps, features] but gets {}; put an embedding (for \
             token ids) or another sequence layer before it",
            batch_shape(other)
        ))),
    }
}

/// `lstm` and `gru`: `[T, in]` → `[T, hidden]` (`[T, 2·hidden]` both ways).
pub(super) fn recurrent(
    at: &At<'_>,
    cell: RecurrentCell,
    r: &RecurrentSpec,
) -> Result<PlannedLayer> {
    let [steps, inputs] = steps_and_features(at)?;
    check_sizes(at, &[("hidden", r.hidden)], 1)?;
    if !(1..=MAX_STACK).contains(&r.layers) {
        return Err(at.error(format!(
            "has layers = {}; it must be between 1 and {MAX_STACK}",
            r.layers
        )));
    }
    if !(0.0..1.0).contains(&r.dropout) {
        return Err(at.error(format!("has dropout = {}, outside [0, 1)", r.dropout)));
    }
    let gates: u64 = match cell {
        RecurrentCell::Lstm => 4,
        RecurrentCell::Gru => 3,
    };
    let directions = if r.bidirectional { 2 } else { 1 };
    let (hidden, out) = (r.hidden as u64, (directions * r.hidden) as u64);
    // Each direction of each layer: input and recurrent weights and the biases (a GRU has two).
    let biases = match cell {
        RecurrentCell::Lstm => 1,
        RecurrentCell::Gru => 2,
    };
    let per_direction = |inputs: u64| {
        (inputs.saturating_add(hidden))
            .saturating_add(biases)
            .saturating_mul(gates.saturating_mul(hidden))
    };
    let first = per_direction(inputs as u64);
    let rest = per_direction(out).saturating_mul(r.layers as u64 - 1);
    let params = first.saturating_add(rest).saturating_mul(directions as u64);
    let layer = Resolved::Recurrent {
        cell,
        inputs,
        hidden: r.hidden,
        layers: r.layers,
        bidirectional: r.bidirectional,
        dropout: r.dropout,
    };
    at.planned(vec![steps, directions * r.hidden], params, layer)
}

/// `sequence_pool`: `[T, features]` → `[features]`.
pub(super) fn pool(at: &At<'_>, p: &SequencePoolSpec) -> Result<PlannedLayer> {
    let [_, features] = steps_and_features(at)?;
    at.planned(vec![features], 0, Resolved::SequencePool(p.reduce))
}

/// Checks `heads` (and `dropout`) for a layer over `dim` features.
fn check_heads(at: &At<'_>, dim: usize, heads: usize, dropout: f32) -> Result<()> {
    check_sizes(at, &[("heads", heads)], 1)?;
    if !dim.is_multiple_of(heads) {
        return Err(at.error(format!(
            "has heads = {heads}, which must divide the {dim} features of its input {}",
            batch_shape(at.input)
        )));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(at.error(format!("has dropout = {dropout}, outside [0, 1)")));
    }
    Ok(())
}

/// The query, key, value and output projections of `dim` features.
fn attention_params(dim: u64) -> u64 {
    dim.saturating_mul(dim)
        .saturating_add(dim)
        .saturating_mul(4)
}

/// `multi_head_attention`: `[T, dim]` → `[T, dim]`.
pub(super) fn attention(at: &At<'_>, a: &AttentionSpec) -> Result<PlannedLayer> {
    let [steps, dim] = steps_and_features(at)?;
    check_heads(at, dim, a.heads, a.dropout)?;
    let layer = Resolved::MultiHeadAttention {
        dim,
        heads: a.heads,
        dropout: a.dropout,
    };
    at.planned(vec![steps, dim], attention_params(dim as u64), layer)
}

/// `transformer_encoder`: `[T, dim]` → `[T, dim]`.
pub(super) fn transformer(at: &At<'_>, t: &TransformerSpec) -> Result<PlannedLayer> {
    let [steps, dim] = steps_and_features(at)?;
    check_heads(at, dim, t.heads, t.dropout)?;
    check_sizes(at, &[("ff", t.ff)], 1)?;
    if !t.activation.is_relu_like() {
        return Err(at.error("has an activation other than \"relu\", \"gelu\" or \"gelu_exact\""));
    }
    let (d, ff) = (dim as u64, t.ff as u64);
    // Attention, the two feed-forward layers with biases, two layer norms.
    let params = attention_params(d)
        .saturating_add(d.saturating_mul(ff).saturating_mul(2))
        .saturating_add(ff + d)
        .saturating_add(4 * d);
    let layer = Resolved::TransformerEncoder {
        dim,
        heads: t.heads,
        ff: t.ff,
        dropout: t.dropout,
        activation: t.activation,
    };
    at.planned(vec![steps, dim], params, layer)
}

/// `position_embedding`: `[T, dim]` → `[T, dim]`, a table of `T` (the longest sequence) rows.
pub(super) fn positions(at: &At<'_>, p: &PositionSpec) -> Result<PlannedLayer> {
    let [steps, dim] = steps_and_features(at)?;
    let params = match p.kind {
        PositionKind::Sinusoidal => 0,
        PositionKind::Learned => (steps as u64).saturating_mul(dim as u64),
    };
    let layer = Resolved::PositionEmbedding {
        kind: p.kind,
        max_length: steps,
        dim,
    };
    at.planned(vec![steps, dim], params, layer)
}
