//! Evaluation of a rank's share of the test split.

use std::sync::Arc;

use ringflow_core::metrics::entities::{EntityCounts, TagScheme};
use ringflow_core::pb::EpochPlan;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::Model;
use ringflow_ml::{Device, Tensor, no_grad};

use crate::data::batches::EpochStream;
use crate::data::converter::BatchConverter;
use crate::data::partitions::ReadContext;
use crate::error::Result;
use crate::train::context::EvalStats;
use crate::train::forward::forward_batch;

/// Rows per evaluation batch.
const EVAL_BATCH: usize = ringflow_core::data::EVAL_BATCH_ROWS;

/// Loss, accuracy (classification) or squared error (regression) of `model` on `plan`'s rows
/// (on the real tokens, for a tagger), and with `entities` the entity counts of its IOB2 tags.
pub fn evaluate(
    model: &Model,
    loss_kind: LossKind,
    plan: &EpochPlan,
    (converter, read): (Arc<dyn BatchConverter>, ReadContext),
    entities: Option<&TagScheme>,
) -> Result<EvalStats> {
    // Evaluation is deterministic: dropout is off, so its generator is never drawn from.
    let mut rng = ringflow_ml::rng::seeded(0, 0);
    let shape = model.shape();
    let device = model.params().iter().next().map(|p| p.tensor.device());
    let device = device.unwrap_or(ringflow_ml::Device::Cpu);
    let mut stream = EpochStream::start(
        plan,
        converter,
        shape.input_width(),
        (None, false),
        None,
        read,
    );
    let mut stats = EvalStats::default();
    no_grad(|| -> Result<()> {
        while let Some(mut batch) = stream.next_batch(EVAL_BATCH)? {
            let labels = std::mem::take(&mut batch.labels);
            // Examples, or the real tokens of a tagger.
            let rows = labels.len();
            let tagged = batch.is_sequences() && rows != batch.rows;
            stats.tokens |= tagged;
            let lengths = batch.lengths.clone();
            let y = labels_tensor(loss_kind, labels.clone(), shape.outputs, device)?;
            let output = forward_batch(model, &mut batch, false, &mut rng, device)?;
            let loss = loss_kind.compute(&output, &y)?.item()? as f64;
            stats.rows += rows as u64;
            stats.loss_sum += loss * rows as f64;
            let out = output.try_to_vec()?;
            match loss_kind {
                LossKind::CrossEntropy => {
                    let predicted: Vec<usize> =
                        out.chunks_exact(shape.outputs).map(argmax).collect();
                    for (&p, &label) in predicted.iter().zip(&labels) {
                        if p == label as usize {
                            stats.correct += 1;
                        }
                    }
                    if let Some(scheme) = entities.filter(|_| tagged) {
                        let counts = stats.entities.get_or_insert_with(Default::default);
                        *counts += count_entities(scheme, &lengths, &labels, &predicted);
                    }
                }
                LossKind::BinaryCrossEntropy => {
                    for (&logit, &label) in out.iter().zip(&labels) {
                        if (logit > 0.0) == (label >= 0.5) {
                            stats.correct += 1;
                        }
                    }
                }
                LossKind::Mse => {
                    for (&p, &label) in out.iter().zip(&labels) {
                        stats.squared_error += ((p - label) as f64).powi(2);
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok(stats)
}

/// The entity counts of the sentences (of `lengths` tokens each) whose tokens' gold and
/// predicted classes follow one another in `gold` and `predicted`.
fn count_entities(
    scheme: &TagScheme,
    lengths: &[usize],
    gold: &[f32],
    predicted: &[usize],
) -> EntityCounts {
    let mut counts = EntityCounts::default();
    let mut start = 0;
    for &len in lengths {
        let g: Vec<usize> = gold[start..start + len]
            .iter()
            .map(|&c| c as usize)
            .collect();
        counts += scheme.count(&g, &predicted[start..start + len]);
        start += len;
    }
    counts
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// The labels of a batch on `device`. Class labels are checked on the host as they are uploaded,
/// so the loss need not read them back from a GPU in every step.
pub fn labels_tensor(
    loss: LossKind,
    labels: Vec<f32>,
    outputs: usize,
    device: Device,
) -> Result<Tensor> {
    let rows = labels.len();
    Ok(match loss {
        LossKind::CrossEntropy => Tensor::from_indices(labels, &[rows], outputs, device)?,
        _ => Tensor::from_vec(labels, &[rows], device)?,
    })
}
