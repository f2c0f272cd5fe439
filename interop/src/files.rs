//! Writing exported files: each through a temporary name beside it and renamed into place, so
//! a reader never sees half a file, and never over an existing one unless asked.

use std::path::{Path, PathBuf};

use crate::error::ExportError;

/// Writes each `(path, bytes)` of `files`; refuses, before writing any, when one exists and
/// `overwrite` is false.
pub fn write_new(files: &[(&Path, &[u8])], overwrite: bool) -> Result<(), ExportError> {
    for (path, _) in files {
        if !overwrite && path.exists() {
            return Err(ExportError::Exists {
                path: path.display().to_string(),
            });
        }
    }
    files
        .iter()
        .try_for_each(|(path, bytes)| write_atomic(path, bytes))
}

/// Writes `bytes` to `path` through a temporary file beside it.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    let fail = |source| ExportError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e)
    })
}
