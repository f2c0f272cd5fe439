//! The executor manager ([`ExecutorManager`]): every executor the driver knows. This file owns:
//!
//! - **Registration.** Executors register and then heartbeat with their full registration, so a
//!   restarted driver learns them again from their next heartbeat. A protocol version other
//!   than [`ringflow_core::PROTOCOL_VERSION`] is refused with a message naming both.
//! - **Heartbeats.** Each one refreshes the executor's entry, frees an executor that says it is
//!   idle while its job ended, and tells a running task whether to stop.
//! - **Attachments.** The stream each executor holds open, numbered so that only the end of
//!   its latest counts ([`super::loss`] turns that end into a loss).
//! - **Who is available.** Idle executors with a job's device and memory, and how the
//!   registered ones are described when a job waits for them in vain.
//!
//! How an executor is lost, and what that does to its job, is [`super::loss`]'s.

use std::collections::BTreeMap;
use std::time::Instant;

use ringflow_core::pb;
use ringflow_ml::Device;
use tracing::info;

use super::registry::{Assignment, ExecutorEntry};
use super::{Refusal, Scheduler};

/// The registered executors and their attachment streams.
#[derive(Debug)]
pub(super) struct ExecutorManager {
    entries: BTreeMap<String, ExecutorEntry>,
    /// The number of each executor's open attachment stream (its latest), kept apart from its
    /// entry: an executor dropped as lost (stopped past the heartbeat timeout) that comes back
    /// keeps the stream it opened before, and its end must still count.
    attachments: BTreeMap<String, u64>,
    /// The number the next attachment stream gets (unique in this driver).
    next_attachment: u64,
}

impl ExecutorManager {
    /// No executors.
    pub fn new() -> ExecutorManager {
        ExecutorManager {
            entries: BTreeMap::new(),
            attachments: BTreeMap::new(),
            next_attachment: 1,
        }
    }

    /// The executor `id`.
    pub fn get(&self, id: &str) -> Option<&ExecutorEntry> {
        self.entries.get(id)
    }

