//! How a job survives losing executors. This file owns:
//!
//! - a lost rank: an elastic job re-forms its ring without it ([`Job::rank_lost`]), any other
//!   job fails;
//! - a rank's request to recover after its ring broke ([`Job::recover`]): once every rank has
//!   asked or was lost, the new ring ([`super::membership`] decides who is in it), announced in
//!   the job's messages and event log, and the new task of each member;
//! - a rank's communication error, held while its root cause (another executor's loss) may
//!   still come, and the job's failure with it once that wait is over.

use std::time::{Duration, Instant};

use ringflow_core::pb::{self, JobState};
use tracing::info;

use super::Job;
use super::membership::Reformed;
use crate::error::JobError;
use crate::events::{Event, micros};

impl Job {
    /// How many times the ring was re-formed.
    pub fn generation(&self) -> u32 {
        self.members.generation()
    }

    /// True when the job survives lost executors.
    pub fn is_elastic(&self) -> bool {
        self.kind.is_elastic()
    }

    /// True while an elastic job re-forms its ring (an executor was lost or a rank asked).
    pub fn is_recovering(&self) -> bool {
        self.members.is_recovering()
    }

    /// Counts recoveries and lost executors into a summary.
    pub fn recoveries(&self) -> (u32, usize) {
        self.members.recoveries()
    }

    /// The executor of `rank` stopped heartbeating: an elastic job re-forms its ring without it,
    /// any other job fails.
    pub fn rank_lost(&mut self, rank: usize, why: String, now: Instant) {
        if let Some(e) = self.members.ranks().get(rank).cloned()
            && !self.is_finished()
        {
            self.feed.log(Event::ExecutorLost {
                rank,
                executor_id: e.executor_id,
                host: e.host,
                reason: why.clone(),
            });
        }
        // A rank already failed over its connections (held, waiting for this root cause): the
        // job cannot be recovered without it.
        if self.held_error.is_some()
            || !self.is_elastic()
            || self.state != JobState::Running
            || rank >= self.members.ranks().len()
        {
            self.fail(JobError::Executor(why), now);
            return;
        }
        if self.progress.any_finished() {
            // Training is over on some rank: there is no epoch left to re-form the ring for.
            self.fail(JobError::LostAfterFinish(why), now);
            return;
        }
        self.message(format!("{why}; re-forming the ring without it"));
        self.members.lose(rank, why, now);
    }

    /// A rank of generation `generation` lost its ring (`error`). Returns its new task once the
    /// ring is re-formed, `Ok(None)` while it is not yet, and `Err` when it must stop. Only
    /// `idle` executors may join the new ring, and at least `min_executors` must remain.
    pub fn recover(
        &mut self,
        req: &pb::RecoverRequest,
        min_executors: usize,
        idle: Vec<pb::ExecutorInfo>,
        now: Instant,
    ) -> Result<Option<pb::Task>, JobError> {
        if self.is_finished() {
            return Err(JobError::Ended(self.id.clone()));
        }
        if req.generation < self.members.generation() {
            // The ring was re-formed already: is this executor in it?
            return match self.members.rank_of(&req.executor_id) {
                Some(rank) if !self.is_recovering() => Ok(Some(self.task_for(rank as u32))),
                Some(_) => Ok(None),
                None => Err(JobError::LeftOut),
            };
        }
        let rank = req.rank as usize;
        if !self.is_elastic() || rank >= self.members.ranks().len() {
            return Err(JobError::NotElastic(self.id.clone()));
        }
        if self.members.ranks()[rank].executor_id != req.executor_id {
            return Err(JobError::LeftOut);
        }
        if !self.members.ask(rank, &req.error, req.awaiting_state, now) {
            return Ok(None);
        }
        let settled = match self.members.settle(min_executors) {
            Ok(settled) => settled,
            Err(e) => {
                self.fail(e.clone(), now);
                return Err(e);
            }
        };
        let max = self.kind.max_executors();
        let reformed = self.members.reform(settled, idle, max, now);
        self.announce(&reformed);
        self.progress.regroup(reformed.world_after);
        *self.plans.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // A caller lost while it asked (silent past the heartbeat timeout) is left out.
        match self.members.rank_of(&req.executor_id) {
            Some(rank) => Ok(Some(self.task_for(rank as u32))),
            None => Err(JobError::LeftOut),
        }
    }

    /// Says how the ring was re-formed, in job messages and the event log: who joins, and
    /// whether it was re-formed after a loss (the root cause), after a break with no executor
    /// lost, or at an epoch boundary for joiners.
    fn announce(&mut self, r: &Reformed) {
        for e in &r.joined {
            self.message(format!(
                "executor {} on {} joins the job",
                e.executor_id, e.host
            ));
        }
        let (world_after, waited, cause) = (r.world_after, r.waited, &r.cause);
        if !r.lost.is_empty() {
            let (recoveries, _) = self.members.recoveries();
            self.message(format!(
                "recovery {recoveries}: the ring is re-formed with {world_after} executors \
                 {waited:.1} s after it broke ({cause}); the epoch in progress restarts from \
                 its beginning"
            ));
        } else if r.broke {
            // A rank hung for less than the heartbeat timeout (or the network blipped): every
            // rank asked to recover and none was lost.
            self.message(format!(
                "the ring is re-formed with the same {world_after} executors {waited:.1} s after \
                 it broke ({cause}), with no executor lost; the epoch in progress restarts from \
                 its beginning"
            ));
        } else {
            self.message(format!(
                "the ring is re-formed with {world_after} executors at an epoch boundary"
            ));
        }
        let mut joined: Vec<String> = r.joined.iter().map(|e| e.executor_id.clone()).collect();
        joined.sort();
        self.feed.log(Event::Recovery {
            generation: self.members.generation(),
            world_before: r.world_before,
            world_after,
            lost: r.lost.clone(),
            joined,
            waited_s: micros(waited),
            cause: if r.broke {
                cause.clone()
            } else {
                String::new()
            },
        });
    }

    /// Holds `error`, a rank's communication error at `now`, while a root cause may come
    /// ([`Job::settle_held_error`]); the first one held is kept.
    pub(super) fn hold_error(&mut self, error: JobError, now: Instant) {
        info!(job = %self.id, "holding, while a root cause may come: {error}");
        self.held_error.get_or_insert((error, now));
    }

    /// Whether a rank's communication error waits for a root cause.
    pub fn has_held_error(&self) -> bool {
        self.held_error.is_some() && !self.is_finished()
    }

    /// Fails the job with its held communication error once `grace` has passed without a root
    /// cause, or, while a lost connection of one of its executors is `settling`, once that has
    /// had its own grace too (at most four graces in all).
    pub fn settle_held_error(&mut self, now: Instant, grace: Duration, settling: bool) {
        let Some((_, since)) = &self.held_error else {
            return;
        };
        let held = now.saturating_duration_since(*since);
        if (held >= grace && !settling) || held >= grace * 4 {
            let (error, _) = self.held_error.take().expect("checked");
            self.fail(error, now);
        }
    }
}
