//! The train loop's view of a remote driver.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ringflow_proto::pb;
use tokio::runtime::Handle;

use super::client::DriverClient;
use crate::error::Result;
use crate::train::{Report, Split, TaskContext, TrainEvent};

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

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}
