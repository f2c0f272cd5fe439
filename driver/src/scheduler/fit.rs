//! Matching a job to executors with the memory it needs: executors whose advertised limit is
//! below the job's estimate are passed over, and a job that no registered executor set can hold
//! is refused with the estimate, the executors' limits and the setting to lower, before any
//! task is sent.

use ringflow_core::pb;

use super::registry::ExecutorEntry;
use crate::planner::memory::MemoryEstimate;

/// What to do with a queued job.
#[derive(Debug, PartialEq)]
pub(super) enum Match {
    /// Start it on these executors (in rank order).
    Start(Vec<pb::ExecutorInfo>),
    /// Wait: too few idle executors, or the ones with enough memory are busy.
    Wait,
    /// Refuse it: the registered executors cannot hold it. The sentence says why.
    Refuse(String),
}

/// Chooses `need` executors for a job needing `memory` each, from `idle` (idle executors with
/// the job's device, in rank order); `busy_fitting` counts the busy ones with the device and
/// enough memory, which may free up.
pub(super) fn choose(
    memory: &MemoryEstimate,
    need: usize,
    idle: &[&ExecutorEntry],
    busy_fitting: usize,
) -> Match {
    if idle.len() < need {
        return Match::Wait;
    }
    let fitting: Vec<&ExecutorEntry> = idle
        .iter()
        .copied()
        .filter(|e| e.fits(memory.bytes))
        .collect();
    if fitting.len() >= need {
        return Match::Start(fitting.iter().take(need).map(|e| e.info.clone()).collect());
    }
    if fitting.len() + busy_fitting >= need {
        return Match::Wait;
    }
    let small: Vec<&ExecutorEntry> = idle
        .iter()
        .copied()
        .filter(|e| !e.fits(memory.bytes))
        .collect();
    let limits: Vec<String> = small.iter().map(|e| e.memory_text()).collect();
    let largest = small.iter().map(|e| e.info.memory_bytes).max().unwrap_or(0);
    Match::Refuse(memory.refusal(&limits.join(" and "), largest))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::planner::memory::MemoryPart;

    fn executor(id: &str, memory: u64) -> ExecutorEntry {
        let info = pb::ExecutorInfo {
            executor_id: id.into(),
            host: "host-1".into(),
            ring_address: format!("host-1:{}", id.len()),
            memory_bytes: memory,
            memory_source: if memory > 0 {
                "--memory".into()
            } else {
                String::new()
            },
            ..Default::default()
        };
        ExecutorEntry::new(info, Instant::now())
    }

    /// An estimate of `mib` MiB in the shuffle buffer and 24 MiB of runtime.
    fn needing(mib: u64) -> MemoryEstimate {
        MemoryEstimate::from_parts(
            vec![
                MemoryPart::new("runtime", 24 << 20, None),
                MemoryPart::new("shuffle buffer", mib << 20, Some("data.shuffle_buffer")),
            ],
            None,
        )
    }

    fn ids(m: &Match) -> Vec<String> {
        match m {
            Match::Start(chosen) => chosen.iter().map(|e| e.executor_id.clone()).collect(),
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn executors_with_enough_memory_are_chosen_over_small_ones() {
        let (small, big, unknown) = (
            executor("small", 64 << 20),
            executor("big", 8 << 30),
            executor("unknown", 0),
        );
        let m = choose(&needing(500), 2, &[&small, &big, &unknown], 0);
        assert_eq!(ids(&m), ["big", "unknown"]);
    }

    #[test]
    fn a_job_no_executor_can_hold_is_refused_naming_them() {
        let small = executor("exec-small", 64 << 20);
        let big = executor("exec-big", 8 << 30);
        let Match::Refuse(why) = choose(&needing(500), 2, &[&small, &big], 0) else {
            panic!("a job that cannot fit was not refused");
        };
        assert!(why.contains("about 524.0 MiB"), "{why}");
        assert!(
            why.contains("the 64.0 MiB (--memory) of executor exec-small on host-1"),
            "{why}"
        );
        assert!(!why.contains("exec-big"), "{why}");
        assert!(why.contains("lower data.shuffle_buffer"), "{why}");
    }

    #[test]
    fn a_job_waits_for_busy_executors_that_can_hold_it() {
        let small = executor("small", 64 << 20);
        let big = executor("big", 8 << 30);
        assert_eq!(choose(&needing(500), 2, &[&small, &big], 1), Match::Wait);
        assert_eq!(choose(&needing(500), 3, &[&small, &big], 5), Match::Wait);
    }
}
