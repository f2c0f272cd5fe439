//! Where jobs write, checked before any executor starts and held while a job runs.
//!
//! A training job writes its model, checkpoints, event log and lock into its checkpoint
//! directory; a prediction writes its parts into `--output`. At submit time, before any
//! executor starts, [`check_dir`] refuses a location that cannot become such a directory: the
//! file system's root, a regular file, a device, a directory that cannot be written, or one that
//! cannot be created because of what lies above it. It creates nothing: a refused job leaves no
//! trace. The job then takes its directory's [`lock`], whose creation is the real write probe
//! (on object stores the conditional put that creates the lock object is the only one).
//!
//! [`check_local_file`] does the same for a file the command line writes itself
//! (`--summary-json`, `--timeline`). A prediction's output is checked further, and replaced
//! whole with `--overwrite`, by [`prediction`].

mod error;
pub mod lock;
pub mod prediction;

use std::ffi::CString;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use ringflow_core::data::Location;

pub use error::{CleanError, DirError, HeldError};
pub use lock::{DirLock, LOCK_FILE, LockOwner, LockTiming};

/// A job's output location that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The location cannot be (or become) a writable directory.
    #[error("{key} {dir} {why}")]
    Unusable {
        /// The spec key or flag that gave it (`cluster.checkpoint_dir`, `--output`).
        key: String,
        /// The location as given.
        dir: String,
        /// What is wrong, as the end of a sentence ("is a regular file, not a directory").
        why: String,
    },
    /// Another job holds the directory's lock.
    #[error(
        "{key} {dir} is in use by job {} ({}); wait for that job to end, cancel it \
         (`ringflow cancel {}`), or give this job another {key}",
        holder.job_id, holder.describe(), holder.job_id
    )]
    Locked {
        /// The spec key or flag that gave the directory.
        key: String,
        /// The directory as given.
        dir: String,
        /// Who holds it.
        holder: Box<LockOwner>,
    },
    /// An output that is, contains or lies inside something the job reads.
    #[error(
        "{key} {dir} {how} the {input_key} {input}; predictions are never written where the \
         job reads (--overwrite does not change that), so give {key} a directory outside it"
    )]
    Overlaps {
        /// The flag that gave the output (`--output`).
        key: String,
        /// The output as given.
        dir: String,
        /// `is`, `is inside` or `contains`.
        how: String,
        /// The flag or key of the input (`--data`, `--model`, `model's data.tables.names`).
        input_key: String,
        /// The input as given.
        input: String,
    },
    /// An output that already holds something, without `--overwrite`.
    #[error(
        "{key} {dir} already holds {held} (such as {example}); give {key} a new or empty \
         directory, or pass --overwrite to replace everything in it with this run's \
         predictions"
    )]
    NotEmpty {
        /// The flag that gave the output (`--output`).
        key: String,
        /// The output as given.
        dir: String,
        /// How much it holds ("3 entries").
        held: String,
        /// One of them.
        example: String,
    },
}

/// Checks, without creating anything, that `dir` (the value of `key`) can be a job's output
/// directory: an object-store URL with credentials (its lock's conditional put probes it), or a
/// local directory that exists and can be written, or that can be created in a writable
/// directory. The file system's root is refused, however it is written.
pub fn check_dir(key: &str, dir: &str) -> Result<(), OutputError> {
    let unusable = |why: String| OutputError::Unusable {
        key: key.to_string(),
        dir: dir.to_string(),
        why,
    };
    if dir.trim().is_empty() {
        return Err(unusable("is empty".into()));
    }
    let location = Location::parse(dir).map_err(|e| unusable(e.message))?;
    let Some(path) = location.local_path() else {
        return Ok(());
    };
    if path.parent().is_none() {
        return Err(unusable(
            "is the file system's root; give the job a directory of its own".into(),
        ));
    }
    check_local_dir(&path).map_err(|e| unusable(e.to_string()))
}

