//! Learning-rate schedules, evaluated per optimizer step.

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};

/// `train.schedule` in the job spec (default: constant).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Schedule {
    /// The optimizer's `lr` throughout.
    #[default]
    Constant,
    /// `lr · gamma^⌊step / step_size⌋`.
    Step {
        /// Steps between decays.
        step_size: u64,
        /// Factor applied at each decay (default 0.1).
        #[serde(default = "default_gamma")]
        gamma: f32,
    },
    /// Linear warm-up from 0 to `lr` over `warmup_steps`, then cosine decay to `min_lr` at the
    /// last step of the job.
    Cosine {
        /// Steps of linear warm-up (default 0).
        #[serde(default)]
        warmup_steps: u64,
        /// The floor reached at the end (default 0).
        #[serde(default)]
        min_lr: f32,
    },
}

fn default_gamma() -> f32 {
    0.1
}

impl Schedule {
    /// Checks the fields; errors name them.
    pub fn validate(&self) -> Result<()> {
        match self {
            Schedule::Step { step_size: 0, .. } => {
                Err(MlError::spec("train.schedule.step_size must be at least 1"))
            }
            Schedule::Cosine { min_lr, .. } if *min_lr < 0.0 => {
                Err(MlError::spec("train.schedule.min_lr must not be negative"))
            }
            _ => Ok(()),
        }
    }

    /// The learning rate for 0-based optimizer step `step` of `total_steps`, from base `lr`.
    pub fn lr_at(&self, lr: f32, step: u64, total_steps: u64) -> f32 {
        match *self {
            Schedule::Constant => lr,
            Schedule::Step { step_size, gamma } => {
                lr * gamma.powi((step / step_size.max(1)) as i32)
            }
            Schedule::Cosine {
                warmup_steps,
                min_lr,
            } => {
                if step < warmup_steps {
                    return lr * (step + 1) as f32 / warmup_steps as f32;
                }
                let span = total_steps.saturating_sub(warmup_steps).max(1);
                let t = ((step - warmup_steps) as f32 / span as f32).min(1.0);
                min_lr + 0.5 * (lr - min_lr) * (1.0 + (std::f32::consts::PI * t).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_decay() {
        let s = Schedule::Step {
            step_size: 10,
            gamma: 0.5,
        };
        assert_eq!(s.lr_at(1.0, 0, 100), 1.0);
        assert_eq!(s.lr_at(1.0, 9, 100), 1.0);
        assert_eq!(s.lr_at(1.0, 10, 100), 0.5);
        assert_eq!(s.lr_at(1.0, 25, 100), 0.25);
    }

    #[test]
    fn cosine_with_warmup() {
        let s = Schedule::Cosine {
            warmup_steps: 10,
            min_lr: 0.0,
        };
        assert!((s.lr_at(1.0, 0, 110) - 0.1).abs() < 1e-6);
        assert!((s.lr_at(1.0, 9, 110) - 1.0).abs() < 1e-6);
        assert!((s.lr_at(1.0, 10, 110) - 1.0).abs() < 1e-6);
        assert!((s.lr_at(1.0, 60, 110) - 0.5).abs() < 1e-6);
        assert!(s.lr_at(1.0, 110, 110).abs() < 1e-6);
    }
}
