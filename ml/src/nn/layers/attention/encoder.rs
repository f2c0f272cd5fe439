//! One Transformer encoder block (post-norm, as `torch.nn.TransformerEncoderLayer`).

use super::{MultiHeadAttention, zero_padding};
use crate::error::{MlError, Result};
use crate::nn::layers::{Activation, ActivationKind, Dropout, Init, LayerNorm, Linear};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// A Transformer encoder block `[n, T, dim]` → `[n, T, dim]` with PyTorch's
/// `nn.TransformerEncoderLayer` semantics for `norm_first = false` (post-norm, the original
/// Transformer's):
///
/// ```text
/// x ← norm1(x + dropout(attention(x)))
/// x ← norm2(x + dropout(linear2(dropout(activation(linear1(x))))))
/// ```
///
/// `attention` is [`MultiHeadAttention`] (with the same dropout on its attention weights),
/// `linear1` maps `dim → ff` and `linear2` `ff → dim`, the activation is ReLU unless
/// [`activation`](Self::activation) says otherwise, and both layer norms use `eps = 1e-5`.
/// Padded steps are no keys for the attention and output zeros (see the
/// [module documentation](super)).
pub struct TransformerEncoder {
    /// Self-attention (parameters `attention.query.weight`, ...).
    pub attention: MultiHeadAttention,
    /// The feed-forward's first layer, `[dim, ff]` (`linear1.weight`, `linear1.bias`).
    pub linear1: Linear,
    /// The feed-forward's second layer, `[ff, dim]` (`linear2.weight`, `linear2.bias`).
    pub linear2: Linear,
    /// The layer norm after the attention's residual (`norm1.weight`, `norm1.bias`).
    pub norm1: LayerNorm,
    /// The layer norm after the feed-forward's residual (`norm2.weight`, `norm2.bias`).
    pub norm2: LayerNorm,
    /// The feed-forward's nonlinearity: ReLU (PyTorch's default) or GELU, say.
    pub activation: ActivationKind,
    /// Probability of dropping a value while training, after the attention, inside the
    /// feed-forward and after it.
    pub dropout: f32,
}

impl TransformerEncoder {
    /// PyTorch's layer norm `eps`.
    pub const NORM_EPS: f32 = 1e-5;

    /// A block over `dim` features with `heads` attention heads (`dim` a multiple of
    /// `heads`), a feed-forward of `ff` hidden units (ReLU) and dropout `dropout` in `[0, 1)`.
    /// `linear1` starts He-uniform, `linear2` and the attention's projections Glorot-uniform,
    /// biases at zero and the layer norms at the identity.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        dim: usize,
        heads: usize,
        ff: usize,
        dropout: f32,
    ) -> Result<TransformerEncoder> {
        if ff == 0 {
            return Err(MlError::spec(
                "a transformer encoder needs at least one feed-forward unit, not 0",
            ));
        }
        let attention = MultiHeadAttention::new(&mut b.sub("attention"), dim, heads, dropout)?;
        let relu = Some(ActivationKind::Relu);
        Ok(TransformerEncoder {
            attention,
            linear1: Linear::new(&mut b.sub("linear1"), dim, ff, Init::Auto, relu)?,
            linear2: Linear::new(&mut b.sub("linear2"), ff, dim, Init::Auto, None)?,
            norm1: LayerNorm::new(&mut b.sub("norm1"), dim, Self::NORM_EPS)?,
            norm2: LayerNorm::new(&mut b.sub("norm2"), dim, Self::NORM_EPS)?,
            activation: ActivationKind::Relu,
            dropout,
        })
    }

    /// The outputs `[n, T, dim]` of `x` (`[n, T, dim]`); `lengths` mark each sequence's real
    /// steps (`None`: all), `train` turns dropout on, its masks drawn from `rng`.
    pub fn run(
        &self,
        x: &Tensor,
        lengths: Option<&[usize]>,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        self.forward(
            x,
            &mut Forward {
                train,
                rng,
                lengths,
            },
        )
    }
}

impl Module for TransformerEncoder {
    /// Over the real steps [`Forward::lengths`] gives, dropout while [`Forward::train`].
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        let drop = Dropout { p: self.dropout };
        let attended = self.attention.run(x, ctx.lengths, ctx.train, ctx.rng)?;
        let x = self
            .norm1
            .forward(&x.add(&drop.forward(&attended, ctx)?)?, ctx)?;
        let hidden = Activation(self.activation).forward(&self.linear1.forward(&x, ctx)?, ctx)?;
        let fed = self.linear2.forward(&drop.forward(&hidden, ctx)?, ctx)?;
        let out = self
            .norm2
            .forward(&x.add(&drop.forward(&fed, ctx)?)?, ctx)?;
        zero_padding(out, ctx.lengths)
    }
}