/// Why the local directory `path` cannot be written or created, if it cannot: it is not a
/// directory, it cannot be written, or its first existing ancestor is not a writable directory.
/// Creates nothing.
pub fn check_local_dir(path: &Path) -> Result<(), DirError> {
    let mut at = path;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => {
                return writable(at).map_err(|source| {
                    if at == path {
                        DirError::NotWritable(source)
                    } else {
                        DirError::AncestorNotWritable {
                            at: at.to_path_buf(),
                            source,
                        }
                    }
                });
            }
            Ok(m) => {
                return Err(if at == path {
                    DirError::NotADirectory(kind(&m))
                } else {
                    DirError::AncestorNotADirectory {
                        at: at.to_path_buf(),
                        kind: kind(&m),
                    }
                });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                at = match at.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent,
                    _ => Path::new("."),
                };
            }
            Err(e) => return Err(DirError::Unchecked(e)),
        }
    }
}

/// Checks, without creating anything, that the local file `path` (the value of `flag`) can be
/// written later: it is not a directory, and its directory exists and can be written or can be
/// created. The error is one sentence naming the flag and the path.
pub fn check_local_file(flag: &str, path: &Path) -> Result<(), OutputError> {
    let unusable = |why: String| OutputError::Unusable {
        key: flag.to_string(),
        dir: path.display().to_string(),
        why,
    };
    let absolute =
        std::path::absolute(path).map_err(|e| unusable(format!("cannot be resolved: {e}")))?;
    match std::fs::metadata(&absolute) {
        Ok(m) if m.is_dir() => return Err(unusable("is a directory, not a file".into())),
        Ok(_) | Err(_) => {}
    }
    let Some(dir) = absolute.parent() else {
        return Err(unusable("is not a file name".into()));
    };
    check_local_dir(dir).map_err(|why| {
        unusable(format!(
            "cannot be written: its directory {} {why}",
            dir.display()
        ))
    })
}

/// What kind of file `m` describes, with its article ("a regular file").
fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file or directory"
    }
}

/// Whether this process may create files in the directory `dir` (write and search permission).
fn writable(dir: &Path) -> std::io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the path holds a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let rc = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(key: &str, dir: &str) -> String {
        check_dir(key, dir).unwrap_err().to_string()
    }

    #[test]
    fn refuses_what_cannot_become_a_directory_naming_key_path_and_why() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let f = file.display().to_string();
        assert_eq!(
            why("cluster.checkpoint_dir", &f),
            format!("cluster.checkpoint_dir {f} is a regular file, not a directory")
        );
        let below = format!("{f}/sub/dir");
        assert_eq!(
            why("--output", &below),
            format!("--output {below} cannot be created: {f} is a regular file")
        );
        assert_eq!(
            why("cluster.checkpoint_dir", "/dev/null"),
            "cluster.checkpoint_dir /dev/null is a character device, not a directory"
        );
        for root in ["/", "/..", "file:///"] {
            assert!(
                why("cluster.checkpoint_dir", root).contains("is the file system's root"),
                "{root}"
            );
        }
        assert!(why("cluster.checkpoint_dir", " ").ends_with(" is empty"));
        assert!(why("--output", "hdfs://x/y").contains("unsupported scheme"));
    }

    #[test]
    fn accepts_existing_and_creatable_directories_without_creating_them() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().display().to_string();
        check_dir("k", &d).unwrap();
        let deep = tmp.path().join("a/b/c");
        check_dir("k", &deep.display().to_string()).unwrap();
        assert!(!tmp.path().join("a").exists(), "nothing is created");
        check_local_file("--summary-json", &tmp.path().join("new/s.json")).unwrap();
        let err = check_local_file("--summary-json", tmp.path()).unwrap_err();
        assert!(
            err.to_string().ends_with("is a directory, not a file"),
            "{err}"
        );
    }

    #[test]
    fn an_unwritable_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        // Root may write into any directory of a normal file system, but not into /proc's.
        // SAFETY: geteuid has no preconditions.
        let ro = if unsafe { libc::geteuid() } == 0 {
            std::path::PathBuf::from("/proc/self")
        } else {
            let ro = tmp.path().join("ro");
            std::fs::create_dir(&ro).unwrap();
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
            ro
        };
        let r = ro.display().to_string();
        let err = why("k", &r);
        assert!(
            err.starts_with(&format!("k {r} is not writable (")),
            "{err}"
        );
        let sub = ro.join("sub").display().to_string();
        let err = why("k", &sub);
        assert!(
            err.contains(&format!("cannot be created: {r} is not writable")),
            "{err}"
        );
    }
}
