//! Task handout: what the scheduler says to a running job's executors, and what it hears back.
//! This file owns:
//!
//! - handing each chosen executor its task once ([`Scheduler::take_task`]), and freeing those
//!   whose job ended before they picked it up;
//! - the preparation phases, merged across ranks ([`Scheduler::prepare`]);
//! - a rank's request to recover, with the idle executors that may join the new ring, and the
//!   new ranks of the executors in it ([`Scheduler::recover`]);
//! - progress reports, counted only from the current ring ([`Scheduler::report`]);
//! - a rank's end, with what its executor reported as it failed ([`Scheduler::finish_task`]).

use std::time::Instant;

use ringflow_proto::pb;

use super::{Refusal, Scheduler};
use crate::error::JobError;

impl Scheduler {
    /// The task waiting for `executor_id`, if any (marks it delivered).
    pub fn take_task(&mut self, executor_id: &str) -> Option<pb::Task> {
        let entry = self.executors.get_mut(executor_id)?;
        if entry.delivered {
            return None;
        }
        let assigned = entry.assigned.as_ref()?;
        let job = self.jobs.get(&assigned.job_id)?;
        if job.is_finished() {
            return None;
        }
        let task = job.task_for(assigned.rank);
        entry.delivered = true;
        Some(task)
    }

    /// A rank's partial for a preparation phase: the merged result once every rank has sent
    /// one, and whether the rank should stop.
    pub fn prepare(
        &mut self,
        req: &pb::PrepareRequest,
        partial: Option<&str>,
        now: Instant,
    ) -> Result<(Option<String>, bool), Refusal> {
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
