//! The exclusive lock a job holds on its output directory from submit to end, so that two jobs
//! never write one checkpoint directory (or one prediction output) at once.
//!
//! The lock is a file, [`LOCK_FILE`], inside the directory: JSON naming the holder
//! ([`LockOwner`]: job id, host, pid, since when, last refresh). It is created only when absent
//! (a hard link of a complete temporary file on a local file system, a conditional put,
//! `PutMode::Create`, on an object store), so of two jobs that start at once exactly one gets it.
//! While the job runs a thread of the lock rewrites it every [`LockTiming::refresh_every`]
//! (atomically by rename locally, `PutMode::Update` with the last e-tag on a store), and removes
//! it when the job ends, fails, is cancelled or its driver shuts down.
//!
//! A holder that crashed never leaves its directory locked for good:
//! - on the same host, a lock whose process is gone (or is another process with a reused pid)
//!   is taken over at once, which is what `--resume` after a killed `ringflow local` needs;
//! - from another host, a lock not refreshed for [`LockTiming::stale_after`] is taken over.
//!
//! Taking over replaces exactly the stale lock that was read (under a short-lived
//! `ringflow.lock.takeover` guard file locally, with the e-tag's precondition on a store) and is
//! reported as a job message. A holder whose lock was taken over learns it at its next refresh
//! ([`DirLock::lost`]); its job then fails rather than write beside the new holder.
//!
//! A store that cannot put conditionally (a plain HTTP server, S3 with `AWS_CONDITIONAL_PUT=
//! disabled`) cannot be locked: the job runs unlocked, with a warning saying so.

mod local;
mod store;

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::UpdateVersion;
use ringflow_core::data::Location;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::OutputError;
use crate::events::rfc3339;

/// The lock file's name inside the directory it locks.
pub const LOCK_FILE: &str = "ringflow.lock";

/// How a held lock is kept fresh and when a silent one is taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockTiming {
    /// How often the holder rewrites its lock.
    pub refresh_every: Duration,
    /// A lock from another host not refreshed for this long is taken over.
    pub stale_after: Duration,
}

impl Default for LockTiming {
    fn default() -> Self {
        LockTiming {
            refresh_every: Duration::from_secs(10),
            stale_after: Duration::from_secs(60),
        }
    }
}

/// Who holds a directory: the contents of its lock file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    /// The job that writes into the directory.
    pub job_id: String,
    /// The host of the process that holds the lock (the job's driver).
    pub host: String,
    /// That process's id.
    pub pid: u32,
    /// When that process started (clock ticks after boot), which tells the holder from a later
    /// process that reuses its pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    /// Random, one per acquisition: tells this holder's lock from any other.
    pub token: String,
    /// When the lock was taken (RFC 3339, UTC).
    pub since: String,
    /// When it was last refreshed (RFC 3339, UTC).
    pub refreshed: String,
    /// The same, in seconds since the Unix epoch.
    pub refreshed_unix_s: u64,
}

impl LockOwner {
    /// This process, taking a lock for `job_id` now.
    pub fn this_process(job_id: &str) -> LockOwner {
        let mut token = [0u8; 8];
        rand::fill(&mut token);
        let now = SystemTime::now();
        LockOwner {
            job_id: job_id.to_string(),
            host: ringflow_core::host::hostname(),
            pid: std::process::id(),
            pid_start: process_start(std::process::id()),
            token: token.iter().map(|b| format!("{b:02x}")).collect(),
            since: rfc3339(now),
            refreshed: rfc3339(now),
            refreshed_unix_s: unix_s(now),
        }
    }

    /// The lock file's bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec_pretty(self).expect("a lock owner serializes");
        json.push(b'\n');
        json
    }

    /// The same owner, refreshed now.
    fn refreshed_now(&self) -> LockOwner {
        let now = SystemTime::now();
        LockOwner {
            refreshed: rfc3339(now),
            refreshed_unix_s: unix_s(now),
            ..self.clone()
        }
    }

    /// Why the holder is gone, when it is, as what follows "whose": its process ended (same
    /// host), or it has not refreshed the lock for `timing.stale_after` (another host).
    pub fn gone(&self, timing: LockTiming) -> Option<String> {
        if self.host == ringflow_core::host::hostname() {
            return (!process_alive(self.pid, self.pid_start))
                .then(|| "process has ended".to_string());
        }
        let silent = unix_s(SystemTime::now()).saturating_sub(self.refreshed_unix_s);
        (silent > timing.stale_after.as_secs()).then(|| {
            format!(
                "lock was not refreshed for {silent} s, over the {} s after which a lock from \
                 another host is stale",
                timing.stale_after.as_secs()
            )
        })
    }

    /// A stale lock for people, with `why` it is stale: "job … (pid 12 on host-1 since …,
    /// refreshed 80 s ago), whose …".
    fn gone_because(&self, why: &str) -> String {
        format!("job {} ({}), whose {why}", self.job_id, self.describe())
    }

    /// The holder for people: "pid 12 on host-1 since …, refreshed 3 s ago".
    pub fn describe(&self) -> String {
        let ago = unix_s(SystemTime::now()).saturating_sub(self.refreshed_unix_s);
        format!(
            "pid {} on {} since {}, refreshed {ago} s ago",
            self.pid, self.host, self.since
        )
    }
}

