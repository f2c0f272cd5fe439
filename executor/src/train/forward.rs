//! One batch through a model, whatever its examples: fixed-shape rows (`[n, input...]`) or
//! token sequences padded to the batch's longest (`[n, T]` with their lengths). The result
//! has one row of outputs per labeled unit: per example, or per real token of a tagger (the
//! padding's outputs are left out, so the loss and the metrics see real tokens only).

use ringflow_ml::nn::{Model, SequenceOutput};
use ringflow_ml::rng::Rng;
use ringflow_ml::{Device, Tensor};

use crate::data::rows::Batch;
use crate::error::Result;

/// The outputs of `batch` (whose features and positions it takes), `[units, outputs]`.
pub fn forward_batch(
    model: &Model,
    batch: &mut Batch,
    train: bool,
    rng: &mut Rng,
    device: Device,
) -> Result<Tensor> {
    let shape = model.shape();
    let features = std::mem::take(&mut batch.features);
    if !batch.is_sequences() {
        let x = Tensor::from_vec(features, &shape.batch(batch.rows), device)?;
        return Ok(model.forward(&x, train, rng)?);
    }
    let (rows, steps) = (batch.rows, batch.steps);
    let x = Tensor::from_vec(features, &[rows, steps], device)?;
    let out = model.forward_sequences(&x, &batch.lengths, train, rng)?;
    if shape.sequence != Some(SequenceOutput::PerStep) {
        return Ok(out);
    }
    let positions = std::mem::take(&mut batch.positions);
    let real = Tensor::from_vec(positions, &[batch.tokens()], device)?;
    Ok(out
        .reshape(&[rows * steps, shape.outputs])?
        .index_select(&real)?)
}
