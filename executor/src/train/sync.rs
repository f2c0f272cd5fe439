//! [`GradientSync`]: how one step's gradients become the same on every replica.
//!
//! Alone there is nothing to do. On a ring, gradients are fused into buckets that are
//! all-reduced while the backward pass runs ([`GradientBuckets`]). With backup workers, the
//! rank's whole gradient goes to the aggregator on rank 0 and the step uses the average of the
//! first N−b ranks ([`crate::collective::BackupReduce`]); a rank that falls behind applies the
//! common gradients of the steps it missed instead of computing them.

use std::time::Duration;

use ringflow_core::spec::Fusion;
use ringflow_ml::nn::ParamStore;
use ringflow_ml::{GradStore, MlError, Tensor};

use crate::collective::Collective;
use crate::error::{CommError, CommOp, Peer, Result};
use crate::train::autotune::{FusionState, TunedBuckets};

/// How a step's gradients are combined across ranks.
pub enum GradientSync {
    /// A world of one.
    Alone,
    /// Bucketed ring all-reduce, overlapped with backward.
    Ring(TunedBuckets),
    /// Backup workers: the average of the first N−b ranks' gradients (a flat staging buffer).
    Backup(Vec<f32>),
    /// NCCL on the GPUs of one host.
    #[cfg(feature = "nccl")]
    Nccl(crate::collective::NcclAllReduce),
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
    /// The way `comm` combines gradients of `params`. With the `nccl` feature this is a
    /// collective step of the ring (its ranks decide together whether NCCL can carry the
    /// gradients, waiting at most `timeout`).
    pub fn new(
        comm: &mut dyn Collective,
        params: &ParamStore,
        fusion: Fusion,
        timeout: Duration,
    ) -> GradientSync {
        if comm.world() == 1 {
            return GradientSync::Alone;
        }
        if comm.backup().is_some() {
            return GradientSync::Backup(vec![0.0; params.numel()]);
        }
        #[cfg(feature = "nccl")]
        {
            let device = params
                .iter()
                .next()
                .map_or(ringflow_ml::Device::Cpu, |p| p.tensor.device());
            match crate::collective::NcclAllReduce::connect(comm, device, timeout) {
                Ok(Some(nccl)) => return GradientSync::Nccl(nccl),
                Ok(None) => {}
                Err(e) => tracing::warn!("gradients go over the TCP ring: {e}"),
            }
        }
        #[cfg(not(feature = "nccl"))]
        let _ = timeout;
        GradientSync::Ring(TunedBuckets::new(params, fusion))
    }

    /// Runs the backward pass of `loss` into `grads`; on a ring, buckets start reducing as
    /// they complete.
    pub fn backward(
        &mut self,
        loss: &Tensor,
        comm: &mut dyn Collective,
        grads: &mut GradStore,
    ) -> Result<()> {
        let GradientSync::Ring(buckets) = self else {
            return Ok(loss.backward_into(grads)?);
        };
        buckets.begin();
        let mut comm_error = None;
        let r = loss.backward_with(grads, |p, grads| {
            buckets.buckets().ready(p, grads, comm).map_err(|e| {
                comm_error = Some(e);
                MlError::Backward("a gradient all-reduce failed".into())
            })
        });
        if let Some(e) = comm_error {
            return Err(e);
        }
        Ok(r?)
    }

    /// Replaces this rank's gradients of global step `step` (of `params`, in `grads`) by the
    /// step's common ones.
    pub fn exchange(
        &mut self,
        comm: &mut dyn Collective,
        params: &ParamStore,
        grads: &mut GradStore,
        step: u64,
    ) -> Result<Contribution> {
        match self {
            GradientSync::Alone => Ok(Contribution::Used),
            GradientSync::Ring(buckets) => {
                buckets.finish(params, grads, comm)?;
                Ok(Contribution::Used)
            }
            #[cfg(feature = "nccl")]
            GradientSync::Nccl(nccl) => {
                nccl.all_reduce(params, grads)?;
                Ok(Contribution::Used)
            }
            GradientSync::Backup(flat) => {
                let backup = backup_of(comm)?;
                grads.gather(&params.tensors(), flat)?;
                backup.contribute(step, flat);
                let result = backup.result(step)?;
                load_gradient(params, grads, &result.gradient)?;
                Ok(if result.included {
                    Contribution::Used
                } else {
                    Contribution::Dropped
                })
            }
        }
    }

    /// With backup workers, the common gradients of `step` if the other ranks already finished
    /// it without this one: they are loaded into `grads` and the caller skips the step's
    /// computation. `false` otherwise.
    pub fn caught_up(
        &mut self,
        comm: &mut dyn Collective,
        params: &ParamStore,
        grads: &mut GradStore,
        step: u64,
    ) -> Result<bool> {
        let GradientSync::Backup(_) = self else {
            return Ok(false);
        };
        match backup_of(comm)?.try_result(step)? {
            Some(result) => {
                load_gradient(params, grads, &result.gradient)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

impl GradientSync {
    /// True in a world of one: gradients need no combining.
    pub fn is_alone(&self) -> bool {
        matches!(self, GradientSync::Alone)
    }

    /// True when steps do not wait for every rank (backup workers).
    pub fn skips_late_ranks(&self) -> bool {
        matches!(self, GradientSync::Backup(_))
    }

    /// On a ring, the time spent staging gradients through the buckets since the last call
    /// ([`GradientBuckets::take_staging`]); `None` for the other ways.
    pub fn take_staging(&mut self) -> Option<Duration> {
        match self {
            GradientSync::Ring(buckets) => Some(buckets.buckets().take_staging()),
            _ => None,
        }
    }

    /// On a ring, the gradient buckets in use and what `cluster.fusion = "auto"` tried;
    /// `None` for the other ways.
    pub fn fusion(&self) -> Option<FusionState> {
        match self {
            GradientSync::Ring(buckets) => Some(buckets.state()),
            _ => None,
        }
    }

    /// Ends training on this rank: with backup workers, tells the aggregator that this rank
    /// finished rather than failed.
    pub fn finish(&mut self, comm: &mut dyn Collective) {
        if let (GradientSync::Backup(_), Some(backup)) = (self, comm.backup()) {
            backup.finish();
        }
    }
}

fn backup_of(comm: &mut dyn Collective) -> Result<&mut crate::collective::BackupReduce> {
    comm.backup().ok_or_else(|| {
        let why = "the ring has no backup-worker connections";
        CommError::new(Peer::Local, CommOp::BackupGradient, why).into()
    })
}

fn load_gradient(params: &ParamStore, grads: &mut GradStore, gradient: &[f32]) -> Result<()> {
    if gradient.len() != params.numel() {
        let why = format!(
            "the common gradient has {} values, the model {}",
            gradient.len(),
            params.numel()
        );
        return Err(CommError::new(Peer::rank(0), CommOp::BackupGradient, why).into());
    }
    Ok(grads.scatter(&params.tensors(), gradient)?)
}
