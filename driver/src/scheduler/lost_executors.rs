//! How the driver learns that an executor is gone, and how it names the cause.
//!
//! Four sources, fastest first:
//!
//! - **Exit status.** `ringflow local` waits on the executor processes it started and reports
//!   each one's end at once ([`Scheduler::executor_exited`]): `exited with status 3`,
//!   `exited: killed by signal 9 (SIGKILL)`.
//! - **A closed connection.** Every executor holds an attachment stream open to the driver
//!   ([`Scheduler::attach`]). When its process ends the kernel closes the connection and the
//!   stream ends ([`Scheduler::detach`]); after [`SchedulerConfig::loss_grace`] without a sign of
//!   life (a new attachment, a heartbeat) or a better cause, the executor is declared lost.
//! - **Last words.** An executor that panics or fails to allocate reports it before it dies
//!   ([`Scheduler::last_words`]); the words are added to whatever cause follows.
//! - **Silence.** Heartbeats stop for [`SchedulerConfig::executor_timeout`]: the cause for a
//!   hung executor or a cut network, where nothing else tells.
//!
//! A rank whose ring breaks because a neighbour died often reports its own communication error
//! before the loss is known. Such errors are held for a bounded grace (longer while a lost
//! connection of one of the job's executors is still being settled), so that the job fails with
//! the root cause: the dead executor and how it died.
//!
//! [`SchedulerConfig::loss_grace`]: super::SchedulerConfig::loss_grace
//! [`SchedulerConfig::executor_timeout`]: super::SchedulerConfig::executor_timeout

use std::fmt;
use std::time::{Duration, Instant};

use ringflow_core::pb;
use tracing::warn;

use super::executors::ExecutorManager;
use super::registry::ExecutorEntry;
use super::{Refusal, Scheduler};

/// The longest last words the driver keeps, in bytes.
pub const MAX_LAST_WORDS: usize = 1000;

/// How an executor process ended, as the process that started it saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signaled {
        /// The signal's number.
        signal: i32,
        /// Whether it left a core dump.
        core_dumped: bool,
    },
}

#[cfg(unix)]
impl From<std::process::ExitStatus> for ProcessEnd {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match status.code() {
            Some(code) => ProcessEnd::Exited(code),
            None => ProcessEnd::Signaled {
                signal: status.signal().unwrap_or(0),
                core_dumped: status.core_dumped(),
            },
        }
    }
}

impl fmt::Display for ProcessEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProcessEnd::Exited(code) => write!(f, "exited with status {code}"),
            ProcessEnd::Signaled {
                signal,
                core_dumped,
            } => {
                write!(f, "exited: killed by signal {signal}")?;
                if let Some(name) = signal_name(signal) {
                    write!(f, " ({name})")?;
                }
                if core_dumped {
                    write!(f, ", core dumped")?;
                }
                Ok(())
            }
        }
    }
}

/// The name of Linux signal `n` (`SIGKILL` for 9), if it has one.
pub fn signal_name(n: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i).copied())
}

/// Why the driver considers an executor gone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GoneReason {
    /// No heartbeat for this long.
    Silent(Duration),
    /// Its process ended (seen by the `ringflow local` that started it).
    Exited(ProcessEnd),
    /// Its connection to the driver closed and nothing was heard from it within the grace.
    Disconnected,
}

impl GoneReason {
    /// The cause as the error (or recovery message) of the job in which `entry` had `rank`.
    pub fn for_rank(&self, entry: &ExecutorEntry, rank: u32) -> String {
        let cause = match self {
            GoneReason::Silent(silent) => format!(
                "{} stopped sending heartbeats {:.0} s ago (killed, hung, or cut off)",
                entry.describe(rank),
                silent.as_secs_f64()
            ),
            // A local child: on the driver's own machine, so the host is left out.
            GoneReason::Exited(end) => {
                format!("executor {} (rank {rank}) {end}", entry.info.executor_id)
            }
            GoneReason::Disconnected => format!(
                "{} lost its connection to the driver (its process ended or its host went down)",
                entry.describe(rank)
            ),
        };
        with_last_words(cause, entry)
    }

