//! The lock file on the local file system (or a shared one mounted on every host).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{LOCK_FILE, LockOwner, LockTiming, RefreshError, Refusal, ReleaseError};

/// The guard that one job creates while it replaces a stale lock.
const TAKEOVER_GUARD: &str = "ringflow.lock.takeover";
/// A guard older than this was left by a crash in the middle of a takeover.
const GUARD_STALE: Duration = Duration::from_secs(30);
/// Rounds of create / inspect / take over before giving up on a lock that keeps changing.
const ATTEMPTS: usize = 5;

/// Takes `<dir>/ringflow.lock` for `owner`, creating `dir` when missing; returns the lock
/// file, and when a stale lock was taken over, whose it was and why it was stale.
pub(super) fn acquire(
    dir: &Path,
    owner: &LockOwner,
    timing: LockTiming,
) -> Result<(PathBuf, Option<String>), Refusal> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Refusal::Unusable(format!("cannot be created: {e}")))?;
    let file = dir.join(LOCK_FILE);
    let bytes = owner.to_bytes();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        match create_new(&file, &bytes, &owner.token) {
            Ok(()) => return Ok((file, None)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(Refusal::Unusable(format!(
                    "cannot be written: creating its lock file {} failed ({e})",
                    file.display()
                )));
            }
        }
        let seen = match std::fs::read(&file) {
            Ok(seen) => seen,
            // Released in the meantime: try again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(Refusal::Unusable(format!(
                    "holds a lock file {} that cannot be read ({e})",
                    file.display()
                )));
            }
        };
        let holder = match serde_json::from_slice::<LockOwner>(&seen) {
            Ok(holder) => holder,
            Err(_) if older_than(&file, timing.stale_after) => {
                if take_over(&file, &seen, &bytes, &owner.token)? {
                    let was = format!(
                        "an unreadable lock file not written for over {} s",
                        timing.stale_after.as_secs()
                    );
                    return Ok((file, Some(was)));
                }
                continue;
            }
            Err(e) => {
                return Err(Refusal::Unusable(format!(
                    "holds a lock file {} that is not a ringflow lock ({e}); if no job uses \
                     the directory, delete the file",
                    file.display()
                )));
            }
        };
        let Some(why) = holder.gone(timing) else {
            return Err(Refusal::Held(Box::new(holder)));
        };
        if take_over(&file, &seen, &bytes, &owner.token)? {
            return Ok((file, Some(holder.gone_because(&why))));
        }
    }
    Err(Refusal::Unusable(format!(
        "has a lock file {} that kept changing hands while this job tried to take it",
        file.display()
    )))
}

/// Whether `file` was last written more than `age` ago.
fn older_than(file: &Path, age: Duration) -> bool {
    std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|d| d > age)
}

/// A temporary file beside `file`, unique to the holder `token`.
fn temporary(file: &Path, token: &str) -> PathBuf {
    file.with_file_name(format!(".{LOCK_FILE}.{token}.tmp"))
}

/// Writes `bytes` to a temporary file beside `file` and syncs it; returns its path.
fn write_temporary(file: &Path, bytes: &[u8], token: &str) -> std::io::Result<PathBuf> {
    let tmp = temporary(file, token);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Creates `file` holding `bytes` only if it does not exist, so that a reader never sees it
/// half written: a hard link of a complete temporary file (or, where the file system has no
/// hard links, an exclusive create).
fn create_new(file: &Path, bytes: &[u8], token: &str) -> std::io::Result<()> {
    let tmp = write_temporary(file, bytes, token)?;
    let linked = std::fs::hard_link(&tmp, file);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(file)?;
            f.write_all(bytes)?;
            f.sync_all()
        }
        other => other,
    }
}

/// Replaces `file` by `bytes` atomically (a rename of a complete temporary file).
fn replace(file: &Path, bytes: &[u8], token: &str) -> std::io::Result<()> {
    let tmp = write_temporary(file, bytes, token)?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Replaces the stale lock `seen` in `file` by `bytes`, unless it changed meanwhile or another
/// job is taking it over right now (false: look again).
fn take_over(file: &Path, seen: &[u8], bytes: &[u8], token: &str) -> Result<bool, Refusal> {
    let guard = file.with_file_name(TAKEOVER_GUARD);
    let unusable = |e: std::io::Error| {
        Refusal::Unusable(format!(
            "cannot be written: replacing its stale lock file {} failed ({e})",
            file.display()
        ))
    };
    if older_than(&guard, GUARD_STALE) {
        let _ = std::fs::remove_file(&guard);
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&guard)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(unusable(e)),
    }
    let unchanged = std::fs::read(file).is_ok_and(|now| now == seen);
    let replaced = if unchanged {
        replace(file, bytes, token).map(|()| true)
    } else {
        Ok(false)
    };
    let _ = std::fs::remove_file(&guard);
    replaced.map_err(unusable)
}

/// Reads the holder of `file`.
fn holder(file: &Path) -> Result<LockOwner, RefreshError> {
    let bytes = std::fs::read(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            RefreshError::Lost(format!("its lock file {} was deleted", file.display()))
        }
        _ => RefreshError::Failed(e.to_string()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        RefreshError::Lost(format!(
            "its lock file {} was replaced by something else ({e})",
            file.display()
        ))
    })
}

/// Rewrites `file` with `next` (the same holder, refreshed now), if it is still that holder's.
pub(super) fn refresh(file: &Path, next: &LockOwner) -> Result<(), RefreshError> {
    let current = holder(file)?;
    if current.token != next.token {
        return Err(RefreshError::Lost(format!(
            "job {} took it over ({})",
            current.job_id,
            current.describe()
        )));
    }
    replace(file, &next.to_bytes(), &next.token).map_err(|e| RefreshError::Failed(e.to_string()))
}

/// Removes `file` if it is still `owner`'s.
pub(super) fn release(file: &Path, owner: &LockOwner) -> Result<(), ReleaseError> {
    match holder(file) {
        Ok(current) if current.token == owner.token => {
            std::fs::remove_file(file).map_err(|source| ReleaseError::Local {
                file: file.to_path_buf(),
                source,
            })
        }
        // Someone else's now, or gone: nothing to remove.
        _ => Ok(()),
    }
}
