//! Listing the Parquet files of a data path: a file, a directory (prefix), or a glob, on the
//! local file system or in an object store. Only regular local files are data: a FIFO, socket
//! or device named directly is refused, and one inside a directory or glob is skipped and
//! reported ([`Listing::skipped`]).

use ringflow_core::data::Location;
use ringflow_core::data::local::{self, Named, Skipped};
use ringflow_core::data::location::is_local;
use ringflow_core::data::runtime::block_on;

use super::schema_error::ListingError;
use crate::error::{DriverError, Result};

/// The data files of a path and what its listing left out.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// The files, sorted, written the way the path was.
    pub files: Vec<String>,
    /// Entries of a local directory or glob that are not regular files.
    pub skipped: Vec<Skipped>,
}

/// The Parquet files `path` names (for the spec key `key`), sorted, written the way the user
/// wrote `path` (a relative directory gives relative file paths, a URL gives URLs).
///
/// A directory or prefix contributes every `*.parquet` file below it, skipping names that start
/// with `_` or `.` (Spark's `_SUCCESS` and hidden files). A path containing `*`, `?` or `[` is a
/// glob (whose wildcards, as in a shell, do not match a leading `.`).
pub fn files(key: &str, path: &str) -> Result<Listing> {
    if !is_local(path) {
        return Ok(Listing {
            files: remote_files(key, path)?,
            skipped: Vec::new(),
        });
    }
    match file_url_path(path) {
        None => local_files(key, path, path, ""),
        Some(Ok(local)) => local_files(key, path, &local, "file://"),
        Some(Err(e)) => Err(fail(key, e)),
    }
}

fn fail(key: &str, source: ListingError) -> DriverError {
    DriverError::Listing {
        key: key.to_string(),
        source,
    }
}

/// The file-system path of a `file://` URL (a glob's text as it is written), or `None` for a
/// plain path.
fn file_url_path(path: &str) -> Option<std::result::Result<String, ListingError>> {
    let scheme = path.get(..7)?;
    if !scheme.eq_ignore_ascii_case("file://") {
        return None;
    }
    if local::is_glob(path) {
        return Some(Ok(path[7..].to_string()));
    }
    Some(
        Location::parse(path)
            .map_err(ListingError::from)
            .and_then(|l| {
                l.local_path().ok_or_else(|| ListingError::NotAFilePath {
                    path: path.to_string(),
                })
            })
            .map(|p| p.display().to_string()),
    )
}

/// Lists `local` (the file-system form of `written`), writing each file as `prefix` followed
/// by its path (or as `written` when it names the file).
fn local_files(key: &str, written: &str, local: &str, prefix: &str) -> Result<Listing> {
    let listing = local::list(local, ".parquet").map_err(|e| fail(key, e.into()))?;
    if listing.files.is_empty() {
        let (regular, skipped) = match listing.skipped.as_slice() {
            [] => ("", String::new()),
            [first] => ("regular ", format!(" ({first})")),
            [first, rest @ ..] => ("regular ", format!(" ({first}; and {} more)", rest.len())),
        };
        let path = written.to_string();
        return Err(fail(
            key,
            match listing.named {
                Named::Glob => ListingError::GlobMatchesNone {
                    path,
                    regular,
                    skipped,
                },
                _ => ListingError::EmptyDirectory {
                    path,
                    regular,
                    skipped,
                },
            },
        ));
    }
    let files = match listing.named {
        Named::File => vec![written.to_string()],
        _ => listing
            .files
            .iter()
            .map(|p| format!("{prefix}{}", p.display()))
            .collect(),
    };
    Ok(Listing {
        files,
        skipped: listing.skipped,
    })
}

/// Files in an object store: one object, every `.parquet` object below a prefix, or the
/// objects that match a glob.
fn remote_files(key: &str, path: &str) -> Result<Vec<String>> {
    let wild = path.find(['*', '?', '[']);
    let base_text = match wild {
        Some(i) => &path[..path[..i].rfind('/').map(|j| j + 1).unwrap_or(i)],
        None => path,
    };
    let base = Location::parse(base_text).map_err(|e| fail(key, e.into()))?;
    let listed = {
        let base = base.clone();
        block_on(async move { base.list().await }).map_err(|e| fail(key, e.into()))?
    };
    let pattern = match wild {
        Some(_) => Some(glob::Pattern::new(path).map_err(|e| {
            let (path, reason) = (path.to_string(), e.to_string());
            fail(key, ListingError::BadGlob { path, reason })
        })?),
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
        let path = path.to_string();
        return Err(fail(
            key,
            match wild {
                Some(_) => ListingError::GlobMatchesNone {
                    path,
                    regular: "",
                    skipped: String::new(),
                },
                None => ListingError::NoObjects { path },
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
        let names = |v: Listing| -> Vec<String> {
            v.files
                .iter()
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
            names(Listing {
                files: files("data.train", &url)
                    .unwrap()
                    .files
                    .into_iter()
                    .map(|u| u.replace("file://", ""))
                    .collect(),
                skipped: Vec::new(),
            }),
            ["a.parquet", "b.parquet", "sub/c.parquet"]
        );
        let url_glob = format!("file://{root}/*.parquet");
        assert_eq!(files("data.train", &url_glob).unwrap().files.len(), 2);
        let err = files("data.test", &format!("{root}/nope.parquet")).unwrap_err();
        assert!(err.to_string().starts_with("data.test:"), "{err}");
        let err = files("data.train", &format!("{root}/*.csv")).unwrap_err();
        assert!(err.to_string().contains("matches no files"), "{err}");
    }

    /// A FIFO named directly is refused by name; a directory or glob holding only FIFOs says
    /// so, naming what it skipped.
    #[cfg(unix)]
    #[test]
    fn fifos_are_refused_or_skipped_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.parquet");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let (root, fifo) = (dir.path().display().to_string(), fifo.display().to_string());
        let err = files("data.train", &fifo).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("data.train: {fifo} is a FIFO (named pipe), not a regular file")
        );
        let url = format!("file://{fifo}");
        let err = files("data.train", &url).unwrap_err().to_string();
        assert!(err.contains("is a FIFO (named pipe)"), "{err}");
        let err = files("data.test", &root).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "data.test: the directory {root:?} holds no regular .parquet files (skipped \
                 {fifo}: it is a FIFO (named pipe), not a regular file)"
            )
        );
        let err = files("data.test", &format!("{root}/*"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("matches no regular files (skipped"), "{err}");
    }
}