    /// The cause as a line for jobs that wait for executors.
    pub fn for_log(&self, entry: &ExecutorEntry) -> String {
        let who = format!("executor {} on {}", entry.info.executor_id, entry.info.host);
        let cause = match self {
            GoneReason::Silent(silent) => {
                format!("{who} lost: no heartbeat for {:.0} s", silent.as_secs_f64())
            }
            GoneReason::Exited(end) => format!("{who} {end}"),
            GoneReason::Disconnected => format!("{who} lost its connection to the driver"),
        };
        with_last_words(cause, entry)
    }
}

/// `cause`, followed by what the executor reported as it died, if anything.
fn with_last_words(cause: String, entry: &ExecutorEntry) -> String {
    match &entry.last_words {
        Some(words) => format!("{cause}; it reported: {words}"),
        None => cause,
    }
}

/// `words` cut to at most [`MAX_LAST_WORDS`] bytes (on a character boundary), on one line.
fn bounded(words: &str) -> String {
    let line = words.lines().next().unwrap_or_default();
    let mut end = line.len().min(MAX_LAST_WORDS);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

impl ExecutorManager {
    /// The executors silent for longer than `timeout` at `now`, and those detached at least
    /// `grace` ago with no sign of life since, with why each is gone.
    pub fn lost(
        &self,
        now: Instant,
        timeout: Duration,
        grace: Duration,
    ) -> Vec<(String, GoneReason)> {
        self.values()
            .filter_map(|e| {
                let silent = now.duration_since(e.last_seen);
                if silent > timeout {
                    Some((e.info.executor_id.clone(), GoneReason::Silent(silent)))
                } else if e
                    .detached_at
                    .is_some_and(|at| now.duration_since(at) >= grace)
                {
                    Some((e.info.executor_id.clone(), GoneReason::Disconnected))
                } else {
                    None
                }
            })
            .collect()
    }
}

impl Scheduler {
    /// An executor opened its attachment stream (registering it if this driver never saw it);
    /// returns the number that its end is reported with ([`Scheduler::detach`]).
    pub fn attach(&mut self, info: pb::ExecutorInfo, now: Instant) -> Result<u64, Refusal> {
        let id = info.executor_id.clone();
        self.register(info, now)?;
        Ok(self.executors.attach(&id))
    }

    /// Attachment stream number `attachment` of `executor_id` ended. Unless it is the latest
    /// one, nothing follows; otherwise the executor is lost after the grace, unless it shows a
    /// sign of life first.
    pub fn detach(&mut self, executor_id: &str, attachment: u64, now: Instant) {
        self.executors.detach(executor_id, attachment, now);
    }

    /// What `executor_id` reports as it dies: kept for the error of whatever follows.
    pub fn last_words(&mut self, executor_id: &str, words: &str) -> Result<(), Refusal> {
        let entry = self
            .executors
            .get_mut(executor_id)
            .ok_or_else(|| Refusal::NotFound(format!("no executor {executor_id:?}")))?;
        let words = bounded(words);
        warn!(executor = %executor_id, "executor reports: {words}");
        entry.last_words = Some(words);
        Ok(())
    }

    /// The executor process `pid` on `host` ended `how`: it is lost at once. Returns false
    /// when no registered executor has that pid on that host (it ended before it registered,
    /// or it was dropped already).
    pub fn executor_exited(&mut self, host: &str, pid: u32, how: ProcessEnd, now: Instant) -> bool {
        let id = self
            .executors
            .values()
            .find(|e| e.info.pid == pid && e.info.host == host)
            .map(|e| e.info.executor_id.clone());
        match id {
            Some(id) => {
                self.executor_gone(&id, GoneReason::Exited(how), now);
                true
            }
            None => false,
        }
    }

    /// Drops the executors that stopped heartbeating, and those whose connection closed more
    /// than the grace ago with no sign of life since.
    pub(super) fn drop_lost_executors(&mut self, now: Instant) {
        let lost = self
            .executors
            .lost(now, self.config.executor_timeout, self.config.loss_grace);
        for (id, gone) in lost {
            self.executor_gone(&id, gone, now);
        }
    }

    /// Removes `id` from the registry; a job it was training loses its rank with `gone`.
    fn executor_gone(&mut self, id: &str, gone: GoneReason, now: Instant) {
        let Some(entry) = self.executors.remove(id) else {
            return;
        };
        let line = gone.for_log(&entry);
        warn!(executor = %id, "{line}");
        self.jobs.message_waiting(&line);
        if let Some(a) = &entry.assigned
            && let Some(job) = self.jobs.get_mut(&a.job_id)
            && !job.is_finished()
        {
            job.rank_lost(a.rank as usize, gone.for_rank(&entry, a.rank), now);
        }
    }

    /// Fails the jobs whose held communication error found no root cause within the grace
    /// (waiting longer, up to a bound, while a closed connection of one of their executors is
    /// being settled).
    pub(super) fn settle_held_errors(&mut self, now: Instant) {
        let grace = self.config.loss_grace;
        let executors = &self.executors;
        for job in self.jobs.values_mut().filter(|j| j.has_held_error()) {
            let settling = job
                .ranks()
                .iter()
                .any(|r| executors.is_detached(&r.executor_id));
            job.settle_held_error(now, grace, settling);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bench, info, sched, train_with};
    use super::*;
    use crate::scheduler::JobKind;
    use pb::finish_task_request::Result as R;

    const KILLED: ProcessEnd = ProcessEnd::Signaled {
        signal: 9,
        core_dumped: false,
    };

    /// e2's attachment stream in [`running`].
    const E2_STREAM: u64 = 2;

    /// A scheduler running `kind` on executors e1 (rank 0) and e2 (rank 1) of host h, pids 11
    /// and 12, attached (streams 1 and [`E2_STREAM`]); returns it and the job id.
    fn running(kind: JobKind, now: Instant) -> (Scheduler, String) {
        let mut s = sched();
        for (stream, (id, pid)) in [("e1", 11), ("e2", 12)].into_iter().enumerate() {
            let mut i = info(id, "h", pid as u16);
            i.pid = pid;
            assert_eq!(s.attach(i, now), Ok(stream as u64 + 1));
        }
        let id = s.submit(kind, now);
        s.tick(now);
        assert!(
            s.take_task("e1", Instant::now()).is_some()
                && s.take_task("e2", Instant::now()).is_some()
        );
        (s, id)
    }

    /// Rank `rank` (on `executor`) ends with `error`, a communication error or not.
    fn failed(s: &mut Scheduler, job: &str, rank: u32, executor: &str, communication: bool) {
        let req = pb::FinishTaskRequest {
            job_id: job.into(),
            rank,
            executor_id: executor.into(),
            result: Some(R::Error("rank 1 closed the ring connection".into())),
            communication,
        };
        s.finish_task(req, Instant::now()).unwrap();
    }

    fn error(s: &Scheduler, job: &str) -> Option<String> {
        s.job(job).unwrap().error().map(str::to_string)
    }

    fn heartbeat(s: &mut Scheduler, id: &str, pid: u32, job: &str, now: Instant) {
        let mut i = info(id, "h", pid as u16);
        i.pid = pid;
        s.heartbeat(i, job, now).unwrap();
    }

    #[test]
    fn an_exited_executor_is_the_cause_not_its_neighbours_broken_ring() {
        let now = Instant::now();
        let (mut s, id) = running(bench(2), now);
        // The neighbour's ring breaks first: held, not the job's error yet.
        failed(&mut s, &id, 0, "e1", true);
        s.tick(now);
        assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
        assert!(!s.executor_exited("other-host", 12, KILLED, now));
        assert!(s.executor_exited("h", 12, KILLED, now));
        assert_eq!(
            error(&s, &id).as_deref(),
            Some("executor e2 (rank 1) exited: killed by signal 9 (SIGKILL)")
        );
        assert_eq!(s.executors().count(), 1, "the dead executor is dropped");
    }

    #[test]
    fn a_held_communication_error_fails_the_job_after_the_grace() {
        let now = Instant::now();
        let (mut s, id) = running(bench(2), now);
        failed(&mut s, &id, 0, "e1", true);
        s.tick(now + Duration::from_millis(1000));
        assert_eq!(error(&s, &id), None);
        s.tick(now + Duration::from_millis(1600));
        let err = error(&s, &id).unwrap();
        assert!(
            err.starts_with("executor e1 (rank 0) on h failed: rank 1 closed"),
            "{err}"
        );
    }

    #[test]
    fn a_rank_s_own_error_fails_the_job_at_once() {
        let now = Instant::now();
        let (mut s, id) = running(bench(2), now);
        failed(&mut s, &id, 1, "e2", false);
        assert!(
            error(&s, &id)
                .unwrap()
                .starts_with("executor e2 (rank 1) on h failed: ")
        );
    }

    #[test]
    fn a_closed_connection_is_a_loss_after_the_grace() {
        let now = Instant::now();
        let (mut s, id) = running(bench(2), now);
        failed(&mut s, &id, 0, "e1", true);
        let closed = now + Duration::from_millis(500);
        s.detach("e2", E2_STREAM, closed);
        // The held error's grace is over, but it waits while the closed connection is being
        // settled.
        let later = closed + Duration::from_millis(1400);
        heartbeat(&mut s, "e1", 11, &id, later);
        s.tick(later);
        assert_eq!(error(&s, &id), None);
        s.tick(closed + Duration::from_millis(1500));
        assert_eq!(
            error(&s, &id).as_deref(),
            Some(
                "executor e2 (rank 1) on h lost its connection to the driver (its process ended \
                 or its host went down)"
            )
        );
    }

    #[test]
    fn an_executor_that_comes_back_after_being_dropped_is_lost_when_its_old_stream_ends() {
        let now = Instant::now();
        let (mut s, _) = running(bench(2), now);
        // e2 is stopped past the heartbeat timeout: dropped, though its stream stays open.
        let dropped = now + Duration::from_secs(16);
        heartbeat(&mut s, "e1", 11, "", dropped);
        s.tick(dropped);
        assert!(s.executors().all(|e| e.info.executor_id != "e2"));
        // It is continued and heartbeats again (registered anew), on the same stream.
        let back = dropped + Duration::from_secs(1);
        heartbeat(&mut s, "e2", 12, "", back);
        assert!(s.executors().any(|e| e.info.executor_id == "e2"));
        // Then it is killed: the stream it opened before it was dropped ends.
        let killed = back + Duration::from_secs(1);
        s.detach("e2", E2_STREAM, killed);
        heartbeat(&mut s, "e1", 11, "", killed + Duration::from_secs(2));
        s.tick(killed + Duration::from_secs(2));
        assert!(
            s.executors().all(|e| e.info.executor_id != "e2"),
            "lost by its closed connection within seconds, not by its heartbeats"
        );
    }

    #[test]
    fn an_executor_that_attaches_again_or_heartbeats_is_not_lost() {
        let now = Instant::now();
        let later = now + Duration::from_secs(3);
        // Attaches again within the grace.
        let (mut s, id) = running(bench(2), now);
        s.detach("e2", E2_STREAM, now);
        let mut e2 = info("e2", "h", 12);
        e2.pid = 12;
        assert_eq!(
            s.attach(e2, now + Duration::from_millis(300)),
            Ok(E2_STREAM + 1)
        );
        // The end of its old stream, noticed late, is not its latest one.
        s.detach("e2", E2_STREAM, now + Duration::from_millis(400));
        s.tick(later);
        assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);

        // Heartbeats after the connection closed: it lives (one in flight as it closed does
        // not count).
        let (mut s, id) = running(bench(2), now);
        s.detach("e2", E2_STREAM, now);
        heartbeat(&mut s, "e2", 12, &id, now + Duration::from_millis(10));
        s.tick(now + Duration::from_millis(1600));
        assert!(error(&s, &id).unwrap().contains("lost its connection"));

        let (mut s, id) = running(bench(2), now);
        s.detach("e2", E2_STREAM, now);
        heartbeat(&mut s, "e2", 12, &id, now + Duration::from_millis(900));
        s.tick(later);
        assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
    }

    #[test]
    fn last_words_join_the_cause_and_make_an_error_a_root_cause() {
        let now = Instant::now();
        let (mut s, id) = running(bench(2), now);
        s.last_words("e2", "out of memory allocating 10 bytes")
            .unwrap();
        assert!(matches!(s.last_words("e9", "x"), Err(Refusal::NotFound(_))));
        s.executor_exited(
            "h",
            12,
            ProcessEnd::Signaled {
                signal: 6,
                core_dumped: false,
            },
            now,
        );
        assert_eq!(
            error(&s, &id).as_deref(),
            Some(
                "executor e2 (rank 1) exited: killed by signal 6 (SIGABRT); it reported: out \
                 of memory allocating 10 bytes"
            )
        );

        // A thread's panic, then a communication error of the same rank: not held.
        let (mut s, id) = running(bench(2), now);
        s.last_words("e1", "panicked at a.rs:1:2: boom").unwrap();
        failed(&mut s, &id, 0, "e1", true);
        let err = error(&s, &id).unwrap();
        assert!(
            err.ends_with("; it reported: panicked at a.rs:1:2: boom"),
            "{err}"
        );
    }

    #[test]
    fn an_elastic_recovery_names_the_lost_executor_as_its_cause() {
        let now = Instant::now();
        let kind = train_with("cpu", 2, &["cluster.min_executors=1"]);
        let (mut s, id) = running(kind, now);
        let req = pb::RecoverRequest {
            job_id: id.clone(),
            executor_id: "e1".into(),
            rank: 0,
            generation: 0,
            error: "rank 1 closed the ring connection".into(),
            wait_ms: 0,
            ..Default::default()
        };
        assert_eq!(s.recover(&req, now), Ok(None));
        assert!(s.executor_exited("h", 12, KILLED, now));
        let task = s.recover(&req, now).unwrap().unwrap();
        assert_eq!(crate::scheduler::tests::header(&task).ring.len(), 1);
        let recovery = s
            .job(&id)
            .unwrap()
            .events()
            .iter()
            .find_map(|e| match &e.event {
                Some(pb::job_event::Event::Message(m)) if m.starts_with("recovery 1:") => {
                    Some(m.clone())
                }
                _ => None,
            })
            .unwrap();
        assert!(
            recovery.contains("(executor e2 (rank 1) exited: killed by signal 9 (SIGKILL))"),
            "{recovery}"
        );
    }

    #[test]
    fn process_ends_read_as_sentences() {
        assert_eq!(ProcessEnd::Exited(3).to_string(), "exited with status 3");
        let killed = ProcessEnd::Signaled {
            signal: 9,
            core_dumped: false,
        };
        assert_eq!(killed.to_string(), "exited: killed by signal 9 (SIGKILL)");
        let aborted = ProcessEnd::Signaled {
            signal: 6,
            core_dumped: true,
        };
        assert_eq!(
            aborted.to_string(),
            "exited: killed by signal 6 (SIGABRT), core dumped"
        );
        let realtime = ProcessEnd::Signaled {
            signal: 40,
            core_dumped: false,
        };
        assert_eq!(realtime.to_string(), "exited: killed by signal 40");
        assert_eq!(signal_name(1), Some("SIGHUP"));
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(31), Some("SIGSYS"));
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(-9), None);
    }

    #[cfg(unix)]
    #[test]
    fn an_exit_status_converts_to_how_the_process_ended() {
        use std::os::unix::process::ExitStatusExt;
        // Raw wait statuses: exit code in the high byte, or the signal in the low bits.
        let exited = std::process::ExitStatus::from_raw(3 << 8);
        assert_eq!(ProcessEnd::from(exited), ProcessEnd::Exited(3));
        let killed = std::process::ExitStatus::from_raw(9);
        assert_eq!(
            ProcessEnd::from(killed),
            ProcessEnd::Signaled {
                signal: 9,
                core_dumped: false
            }
        );
    }

    #[test]
    fn last_words_are_kept_to_one_bounded_line() {
        assert_eq!(
            bounded("panicked at a.rs:1:2: boom\nmore"),
            "panicked at a.rs:1:2: boom"
        );
        let long = "é".repeat(MAX_LAST_WORDS);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_LAST_WORDS && cut.chars().all(|c| c == 'é'));
    }
}
