//! Listing the Parquet files of a data path: a file, a directory (prefix), or a glob, on the
//! local file system or in an object store.

use std::path::Path;

use ringflow_proto::data::Location;
use ringflow_proto::data::location::is_local;
use ringflow_proto::data::runtime::block_on;

use crate::error::{DriverError, Result};

/// The Parquet files `path` names (for the spec key `key`), sorted, written the way the user
/// wrote `path` (a relative directory gives relative file paths, a URL gives URLs).
///
/// A directory or prefix contributes every `*.parquet` file below it, skipping names that start
/// with `_` or `.` (Spark's `_SUCCESS` and hidden files). A path containing `*`, `?` or `[` is a
/// glob (whose wildcards, as in a shell, do not match a leading `.`).
pub fn files(key: &str, path: &str) -> Result<Vec<String>> {
    if is_local(path) && !path.starts_with("file://") {
        local_files(key, path)
    } else {
        remote_files(key, path)
    }
}

fn fail(key: &str, m: String) -> DriverError {
    DriverError::Data(format!("{key}: {m}"))
}

fn local_files(key: &str, path: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if path.contains(['*', '?', '[']) {
        let options = glob::MatchOptions {
            require_literal_leading_dot: true,
            ..Default::default()
        };
        let entries = glob::glob_with(path, options)
            .map_err(|e| fail(key, format!("bad glob {path:?}: {e}")))?;
        for entry in entries {
            let p = entry.map_err(|e| fail(key, format!("cannot list {path:?}: {e}")))?;
            if p.is_file() {
                out.push(p.display().to_string());
            }
        }
        if out.is_empty() {
            return Err(fail(key, format!("the glob {path:?} matches no files")));
        }
    } else {
        let p = Path::new(path);
        if p.is_dir() {
            walk(p, &mut out).map_err(|e| fail(key, format!("cannot list {path:?}: {e}")))?;
            if out.is_empty() {
                return Err(fail(
                    key,
                    format!("the directory {path:?} holds no .parquet files"),
                ));
            }
        } else if p.is_file() {
            out.push(path.to_string());
        } else {
            return Err(fail(key, format!("{path:?} does not exist")));
        }
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
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
            out.push(path.display().to_string());
        }
    }
    Ok(())
}

/// Files in an object store: one object, every `.parquet` object below a prefix, or the
/// objects that match a glob.
fn remote_files(key: &str, path: &str) -> Result<Vec<String>> {
    let wild = path.find(['*', '?', '[']);
    let base_text = match wild {
        Some(i) => &path[..path[..i].rfind('/').map(|j| j + 1).unwrap_or(i)],
        None => path,
    };
    let base = Location::parse(base_text).map_err(|e| fail(key, e.to_string()))?;
    let listed = {
        let base = base.clone();
        block_on(async move { base.list().await }).map_err(|e| fail(key, e.to_string()))?
    };
    let pattern = match wild {
        Some(_) => Some(
            glob::Pattern::new(path).map_err(|e| fail(key, format!("bad glob {path:?}: {e}")))?,
        ),
        None => None,
    };
    let mut out = Vec::new();
    for object in &listed {
        let child = base.child(object);
        let name = object.filename().unwrap_or_default();
        if name.starts_with('_') || name.starts_with('.') {
            continue;
        }
        match &pattern {
            Some(p) => {
                let options = glob::MatchOptions {
                    require_literal_leading_dot: true,
                    require_literal_separator: true,
                    ..Default::default()
                };
                if p.matches_with(child.as_str(), options) {
                    out.push(child.as_str().to_string());
                }
            }
            None if object == base.path() => out.push(path.to_string()),
            None if name.ends_with(".parquet") => out.push(child.as_str().to_string()),
            None => {}
        }
    }
    if out.is_empty() {
        // A single object is not listed under its own name by every store: ask for it.
        if wild.is_none() {
            let single = base.clone();
            if block_on(async move { single.size().await }).is_ok() {
                return Ok(vec![path.to_string()]);
            }
        }
        return Err(fail(
            key,
            match wild {
                Some(_) => format!("the glob {path:?} matches no files"),
                None => format!("{path:?} does not exist or holds no .parquet files"),
            },
        ));
    }
    out.sort();
    Ok(out)
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
        let names = |v: Vec<String>| -> Vec<String> {
            v.iter()
                .map(|p| {
                    p.strip_prefix(root)
                        .unwrap()
                        .trim_start_matches('/')
                        .to_string()
                })
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
        let url = format!("file://{root}");
        assert_eq!(
            names(
                files("data.train", &url)
                    .unwrap()
                    .into_iter()
                    .map(|u| u.replace("file://", ""))
                    .collect()
            ),
            ["a.parquet", "b.parquet", "sub/c.parquet"]
        );
        let url_glob = format!("file://{root}/*.parquet");
        assert_eq!(files("data.train", &url_glob).unwrap().len(), 2);
        let err = files("data.test", &format!("{root}/nope.parquet")).unwrap_err();
        assert!(err.to_string().starts_with("data.test:"), "{err}");
        let err = files("data.train", &format!("{root}/*.csv")).unwrap_err();
        assert!(err.to_string().contains("matches no files"), "{err}");
    }
}
