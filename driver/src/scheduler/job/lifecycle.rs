//! A job's lifecycle: waiting for executors, running, and how it ended. This file owns:
//!
//! - the job's state and the changes of it that watchers see;
//! - its start on the chosen executors ([`Job::start`]);
//! - its one end ([`Job::fail`], [`Job::cancel`], success once every rank finished): when it
//!   ended, why it failed, its summary (the last event, and the event log's last record);
//! - the lock on its output directory, held until it ends, and its failure when another job
//!   took that lock over.

use std::time::{Duration, Instant};

use ringflow_core::pb::{self, JobState};
use ringflow_core::spec::DataSource;
use ringflow_core::wire::payload::{self, Payload};
use tracing::{info, warn};

use super::{Job, JobKind};
use crate::error::JobError;
use crate::events::Event;
use crate::outputs::DirLock;
use crate::summary::{BenchSummary, JobEnd, JobSummary};

/// How long ending a job waits for the lock on its output directory to be removed.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// `summary` as a payload and as JSON (read back from its text, so that numbers read as they
/// were written).
fn written<T: Payload>(summary: &T) -> (String, serde_json::Value) {
    let text = serde_json::to_string(summary).expect("summaries serialize");
    let value = serde_json::from_str(&text).expect("a summary's JSON reads back");
    (payload::encode(summary), value)
}

/// How summaries and the event log name an ended job's state.
fn ended_as(state: JobState) -> &'static str {
    match state {
        JobState::Succeeded => "succeeded",
        JobState::Cancelled => "cancelled",
        _ => "failed",
    }
}

