//! Task handout: what the scheduler says to a running job's executors, and what it hears back.
//! This file owns:
//!
//! - handing each chosen executor its task once ([`Scheduler::take_task`]), checked against
//!   the size of a message, and freeing those whose job ended before they picked it up;
//! - a task that did not reach its executor: the executor says so
//!   ([`Scheduler::task_not_received`]) or asks for a task again, and the job fails at once,
//!   naming it and the cause;
//! - the job's preprocessing for the executors that fetch it in chunks
//!   ([`Scheduler::preprocessing`]);
//! - the preparation phases, merged across ranks ([`Scheduler::prepare`]);
//! - a rank's request to recover, with the idle executors that may join the new ring, and the
//!   new ranks of the executors in it ([`Scheduler::recover`]);
//! - progress reports, counted only from the current ring ([`Scheduler::report`]);
//! - a rank's end, with what its executor reported as it failed ([`Scheduler::finish_task`]).

use std::sync::Arc;
use std::time::Instant;

use ringflow_core::pb;
use ringflow_core::wire::check_task;

use super::{Refusal, Scheduler};
use crate::error::JobError;

/// The longest cause an executor may give for a task it did not receive, in bytes.
const MAX_CAUSE_BYTES: usize = 1024;

impl Scheduler {
    /// The task waiting for `executor_id`, if any (marks it delivered). An executor that asks
    /// again after it was sent its task, without having reported that task's end, never
    /// received it: its job fails, naming it. So does a job whose task is larger than a message
    /// may be.
    pub fn take_task(&mut self, executor_id: &str, now: Instant) -> Option<pb::Task> {
        let entry = self.executors.get(executor_id)?;
        let assigned = entry.assigned.clone()?;
        if entry.delivered {
            let cause = "it asked for a task again after the driver had sent it this one, \
                         without reporting that task's end (the reply was lost on its way)";
            self.fail_undelivered(executor_id, cause, now);
            return None;
        }
        let job = self.jobs.get_mut(&assigned.job_id)?;
        if job.is_finished() {
            return None;
        }
        let task = job.task_for(assigned.rank);
        if let Err(e) = check_task(&task) {
            let rank = entry.describe(assigned.rank);
            let error = JobError::TaskTooLarge {
                rank,
                reason: e.to_string(),
            };
            job.fail(error, now);
            self.release_finished();
            return None;
        }
        if let Some(entry) = self.executors.get_mut(executor_id) {
            entry.delivered = true;
        }
        Some(task)
    }

    /// Executor `executor_id` could not receive or decode its poll's reply (`error` says
    /// why): if that reply held its task, the task's job fails at once naming the executor
    /// and the cause, and the executor is free again. A reply without a task changes nothing.
    pub fn task_not_received(&mut self, executor_id: &str, error: &str, now: Instant) {
        let delivered = self
            .executors
            .get(executor_id)
            .is_some_and(|e| e.assigned.is_some() && e.delivered);
        if delivered {
            self.fail_undelivered(executor_id, &one_line(error, MAX_CAUSE_BYTES), now);
        }
    }

    /// Fails the job whose task `executor_id` was sent but did not receive (`cause`), and
    /// frees the executor.
    fn fail_undelivered(&mut self, executor_id: &str, cause: &str, now: Instant) {
        let Some(entry) = self.executors.get_mut(executor_id) else {
            return;
        };
        let Some(assigned) = entry.assigned.take() else {
            return;
        };
        entry.delivered = false;
        let error = JobError::TaskNotReceived {
            executor: entry.describe(assigned.rank),
            cause: cause.to_string(),
        };
        if let Some(job) = self.jobs.get_mut(&assigned.job_id)
            && !job.is_finished()
        {
            tracing::warn!(job = %job.id, "{error}");
            job.fail(error, now);
        }
        self.release_finished();
    }

    /// The preprocessing of job `job_id` that its executors fetch: the one its tasks announce,
    /// or (`statistics`) the merged statistics of its training split.
    pub fn preprocessing(&self, job_id: &str, statistics: bool) -> Result<Arc<str>, Refusal> {
        let job = self
            .jobs
            .get(job_id)
            .ok_or_else(|| Refusal::NotFound(format!("no job {job_id:?}")))?;
        if !statistics {
            return Ok(job.preprocessing());
        }
        job.merged_statistics().ok_or_else(|| {
            Refusal::Invalid(format!(
                "job {job_id} has not merged the statistics of its training split"
            ))
        })
    }

