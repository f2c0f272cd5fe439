//! Attention over `[batch, steps, features]` sequences of different lengths:
//! [`MultiHeadAttention`] (scaled dot-product self-attention, several heads), the
//! [`TransformerEncoder`] block built on it, and [`PositionEmbedding`] (where each step is, for
//! layers that do not see order on their own).
//!
//! Padding follows the recurrent layers: a step at or past its sequence's length (see
//! [`Forward::lengths`](crate::nn::Forward)) is no key for any query (its score is pushed to a
//! large negative value before the softmax, so it gets zero weight and zero gradient) and its
//! own output is zero. A padded batch therefore gives each sequence what it would get alone,
//! and what the padding holds changes nothing. Every step is built from the engine's ops
//! (batched products, softmax over the last axis, broadcast adds), so every device runs it.

mod encoder;
mod multi_head;
mod position;

pub use encoder::TransformerEncoder;
pub use multi_head::MultiHeadAttention;
pub use position::{PositionEmbedding, PositionKind, sinusoidal_table};

use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;

/// The score added to a padded key: large enough that its softmax weight is exactly zero
/// (`exp` underflows), finite so that a sequence without real steps gives no NaN.
const MASKED_SCORE: f32 = -1e9;

/// True when some sequence of `steps` is shorter than `steps` (there is padding to mask).
fn has_padding(lengths: Option<&[usize]>, steps: usize) -> bool {
    lengths.is_some_and(|lengths| lengths.iter().any(|&l| l < steps))
}

/// `[n, 1, 1, T]`: 0 for each sequence's real steps, [`MASKED_SCORE`] for its padding, to add
/// to scores `[n, heads, T (queries), T (keys)]`; `None` when nothing is padded.
fn key_bias(lengths: Option<&[usize]>, steps: usize, device: Device) -> Result<Option<Tensor>> {
    let Some(lengths) = lengths.filter(|_| has_padding(lengths, steps)) else {
        return Ok(None);
    };
    let bias: Vec<f32> = lengths
        .iter()
        .flat_map(|&len| (0..steps).map(move |t| if t < len { 0.0 } else { MASKED_SCORE }))
        .collect();
    Tensor::from_vec(bias, &[lengths.len(), 1, 1, steps], device).map(Some)
}

/// `[n, T, 1]`: 1 for each sequence's real steps, 0 for its padding, to zero the outputs of
/// padded steps; `None` when nothing is padded.
fn step_mask(lengths: Option<&[usize]>, steps: usize, device: Device) -> Result<Option<Tensor>> {
    let Some(lengths) = lengths.filter(|_| has_padding(lengths, steps)) else {
        return Ok(None);
    };
    let mask: Vec<f32> = lengths
        .iter()
        .flat_map(|&len| (0..steps).map(move |t| f32::from(u8::from(t < len))))
        .collect();
    Tensor::from_vec(mask, &[lengths.len(), steps, 1], device).map(Some)
}

/// `x` with the outputs of padded steps set to zero (no gradient flows into them).
fn zero_padding(x: Tensor, lengths: Option<&[usize]>) -> Result<Tensor> {
    match step_mask(lengths, x.shape()[1], x.device())? {
        Some(mask) => x.mul(&mask),
        None => Ok(x),
    }
}
