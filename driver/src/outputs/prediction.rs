//! A prediction's output directory (`--output`): checked at submit, before any executor
//! starts, and replaced whole (never mixed with an earlier run) with `--overwrite`.
//!
//! - [`check_inputs`]: an output that is, contains or lies inside anything the job reads
//!   (`--data`, the model's directory, a lookup table of the model's `data.sql`) is refused,
//!   naming both, with or without `--overwrite`. Local paths are compared after resolving
//!   `..` and symbolic links (a path that does not exist yet through its existing ancestor);
//!   URLs by store, bucket and path segments; a glob by the directory its wildcards start in.
//! - [`check_existing`]: an output that already holds anything but its lock is refused unless
//!   `--overwrite` is given.
//! - With `--overwrite` on a file system, executors write into a fresh hidden sibling of the
//!   output ([`write_dir`]), and once every part is written [`commit`] swaps it in by rename
//!   (one atomic exchange where the system has it, else the old output renamed aside first);
//!   the old contents are removed after. A reader or a crash sees the old output or the new
//!   one, never both; a failed job's sibling is removed ([`abandon`]). The lock file moves
//!   with the swap (a hard link of it is put in the new directory first), so the job holds
//!   the lock on `--output` to its end.
//! - On an object store, which cannot rename, executors write their parts over the output
//!   and [`commit`] then deletes every other object in it (but the lock), listing what it
//!   deleted in the job's messages.

use std::path::{Path, PathBuf};

use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use ringflow_core::data::Location;
use ringflow_core::data::local::is_glob;
use ringflow_core::data::runtime::block_on;
use ringflow_core::spec::JobSpec;

use super::{CleanError, HeldError, LOCK_FILE, OutputError};

/// The flag that names a prediction's output.
const KEY: &str = "--output";

/// How many names a message lists before it says how many more there are.
const LISTED: usize = 5;

/// A place to compare: a resolved local path, or a store and the path segments within it.
#[derive(Debug, PartialEq)]
enum Place {
    Local(PathBuf),
    Store { root: String, parts: Vec<String> },
}

impl Place {
    /// `text` (a path, URL or glob) as a place; `None` when it cannot be parsed (planning
    /// refuses it with its own sentence).
    fn of(text: &str) -> Option<Place> {
        let base = match text.find(['*', '?', '[']).filter(|_| is_glob(text)) {
            Some(i) => &text[..text[..i].rfind('/').map_or(0, |j| j + 1)],
            None => text,
        };
        let base = if base.is_empty() { "." } else { base };
        let location = Location::parse(base).ok()?;
        if let Some(path) = location.local_path() {
            return Some(Place::Local(resolved(&path)));
        }
        let url = location.url();
        let root = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default(),
            url.port().map(|p| format!(":{p}")).unwrap_or_default()
        );
        let parts = location.path().parts().map(|p| p.as_ref().to_string());
        Some(Place::Store {
            root,
            parts: parts.collect(),
        })
    }

    /// Whether `self` is `other` or lies below it.
    fn within(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Local(a), Place::Local(b)) => a.starts_with(b),
            (Place::Store { root: r, parts: a }, Place::Store { root: q, parts: b }) => {
                r == q && a.starts_with(b)
            }
            _ => false,
        }
    }
}

