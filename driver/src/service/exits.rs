//! Reports of executor processes that ended, from the process that started them.

use std::sync::Arc;
use std::time::Instant;

use super::Shared;
use crate::error::JobError;
use crate::scheduler::ProcessEnd;

/// Tells a driver that executor processes ended, from any thread: `ringflow local` waits on the
/// executors it started and reports each one's exit status at once, before any heartbeat is
/// missed or any connection is noticed closed.
#[derive(Clone)]
pub struct ExitReporter(pub(super) Arc<Shared>);

impl ExitReporter {
    /// The executor process `pid` on `host` ended `how`: the job it trained fails (or, elastic,
    /// re-forms its ring) naming it and `how`. Returns false when no registered executor has
    /// that pid on that host (it ended before it registered, or it was dropped already).
    pub fn executor_exited(&self, host: &str, pid: u32, how: ProcessEnd) -> bool {
        let known = self
            .0
            .lock()
            .executor_exited(host, pid, how, Instant::now());
        if known {
            self.0.tick();
        }
        known
    }

    /// Fails job `job_id` with `error` if it is still waiting for its executors (one that
    /// should have joined it ended before it registered); returns whether it did.
    pub fn fail_waiting_job(&self, job_id: &str, error: String) -> bool {
        let mut s = self.0.lock();
        let failed = s.fail_waiting(job_id, JobError::Executor(error), Instant::now());
        drop(s);
        if failed {
            self.0.tick();
        }
        failed
    }
}
