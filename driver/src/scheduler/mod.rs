//! The driver's state: registered executors, jobs, rendezvous, ranks, health.
//!
//! [`Scheduler`] is a plain state machine driven by the RPC handlers and by a periodic
//! [`Scheduler::tick`]; it never blocks and takes the current time as an argument, so every rule
//! (rendezvous deadlines, heartbeat deadlines, rank assignment) is testable without a clock.
//! Like Ballista's scheduler state, it holds its state in managers, and its rules are split by
//! concept, each file opening with the duties it owns:
//!
//! - [`executors`]: the executor manager: registration, heartbeats, attachment streams, and
//!   who is available for a job;
//! - [`lost_executors`]: health: how an executor is found lost (exit status, closed connection,
//!   silence), how the cause is named, and what the loss does to its job;
//! - [`queue`]: the job manager: planning, job ids, submission with its event log and output
//!   lock, cancellation;
//! - [`rendezvous`]: queued jobs meet idle executors with their device and memory ([`fit`]),
//!   take ranks, or give up after `cluster.rendezvous_timeout_s`;
//! - [`tasks`]: task handout (and tasks that did not arrive), the preprocessing executors
//!   fetch, preparation, recovery requests, reports and each rank's end;
//! - [`bounds`]: what a planned job's tasks and epoch plans would carry, checked against the
//!   control plane's bounds before the job is queued, refusing it with a [`bounds_error`];
//! - [`retention`]: the driver keeps the `retained_jobs` most recently finished jobs and
//!   forgets older ones, so its memory does not grow with the jobs it has run;
//! - [`job`]: one job, itself split by concept (lifecycle, membership, recovery, tasks,
//!   preparation, progress, events);
//! - [`registry`]: what the driver knows about each executor.

mod bounds;
pub mod bounds_error;
mod executors;
mod fit;
mod job;
mod lost_executors;
mod queue;
mod registry;
mod rendezvous;
mod retention;
mod tasks;

pub use job::{Job, JobKind};
pub use lost_executors::{GoneReason, MAX_LAST_WORDS, ProcessEnd, signal_name};
pub use registry::ExecutorEntry;
pub use retention::DEFAULT_RETAINED_JOBS;

use std::time::{Duration, Instant};

use ringflow_core::pb;
use ringflow_ml::nn::ModelRegistry;

use crate::error::{DriverError, JobError};
use executors::ExecutorManager;
use queue::JobManager;

/// Timing rules of a driver.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// How often executors heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which an executor is considered lost.
    pub executor_timeout: Duration,
    /// How long a closed executor connection waits for a better cause (an exit status, a sign
    /// of life) before the executor is declared lost, and how long a rank's communication error
    /// waits for a root cause before it fails the job.
    pub loss_grace: Duration,
    /// How many finished jobs the driver keeps (with their events and summaries); older ones
    /// are forgotten ([`retention`]).
    pub retained_jobs: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            heartbeat_interval: Duration::from_millis(1000),
            executor_timeout: Duration::from_secs(15),
            loss_grace: Duration::from_millis(1500),
            retained_jobs: DEFAULT_RETAINED_JOBS,
        }
    }
}

/// Everything the driver knows.
pub struct Scheduler {
    config: SchedulerConfig,
    registry: ModelRegistry,
    /// This driver process's id (changes on restart).
    pub driver_id: String,
    /// The executor manager ([`executors`]).
    executors: ExecutorManager,
    /// The job manager ([`queue`]).
    jobs: JobManager,
}

/// A refusal of an RPC, mapped to a gRPC status by the service.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The caller speaks another protocol version.
    Version(String),
    /// The request names something unknown or is malformed.
    Invalid(String),
    /// No such job or executor.
    NotFound(String),
}

impl From<JobError> for Refusal {
    /// An unknown job is not found; any other error about a job makes the request invalid.
    fn from(e: JobError) -> Refusal {
        match e {
            JobError::NoSuchJob(_) => Refusal::NotFound(e.to_string()),
            _ => Refusal::Invalid(e.to_string()),
        }
    }
}

impl Scheduler {
    /// A scheduler with no executors and no jobs.
    pub fn new(config: SchedulerConfig, registry: ModelRegistry) -> Scheduler {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Scheduler {
            config,
            registry,
            driver_id: format!("driver-{:x}", stamp & 0xffff_ffff_ffff),
            executors: ExecutorManager::new(),
            jobs: JobManager::new(),
        }
    }

    /// A scheduler whose jobs write no event logs (for tests of its rules).
    pub fn without_event_logs(mut self) -> Scheduler {
        self.jobs.without_event_logs();
        self
    }

    /// The timing rules.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The model registry jobs are checked against.
    pub fn registry(&self) -> &ModelRegistry {
        &self.registry
    }

    /// Periodic work: drop silent executors, fail jobs that lost one or waited too long, start
    /// queued jobs that now have enough idle executors, and forget old finished jobs.
    pub fn tick(&mut self, now: Instant) {
        self.drop_lost_executors(now);
        self.settle_held_errors(now);
        for job in self.jobs.values_mut() {
            job.check_lock(now);
            let idle = self
                .executors
                .idle_for(job.device(), job.memory().bytes)
                .next()
                .is_some();
            job.set_joinable(idle && job.state == pb::JobState::Running);
        }
        self.expire_waiting_jobs(now);
        self.start_jobs(now);
        self.release_finished();
        self.forget_finished();
    }
}

/// Maps a planning failure to what the submitter sees.
pub fn planning_refusal(e: DriverError) -> Refusal {
    Refusal::Invalid(e.to_string())
}

#[cfg(test)]
pub(crate) mod tests;
