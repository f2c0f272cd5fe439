//! The train loop's view of a remote driver.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ringflow_proto::pb;
use tokio::runtime::Handle;

use super::client::DriverClient;
use crate::error::{ExecutorError, Result};
use crate::train::{PreparePhase, Report, Split, TaskContext, TrainEvent};

/// How long one preparation call may wait at the driver for the other ranks.
const PREPARE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A [`TaskContext`] that asks the driver over RPC.
pub struct RemoteContext {
    rt: Handle,
    client: DriverClient,
    job_id: String,
    rank: u32,
    cancel: Arc<AtomicBool>,
}

impl RemoteContext {
    /// A context for rank `rank` of `job_id`; `cancel` is also set by heartbeat replies.
    pub fn new(
        rt: Handle,
        client: DriverClient,
        job_id: String,
        rank: u32,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        RemoteContext {
            rt,
            client,
            job_id,
            rank,
            cancel,
        }
    }
}

impl TaskContext for RemoteContext {
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
        };
        let req = pb::ReportRequest {
            job_id: self.job_id.clone(),
            rank: self.rank,
            report: Some(report),
        };
        if self.rt.block_on(self.client.report(req))? {
            self.cancel.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn prepare(&mut self, phase: PreparePhase, partial: String) -> Result<String> {
        let mut req = pb::PrepareRequest {
            job_id: self.job_id.clone(),
            rank: self.rank,
            phase: match phase {
                PreparePhase::Source => pb::PreparePhase::Source,
                PreparePhase::Stats => pb::PreparePhase::Stats,
            } as i32,
            partial_json: partial,
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
                return Ok(reply.merged_json);
            }
            if self.cancelled() {
                return Err(ExecutorError::Cancelled);
            }
            // Sent once; from now on only poll.
            req.has_partial = false;
            req.partial_json = String::new();
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}
