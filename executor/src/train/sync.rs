//! [`GradientSync`]: how one step's gradients become the same on every replica.
//!
//! Alone there is nothing to do. On a ring, gradients are fused into buckets that are
//! all-reduced while the backward pass runs ([`GradientBuckets`]). With backup workers, the
//! rank's whole gradient goes to the aggregator on rank 0 and the step uses the average of the
//! first N−b ranks ([`crate::collective::BackupReduce`]); a rank that falls behind applies the
//! common gradients of the steps it missed instead of computing them.

use std::time::Duration;

use ringflow_ml::nn::ParamStore;
use ringflow_ml::{MlError, Tensor};

use crate::collective::Collective;
use crate::error::{ExecutorError, Result};
use crate::train::fusion::GradientBuckets;

/// The environment variable of the test-only straggler: `RANK:MILLISECONDS` makes that rank
/// sleep so long in every training step (after its backward pass), like a slow machine.
pub const STRAGGLER_ENV: &str = "RINGFLOW_TEST_STRAGGLER";

/// How a step's gradients are combined across ranks.
pub enum GradientSync {
    /// A world of one.
    Alone,
    /// Bucketed ring all-reduce, overlapped with backward.
    Ring(GradientBuckets),
    /// Backup workers: the average of the first N−b ranks' gradients (a flat staging buffer).
    Backup(Vec<f32>),
}

/// What a step's exchange did with this rank's gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contribution {
    /// It is part of the step's common gradient.
    Used,
    /// It came too late (backup workers) and was dropped.
    Dropped,
}

impl GradientSync {
    /// The way `comm` combines gradients of `params`.
    pub fn new(comm: &mut dyn Collective, params: &ParamStore) -> GradientSync {
        if comm.world() == 1 {
            GradientSync::Alone
        } else if comm.backup().is_some() {
            GradientSync::Backup(vec![0.0; params.numel()])
        } else {
            GradientSync::Ring(GradientBuckets::new(params))
        }
    }

    /// Runs the backward pass of `loss`; on a ring, buckets start reducing as they complete.
    pub fn backward(&mut self, loss: &Tensor, comm: &mut dyn Collective) -> Result<()> {
        let GradientSync::Ring(buckets) = self else {
            return Ok(loss.backward()?);
        };
        buckets.begin();
        let mut comm_error = None;
        let r = loss.backward_with(|p| {
            buckets.ready(p, comm).map_err(|e| {
                comm_error = Some(e);
                MlError::Backward("a gradient all-reduce failed".into())
            })
        });
        if let Some(e) = comm_error {
            return Err(e);
        }
        Ok(r?)
    }

    /// Replaces this rank's gradients of global step `step` by the step's common ones.
    pub fn exchange(
        &mut self,
        comm: &mut dyn Collective,
        params: &ParamStore,
        step: u64,
    ) -> Result<Contribution> {
        match self {
            GradientSync::Alone => Ok(Contribution::Used),
            GradientSync::Ring(buckets) => {
                buckets.finish(comm)?;
                Ok(Contribution::Used)
            }
            GradientSync::Backup(flat) => {
                let backup = backup_of(comm)?;
                let mut at = 0;
                for p in params.iter() {
                    let n = p.tensor.numel();
                    p.tensor.copy_grad_to_slice(&mut flat[at..at + n])?;
                    at += n;
                }
                backup.contribute(step, flat);
                let result = backup.result(step)?;
                load_gradient(params, &result.gradient)?;
                Ok(if result.included {
                    Contribution::Used
                } else {
                    Contribution::Dropped
                })
            }
        }
    }

    /// With backup workers, the common gradients of `step` if the other ranks already finished
    /// it without this one: they are loaded into `params` and the caller skips the step's
    /// computation. `false` otherwise.
    pub fn caught_up(
        &mut self,
        comm: &mut dyn Collective,
        params: &ParamStore,
        step: u64,
    ) -> Result<bool> {
        let GradientSync::Backup(_) = self else {
            return Ok(false);
        };
        match backup_of(comm)?.try_result(step)? {
            Some(result) => {
                load_gradient(params, &result.gradient)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

impl GradientSync {
    /// Ends training on this rank: with backup workers, tells the aggregator that this rank
    /// finished rather than failed.
    pub fn finish(&mut self, comm: &mut dyn Collective) {
        if let (GradientSync::Backup(_), Some(backup)) = (self, comm.backup()) {
            backup.finish();
        }
    }
}

fn backup_of(comm: &mut dyn Collective) -> Result<&mut crate::collective::BackupReduce> {
    comm.backup()
        .ok_or_else(|| ExecutorError::Comm("the ring has no backup-worker connections".into()))
}

fn load_gradient(params: &ParamStore, gradient: &[f32]) -> Result<()> {
    if gradient.len() != params.numel() {
        return Err(ExecutorError::Comm(format!(
            "the common gradient has {} values, the model {}",
            gradient.len(),
            params.numel()
        )));
    }
    let mut at = 0;
    for p in params.iter() {
        let n = p.tensor.numel();
        p.tensor.copy_grad_from_slice(&gradient[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// The delay [`STRAGGLER_ENV`] injects into every step of `rank` (test and benchmark use only).
pub fn straggler_delay(rank: usize) -> Result<Option<Duration>> {
    let value = match std::env::var(STRAGGLER_ENV) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => return Ok(None),
    };
    let parsed = value
        .split_once(':')
        .and_then(|(r, ms)| Some((r.trim().parse::<usize>().ok()?, ms.trim().parse().ok()?)));
    match parsed {
        Some((r, ms)) if r == rank => Ok(Some(Duration::from_millis(ms))),
        Some(_) => Ok(None),
        None => Err(ExecutorError::Spec(format!(
            "{STRAGGLER_ENV} = {value:?} is not RANK:MILLISECONDS"
        ))),
    }
}
