//! Who a job runs on ([`Membership`]). This file owns:
//!
//! - the ranks: which executor holds each, and how errors and the event log name them;
//! - the ring's generation (how many times it was re-formed) and the job's secret, drawn anew
//!   for every ring;
//! - a ring being re-formed ([`Recovery`]): the ranks that were lost and those that asked to
//!   recover, until every rank is one or the other; then who remains, who may join, and in
//!   which order they take their ranks;
//! - joining at an epoch boundary: whether idle executors could join, and the epoch before
//!   which every rank re-forms the ring to let them in.
//!
//! It decides and counts; what the job says about it (messages, the event log) is
//! [`super::recovery`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

use ringflow_core::pb;

use crate::error::JobError;
use crate::events::RankInfo;

/// The executors of a job by rank, and the re-forming of their ring.
#[derive(Debug, Default)]
pub(super) struct Membership {
    ranks: Vec<pb::ExecutorInfo>,
    generation: u32,
    secret: [u8; 32],
    recovery: Option<Recovery>,
    recoveries: u32,
    executors_lost: Vec<String>,
    joiners: BTreeSet<String>,
    /// Idle executors could join (set by the scheduler); the ring is re-formed at the next
    /// epoch boundary.
    joinable: bool,
    /// The epoch before which the ring is re-formed to add executors.
    reform_before: Mutex<Option<u64>>,
}

/// A ring being re-formed: which ranks asked to recover (with their error), which were lost
/// (with the cause).
#[derive(Debug, Default)]
pub(super) struct Recovery {
    asked: BTreeMap<usize, String>,
    /// Ranks that asked before they had the job's state (joiners whose ring broke first).
    awaiting: BTreeSet<usize>,
    lost: BTreeMap<usize, String>,
    started: Option<Instant>,
}

/// A ring whose every rank either asked to recover or was lost, with enough executors left
/// to re-form it.
#[derive(Debug)]
pub(super) struct Settled {
    recovery: Recovery,
    /// Survivors that hold the job's state.
    survivors: Vec<pb::ExecutorInfo>,
    /// Survivors that joined and had not received the job's state yet.
    awaiting: Vec<pb::ExecutorInfo>,
}

/// How a ring was re-formed, for the job's messages and event log.
#[derive(Debug)]
pub(super) struct Reformed {
    /// Ranks in the ring before.
    pub world_before: usize,
    /// Ranks in the new ring.
    pub world_after: usize,
    /// The lost executors' ids.
    pub lost: Vec<String>,
    /// The executors that joined.
    pub joined: Vec<pb::ExecutorInfo>,
    /// Seconds from the first loss or request to the new ring.
    pub waited: f64,
    /// The root cause: how a lost executor was lost, or else the first rank's broken ring.
    pub cause: String,
    /// The ring broke (a loss or a failed collective), rather than being re-formed at an epoch
    /// boundary to let idle executors join.
    pub broke: bool,
}

/// The order in which executors take their ranks: by host, ring address and id, so that the
/// same executors always form the same ring whatever order they registered in.
pub(in crate::scheduler) fn rank_order(
    a: &pb::ExecutorInfo,
    b: &pb::ExecutorInfo,
) -> std::cmp::Ordering {
    (&a.host, &a.ring_address, &a.executor_id).cmp(&(&b.host, &b.ring_address, &b.executor_id))
}

impl Membership {
    /// The ring of a starting job: `ranks` (index = rank), with a fresh secret.
    pub fn start(&mut self, ranks: Vec<pb::ExecutorInfo>) {
        rand::fill(&mut self.secret);
        self.ranks = ranks;
    }

    /// The executors by rank.
    pub fn ranks(&self) -> &[pb::ExecutorInfo] {
        &self.ranks
    }

    /// The ring's generation: how many times it was re-formed.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The secret of the current ring.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The rank `executor_id` holds, if any.
    pub fn rank_of(&self, executor_id: &str) -> Option<usize> {
        self.ranks.iter().position(|e| e.executor_id == executor_id)
    }

    /// Whether `rank` holds an executor that joined the current ring (and receives the job's
    /// state from the others).
    pub fn is_joiner(&self, rank: usize) -> bool {
        self.ranks
            .get(rank)
            .is_some_and(|e| self.joiners.contains(&e.executor_id))
    }

