//! Normalization layers: [`LayerNorm`] over each example's last axis and [`BatchNorm`] over
//! the batch, with running statistics for evaluation.

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::ops::{BatchNormMode, BatchStats};
use crate::tensor::Tensor;

/// Normalization over the last axis with a learned scale and shift.
pub struct LayerNorm {
    /// `[dim]`, starts at 1
    pub gamma: Tensor,
    /// `[dim]`, starts at 0
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// A layer norm over vectors of size `dim`.
    pub fn new(b: &mut ParamBuilder<'_>, dim: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: b.constant("weight", &[dim], 1.0)?,
            beta: b.constant("bias", &[dim], 0.0)?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        let mean = x.mean(-1, true)?;
        let centered = x.sub(&mean)?;
        let var = centered.square()?.mean(-1, true)?;
        let std = var.add_scalar(self.eps)?.sqrt()?;
        centered.div(&std)?.mul(&self.gamma)?.add(&self.beta)
    }
}

/// Batch normalization (Ioffe & Szegedy) of `[n, C]` or `[n, C, H, W]` inputs, per channel
/// (axis 1), as `torch.nn.BatchNorm1d`/`BatchNorm2d` do.
///
/// While training it normalizes with the batch's mean and biased variance and then updates
/// the running statistics, `running ← (1 − momentum)·running + momentum·batch` (the variance
/// term unbiased, `n/(n − 1)`, like PyTorch); in evaluation it normalizes with the running
/// statistics. The running statistics are buffers (`running_mean`, `running_var`): saved in
/// checkpoints, never trained.
pub struct BatchNorm {
    /// Scale `[C]`, starts at 1 (`weight`).
    pub gamma: Tensor,
    /// Shift `[C]`, starts at 0 (`bias`).
    pub beta: Tensor,
    /// Running mean `[C]`, starts at 0 (buffer `running_mean`).
    pub running_mean: Tensor,
    /// Running variance `[C]`, starts at 1 (buffer `running_var`).
    pub running_var: Tensor,
    /// Added to the variance.
    pub eps: f32,
    /// Weight of each batch in the running statistics.
    pub momentum: f32,
}

impl BatchNorm {
    /// PyTorch's default `eps`.
    pub const DEFAULT_EPS: f32 = 1e-5;
    /// PyTorch's default `momentum`.
    pub const DEFAULT_MOMENTUM: f32 = 0.1;

    /// A batch norm over `channels` channels.
    pub fn new(
        b: &mut ParamBuilder<'_>,
        channels: usize,
        eps: f32,
        momentum: f32,
    ) -> Result<BatchNorm> {
        if channels == 0 {
            return Err(MlError::spec("a batch norm needs at least one channel"));
        }
        if !(eps > 0.0 && eps.is_finite()) || !(0.0..=1.0).contains(&momentum) {
            return Err(MlError::spec(format!(
                "a batch norm needs eps > 0 and momentum in [0, 1], not eps {eps}, momentum \
                 {momentum}"
            )));
        }
        Ok(BatchNorm {
            gamma: b.constant("weight", &[channels], 1.0)?,
            beta: b.constant("bias", &[channels], 0.0)?,
            running_mean: b.buffer("running_mean", &[channels], 0.0)?,
            running_var: b.buffer("running_var", &[channels], 1.0)?,
            eps,
            momentum,
        })
    }

    /// Folds a training batch's statistics into the running ones, in place and outside the
    /// graph.
    fn update_running(&self, stats: &BatchStats) -> Result<()> {
        let m = self.momentum;
        // PyTorch's running variance is the unbiased one.
        let unbias = if stats.count > 1 {
            stats.count as f32 / (stats.count - 1) as f32
        } else {
            1.0
        };
        crate::no_grad(|| {
            let mean = self
                .running_mean
                .scale(1.0 - m)?
                .add(&stats.mean.scale(m)?)?;
            let var = self
                .running_var
                .scale(1.0 - m)?
                .add(&stats.var.scale(m * unbias)?)?;
            assign(&self.running_mean, &mean)?;
            assign(&self.running_var, &var)
        })
    }
}

/// Replaces the values of `dst` by those of `src`, a freshly computed tensor of the same shape
/// on the same device, without a copy: the two exchange their storage (`src` ends up holding
/// `dst`'s old values). Every handle on `dst` sees the new values.
fn assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.shape() != src.shape() || dst.device() != src.device() {
        return Err(MlError::invalid(
            "assign",
            format!(
                "{:?} on {} cannot take the values of {:?} on {}",
                dst.shape(),
                dst.device(),
                src.shape(),
                src.device()
            ),
        ));
    }
    if dst.key() == src.key() {
        return Ok(());
    }
    std::mem::swap(&mut *dst.write(), &mut *src.write());
    Ok(())
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        if ctx.train {
            let (y, stats) =
                x.batch_norm(&self.gamma, &self.beta, BatchNormMode::Train, self.eps)?;
            if let Some(stats) = stats {
                self.update_running(&stats)?;
            }
            Ok(y)
        } else {
            let mode = BatchNormMode::Eval {
                mean: &self.running_mean,
                var: &self.running_var,
            };
            Ok(x.batch_norm(&self.gamma, &self.beta, mode, self.eps)?.0)
        }
    }
}
