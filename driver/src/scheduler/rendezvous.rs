//! Rendezvous: queued jobs meet their executors. This file owns:
//!
//! - **Starting jobs.** A queued job waits for `cluster.executors` idle executors that have its
//!   device (every executor runs CPU jobs; a `cluster.device = "cuda"` job needs executors that
//!   advertised a `cuda:*` device, see [`ExecutorEntry::offers`]) and whose advertised memory
//!   holds the job's estimate. The chosen ones take ranks 0..N−1 in host, ring address and id
//!   order. Jobs start in the order they were queued.
//! - **Refusing jobs that cannot fit.** A job that the registered executors cannot hold is
//!   refused before any task is sent, naming them ([`super::fit`]); so is one that exceeds
//!   the memory an embedded driver's executors will share.
//! - **Giving up.** A job that waits longer than `cluster.rendezvous_timeout_s` fails with a
//!   message that says how many executors registered and from where, and for a GPU job which
//!   of them have no GPU.

use std::time::{Duration, Instant};

use ringflow_ml::Device;

use super::job::rank_order;
use super::registry::ExecutorEntry;
use super::{Scheduler, fit};
use crate::error::JobError;

impl Scheduler {
    /// Fails the queued jobs that waited longer than their rendezvous timeout at `now`.
    pub(super) fn expire_waiting_jobs(&mut self, now: Instant) {
        for id in self.jobs.queued() {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let limit = job.rendezvous_timeout();
            if now.duration_since(job.submitted) > limit {
                let error = self.rendezvous_failure(job.executors_needed(), job.device(), limit);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.fail(error, now);
                }
                self.jobs.dequeue(&id);
            }
        }
    }

    /// Why a job that needs `need` executors with `device` waited `limit` in vain: how many
    /// executors registered and from where, and for a GPU job, which of them have no GPU.
    fn rendezvous_failure(&self, need: usize, device: Device, limit: Duration) -> JobError {
        let count = self.executors.len();
        let waited = limit.as_secs_f64();
        let gpu = match device {
            Device::Cpu => None,
            Device::Cuda(0) => Some("a CUDA device".to_string()),
            Device::Cuda(n) => Some(format!("CUDA device cuda:{n}")),
        };
        let wanted = match &gpu {
            None => format!("{need} executors"),
            Some(gpu) => format!("{need} executors with {gpu} (cluster.device = \"{device}\")"),
        };
        let sentence = if count == 0 {
            format!(
                "waited {waited:.0} s for {wanted}, but 0 registered (start executors with \
                 `ringflow executor --driver URL`)"
            )
        } else {
            let registered = self.executors.describe();
            let lacking = self.executors.lacking(device);
            match gpu {
                Some(gpu) if !lacking.is_empty() => format!(
                    "waited {waited:.0} s for {wanted}, but {count} registered: {registered}; \
                     without {gpu}: {} (an executor advertises the GPUs it can see when it is \
                     built with `--features cuda`)",
                    lacking.join(", ")
                ),
                _ => format!(
                    "waited {waited:.0} s for {wanted}, but {count} registered: {registered}"
                ),
            }
        };
        JobError::Rendezvous(sentence)
    }

    /// Starts the queued jobs, oldest first, while each finds its executors; one that cannot
    /// fit the registered executors is refused, and the first that must wait stops the rest.
    pub(super) fn start_jobs(&mut self, now: Instant) {
        while let Some(id) = self.jobs.first_queued().map(str::to_string) {
            let Some(job) = self.jobs.get(&id) else {
                self.jobs.dequeue(&id);
                continue;
            };
            let (need, device, memory) = (job.executors_needed(), job.device(), job.memory());
            let (mut idle, busy): (Vec<&ExecutorEntry>, Vec<&ExecutorEntry>) = self
                .executors
                .values()
                .filter(|e| e.offers(device))
                .partition(|e| e.assigned.is_none());
            idle.sort_by(|a, b| rank_order(&a.info, &b.info));
            let busy_fitting = busy.iter().filter(|e| e.fits(memory.bytes)).count();
            let chosen = match fit::choose(memory, need, &idle, busy_fitting) {
                fit::Match::Wait => return,
                fit::Match::Start(chosen) => chosen,
                fit::Match::Refuse(why) => {
                    self.jobs.dequeue(&id);
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.fail(JobError::DoesNotFit(why), now);
                    }
                    continue;
                }
            };
            self.jobs.dequeue(&id);
            for (rank, info) in chosen.iter().enumerate() {
                if let Some(e) = self.executors.get_mut(&info.executor_id) {
                    e.assign(&id, rank as u32);
                }
            }
            if let Some(job) = self.jobs.get_mut(&id) {
                job.start(chosen, now);
            }
        }
    }

    /// Fails job `job_id` unless its memory estimate fits `limit_bytes` per executor, which
    /// `limit` describes to complete "more than …"; returns the refusal. Embedded drivers
    /// check this against the machine their executors will share, before starting them.
    pub fn refuse_unless_fits(
        &mut self,
        job_id: &str,
        limit_bytes: u64,
        limit: &str,
        now: Instant,
    ) -> Result<(), JobError> {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return Ok(());
        };
        if job.memory().fits(limit_bytes) {
            return Ok(());
        }
        let why = JobError::DoesNotFit(job.memory().refusal(limit, limit_bytes));
        job.fail(why.clone(), now);
        self.jobs.dequeue(job_id);
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use ringflow_core::pb::JobState;

    use super::super::tests::{info, sched, train_with};

    #[test]
    fn a_job_waits_for_its_executors_until_its_rendezvous_timeout_and_no_longer() {
        let t0 = Instant::now();
        let mut s = sched();
        let kind = train_with("cpu", 2, &["cluster.rendezvous_timeout_s=10"]);
        let id = s.submit(kind, t0);
        s.register(info("e1", "h1", 1), t0).unwrap();
        let limit = t0 + Duration::from_secs(10);
        s.tick(limit);
        assert_eq!(s.job(&id).unwrap().state, JobState::Waiting);
        s.tick(limit + Duration::from_millis(1));
        let job = s.job(&id).unwrap();
        assert_eq!(job.state, JobState::Failed);
        assert_eq!(job.ended(), Some(limit + Duration::from_millis(1)));
        assert_eq!(
            job.error(),
            Some("waited 10 s for 2 executors, but 1 registered: e1 from h1 (idle)")
        );
        // A later executor does not start the failed job.
        s.register(info("e2", "h2", 1), limit).unwrap();
        s.tick(limit + Duration::from_secs(1));
        assert_eq!(s.job(&id).unwrap().state, JobState::Failed);
        assert!(
            s.take_task("e1", Instant::now()).is_none()
                && s.take_task("e2", Instant::now()).is_none()
        );
    }
}
