//! Pooling a sequence batch `[n, T, features]` over its real steps into one vector per sequence
//! (`[n, features]`), for sequence classification: [`SequencePool`].

use serde::{Deserialize, Serialize};

use super::recurrent::sequence_shape;
use crate::error::{MlError, Result};
use crate::nn::{Forward, Module};
use crate::ops::Pool2dOptions;
use crate::tensor::Tensor;

/// How [`SequencePool`] combines a sequence's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SequencePoolKind {
    /// The mean over the real steps.
    Mean,
    /// The largest value of each feature over the real steps.
    Max,
}

/// `[n, T, features]` → `[n, features]`: the mean or maximum over each sequence's real steps
/// (padding neither counts nor gets gradient).
#[derive(Clone, Copy, Debug)]
pub struct SequencePool {
    /// Mean or max.
    pub kind: SequencePoolKind,
}

impl SequencePool {
    /// Pools `x` over the first `lengths[i]` steps of each sequence `i` (`None`: all steps). A
    /// sequence must have at least one real step.
    pub fn run(&self, x: &Tensor, lengths: Option<&[usize]>) -> Result<Tensor> {
        let shape = x.shape();
        let every_step =
            vec![shape.get(1).copied().unwrap_or(0); shape.first().copied().unwrap_or(0)];
        let lengths = lengths.unwrap_or(&every_step);
        let [n, steps, features] = sequence_shape("sequence_pool", x, Some(lengths))?;
        if let Some(row) = lengths.iter().position(|&l| l == 0) {
            return Err(MlError::invalid(
                "sequence_pool",
                format!("sequence {row} has 0 real steps; it needs 1 to {steps}"),
            ));
        }
        // Per step: 1 (mean) or 0 (max) where real; 0 (mean) or −∞ (max) where padding.
        let per_step = |real: bool| match (self.kind, real) {
            (SequencePoolKind::Mean, real) => f32::from(u8::from(real)),
            (SequencePoolKind::Max, true) => 0.0,
            (SequencePoolKind::Max, false) => f32::NEG_INFINITY,
        };
        let mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&len| (0..steps).map(move |t| t < len))
            .map(per_step)
            .collect();
        let mask = Tensor::from_vec(mask, &[n, steps, 1], x.device())?;
        match self.kind {
            SequencePoolKind::Mean => {
                let counts: Vec<f32> = lengths.iter().map(|&l| l as f32).collect();
                let counts = Tensor::from_vec(counts, &[n, 1], x.device())?;
                x.mul(&mask)?.sum(1, false)?.div(&counts)
            }
            SequencePoolKind::Max => {
                let window = Pool2dOptions {
                    kernel: [1, steps],
                    stride: None,
                    padding: [0, 0],
                };
                x.add(&mask)?
                    .permute(&[0, 2, 1])?
                    .reshape(&[n, features, 1, steps])?
                    .max_pool2d(window)?
                    .reshape(&[n, features])
            }
        }
    }
}

impl Module for SequencePool {
    /// Over the real steps [`Forward::lengths`] gives.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, ctx.lengths)
    }
}