/// `path` (absolute) with its symbolic links resolved: its longest existing ancestor
/// canonicalized, the rest appended.
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path.to_path_buf();
    loop {
        if let Ok(real) = at.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (at.file_name().map(ToOwned::to_owned), at.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                at = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// What a prediction of the model saved in `model_dir` (trained with `spec`) over `data`
/// reads, each named by its flag or key: the data, the model, the lookup tables of its
/// `data.sql`.
pub fn inputs(model_dir: &str, data: &str, spec: &JobSpec) -> Vec<(String, String)> {
    let mut out = vec![
        ("--data".to_string(), data.to_string()),
        ("--model".to_string(), model_dir.to_string()),
    ];
    for (name, path) in &spec.data.tables {
        out.push((format!("model's data.tables.{name}"), path.clone()));
    }
    out
}

/// Refuses `output` when it is, contains or lies inside one of `inputs` (each named by the
/// flag or key that gave it), in one sentence naming both.
pub fn check_inputs(output: &str, inputs: &[(String, String)]) -> Result<(), OutputError> {
    let Some(out) = Place::of(output) else {
        return Ok(());
    };
    for (key, input) in inputs {
        let Some(place) = Place::of(input) else {
            continue;
        };
        let how = if out == place {
            "is"
        } else if out.within(&place) {
            "is inside"
        } else if place.within(&out) {
            "contains"
        } else {
            continue;
        };
        return Err(OutputError::Overlaps {
            key: KEY.into(),
            dir: output.into(),
            how: how.into(),
            input_key: key.clone(),
            input: input.clone(),
        });
    }
    Ok(())
}

/// Refuses `output` when it already holds anything but its lock, unless `overwrite`; with
/// `overwrite`, refuses a local output whose directory cannot take the sibling that replaces
/// it.
pub fn check_existing(output: &str, overwrite: bool) -> Result<(), OutputError> {
    let unusable = |why: String| OutputError::Unusable {
        key: KEY.into(),
        dir: output.into(),
        why,
    };
    let location = Location::parse(output).map_err(|e| unusable(e.message))?;
    let held = held(&location).map_err(|e| unusable(e.to_string()))?;
    if !held.is_empty() && !overwrite {
        return Err(OutputError::NotEmpty {
            key: KEY.into(),
            dir: output.into(),
            held: counted(held.len(), "entry", "entries"),
            example: held[0].clone(),
        });
    }
    if let (true, Some(path)) = (overwrite, location.local_path())
        && let Some(parent) = path.parent()
    {
        super::check_local_dir(parent).map_err(|why| {
            unusable(format!(
                "cannot be replaced: --overwrite writes the new predictions beside it, but its \
                 directory {} {why}",
                parent.display()
            ))
        })?;
    }
    Ok(())
}

/// The names of what `location` (a directory or prefix) holds, but its lock: its entries
/// locally (none when it does not exist), the objects below it (relative) on a store.
fn held(location: &Location) -> Result<Vec<String>, HeldError> {
    if let Some(path) = location.local_path() {
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(HeldError::Unlisted(e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOCK_FILE)
            .collect();
        names.sort();
        return Ok(names);
    }
    let listed = {
        let location = location.clone();
        block_on(async move { location.list().await }).map_err(HeldError::Store)?
    };
    Ok(relative(location, &listed)
        .into_iter()
        .filter(|n| n != LOCK_FILE)
        .collect())
}

/// Each of `objects` (below `base`) by its path relative to `base`.
fn relative(base: &Location, objects: &[ObjectPath]) -> Vec<String> {
    let depth = base.path().parts().count();
    objects
        .iter()
        .map(|o| {
            let parts: Vec<String> = o.parts().map(|p| p.as_ref().to_string()).collect();
            parts[depth.min(parts.len())..].join("/")
        })
        .collect()
}

/// Where a prediction's executors write their parts: the output itself, or with `overwrite`
/// on a local file system the sibling that [`commit`] swaps in.
pub fn write_dir(output: &str, overwrite: bool, job_id: &str) -> String {
    match staging(output, job_id).filter(|_| overwrite) {
        Some(s) => s.display().to_string(),
        None => output.to_string(),
    }
}

/// The hidden sibling of the local `output` that job `job_id` writes into with `--overwrite`
/// (`.<name>.ringflow-<job id>`); `None` on an object store.
fn staging(output: &str, job_id: &str) -> Option<PathBuf> {
    let path = Location::parse(output).ok()?.local_path()?;
    let name = path.file_name()?.to_string_lossy().into_owned();
    Some(path.with_file_name(format!(".{name}.ringflow-{job_id}")))
}

/// Makes what job `job_id` wrote the output, with `--overwrite`: swaps the local sibling in
/// (see the module docs), or deletes from the store every object but the lock and `written`
/// (the parts this run wrote, relative names). Returns what the job's messages should say.
pub fn commit(output: &str, job_id: &str, written: &[String]) -> Result<String, OutputError> {
    let fail = |why: String| OutputError::Unusable {
        key: KEY.into(),
        dir: output.into(),
        why,
    };
    let location = Location::parse(output).map_err(|e| fail(e.message))?;
    let Some(path) = location.local_path() else {
        return clean_store(&location, written).map_err(|e| fail(e.to_string()));
    };
    let new = staging(output, job_id).ok_or_else(|| fail("has no directory name".into()))?;
    let old = held(&location).map_err(|e| fail(e.to_string()))?;
    std::fs::create_dir_all(&new)
        .map_err(|e| fail(format!("cannot be replaced: {} ({e})", new.display())))?;
    let lock = path.join(LOCK_FILE);
    if lock.exists()
        && std::fs::hard_link(&lock, new.join(LOCK_FILE)).is_err()
        && let Ok(bytes) = std::fs::read(&lock)
    {
        let _ = std::fs::write(new.join(LOCK_FILE), bytes);
    }
    let aside = swap(&new, &path).map_err(|e| {
        fail(format!(
            "cannot be replaced by {} ({e}); the previous output is unchanged",
            new.display()
        ))
    })?;
    // The previous contents, now outside the output; a leftover is hidden and harmless.
    let _ = std::fs::remove_dir_all(&aside);
    Ok(format!(
        "--overwrite: {KEY} {output} was replaced whole by this run's predictions ({} of the \
         previous output removed)",
        counted(old.len(), "entry", "entries")
    ))
}

/// Puts the directory `new` in place of `path`, atomically where the system can exchange two
/// names (else `path` is first renamed aside); returns where the old directory is now.
fn swap(new: &Path, path: &Path) -> std::io::Result<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other("the path holds a NUL byte"))
        };
        let (a, b) = (c(new)?, c(path)?);
        // SAFETY: both are valid NUL-terminated paths for the duration of the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            return Ok(new.to_path_buf());
        }
        let e = std::io::Error::last_os_error();
        let unsupported = [libc::EINVAL, libc::ENOSYS, libc::EOPNOTSUPP];
        if !e.raw_os_error().is_some_and(|c| unsupported.contains(&c)) {
            return Err(e);
        }
    }
    swap_by_renames(new, path)
}

