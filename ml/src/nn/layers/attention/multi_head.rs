//! Multi-head scaled dot-product self-attention (Vaswani et al.) over sequences of different
//! lengths.

use super::{key_bias, zero_padding};
use crate::error::{MlError, Result};
use crate::nn::layers::recurrent::sequence_shape;
use crate::nn::layers::{Init, Linear};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::rng::Rng;
use crate::tensor::Tensor;

const OP: &str = "multi_head_attention";

/// Self-attention `[n, T, dim]` → `[n, T, dim]` with `heads` heads of `dim / heads` features:
/// the input is projected to queries, keys and values (`[dim, dim]` each, with bias), each head
/// weighs every step's value by `softmax(q·kᵀ / √(dim / heads))` over the keys, and the heads'
/// results side by side go through the output projection (`torch.nn.MultiheadAttention` with
/// `batch_first`).
///
/// Keys at padded steps get zero weight and padded steps output zeros (see the
/// [module documentation](super)). While training, dropout with probability `dropout` zeroes
/// attention weights (after the softmax, as PyTorch does).
pub struct MultiHeadAttention {
    /// The query projection (parameters `query.weight` `[dim, dim]`, `query.bias` `[dim]`).
    pub query: Linear,
    /// The key projection (`key.weight`, `key.bias`).
    pub key: Linear,
    /// The value projection (`value.weight`, `value.bias`).
    pub value: Linear,
    /// The output projection of the concatenated heads (`output.weight`, `output.bias`).
    pub output: Linear,
    /// Probability of dropping an attention weight while training.
    pub dropout: f32,
    heads: usize,
    dim: usize,
}

impl MultiHeadAttention {
    /// A layer over `dim` features split among `heads` heads (`dim` must be a multiple of
    /// `heads`), projections drawn Glorot-uniform (PyTorch's) with zero biases, and attention
    /// dropout `dropout` in `[0, 1)`.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        dim: usize,
        heads: usize,
        dropout: f32,
    ) -> Result<MultiHeadAttention> {
        check_settings(dim, heads, dropout)?;
        let mut projection =
            |name: &str| Linear::new(&mut b.sub(name), dim, dim, Init::Glorot, None);
        Ok(MultiHeadAttention {
            query: projection("query")?,
            key: projection("key")?,
            value: projection("value")?,
            output: projection("output")?,
            dropout,
            heads,
            dim,
        })
    }

    /// A layer from its four projections (`[dim, dim]` weights, each with a `[dim]` bias or
    /// none), in the order query, key, value, output; an error names a shape that does not fit.
    pub fn from_parts(
        [query, key, value, output]: [Linear; 4],
        heads: usize,
        dropout: f32,
    ) -> Result<MultiHeadAttention> {
        let dim = query.weight.shape().first().copied().unwrap_or(0);
        check_settings(dim, heads, dropout)?;
        let named = [
            ("query", &query),
            ("key", &key),
            ("value", &value),
            ("output", &output),
        ];
        for (name, l) in named {
            let bias_fits = l.bias.as_ref().is_none_or(|b| b.shape() == [dim]);
            if l.weight.shape() != [dim, dim] || !bias_fits {
                let bias = l
                    .bias
                    .as_ref()
                    .map_or("no bias".to_string(), |b| format!("bias {:?}", b.shape()));
                return Err(MlError::invalid(
                    OP,
                    format!(
                        "the {name} projection's weight {:?} and {bias} are not [{dim}, {dim}] \
                         with a [{dim}] bias or none",
                        l.weight.shape(),
                    ),
                ));
            }
        }
        Ok(MultiHeadAttention {
            query,
            key,
            value,
            output,
            dropout,
            heads,
            dim,
        })
    }

    /// Features of each step (input and output).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The outputs `[n, T, dim]` of `x` (`[n, T, dim]`). `lengths` (one per sequence, each at
    /// most `T`) mark the real steps, `None` meaning all; `train` turns attention dropout on,
    /// its masks drawn from `rng`.
    pub fn run(
        &self,
        x: &Tensor,
        lengths: Option<&[usize]>,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        let [n, steps, dim] = sequence_shape(OP, x, lengths)?;
        if dim != self.dim {
            return Err(MlError::invalid(
                OP,
                format!(
                    "the input {:?} has {dim} features per step, the layer {}",
                    x.shape(),
                    self.dim
                ),
            ));
        }
        let (heads, width) = (self.heads, dim / self.heads);
        let flat = x.reshape(&[n * steps, dim])?;
        // [n·T, dim] → [n·heads, T, width]: each head's steps as one matrix.
        let split = |l: &Linear| {
            project(l, &flat)?
                .reshape(&[n, steps, heads, width])?
                .permute(&[0, 2, 1, 3])?
                .reshape(&[n * heads, steps, width])
        };
        // Scaling the queries scales every score by 1/√width, on T·width values, not T².
        let q = split(&self.query)?.scale(1.0 / (width as f32).sqrt())?;
        let (k, v) = (split(&self.key)?, split(&self.value)?);
        let mut scores = q.bmm_t(&k)?;
        if let Some(bias) = key_bias(lengths, steps, x.device())? {
            scores = scores
                .reshape(&[n, heads, steps, steps])?
                .add(&bias)?
                .reshape(&[n * heads, steps, steps])?;
        }
        let mut weights = scores.softmax(-1)?;
        if train && self.dropout > 0.0 {
            weights = weights.dropout(self.dropout, rng)?;
        }
        let merged = weights
            .bmm(&v)?
            .reshape(&[n, heads, steps, width])?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[n * steps, dim])?;
        let out = project(&self.output, &merged)?.reshape(&[n, steps, dim])?;
        zero_padding(out, lengths)
    }
}

impl Module for MultiHeadAttention {
    /// Over the real steps [`Forward::lengths`] gives, dropout while [`Forward::train`].
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, ctx.lengths, ctx.train, ctx.rng)
    }
}

/// `x·W + b` for a 2-D `x`.
fn project(l: &Linear, x: &Tensor) -> Result<Tensor> {
    match &l.bias {
        Some(bias) => x.linear(&l.weight, bias),
        None => x.matmul(&l.weight),
    }
}

/// An error unless `heads` heads can share `dim` features and `dropout` is a probability.
fn check_settings(dim: usize, heads: usize, dropout: f32) -> Result<()> {
    if dim == 0 || heads == 0 {
        return Err(MlError::spec(format!(
            "multi-head attention needs at least one feature and one head, not dim {dim} with \
             {heads} heads"
        )));
    }
    if !dim.is_multiple_of(heads) {
        return Err(MlError::spec(format!(
            "multi-head attention needs a dim divisible by its heads: dim {dim} is not divisible \
             by {heads} heads"
        )));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(MlError::spec(format!(
            "multi-head attention needs a dropout in [0, 1), not {dropout}"
        )));
    }
    Ok(())
}
