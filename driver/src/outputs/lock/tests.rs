use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

const KEY: &str = "cluster.checkpoint_dir";

fn fast() -> LockTiming {
    LockTiming {
        refresh_every: Duration::from_millis(50),
        stale_after: Duration::from_secs(60),
    }
}

fn take(dir: &Path, job: &str) -> Result<DirLock, OutputError> {
    DirLock::acquire(KEY, &dir.display().to_string(), job, LockTiming::default())
}

fn read_owner(dir: &Path) -> LockOwner {
    serde_json::from_slice(&std::fs::read(dir.join(LOCK_FILE)).unwrap()).unwrap()
}

fn write_owner(dir: &Path, owner: &LockOwner) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(LOCK_FILE), owner.to_bytes()).unwrap();
}

/// Waits (at most 10 s) for `cond`.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of a process that has ended.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_second_job_is_refused_naming_the_holder_until_the_first_releases() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new/ckpt");
    let mut first = take(&dir, "first-1").unwrap();
    assert!(first.note().is_none());
    let owner = read_owner(&dir);
    assert_eq!(owner.job_id, "first-1");
    assert_eq!(owner.pid, std::process::id());
    assert_eq!(owner.host, ringflow_core::host::hostname());

    let err = take(&dir, "second-1").unwrap_err();
    assert!(matches!(err, OutputError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    let d = dir.display();
    assert!(
        msg.starts_with(&format!(
            "{KEY} {d} is in use by job first-1 (pid {} on ",
            owner.pid
        )),
        "{msg}"
    );
    assert!(msg.contains(&format!("since {}", owner.since)), "{msg}");
    assert!(msg.contains("ringflow cancel first-1"), "{msg}");

    first.release(Duration::from_secs(5));
    assert!(!dir.join(LOCK_FILE).exists(), "released");
    let mut second = take(&dir, "second-1").unwrap();
    assert_eq!(read_owner(&dir).job_id, "second-1");
    second.release(Duration::from_secs(5));
}

#[test]
fn of_jobs_that_start_at_once_exactly_one_gets_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (dir, barrier) = (dir.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                take(&dir, &format!("job-{i}"))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let held: Vec<&DirLock> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(held.len(), 1, "{results:?}");
    let winner = read_owner(&dir).job_id;
    for r in &results {
        if let Err(e) = r {
            assert!(
                e.to_string()
                    .contains(&format!("is in use by job {winner} ")),
                "{e}"
            );
        }
    }
}

#[test]
fn a_lock_whose_process_ended_is_taken_over_and_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let mut crashed = LockOwner::this_process("crashed-1");
    crashed.pid = dead_pid();
    crashed.pid_start = None;
    write_owner(tmp.path(), &crashed);
    let mut lock = take(tmp.path(), "next-1").unwrap();
    let note = lock.note().unwrap();
    assert!(
        note.contains("took over the lock of")
            && note.contains("from job crashed-1 (pid")
            && note.ends_with("whose process has ended"),
        "{note}"
    );
    assert_eq!(read_owner(tmp.path()).job_id, "next-1");
    lock.release(Duration::from_secs(5));

    // A live pid that started at another time is another process: the holder is gone.
    let mut reused = LockOwner::this_process("reused-1");
    reused.pid_start = reused.pid_start.map(|t| t + 1);
    write_owner(tmp.path(), &reused);
    if reused.pid_start.is_some() {
        let mut lock = take(tmp.path(), "next-2").unwrap();
        assert!(lock.note().unwrap().contains("from job reused-1"));
        lock.release(Duration::from_secs(5));
    }
}

#[test]
fn a_lock_from_another_host_is_taken_over_only_once_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let mut remote = LockOwner::this_process("remote-1");
    remote.host = "another-host.invalid".into();
    remote.pid = 1;
    write_owner(tmp.path(), &remote);
    let err = take(tmp.path(), "mine-1").unwrap_err().to_string();
    assert!(
        err.contains("in use by job remote-1 (pid 1 on another-host.invalid"),
        "{err}"
    );

    remote.refreshed_unix_s -= 61;
    write_owner(tmp.path(), &remote);
    let mut lock = take(tmp.path(), "mine-1").unwrap();
    let note = lock.note().unwrap();
    assert!(
        note.contains("from job remote-1") && note.contains("was not refreshed for 61 s"),
        "{note}"
    );
    lock.release(Duration::from_secs(5));
}

#[test]
fn a_foreign_lock_file_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(LOCK_FILE), "not json").unwrap();
    let err = take(tmp.path(), "j-1").unwrap_err().to_string();
    assert!(
        err.contains(&format!("{}/{LOCK_FILE}", tmp.path().display()))
            && err.contains("is not a ringflow lock"),
        "{err}"
    );
}

#[test]
fn the_holder_refreshes_its_lock_and_notices_when_it_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display().to_string();
    let mut lock = DirLock::acquire(KEY, &d, "mine-1", fast()).unwrap();
    let first = read_owner(tmp.path());
    eventually("a refresh", || {
        let now = read_owner(tmp.path());
        now.refreshed != first.refreshed && now.token == first.token
    });
    assert!(lock.lost().is_none());

    // Another job replaces the lock (as a takeover would): the holder learns it, and its
    // release leaves the other job's lock alone.
    let mut other = LockOwner::this_process("other-1");
    other.host = "another-host.invalid".into();
    write_owner(tmp.path(), &other);
    eventually("noticing the loss", || lock.lost().is_some());
    let lost = lock.lost().unwrap();
    assert!(
        lost.contains(&format!(
            "lost its lock on {KEY} {d}: job other-1 took it over"
        )),
        "{lost}"
    );
    lock.release(Duration::from_secs(5));
    assert_eq!(read_owner(tmp.path()).job_id, "other-1");
}

#[test]
fn a_dropped_lock_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    drop(take(tmp.path(), "j-1").unwrap());
    eventually("the removal", || !tmp.path().join(LOCK_FILE).exists());
}

#[test]
fn a_directory_that_cannot_hold_a_lock_is_refused_by_key_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let below = file.join("ckpt");
    let err = take(&below, "j-1").unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{KEY} {} cannot be created: ", below.display())),
        "{err}"
    );
    let err = take(Path::new("/proc/self"), "j-1")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{KEY} /proc/self cannot be written: creating its lock file"
        )),
        "{err}"
    );
}
