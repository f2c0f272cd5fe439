//! Position embeddings: where each step of a sequence is, added to its features.

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::tensor::Tensor;

const OP: &str = "position_embedding";

/// Where a [`PositionEmbedding`]'s vectors come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PositionKind {
    /// Fixed sines and cosines of geometrically spaced frequencies (Vaswani et al.): no
    /// parameters.
    #[default]
    Sinusoidal,
    /// A trained vector per position (BERT's, GPT's), drawn from `N(0, 0.02²)`.
    Learned,
}

/// `[n, T, dim]` → `[n, T, dim]`: adds to each step `t` the vector of position `t` (`t <
/// max_length`). Padded steps get theirs too; the layers that follow ignore padding.
pub struct PositionEmbedding {
    /// Fixed or learned.
    pub kind: PositionKind,
    /// `[max_length, dim]`: row `t` is position `t`'s vector. A parameter (`weight`) when
    /// learned; a constant outside the parameter store when sinusoidal.
    pub table: Tensor,
}

impl PositionEmbedding {
    /// The standard deviation of a learned table's initial values.
    pub const LEARNED_STD: f32 = 0.02;

    /// An embedding of positions `0..max_length` into `dim` features.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        kind: PositionKind,
        max_length: usize,
        dim: usize,
    ) -> Result<PositionEmbedding> {
        if max_length == 0 || dim == 0 {
            return Err(MlError::spec(format!(
                "a position embedding needs at least one position and one feature, not \
                 max_length {max_length}, dim {dim}"
            )));
        }
        let shape = [max_length, dim];
        let device = b.device();
        let table = match kind {
            PositionKind::Sinusoidal => {
                Tensor::from_vec(sinusoidal_table(max_length, dim), &shape, device)?
            }
            PositionKind::Learned => {
                let init = Tensor::randn(&shape, Self::LEARNED_STD, b.rng(), device)?;
                b.param("weight", init)?
            }
        };
        Ok(PositionEmbedding { kind, table })
    }

    /// Positions the table holds.
    pub fn max_length(&self) -> usize {
        self.table.shape()[0]
    }

    /// Features of each position's vector.
    pub fn dim(&self) -> usize {
        self.table.shape()[1]
    }

    /// `x` (`[n, T, dim]`, `T ≤ max_length`) plus the vectors of positions `0..T`.
    pub fn run(&self, x: &Tensor) -> Result<Tensor> {
        let (max_length, dim) = (self.max_length(), self.dim());
        let &[_, steps, features] = x.shape() else {
            return Err(MlError::invalid(
                OP,
                format!("the input {:?} is not [batch, steps, features]", x.shape()),
            ));
        };
        if features != dim {
            return Err(MlError::invalid(
                OP,
                format!(
                    "the input {:?} has {features} features per step, the table {dim}",
                    x.shape()
                ),
            ));
        }
        if steps > max_length {
            return Err(MlError::invalid(
                OP,
                format!(
                    "the input has {steps} steps, more than the table's {max_length} positions \
                     (max_length)"
                ),
            ));
        }
        x.add(&self.table.narrow(0, 0, steps)?)
    }
}

impl Module for PositionEmbedding {
    fn forward(&self, input: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input)
    }
}

/// The `[positions, dim]` sinusoidal table, row-major: for position `p` and `i < dim / 2`,
/// feature `2i` is `sin(p / 10000^(2i / dim))` and feature `2i + 1` is `cos` of the same angle.
pub fn sinusoidal_table(positions: usize, dim: usize) -> Vec<f32> {
    let mut table = Vec::with_capacity(positions * dim);
    for p in 0..positions {
        table.extend((0..dim).map(|f| {
            let pair = (f - f % 2) as f64;
            let angle = p as f64 / 10_000f64.powf(pair / dim as f64);
            (if f % 2 == 0 { angle.sin() } else { angle.cos() }) as f32
        }));
    }
    table
}