/// Seconds since the Unix epoch.
fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The start time of process `pid` (clock ticks after boot, field 22 of `/proc/PID/stat`), on
/// systems with `/proc`.
fn process_start(pid: u32) -> Option<u64> {
    let stat =
        std::fs::read_to_string(PathBuf::from("/proc").join(pid.to_string()).join("stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything, spaces included.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` still runs and is the one that started at `start` (when known). A
/// zombie has ended.
fn process_alive(pid: u32, start: Option<u64>) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid_t <= 0 {
        return false;
    }
    let stat = PathBuf::from("/proc").join(pid.to_string()).join("stat");
    if let Ok(text) = std::fs::read_to_string(&stat) {
        let fields: Vec<&str> = text
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
            return false;
        }
        let started = fields.get(19).and_then(|s| s.parse::<u64>().ok());
        return match (start, started) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        };
    }
    if std::path::Path::new("/proc/self/stat").exists() {
        // /proc works and has no entry for it.
        return false;
    }
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Why a lock could not be taken.
#[derive(Debug)]
enum Refusal {
    /// A live holder has it.
    Held(Box<LockOwner>),
    /// The directory or its lock cannot be written; the end of a sentence about the directory.
    Unusable(String),
}

/// Where a lock lives, and the version of it this holder wrote last (object stores).
enum Place {
    /// `<dir>/ringflow.lock` on the local file system.
    Local(PathBuf),
    /// The lock object, and its e-tag and version as this holder last wrote them.
    Store(Location, UpdateVersion),
}

/// A held lock could not be refreshed.
enum RefreshError {
    /// Another job has it now; why, as a sentence's end.
    Lost(String),
    /// The store failed this time (the next refresh tries again).
    Failed(String),
}

/// A held lock could not be removed.
#[derive(Debug, thiserror::Error)]
enum ReleaseError {
    /// The local lock file could not be removed.
    #[error("{}: {source}", .file.display())]
    Local {
        /// The lock file.
        file: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The lock object could not be deleted.
    #[error("{lock}: {}", first_line(source))]
    Store {
        /// The lock object.
        lock: String,
        /// What the store said (the message gives its first line).
        source: object_store::Error,
    },
}

/// The first line of a store's error.
fn first_line(e: &object_store::Error) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or(&text).trim().to_string()
}

impl Place {
    fn refresh(&mut self, owner: &mut LockOwner) -> Result<(), RefreshError> {
        let next = owner.refreshed_now();
        match self {
            Place::Local(file) => local::refresh(file, &next)?,
            Place::Store(lock, version) => *version = store::refresh(lock, version, &next)?,
        }
        *owner = next;
        Ok(())
    }

    fn release(&self, owner: &LockOwner) -> Result<(), ReleaseError> {
        match self {
            Place::Local(file) => local::release(file, owner),
            Place::Store(lock, _) => store::release(lock, owner),
        }
    }
}

enum Message {
    /// Remove the lock, then acknowledge and stop.
    Release(mpsc::SyncSender<()>),
}

/// An exclusive lock on a job's output directory, held until [`DirLock::release`] (or until
/// it is dropped, when the lock is removed in the background).
pub struct DirLock {
    key: String,
    dir: String,
    tx: Option<mpsc::Sender<Message>>,
    lost: Arc<Mutex<Option<String>>>,
    note: Option<String>,
}

impl std::fmt::Debug for DirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirLock")
            .field("key", &self.key)
            .field("dir", &self.dir)
            .finish()
    }
}

