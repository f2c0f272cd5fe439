//! Retention of finished jobs: a driver that runs for months keeps only the most recent ones.
//!
//! A finished job keeps its plan, its events (the stream `ringflow submit` and the web UI
//! replay) and its summary in the driver's memory. [`Scheduler::forget_finished`] keeps the
//! `retained_jobs` most recently ended of them (Spark's standalone master keeps its last 200
//! applications the same way) and forgets the older ones, so the driver's memory does not grow
//! with the number of jobs it has run. A forgotten job's record stays in its event log
//! (`<checkpoint_dir>/events.jsonl`, read by `ringflow history`). A finished job is kept past
//! the bound while a client still follows its events (its summary has not been sent yet) or
//! while an executor is still assigned to it.

use std::time::Instant;

use tracing::debug;

use super::Scheduler;

/// How many finished jobs a driver keeps by default.
pub const DEFAULT_RETAINED_JOBS: usize = 200;

impl Scheduler {
    /// Forgets the finished jobs that ended before the `retained_jobs` most recent ones, except
    /// those still followed by a client or still assigned to an executor; returns how many it
    /// forgot.
    pub fn forget_finished(&mut self) -> usize {
        let keep = self.config.retained_jobs;
        // Runs at every tick: nothing to collect while under the bound.
        if self.jobs.values().filter(|j| j.is_finished()).count() <= keep {
            return 0;
        }
        let mut finished: Vec<(Instant, String)> = self
            .jobs
            .values()
            .filter_map(|j| Some((j.ended()?, j.id.clone())))
            .collect();
        // Oldest first; the last `keep` stay.
        finished.sort();
        let excess = finished.len().saturating_sub(keep);
        let mut forgotten = 0;
        for (_, id) in finished.into_iter().take(excess) {
            let assigned = self
                .executors
                .values()
                .any(|e| e.assigned.as_ref().is_some_and(|a| a.job_id == id));
            let followed = self.jobs.get(&id).is_some_and(|j| j.is_followed());
            if assigned || followed {
                continue;
            }
            self.jobs.forget(&id);
            debug!(job = %id, "finished job forgotten (retention)");
            forgotten += 1;
        }
        forgotten
    }

    /// How many finished jobs this driver has forgotten so far (see [`Scheduler::forget_finished`]).
    pub fn jobs_forgotten(&self) -> u64 {
        self.jobs.forgotten()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::tests::{bench, sched};
    use super::super::{Scheduler, SchedulerConfig};

    fn with_retention(n: usize) -> Scheduler {
        let mut s = sched();
        s.config = SchedulerConfig {
            retained_jobs: n,
            ..SchedulerConfig::default()
        };
        s
    }

    #[test]
    fn only_the_most_recently_ended_jobs_are_kept() {
        let mut s = with_retention(3);
        let t0 = Instant::now();
        let ids: Vec<String> = (0..10).map(|_| s.submit(bench(1), t0)).collect();
        // They end in reverse order of submission: the first submitted ends last.
        for (i, id) in ids.iter().rev().enumerate() {
            s.cancel(id, t0 + Duration::from_secs(i as u64 + 1))
                .unwrap();
        }
        assert_eq!(s.forget_finished(), 7);
        let kept: Vec<&str> = s.jobs().map(|j| j.id.as_str()).collect();
        let mut expected: Vec<&str> = ids[..3].iter().map(String::as_str).collect();
        expected.sort();
        assert_eq!(kept, expected);
        assert_eq!(s.jobs_forgotten(), 7);
        // Nothing more to forget.
        assert_eq!(s.forget_finished(), 0);
    }

    #[test]
    fn jobs_that_have_not_ended_or_are_followed_are_kept() {
        let mut s = with_retention(1);
        let t0 = Instant::now();
        let queued = s.submit(bench(1), t0);
        let followed = s.submit(bench(1), t0);
        let done: Vec<String> = (0..3).map(|_| s.submit(bench(1), t0)).collect();
        s.cancel(&followed, t0).unwrap();
        for id in &done {
            s.cancel(id, t0 + Duration::from_secs(1)).unwrap();
        }
        // A client that still reads the events of the oldest finished job.
        let (_, watcher) = s.job(&followed).unwrap().events_since(0);
        assert_eq!(s.forget_finished(), 2);
        assert!(s.job(&queued).is_some(), "a queued job was forgotten");
        assert!(s.job(&followed).is_some(), "a followed job was forgotten");
        drop(watcher);
        assert_eq!(s.forget_finished(), 1);
        assert!(s.job(&followed).is_none());
        assert_eq!(s.jobs().filter(|j| j.is_finished()).count(), 1);
    }
}