    /// A rank's partial for a preparation phase: the merged result once every rank has sent
    /// one, and whether the rank should stop.
    pub fn prepare(
        &mut self,
        req: &pb::PrepareRequest,
        partial: Option<&str>,
        now: Instant,
    ) -> Result<(Option<Arc<str>>, bool), Refusal> {
        let job = self.jobs.find_mut(&req.job_id)?;
        if job.should_stop() {
            return Ok((None, true));
        }
        let phase = pb::PreparePhase::try_from(req.phase)
            .map_err(|_| Refusal::Invalid(format!("unknown preparation phase {}", req.phase)))?;
        let merged = job.prepare(req.rank as usize, phase, partial, now)?;
        let stop = job.should_stop();
        if stop {
            self.release_finished();
        }
        Ok((merged, stop))
    }

    /// A rank of an elastic job lost its ring: its new task once the ring is re-formed
    /// (`Ok(None)`: not yet), or why it must stop.
    pub fn recover(
        &mut self,
        req: &pb::RecoverRequest,
        now: Instant,
    ) -> Result<Option<pb::Task>, JobError> {
        let job = self.jobs.find_mut(&req.job_id)?;
        let min = job.kind.min_executors().unwrap_or(usize::MAX);
        // Only executors with the job's device and memory may join its re-formed ring.
        let idle = self
            .executors
            .idle_for(job.device(), job.memory().bytes)
            .map(|e| e.info.clone())
            .collect();
        let before = job.generation();
        let task = job.recover(req, min, idle, now);
        if job.generation() > before {
            // Survivors keep working for the job, under their new ranks.
            self.executors.reassign(&req.job_id, job.ranks());
        }
        if task.is_err() {
            self.release_finished();
        }
        task
    }

    /// A rank's report; returns whether the rank should stop, and whether its ring re-forms.
    pub fn report(
        &mut self,
        req: pb::ReportRequest,
        now: Instant,
    ) -> Result<pb::ReportReply, Refusal> {
        let job = self.jobs.find_mut(&req.job_id)?;
        // Ranks are numbered anew in each generation of the ring: a late report from an older
        // one would be counted for another rank.
        if req.generation == job.generation() {
            job.report(req.rank as usize, req.report, now);
        }
        Ok(pb::ReportReply {
            cancel: job.should_stop(),
            reform: job.is_recovering(),
        })
    }

    /// A rank's end.
    pub fn finish_task(&mut self, req: pb::FinishTaskRequest, now: Instant) -> Result<(), Refusal> {
        let entry = self.executors.get(&req.executor_id);
        let executor = entry.map(|e| e.describe(req.rank));
        let words = entry.and_then(|e| e.last_words.clone());
        let job = self.jobs.find_mut(&req.job_id)?;
        let who = executor.unwrap_or_else(|| format!("rank {} ({})", req.rank, req.executor_id));
        let mut result = req.result;
        // What the executor reported as it failed (a thread's panic) is part of its error, and
        // makes it a root cause rather than a consequence.
        if let (Some(pb::finish_task_request::Result::Error(e)), Some(words)) =
            (&mut result, &words)
        {
            e.push_str("; it reported: ");
            e.push_str(words);
        }
        let consequence = req.communication && words.is_none();
        job.finish_rank(
            req.rank as usize,
            &req.executor_id,
            result,
            consequence,
            &who,
            now,
        );
        if let Some(e) = self.executors.get_mut(&req.executor_id)
            && e.assigned.as_ref().is_some_and(|a| a.job_id == req.job_id)
        {
            e.assigned = None;
        }
        self.release_finished();
        Ok(())
    }

    /// Frees executors whose job has ended (or was forgotten) but that are still marked as
    /// assigned and have not yet received their task.
    pub(super) fn release_finished(&mut self) {
        let jobs = &self.jobs;
        self.executors
            .free_undelivered(|job_id| jobs.get(job_id).is_none_or(|j| j.is_finished()));
    }
}

/// `text` on one line (its line breaks as spaces), cut to at most `max` bytes.
fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > max {
        let mut end = max;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
    out
}