impl Job {
    /// True once the job succeeded, failed or was cancelled.
    pub fn is_finished(&self) -> bool {
        matches!(
            self.state,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// True when running tasks should stop.
    pub fn should_stop(&self) -> bool {
        self.is_finished()
    }

    /// Why it failed.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// When the job ended, if it has.
    pub fn ended(&self) -> Option<Instant> {
        self.ended
    }

    /// Seconds since submission (or until the end).
    pub fn age(&self, now: Instant) -> f64 {
        self.ended
            .unwrap_or(now)
            .duration_since(self.submitted)
            .as_secs_f64()
    }

    pub(super) fn set_state(&mut self, state: JobState) {
        self.state = state;
        self.feed.push(pb::job_event::Event::State(state as i32));
    }

    /// Starts the job on `ranks` (index = rank).
    pub fn start(&mut self, ranks: Vec<pb::ExecutorInfo>, _now: Instant) {
        let n = ranks.len();
        for (rank, e) in ranks.iter().enumerate() {
            let line = format!(
                "rank {rank}: executor {} on {} (ring {})",
                e.executor_id, e.host, e.ring_address
            );
            self.message(line);
        }
        info!(job = %self.id, executors = n, "job started");
        self.members.start(ranks);
        let resume = match &self.kind {
            JobKind::Train(plan) => plan.resume,
            JobKind::Infer { .. } | JobKind::Bench { .. } => None,
        };
        if let Some(r) = resume {
            self.message(format!(
                "resuming from the checkpoint at epoch {} step {}",
                r.epoch, r.step
            ));
        }
        self.progress.start(n, resume.map_or(0, |r| r.epoch));
        self.prepare = super::prepare::Prepare::for_ranks(n);
        let ranks = self.members.rank_infos();
        self.feed.log(Event::Started { ranks });
        self.set_state(JobState::Running);
    }

    /// Fails the job (once; later failures are consequences and are only logged).
    pub fn fail(&mut self, error: JobError, now: Instant) {
        if self.is_finished() {
            warn!(job = %self.id, "after the job ended: {error}");
            return;
        }
        warn!(job = %self.id, "job failed: {error}");
        self.error = Some(error.to_string());
        self.end(JobState::Failed, now);
    }

    /// Cancels the job.
    pub fn cancel(&mut self, now: Instant) {
        if !self.is_finished() {
            self.message("cancelled".into());
            self.end(JobState::Cancelled, now);
        }
    }

    /// Ends the job in `state` at `now`: its summary goes to the event log (closed before
    /// watchers learn of the end), the lock on its output directory is released, and the
    /// summary is the last event.
    pub(super) fn end(&mut self, state: JobState, now: Instant) {
        if state != JobState::Succeeded {
            self.abandon_output();
        }
        self.ended = Some(now);
        let (summary, value) = self.summary(state, now);
        if self.feed.has_log() {
            self.feed.log(Event::Finished {
                state: ended_as(state).into(),
                error: self.error.clone(),
                summary: Some(value),
            });
            // The log is complete before watchers learn that the job ended.
            self.feed.close_log();
        }
        // So is the output directory free for the next job.
        self.release_lock();
        self.set_state(state);
        self.feed.push(pb::job_event::Event::Summary(summary));
    }

    /// The summary of the job ending in `state` at `now`, as a payload and as the event log's
    /// JSON: a [`JobSummary`] for training and inference, a [`BenchSummary`] for benchmarks.
    fn summary(&self, state: JobState, now: Instant) -> (String, serde_json::Value) {
        let wall_s = now.duration_since(self.submitted).as_secs_f64();
        match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => {
                let end = JobEnd {
                    job: &self.kind.name(),
                    job_id: &self.id,
                    executors: self.members.ranks().len().max(self.executors_needed()),
                    wall_s,
                    error: self.error.clone(),
                    cancelled: state == JobState::Cancelled,
                };
                let classification = plan.spec.train.loss.is_classification();
                let mut s = JobSummary::new(end, classification, self.progress.reports());
                s.data_source = Some(match self.prepare.source() {
                    Some(source) => source.as_str().into(),
                    None if plan.spec.data.source == DataSource::Driver => "driver".into(),
                    None => "direct".into(),
                });
                (s.recoveries, s.executors_lost) = self.members.recoveries();
                if let Some(model) = &plan.summary {
                    s.parameters = Some(model.total());
                    s.trainable_parameters = Some(model.trainable);
                }
                if let JobKind::Train(plan) = &self.kind {
                    s.test_unknown_token_rate = plan.test_tokens.map(|t| t.unknown_rate());
                    s.compression = Some(plan.spec.cluster.compression.as_str().into());
                    s.matmul_precision = Some(plan.spec.train.matmul_precision.as_str().into());
                    s.winograd = Some(plan.spec.train.winograd);
                }
                if let JobKind::Infer { predict, .. } = &self.kind {
                    s.kind = crate::work::JobWork::inference(predict.is_some());
                    s.output = predict.as_ref().map(|(o, _)| o.clone());
                    s.model_path = None;
                }
                written(&s)
            }
            JobKind::Bench { executors, spec } => written(&BenchSummary {
                job_id: self.id.clone(),
                status: ended_as(state).into(),
                error: self.error.clone(),
                executors: *executors,
                floats: spec.floats,
                seconds: self.progress.bench_seconds().to_vec(),
            }),
        }
    }

    /// Holds `lock`, the lock on the job's output directory, until the job ends; what it says
    /// (a takeover, a store that cannot be locked) goes to the job's messages.
    pub fn hold(&mut self, lock: DirLock) {
        if let Some(note) = lock.note() {
            self.message(note.to_string());
        }
        self.lock = Some(lock);
    }

    /// Fails the job when another job took over the lock on its output directory.
    pub fn check_lock(&mut self, now: Instant) {
        if self.is_finished() {
            return;
        }
        if let Some(why) = self.lock.as_ref().and_then(DirLock::lost) {
            self.lock = None;
            self.fail(JobError::LockLost(why), now);
        }
    }

    /// Removes the lock on the job's output directory, if it holds one.
    pub fn release_lock(&mut self) {
        if let Some(mut lock) = self.lock.take() {
            lock.release(LOCK_RELEASE_WAIT);
        }
    }
}
