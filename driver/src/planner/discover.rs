//! Listing the Parquet files of a data path: a file, a directory, or a glob.

use std::path::{Path, PathBuf};

use crate::error::{DriverError, Result};

/// The Parquet files `path` names (for the spec key `key`), sorted.
///
/// A directory contributes every `*.parquet` file below it, skipping names that start with `_`
/// or `.` (Spark's `_SUCCESS` and hidden files). A path containing `*`, `?` or `[` is a glob
/// (whose wildcards, as in a shell, do not match a leading `.`).
pub fn files(key: &str, path: &str) -> Result<Vec<PathBuf>> {
    let fail = |m: String| DriverError::Data(format!("{key}: {m}"));
    let mut out = Vec::new();
    if path.contains(['*', '?', '[']) {
        let options = glob::MatchOptions {
            require_literal_leading_dot: true,
            ..Default::default()
        };
        let entries =
            glob::glob_with(path, options).map_err(|e| fail(format!("bad glob {path:?}: {e}")))?;
        for entry in entries {
            let p = entry.map_err(|e| fail(format!("cannot list {path:?}: {e}")))?;
            if p.is_file() {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err(fail(format!("the glob {path:?} matches no files")));
        }
    } else {
        let p = Path::new(path);
        if p.is_dir() {
            walk(p, &mut out).map_err(|e| fail(format!("cannot list {path:?}: {e}")))?;
            if out.is_empty() {
                return Err(fail(format!(
                    "the directory {path:?} holds no .parquet files"
                )));
            }
        } else if p.is_file() {
            out.push(p.to_path_buf());
        } else {
            return Err(fail(format!("{path:?} does not exist")));
        }
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('_') || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if name.ends_with(".parquet") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_globs_and_missing_paths() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "b.parquet",
            "a.parquet",
            "_SUCCESS",
            ".hidden.parquet",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/c.parquet"), b"").unwrap();
        let root = dir.path().to_str().unwrap();
        let names = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter()
                .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
                .collect()
        };
        assert_eq!(
            names(files("data.train", root).unwrap()),
            ["a.parquet", "b.parquet", "sub/c.parquet"]
        );
        let glob = format!("{root}/*.parquet");
        assert_eq!(
            names(files("data.train", &glob).unwrap()),
            ["a.parquet", "b.parquet"]
        );
        let err = files("data.test", &format!("{root}/nope.parquet")).unwrap_err();
        assert!(err.to_string().starts_with("data.test:"), "{err}");
        let err = files("data.train", &format!("{root}/*.csv")).unwrap_err();
        assert!(err.to_string().contains("matches no files"), "{err}");
    }
}
