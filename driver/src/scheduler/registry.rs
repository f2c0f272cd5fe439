//! What the driver knows about each executor.

use std::time::{Duration, Instant};

use ringflow_core::pb;
use ringflow_ml::Device;

/// The job and rank an executor was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The job.
    pub job_id: String,
    /// Its rank in that job.
    pub rank: u32,
}

/// One registered executor.
#[derive(Clone, Debug)]
pub struct ExecutorEntry {
    /// Its registration (refreshed by every heartbeat).
    pub info: pb::ExecutorInfo,
    /// When it was last heard from.
    pub last_seen: Instant,
    /// Its current task, if any.
    pub assigned: Option<Assignment>,
    /// Whether it has picked that task up.
    pub delivered: bool,
    /// When its latest attachment stream closed, while it has shown no sign of life since.
    pub detached_at: Option<Instant>,
    /// What it reported as it died (a panic, an allocation that failed), since its current
    /// task was assigned.
    pub last_words: Option<String>,
}

/// A heartbeat this soon after an attachment stream closed may have been in flight on the
/// same connection: only a later one shows that the executor lives.
const SIGN_OF_LIFE_AFTER: Duration = Duration::from_millis(250);

impl ExecutorEntry {
    /// A newly registered, idle executor.
    pub fn new(info: pb::ExecutorInfo, now: Instant) -> Self {
        ExecutorEntry {
            info,
            last_seen: now,
            assigned: None,
            delivered: false,
            detached_at: None,
            last_words: None,
        }
    }

    /// The executor was heard from (a registration or a heartbeat) at `now`: a closed
    /// attachment stream before it no longer counts as a loss, unless the call may have been
    /// in flight when the connection closed.
    pub fn heard_from(&mut self, now: Instant) {
        self.last_seen = now;
        if self
            .detached_at
            .is_some_and(|at| now.saturating_duration_since(at) >= SIGN_OF_LIFE_AFTER)
        {
            self.detached_at = None;
        }
    }

    /// Gives the executor rank `rank` of `job_id`.
    pub fn assign(&mut self, job_id: &str, rank: u32) {
        self.assigned = Some(Assignment {
            job_id: job_id.to_string(),
            rank,
        });
        self.delivered = false;
        self.last_words = None;
    }

    /// Whether the executor advertised a device that can run a job on `device`: every executor
    /// runs CPU jobs; a job on `"cuda"` (ordinal 0, placed by local rank) needs any `cuda:*`
    /// device, one pinned to `cuda:N` needs that one.
    pub fn offers(&self, device: Device) -> bool {
        match device {
            Device::Cpu => true,
            Device::Cuda(0) => self.info.devices.iter().any(|d| d.starts_with("cuda")),
            Device::Cuda(n) => self.info.devices.iter().any(|d| *d == format!("cuda:{n}")),
        }
    }

    /// Whether the executor has `bytes` of memory for a task (an executor that did not say
    /// how much it has is trusted).
    pub fn fits(&self, bytes: u64) -> bool {
        self.info.memory_bytes == 0 || bytes <= self.info.memory_bytes
    }

    /// "the 64.0 MiB (--memory) of executor ID on HOST": its memory, as refusals name it.
    pub fn memory_text(&self) -> String {
        let source = match self.info.memory_source.as_str() {
            "" => String::new(),
            s => format!(" ({s})"),
        };
        format!(
            "the {}{source} of executor {} on {}",
            ringflow_core::size::format_bytes(self.info.memory_bytes),
            self.info.executor_id,
            self.info.host
        )
    }

    /// "executor ID (rank R) on HOST": how errors name it.
    pub fn describe(&self, rank: u32) -> String {
        format!(
            "executor {} (rank {rank}) on {}",
            self.info.executor_id, self.info.host
        )
    }
}
