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
/// checkpoints, never trained. When `model.freeze` names them, the layer normalizes with them
/// while training too and leaves them as they are (PyTorch's `module.eval()` on a frozen
/// layer).
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
    /// True when the running statistics are frozen: training uses them, as evaluation does.
    pub frozen: bool,
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
        if !(eps > 0.0 && eps.is_finite() && (0.0..=1.0).contains(&momentum)) {
            return Err(MlError::spec(format!(
                "a batch norm needs eps > 0 and momentum in [0, 1], not eps {eps}, momentum \
                 {momentum}"
            )));
        }
        Ok(BatchNorm {
            gamma: b.constant("weight", &[channels], 1.0)?,
            beta: b.constant("bias", &[channels], 0.0)?,
            frozen: b.is_frozen("running_mean") && b.is_frozen("running_var"),
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
        // Frozen running statistics are used as in evaluation (PyTorch's `module.eval()`).
        if ctx.train && !self.frozen {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::ParamStore;
    use crate::{Device, rng};

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn a_frozen_batch_norm_trains_with_its_running_statistics_and_keeps_them() {
        let patterns = vec![crate::nn::NamePattern::parse("model.freeze", "bn").unwrap()];
        let mut store = ParamStore::with_freeze(patterns);
        let mut init = rng::seeded(1, rng::streams::INIT);
        let mut b = ParamBuilder::new(&mut store, &mut init, Device::Cpu);
        let bn = BatchNorm::new(&mut b.sub("bn"), 2, 1e-5, 0.1).unwrap();
        assert!(bn.frozen && !bn.gamma.requires_grad());
        bn.running_mean.copy_from_slice(&[1.0, -1.0]).unwrap();
        let x =
            Tensor::from_vec(vec![1., 0., 2., 0., 3., 2., 4., 2.], &[4, 2], Device::Cpu).unwrap();
        let mut r = rng::seeded(0, 0);
        let trained = bn
            .forward(&x, &mut Forward::new(true, &mut r))
            .unwrap()
            .to_vec();
        let evaluated = bn
            .forward(&x, &mut Forward::new(false, &mut r))
            .unwrap()
            .to_vec();
        assert_eq!(trained, evaluated);
        assert_eq!(bn.running_mean.to_vec(), [1.0, -1.0]);
        assert_eq!(bn.running_var.to_vec(), [1.0, 1.0]);
    }

    #[test]
    fn training_uses_the_batch_and_evaluation_the_running_statistics() {
        let mut store = ParamStore::new();
        let mut init = rng::seeded(1, rng::streams::INIT);
        let mut b = ParamBuilder::new(&mut store, &mut init, Device::Cpu);
        let bn = BatchNorm::new(&mut b.sub("bn"), 2, 1e-5, 0.1).unwrap();
        // Channel 0: 1, 2, 3, 4 (mean 2.5, variance 1.25, unbiased 5/3); channel 1: 0, 0, 2,
        // 2 (mean 1, variance 1, unbiased 4/3).
        let x =
            Tensor::from_vec(vec![1., 0., 2., 0., 3., 2., 4., 2.], &[4, 2], Device::Cpu).unwrap();
        let mut r = rng::seeded(0, 0);
        let mut ctx = Forward::new(true, &mut r);
        let y = bn.forward(&x, &mut ctx).unwrap().to_vec();
        let s0 = (1.25f32 + 1e-5).sqrt();
        let s1 = (1f32 + 1e-5).sqrt();
        close(
            &y,
            &[
                -1.5 / s0,
                -1. / s1,
                -0.5 / s0,
                -1. / s1,
                0.5 / s0,
                1. / s1,
                1.5 / s0,
                1. / s1,
            ],
        );
        // running ← 0.9·running + 0.1·batch, with the unbiased variance.
        let (mean, var) = (0.25f32, 0.1f32);
        let (var0, var1) = (0.9 + 0.1 * 5. / 3., 0.9 + 0.1 * 4. / 3.);
        close(&bn.running_mean.to_vec(), &[mean, var]);
        close(&bn.running_var.to_vec(), &[var0, var1]);
        // The store's buffers are the layer's: one tensor, updated in place.
        close(
            &store.get_buffer("bn.running_mean").unwrap().to_vec(),
            &[0.25, 0.1],
        );
        assert!(!bn.running_mean.requires_grad());

        ctx.train = false;
        let e = bn.forward(&x, &mut ctx).unwrap().to_vec();
        let (d0, d1) = ((var0 + 1e-5).sqrt(), (var1 + 1e-5).sqrt());
        let want: Vec<f32> = x
            .to_vec()
            .chunks(2)
            .flat_map(|v| [(v[0] - 0.25) / d0, (v[1] - 0.1) / d1])
            .collect();
        close(&e, &want);
        // Evaluation leaves the running statistics alone.
        close(&bn.running_mean.to_vec(), &[0.25, 0.1]);
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut store = ParamStore::new();
        let mut init = rng::seeded(1, rng::streams::INIT);
        let mut b = ParamBuilder::new(&mut store, &mut init, Device::Cpu);
        assert!(BatchNorm::new(&mut b, 0, 1e-5, 0.1).is_err());
        assert!(BatchNorm::new(&mut b, 2, 0.0, 0.1).is_err());
        assert!(BatchNorm::new(&mut b, 2, 1e-5, 1.5).is_err());
    }
}
