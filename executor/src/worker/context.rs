//! The train loop's view of a remote driver: epoch plans, reports, the preparation phases (a
//! rank's statistics, at most [`MAX_STATISTICS_BYTES`], and the merged result, fetched in
//! chunks when it is too large for the reply) and recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ringflow_core::data::prepare::{PartitionSource, ReadCheck};
use ringflow_core::data::{DataStats, Preprocessing};
use ringflow_core::pb;
use ringflow_core::wire::MAX_STATISTICS_BYTES;
use ringflow_core::wire::payload::{self, Payload};
use tokio::runtime::Handle;

use super::client::DriverClient;
use super::ring;
use crate::collective::RingListener;
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result, Unrunnable};
use crate::train::{Recovered, Report, Split, TaskContext, TrainEvent};

/// How long one preparation call may wait at the driver for the other ranks.
const PREPARE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A [`TaskContext`] that asks the driver over RPC.
pub struct RemoteContext<'a> {
    rt: Handle,
    client: DriverClient,
    job_id: String,
    rank: u32,
    cancel: Arc<AtomicBool>,
    ring: RingPlace<'a>,
    reforming: bool,
}

/// What re-joining a re-formed ring needs.
pub struct RingPlace<'a> {
    /// Where this executor accepts ring connections.
    pub listener: &'a RingListener,
    /// This executor's id.
    pub executor_id: String,
    /// The generation of the ring the task runs on.
    pub generation: u32,
}

impl<'a> RemoteContext<'a> {
    /// A context for rank `rank` of `job_id`; `cancel` is also set by heartbeat replies.
    pub fn new(
        rt: Handle,
        client: DriverClient,
        job_id: String,
        rank: u32,
        cancel: Arc<AtomicBool>,
        ring: RingPlace<'a>,
    ) -> Self {
        RemoteContext {
            rt,
            client,
            job_id,
            rank,
            cancel,
            ring,
            reforming: false,
        }
    }

    /// This executor's rank now (it changes when the ring is re-formed).
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// What the driver answered to a request to re-form the ring cannot be used (`why`).
    fn reform_failed(&self, why: String) -> CommError {
        CommError::new(Peer::driver(self.client.url()), CommOp::Reform, why)
    }

    /// Sends this rank's `partial` of `phase` once, then polls until the driver has merged
    /// every rank's, and reads the merged result (fetched in chunks when it is too large for
    /// the reply).
    fn prepare<P: Payload, M: Payload>(
        &mut self,
        phase: pb::PreparePhase,
        partial: &P,
    ) -> Result<M> {
        let partial = payload::encode(partial);
        if partial.len() > MAX_STATISTICS_BYTES {
            return Err(Unrunnable::StatisticsTooLarge {
                rank: self.rank,
                bytes: partial.len() as u64,
            }
            .into());
        }
        let mut req = pb::PrepareRequest {
            job_id: self.job_id.clone(),
            rank: self.rank,
            phase: phase as i32,
            partial,
            has_partial: true,
            wait_ms: PREPARE_POLL.as_millis() as u64,
        };
        loop {
            let reply = self.rt.block_on(self.client.prepare(req.clone()))?;
            if reply.cancel {
                self.cancel.store(true, Ordering::Relaxed);
                return Err(ExecutorError::Cancelled);
            }
            if reply.ready {
                let merged = if reply.merged_bytes > 0 {
                    let job = (self.job_id.as_str(), self.rank);
                    let fetch = self
                        .client
                        .fetch_preprocessing(job, true, reply.merged_bytes);
                    self.rt.block_on(fetch)?
                } else {
                    reply.merged
                };
                return Ok(payload::decode("PrepareReply.merged", &merged)?);
            }
            if self.cancelled() {
                return Err(ExecutorError::Cancelled);
            }
            // Sent once; from now on only poll.
            req.has_partial = false;
            req.partial = String::new();
        }
    }
}

impl TaskContext for RemoteContext<'_> {
    fn epoch_plan(&mut self, split: Split, epoch: u64) -> Result<pb::EpochPlan> {
        let req = pb::EpochPlanRequest {
            job_id: self.job_id.clone(),
            rank: self.rank,
            split: match split {
                Split::Train => pb::Split::Train,
                Split::Test => pb::Split::Test,
                Split::Stats => pb::Split::Stats,
            } as i32,
            epoch,
        };
        self.rt.block_on(self.client.epoch_plan(req))
    }

    fn report(&mut self, event: TrainEvent) -> Result<()> {
        use pb::report_request::Report as R;
        let report = match Report::from(&event) {
            Report::Step(s) => R::Step(s),
            Report::Epoch(e) => R::Epoch(e),
            Report::Eval(e) => R::Eval(e),
            Report::Checkpoint(c) => R::Checkpoint(c),
        };
        let req = pb::ReportRequest {
            job_id: self.job_id.clone(),
            rank: self.rank,
            report: Some(report),
            generation: self.ring.generation,
        };
        let reply = self.rt.block_on(self.client.report(req))?;
        if reply.cancel {
            self.cancel.store(true, Ordering::Relaxed);
        }
        self.reforming = reply.reform;
        Ok(())
    }

    fn prepare_source(&mut self, check: &ReadCheck) -> Result<PartitionSource> {
        self.prepare(pb::PreparePhase::Source, check)
    }

    fn prepare_stats(&mut self, partial: &DataStats) -> Result<Preprocessing> {
        self.prepare(pb::PreparePhase::Stats, partial)
    }

    fn recover(&mut self, error: &str, awaiting_state: bool) -> Result<Recovered> {
        self.reforming = false;
        let req = pb::RecoverRequest {
            job_id: self.job_id.clone(),
            executor_id: self.ring.executor_id.clone(),
            rank: self.rank,
            generation: self.ring.generation,
            error: error.to_string(),
            wait_ms: PREPARE_POLL.as_millis() as u64,
            awaiting_state,
        };
        loop {
            let reply = self.rt.block_on(self.client.recover(req.clone()))?;
            if let Some(task) = reply.task {
                let (Some(header), Some(pb::task::Work::Train(work))) = (&task.header, &task.work)
                else {
                    let why = "the driver re-formed the ring with a task that is not training";
                    return Err(self.reform_failed(why.into()).into());
                };
                self.rank = header.rank;
                self.ring.generation = header.generation;
                let comm = ring::connect(self.ring.listener, header, self.client.url())?;
                return Ok(Recovered {
                    comm,
                    steps_per_epoch: work.steps_per_epoch,
                });
            }
            if reply.cancel {
                let why =
                    format!("{error}; the driver did not re-form the ring with this executor");
                return Err(self.reform_failed(why).into());
            }
            if self.cancelled() {
                return Err(ExecutorError::Cancelled);
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn reforming(&self) -> bool {
        self.reforming
    }
}