    /// The ranks as the event log lists them.
    pub fn rank_infos(&self) -> Vec<RankInfo> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(rank, e)| RankInfo {
                rank,
                executor_id: e.executor_id.clone(),
                host: e.host.clone(),
            })
            .collect()
    }

    /// "rank R (executor ID on HOST)": how errors name `rank`.
    pub fn describe_rank(&self, rank: usize) -> String {
        match self.ranks.get(rank) {
            Some(e) => format!("rank {rank} (executor {} on {})", e.executor_id, e.host),
            None => format!("rank {rank}"),
        }
    }

    /// True while the ring is re-formed.
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// How many times the ring was re-formed after a loss, and how many executors were lost.
    pub fn recoveries(&self) -> (u32, usize) {
        (self.recoveries, self.executors_lost.len())
    }

    /// The ranks lost from the ring being re-formed (none when it is not).
    pub fn lost_ranks(&self) -> Vec<usize> {
        self.recovery
            .as_ref()
            .map(|r| r.lost.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether idle executors are waiting that the job could take.
    pub fn set_joinable(&mut self, joinable: bool) {
        self.joinable = joinable;
    }

    /// Whether every rank re-forms the ring before training `epoch`: a recovery is pending, or
    /// idle executors can join a ring of fewer than `max` ranks of an `elastic` job. The
    /// boundary is chosen when an epoch's plan is first made (`first_plan`), never before the
    /// first epoch, and once until the ring is re-formed.
    pub fn reform_before(&self, epoch: u64, first_plan: bool, elastic: bool, max: usize) -> bool {
        let mut reform = self.reform_before.lock().unwrap_or_else(|p| p.into_inner());
        if first_plan
            && self.joinable
            && elastic
            && epoch > 0
            && self.ranks.len() < max
            && reform.is_none()
        {
            *reform = Some(epoch);
        }
        // A pending recovery also re-forms at the boundary: with backup workers the survivors
        // of a lost executor may reach it without a failed collective.
        *reform == Some(epoch) || self.recovery.is_some()
    }

    /// `rank`, which exists, was lost (`why`, since `now`): the ring is re-formed without it.
    pub fn lose(&mut self, rank: usize, why: String, now: Instant) {
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.lost.insert(rank, why);
        self.executors_lost
            .push(self.ranks[rank].executor_id.clone());
    }

    /// `rank`, which exists, lost its ring (`error`) at `now`, holding the job's state unless
    /// `awaiting_state`; returns whether every rank has now asked or was lost.
    pub fn ask(&mut self, rank: usize, error: &str, awaiting_state: bool, now: Instant) -> bool {
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.asked.entry(rank).or_insert_with(|| error.to_string());
        if awaiting_state {
            r.awaiting.insert(rank);
        }
        (0..self.ranks.len()).all(|i| r.asked.contains_key(&i) || r.lost.contains_key(&i))
    }

    /// Ends the recovery once every rank asked or was lost ([`Membership::ask`]): who remains,
    /// or why the ring cannot be re-formed with at least `min_executors`, or without an
    /// executor that holds the job's state.
    pub fn settle(&mut self, min_executors: usize) -> Result<Settled, JobError> {
        let recovery = self.recovery.take().unwrap_or_default();
        // Survivors that hold the job's state, and joiners that had not received it yet.
        let (survivors, awaiting): (Vec<usize>, Vec<usize>) = recovery
            .asked
            .keys()
            .filter(|i| !recovery.lost.contains_key(i))
            .partition(|i| !recovery.awaiting.contains(i));
        let remain = survivors.len() + awaiting.len();
        if remain < min_executors || remain == 0 {
            return Err(JobError::TooFewRemain {
                remain,
                lost: recovery.lost.len(),
                min: min_executors,
            });
        }
        if survivors.is_empty() {
            return Err(JobError::StateLost { remain });
        }
        let info = |ranks: Vec<usize>| ranks.into_iter().map(|i| self.ranks[i].clone()).collect();
        Ok(Settled {
            survivors: info(survivors),
            awaiting: info(awaiting),
            recovery,
        })
    }

    /// Re-forms the ring of `settled` at `now`, adding as many `idle` executors as a ring of
    /// at most `max` ranks leaves room for: a new generation with a fresh secret.
    pub fn reform(
        &mut self,
        settled: Settled,
        idle: Vec<pb::ExecutorInfo>,
        max: usize,
        now: Instant,
    ) -> Reformed {
        let Settled {
            recovery,
            survivors,
            awaiting,
        } = settled;
        let waited = recovery
            .started
            .map_or(0.0, |s| now.duration_since(s).as_secs_f64());
        // The root cause: how a lost executor was lost, before the survivors' broken rings.
        let cause = recovery
            .lost
            .values()
            .chain(recovery.asked.values())
            .next()
            .cloned()
            .unwrap_or_default();
        self.generation += 1;
        let lost_any = !recovery.lost.is_empty();
        if lost_any {
            self.recoveries += 1;
        }
        // Re-formed because idle executors join at an epoch boundary, not because it broke.
        let at_boundary = self
            .reform_before
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some();
        let lost = recovery
            .lost
            .keys()
            .filter_map(|&r| self.ranks.get(r).map(|e| e.executor_id.clone()))
            .collect();
        let (ranks, joined) = self.reformed_ranks(survivors, awaiting, idle, max);
        let world_before = std::mem::replace(&mut self.ranks, ranks).len();
        rand::fill(&mut self.secret);
        Reformed {
            world_before,
            world_after: self.ranks.len(),
            lost,
            joined,
            waited,
            cause,
            broke: lost_any || !at_boundary,
        }
    }

    /// The re-formed ring's members: the survivors that hold the job's state in rank order,
    /// then those still `awaiting` it (joiners whose first ring broke), then as many idle
    /// executors as `max` leaves room for (returned apart too: they join).
    fn reformed_ranks(
        &mut self,
        mut ranks: Vec<pb::ExecutorInfo>,
        mut awaiting: Vec<pb::ExecutorInfo>,
        mut joiners: Vec<pb::ExecutorInfo>,
        max: usize,
    ) -> (Vec<pb::ExecutorInfo>, Vec<pb::ExecutorInfo>) {
        ranks.sort_by(rank_order);
        awaiting.sort_by(rank_order);
        ranks.extend(awaiting);
        // Idle executors join after the survivors, so rank 0 (whose state everyone adopts) is
        // always a survivor that holds the job's state.
        joiners.sort_by(rank_order);
        joiners.truncate(max.saturating_sub(ranks.len()));
        self.joiners = joiners.iter().map(|e| e.executor_id.clone()).collect();
        ranks.extend(joiners.iter().cloned());
        (ranks, joiners)
    }
}