    /// The executor `id`, mutable.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut ExecutorEntry> {
        self.entries.get_mut(id)
    }

    /// Every executor, by id.
    pub fn values(&self) -> impl Iterator<Item = &ExecutorEntry> {
        self.entries.values()
    }

    /// How many executors are registered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forgets executor `id`, returning its entry.
    pub fn remove(&mut self, id: &str) -> Option<ExecutorEntry> {
        self.entries.remove(id)
    }

    /// Registers `info` at `now`, or refreshes the registration of an executor already known;
    /// returns whether it is new.
    pub fn register(&mut self, info: pb::ExecutorInfo, now: Instant) -> bool {
        match self.entries.get_mut(&info.executor_id) {
            Some(e) => {
                e.info = info;
                e.heard_from(now);
                false
            }
            None => {
                self.entries
                    .insert(info.executor_id.clone(), ExecutorEntry::new(info, now));
                true
            }
        }
    }

    /// Executor `id` (registered) opened an attachment stream: a sign of life. Returns the
    /// stream's number.
    pub fn attach(&mut self, id: &str) -> u64 {
        if let Some(e) = self.entries.get_mut(id) {
            e.detached_at = None;
        }
        let number = self.next_attachment;
        self.next_attachment += 1;
        self.attachments.insert(id.to_string(), number);
        number
    }

    /// Attachment stream `number` of `id` ended at `now`: when it is the executor's latest,
    /// the executor is detached (lost after the grace without a sign of life); returns whether
    /// it was.
    pub fn detach(&mut self, id: &str, number: u64, now: Instant) -> bool {
        if self.attachments.get(id) != Some(&number) {
            return false;
        }
        self.attachments.remove(id);
        if let Some(e) = self.entries.get_mut(id) {
            e.detached_at = Some(now);
        }
        true
    }

    /// Whether executor `id`'s closed attachment is still being settled (within its grace).
    pub fn is_detached(&self, id: &str) -> bool {
        self.entries
            .get(id)
            .is_some_and(|e| e.detached_at.is_some())
    }

    /// The idle executors that have `device` and `bytes` of memory for a task.
    pub fn idle_for(&self, device: Device, bytes: u64) -> impl Iterator<Item = &ExecutorEntry> {
        self.entries
            .values()
            .filter(move |e| e.assigned.is_none() && e.offers(device) && e.fits(bytes))
    }

    /// Gives the executors of a re-formed ring of `job_id` their ranks (index = rank):
    /// survivors keep working under their new rank, joiners pick their task up with their
    /// next poll.
    pub fn reassign(&mut self, job_id: &str, ranks: &[pb::ExecutorInfo]) {
        for (rank, info) in ranks.iter().enumerate() {
            if let Some(e) = self.entries.get_mut(&info.executor_id) {
                let joining = e.assigned.is_none();
                e.assigned = Some(Assignment {
                    job_id: job_id.to_string(),
                    rank: rank as u32,
                });
                e.delivered = !joining;
            }
        }
    }

    /// Frees the executors assigned to a job that `has_ended` before they picked up their
    /// task.
    pub fn free_undelivered(&mut self, has_ended: impl Fn(&str) -> bool) {
        for e in self.entries.values_mut() {
            if let Some(a) = &e.assigned
                && !e.delivered
                && has_ended(&a.job_id)
            {
                e.assigned = None;
            }
        }
    }

    /// "ID from HOST (idle), …": the registered executors, as a job that waited in vain names
    /// them.
    pub fn describe(&self) -> String {
        self.entries
            .values()
            .map(|e| {
                format!(
                    "{} from {} ({})",
                    e.info.executor_id,
                    e.info.host,
                    if e.assigned.is_some() { "busy" } else { "idle" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// "ID on HOST (devices: …)" for each executor without `device`.
    pub fn lacking(&self, device: Device) -> Vec<String> {
        self.entries
            .values()
            .filter(|e| !e.offers(device))
            .map(|e| {
                format!(
                    "{} on {} (devices: {})",
                    e.info.executor_id,
                    e.info.host,
                    e.info.devices.join(", ")
                )
            })
            .collect()
    }
}

impl Scheduler {
    fn check_version(who: &str, version: u32) -> Result<(), Refusal> {
        if version != ringflow_core::PROTOCOL_VERSION {
            return Err(Refusal::Version(format!(
                "{who} speaks ringflow protocol version {version}, this driver speaks version {}; \
                 run the same ringflow version everywhere",
                ringflow_core::PROTOCOL_VERSION
            )));
        }
        Ok(())
    }

    /// Registers (or re-registers) an executor.
    pub fn register(&mut self, info: pb::ExecutorInfo, now: Instant) -> Result<(), Refusal> {
        let who = format!("executor {} on {}", info.executor_id, info.host);
        Self::check_version(&who, info.protocol_version)?;
        if info.executor_id.is_empty() || info.ring_address.is_empty() {
            return Err(Refusal::Invalid(format!(
                "{who} registered without an id or a ring address"
            )));
        }
        if self.executors.get(&info.executor_id).is_none() {
            info!(executor = %info.executor_id, host = %info.host, ring = %info.ring_address, "executor registered");
            self.jobs.message_waiting(&format!(
                "executor {} registered from {} (ring {})",
                info.executor_id, info.host, info.ring_address
            ));
            for job in self.jobs.values_mut() {
                job.executor_registered(&info);
            }
        }
        self.executors.register(info, now);
        Ok(())
    }

    /// A heartbeat; returns whether the executor's current task should stop.
    pub fn heartbeat(
        &mut self,
        info: pb::ExecutorInfo,
        job_id: &str,
        now: Instant,
    ) -> Result<bool, Refusal> {
        let id = info.executor_id.clone();
        self.register(info, now)?;
        let entry = self.executors.get_mut(&id).expect("just registered");
        // An executor that says it is idle while we think it busy has finished (or restarted).
        if job_id.is_empty()
            && let Some(a) = &entry.assigned
            && entry.delivered
            && self.jobs.get(&a.job_id).is_none_or(|j| j.is_finished())
        {
            entry.assigned = None;
        }
        Ok(!job_id.is_empty() && self.jobs.get(job_id).is_none_or(|j| j.should_stop()))
    }

    /// All executors.
    pub fn executors(&self) -> impl Iterator<Item = &ExecutorEntry> {
        self.executors.values()
    }
}