impl DirLock {
    /// Takes the lock on `dir` (the value of `key`, a local path or an object-store URL) for
    /// `job_id`, creating the directory when it is missing. Refused, in one sentence naming
    /// the key and the directory, when a live job holds it (naming that job, its host, pid and
    /// since when) or when the directory cannot be created or written.
    pub fn acquire(
        key: &str,
        dir: &str,
        job_id: &str,
        timing: LockTiming,
    ) -> Result<DirLock, OutputError> {
        let refusal = |r: Refusal| match r {
            Refusal::Held(holder) => OutputError::Locked {
                key: key.to_string(),
                dir: dir.to_string(),
                holder,
            },
            Refusal::Unusable(why) => OutputError::Unusable {
                key: key.to_string(),
                dir: dir.to_string(),
                why,
            },
        };
        let location = Location::parse(dir).map_err(|e| refusal(Refusal::Unusable(e.message)))?;
        let owner = LockOwner::this_process(job_id);
        let (place, took_over) = match location.local_path() {
            Some(path) => {
                let (file, took_over) = local::acquire(&path, &owner, timing).map_err(refusal)?;
                (Some(Place::Local(file)), took_over)
            }
            None => {
                let lock = location.join(LOCK_FILE);
                match store::acquire(&lock, &owner, timing).map_err(refusal)? {
                    store::Acquired::Held(version, took_over) => {
                        (Some(Place::Store(lock, version)), took_over)
                    }
                    store::Acquired::Unsupported(why) => {
                        let note = format!(
                            "{key} {dir} is not locked: its store cannot write conditionally \
                             ({why}), so nothing stops another job from writing into it at the \
                             same time"
                        );
                        warn!(job = %job_id, "{note}");
                        return Ok(DirLock {
                            key: key.to_string(),
                            dir: dir.to_string(),
                            tx: None,
                            lost: Arc::default(),
                            note: Some(note),
                        });
                    }
                }
            }
        };
        let note = took_over.map(|was| {
            let note = format!("took over the lock of {key} {dir} from {was}");
            warn!(job = %job_id, "{note}");
            note
        });
        let lost = Arc::new(Mutex::new(None));
        let tx = place.map(|p| spawn_keeper(p, owner, timing, lost.clone(), key, dir));
        Ok(DirLock {
            key: key.to_string(),
            dir: dir.to_string(),
            tx,
            lost,
            note,
        })
    }

    /// What the job's log should say about the lock: that it was taken over from a job that
    /// is gone, or that the directory's store cannot be locked.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Why the lock is no longer this job's, when another job took it over.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Removes the lock (when it is still this job's), waiting at most `wait` for storage; a
    /// slower store finishes in the background.
    pub fn release(&mut self, wait: Duration) {
        let Some(tx) = self.tx.take() else { return };
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if tx.send(Message::Release(done_tx)).is_ok() && done_rx.recv_timeout(wait).is_err() {
            warn!(
                "the lock of {} {} is still being removed after {:.0} s",
                self.key,
                self.dir,
                wait.as_secs_f64()
            );
        }
    }
}

/// Starts the thread that refreshes the lock at `place` and removes it when told (or when its
/// [`DirLock`] is dropped).
fn spawn_keeper(
    mut place: Place,
    mut owner: LockOwner,
    timing: LockTiming,
    lost: Arc<Mutex<Option<String>>>,
    key: &str,
    dir: &str,
) -> mpsc::Sender<Message> {
    let (tx, rx) = mpsc::channel::<Message>();
    let what = format!("{key} {dir}");
    let keep = move || {
        let mut warned = false;
        loop {
            match rx.recv_timeout(timing.refresh_every) {
                Err(mpsc::RecvTimeoutError::Timeout) => match place.refresh(&mut owner) {
                    Ok(()) => warned = false,
                    Err(RefreshError::Lost(why)) => {
                        let why = format!("lost its lock on {what}: {why}");
                        warn!(job = %owner.job_id, "{why}");
                        *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                        return;
                    }
                    Err(RefreshError::Failed(e)) if !warned => {
                        warn!(job = %owner.job_id, "the lock of {what} cannot be refreshed ({e}); retrying");
                        warned = true;
                    }
                    Err(RefreshError::Failed(_)) => {}
                },
                Ok(Message::Release(ack)) => {
                    if let Err(e) = place.release(&owner) {
                        warn!(job = %owner.job_id, "the lock of {what} cannot be removed: {e}");
                    }
                    let _ = ack.send(());
                    return;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = place.release(&owner);
                    return;
                }
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("ringflow-lock".into())
        .spawn(keep)
    {
        warn!("the lock of {key} {dir} will not be refreshed: {e}");
    }
    tx
}

#[cfg(test)]
mod tests;
