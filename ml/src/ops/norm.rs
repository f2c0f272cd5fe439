//! Batch normalization over every axis but the channels (axis 1).

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::tensor::Tensor;

/// Which statistics [`Tensor::batch_norm`] normalizes with.
#[derive(Clone, Copy, Debug)]
pub enum BatchNormMode<'a> {
    /// The batch's own per-channel mean and biased variance (training); the gradient flows
    /// through them, and they are returned so a layer can update its running statistics.
    Train,
    /// Given per-channel statistics (evaluation with a layer's running mean and variance,
    /// `[C]` each); they are constants of the graph.
    Eval {
        /// The per-channel mean.
        mean: &'a Tensor,
        /// The per-channel variance.
        var: &'a Tensor,
    },
}

/// A batch's per-channel mean and biased variance, `[C]` each (not part of the graph).
#[derive(Clone, Debug)]
pub struct BatchStats {
    /// The per-channel mean.
    pub mean: Tensor,
    /// The per-channel biased variance `Σ (x − mean)² / count`; PyTorch's running variance
    /// uses the unbiased one, `var · count / (count − 1)`.
    pub var: Tensor,
    /// The number of values per channel (batch · the axes after the channels).
    pub count: usize,
}

/// The gradient of `(x − mean) / √(var + eps) · γ + β` for `x`, `γ` and `β`; through the
/// statistics too when they were the batch's own.
struct BatchNormBackward {
    mean: Storage,
    var: Storage,
    eps: f32,
    batch_stats: bool,
}

impl Backward for BatchNormBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (x, gamma, beta) = (&inputs[0], &inputs[1], &inputs[2]);
        let (dx, dgamma, dbeta) = Storage::batch_norm_backward(
            &x.read(),
            g,
            &self.mean,
            &self.var,
            &gamma.read(),
            self.eps,
            self.batch_stats,
        )?;
        sink.add(x, dx)?;
        sink.add(gamma, dgamma)?;
        sink.add(beta, dbeta)
    }
}

/// Checks the operands of a batch normalization and returns the values per channel.
fn check(x: &Tensor, params: &[(&str, &Tensor)], eps: f32) -> Result<usize> {
    let s = x.shape();
    if s.len() < 2 {
        return Err(MlError::invalid(
            "batch_norm",
            format!("the input {s:?} has no channel axis: it must be [batch, channels, ...]"),
        ));
    }
    let tensors: Vec<&Tensor> = std::iter::once(x)
        .chain(params.iter().map(|p| p.1))
        .collect();
    same_device("batch_norm", &tensors)?;
    for (name, t) in params {
        if t.shape() != [s[1]] {
            return Err(MlError::invalid(
                "batch_norm",
                format!(
                    "{name} {:?} does not have one value per channel of the input {s:?}",
                    t.shape()
                ),
            ));
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(MlError::invalid(
            "batch_norm",
            format!("eps {eps} is not a finite non-negative number"),
        ));
    }
    Ok(x.numel().checked_div(s[1]).unwrap_or(0))
}

impl Tensor {
    /// Batch normalization of a `[n, C]` or `[n, C, ...]` input over every axis but axis 1:
    /// `(x − mean) / √(var + eps) · gamma + beta` per channel, `gamma` and `beta` `[C]`.
    ///
    /// With [`BatchNormMode::Train`] it uses the batch's mean and biased variance (at least two
    /// values per channel are needed) and returns them; with [`BatchNormMode::Eval`] it uses the
    /// given statistics and returns `None`.
    pub fn batch_norm(
        &self,
        gamma: &Tensor,
        beta: &Tensor,
        mode: BatchNormMode<'_>,
        eps: f32,
    ) -> Result<(Tensor, Option<BatchStats>)> {
        let mut params = vec![("gamma", gamma), ("beta", beta)];
        if let BatchNormMode::Eval { mean, var } = mode {
            params.extend([("the mean", mean), ("the variance", var)]);
        }
        let count = check(self, &params, eps)?;
        let (g, b) = (gamma.read(), beta.read());
        let (mean, var, stats) = match mode {
            BatchNormMode::Train => {
                if count < 2 {
                    return Err(MlError::invalid(
                        "batch_norm",
                        format!(
                            "training needs more than one value per channel, but the input {:?} \
                             has {count}",
                            self.shape()
                        ),
                    ));
                }
                let (mean, var) = Storage::batch_norm_stats(&self.read())?;
                let stats = BatchStats {
                    mean: Tensor::from_storage(mean.duplicate()?),
                    var: Tensor::from_storage(var.duplicate()?),
                    count,
                };
                (mean, var, Some(stats))
            }
            BatchNormMode::Eval { mean, var } => {
                (mean.read().duplicate()?, var.read().duplicate()?, None)
            }
        };
        let out = Storage::batch_norm(&self.read(), &mean, &var, &g, &b, eps)?;
        drop((g, b));
        let backward = BatchNormBackward {
            mean,
            var,
            eps,
            batch_stats: stats.is_some(),
        };
        Ok((Tensor::from_op(out, &[self, gamma, beta], backward), stats))
    }
}