/// [`swap`] in two renames: `path` aside (beside `new`, with `.old` added), then `new` in its
/// place (or `path` back, when that fails); returns where the old directory is now.
fn swap_by_renames(new: &Path, path: &Path) -> std::io::Result<PathBuf> {
    let name = new.file_name().unwrap_or_default().to_string_lossy();
    let aside = new.with_file_name(format!("{name}.old"));
    std::fs::rename(path, &aside)?;
    if let Err(e) = std::fs::rename(new, path) {
        let _ = std::fs::rename(&aside, path);
        return Err(e);
    }
    Ok(aside)
}

/// Deletes every object below `location` but the lock and `written`; says which it deleted.
fn clean_store(location: &Location, written: &[String]) -> Result<String, CleanError> {
    let listed = {
        let location = location.clone();
        block_on(async move { location.list().await }).map_err(CleanError::List)?
    };
    let names = relative(location, &listed);
    let mut deleted = Vec::new();
    for (object, name) in listed.iter().zip(names) {
        if name == LOCK_FILE || written.contains(&name) {
            continue;
        }
        let store = location.store().clone();
        let object = object.clone();
        block_on(async move { store.delete(&object).await }).map_err(|source| {
            CleanError::Delete {
                name: name.clone(),
                source,
            }
        })?;
        deleted.push(name);
    }
    let shown: Vec<&str> = deleted.iter().take(LISTED).map(String::as_str).collect();
    let more = deleted.len().saturating_sub(LISTED);
    let list = match (shown.is_empty(), more) {
        (true, _) => String::new(),
        (false, 0) => format!(": {}", shown.join(", ")),
        (false, n) => format!(": {} and {n} more", shown.join(", ")),
    };
    Ok(format!(
        "--overwrite: this run's parts were written over {KEY} {}; deleted {} of the previous \
         output that this run did not write{list}",
        location.as_str(),
        counted(deleted.len(), "object", "objects")
    ))
}

/// Removes what job `job_id` wrote beside the local `output` with `--overwrite`, after it
/// failed or was cancelled, leaving the output as it was (true); false for an object store,
/// whose output the parts were written over.
pub fn abandon(output: &str, job_id: &str) -> bool {
    match staging(output, job_id) {
        Some(new) => {
            let _ = std::fs::remove_dir_all(new);
            true
        }
        None => false,
    }
}

/// "1 entry", "3 entries".
fn counted(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod tests;
