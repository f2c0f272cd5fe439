//! One job and everything that happened to it ([`Job`]), split by concept, each file opening
//! with the duties it owns:
//!
//! - [`kind`]: what the job does, and what follows from that alone (its executors, device,
//!   memory, timeouts, output directory);
//! - [`lifecycle`]: its state, start and one end, its summary, and the lock on its output;
//! - [`output`]: what a prediction's end does to its output with `--overwrite`;
//! - [`membership`]: its ranks, the ring's generation and secret, and who is in a re-formed
//!   ring ([`membership::Membership`]);
//! - [`recovery`]: lost ranks, requests to recover, and communication errors held while a root
//!   cause may come;
//! - [`task`]: each rank's task and its partitions of each epoch;
//! - [`prepare`]: the data source and the statistics the ranks agree on before training
//!   ([`prepare::Prepare`]);
//! - [`progress`]: what the ranks report while they run, and their ends
//!   ([`ranks::RankProgress`]);
//! - [`feed`]: the events and messages watchers follow, and the event log
//!   ([`feed::EventFeed`]).
//!
//! Nothing here reads the clock to decide: every rule takes the current time as an argument,
//! so tests give the instants they need.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringflow_core::pb::{self, JobState};
use ringflow_ml::Device;
use tracing::info;

use crate::error::JobError;
use crate::planner::JobPlan;
use crate::planner::memory::MemoryEstimate;

mod feed;
mod kind;
mod lifecycle;
mod membership;
mod output;
mod prepare;
mod ranks;
mod recovery;
mod task;
#[cfg(test)]
mod tests;

pub use kind::JobKind;
pub(super) use membership::rank_order;
pub(super) use task::training_preprocessing;

/// A job and everything that happened to it.
pub struct Job {
    /// The job's id.
    pub id: String,
    /// What it does.
    pub kind: JobKind,
    /// Where it is in its lifecycle.
    pub state: JobState,
    /// When it was submitted.
    pub submitted: Instant,
    ended: Option<Instant>,
    error: Option<String>,
    /// A rank's communication error, held (since the instant) while a root cause may come.
    held_error: Option<(JobError, Instant)>,
    /// The lock on the job's output directory, held until the job ends.
    lock: Option<crate::outputs::DirLock>,
    /// What one executor needs for the job.
    memory: MemoryEstimate,
    members: membership::Membership,
    prepare: prepare::Prepare,
    progress: ranks::RankProgress,
    feed: feed::EventFeed,
    /// The training split's partitions of one epoch, for every rank of the current ring.
    plans: Mutex<Option<(u64, Vec<pb::EpochPlan>)>>,
    /// The preprocessing known before any data was read, as JSON
    /// ([`task::planned_preprocessing`]), shared by every task (and fetch) of the job.
    planned_preprocessing: Arc<str>,
}

impl Job {
    /// A queued job, submitted at `now`, waiting for its executors.
    pub fn new(id: String, kind: JobKind, now: Instant) -> Job {
        let memory = kind.memory_estimate();
        let planned_preprocessing = task::planned_preprocessing(&kind);
        let mut job = Job {
            feed: feed::EventFeed::new(id.clone(), now),
            id,
            kind,
            state: JobState::Queued,
            submitted: now,
            ended: None,
            error: None,
            held_error: None,
            lock: None,
            memory,
            members: membership::Membership::default(),
            prepare: prepare::Prepare::default(),
            progress: ranks::RankProgress::new(),
            plans: Mutex::new(None),
            planned_preprocessing,
        };
        job.message(job.kind.introduction(&job.id));
        job.message(format!("memory: {}", job.memory.summary()));
        for line in job.kind.model_summary() {
            job.message(line);
        }
        if let Some(s) = job.plan().and_then(|p| p.sequence.as_ref()) {
            let line = s.described.clone();
            job.message(line);
        }
        let notes = job.plan().map(|p| p.notes.clone()).unwrap_or_default();
        for note in notes {
            job.message(note);
        }
        let warnings = job.plan().map(|p| p.warnings.clone()).unwrap_or_default();
        for w in warnings {
            // People see it as a job message; the driver's log keeps it too.
            info!(job = %job.id, "{w}");
            job.message(format!("warning: {w}"));
        }
        job.set_state(JobState::Waiting);
        job.message(format!("waiting for {} executors", job.executors_needed()));
        job
    }

    /// What one executor needs for the job, estimated when it was submitted.
    pub fn memory(&self) -> &MemoryEstimate {
        &self.memory
    }

    /// Executors the job trains on.
    pub fn executors_needed(&self) -> usize {
        self.kind.executors_needed()
    }

    /// The device the job's executors must have: `cluster.device` for training and inference,
    /// the CPU for benchmarks.
    pub fn device(&self) -> Device {
        self.kind.device()
    }

    /// How long the job may wait for its executors.
    pub fn rendezvous_timeout(&self) -> Duration {
        self.kind.rendezvous_timeout()
    }

    /// The plan of a training or inference job.
    pub fn plan(&self) -> Option<&JobPlan> {
        self.kind.plan()
    }

    /// Epochs completed by every rank.
    pub fn epochs_done(&self) -> u64 {
        self.progress.epochs_done()
    }

    /// The job's secret (authenticates ring connections and Flight tickets).
    pub fn secret(&self) -> &[u8] {
        self.members.secret()
    }

    /// The executors of the running job, by rank.
    pub fn ranks(&self) -> &[pb::ExecutorInfo] {
        self.members.ranks()
    }

    /// The latest in-epoch progress report of `rank`, if any (for the web UI).
    pub fn last_step(&self, rank: usize) -> Option<&pb::StepReport> {
        self.progress.last_step(rank)
    }

    /// The step-phase times of `rank`'s latest reported epoch (for the web UI).
    pub fn last_phases(&self, rank: usize) -> Option<pb::PhaseTimes> {
        self.progress.reports().latest_phases(rank)
    }

    /// The ranks' reports combined: finished epochs and evaluations (for the web UI, which
    /// shows the figures of token-sequence jobs that the job's events do not carry).
    pub fn reports(&self) -> &crate::progress::JobProgress {
        self.progress.reports()
    }

    /// An executor registered with the driver while this job waits or runs.
    pub fn executor_registered(&mut self, info: &pb::ExecutorInfo) {
        if !self.is_finished() {
            self.feed.log(crate::events::Event::ExecutorRegistered {
                executor_id: info.executor_id.clone(),
                host: info.host.clone(),
            });
        }
    }
}
