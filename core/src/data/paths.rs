//! Output paths: where a job's files go below its directories, built with path and URL APIs,
//! never by pasting strings together.
//!
//! A job's outputs (its model, checkpoints, event log, lock file, prediction parts) live below a
//! directory given as a local path or an object-store URL ([`super::location`]). [`join`] is the
//! one way to name something below such a directory: [`std::path::Path::join`] for local paths,
//! URL path segments for URLs, so that `""`, `"/"`, a trailing `/` or a `..` cannot make a job
//! write somewhere else than where it was told. [`is_filesystem_root`] recognizes the
//! directories a job must never be given.

use std::path::{Component, Path};

use url::Url;

/// `rel` (one name, or names separated by `/`) below `base`, a local path or a URL, written the
/// way `base` is. Empty parts and `.` are skipped; `..` is kept as a name for a URL and as a
/// component for a local path, so callers pass names they control (file names, not user input).
pub fn join(base: &str, rel: &str) -> String {
    let parts = rel.split('/').filter(|p| !p.is_empty() && *p != ".");
    if base.contains("://")
        && let Ok(mut url) = Url::parse(base)
    {
        let joined = match url.path_segments_mut() {
            Ok(mut segments) => {
                segments.pop_if_empty().extend(parts.clone());
                true
            }
            Err(()) => false,
        };
        if joined {
            return url.to_string();
        }
    }
    let mut path = Path::new(base).to_path_buf();
    for part in parts {
        path.push(part);
    }
    path.display().to_string()
}

/// The directory that holds `text` and `text`'s last name (`runs/job/model` → `runs/job`,
/// `model`), for a local path or a URL; `None` when `text` has no parent (a root, a bare name).
pub fn split_last(text: &str) -> Option<(String, String)> {
    if text.contains("://")
        && let Ok(url) = Url::parse(text)
    {
        let mut names: Vec<String> = url.path_segments()?.map(str::to_string).collect();
        while names.last().is_some_and(String::is_empty) {
            names.pop();
        }
        let last = names.pop()?;
        let mut parent = url.clone();
        parent.path_segments_mut().ok()?.clear().extend(&names);
        return Some((parent.to_string(), last));
    }
    let path = Path::new(text);
    let name = path.file_name()?.to_string_lossy().into_owned();
    let parent = path.parent()?.display().to_string();
    (!parent.is_empty()).then_some((parent, name))
}

/// True when `text` names the root of the local file system however it is written (`/`, `//`,
/// `/.`, `/..`, `file:///`, `file://localhost/`), without consulting the working directory.
pub fn is_filesystem_root(text: &str) -> bool {
    let text = text.trim();
    let local = match text.split_once("://") {
        None => text.to_string(),
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("file") => match Url::parse(text) {
            Ok(url) => url.path().to_string(),
            Err(_) => return false,
        },
        Some(_) => return false,
    };
    let path = Path::new(&local);
    if !path.has_root() {
        return false;
    }
    // Lexically, `..` at the root stays at the root.
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth = depth.saturating_sub(1),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    depth == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_local_paths_with_path_apis() {
        assert_eq!(join("runs/job", "model"), "runs/job/model");
        assert_eq!(join("runs/job/", "model"), "runs/job/model");
        assert_eq!(join("/abs", "events.jsonl"), "/abs/events.jsonl");
        assert_eq!(join("d", "sub/x.bin"), "d/sub/x.bin");
        assert_eq!(join("d", "./x"), "d/x");
        // An empty base is not turned into the root.
        assert_eq!(join("", "model"), "model");
    }

    #[test]
    fn joins_urls_by_their_path_segments() {
        assert_eq!(join("s3://b/runs/job", "model"), "s3://b/runs/job/model");
        assert_eq!(join("s3://b/runs/job/", "model"), "s3://b/runs/job/model");
        assert_eq!(join("s3://b", "model"), "s3://b/model");
        assert_eq!(join("s3://b/", "a/b.bin"), "s3://b/a/b.bin");
        assert_eq!(join("file:///tmp/x", "model"), "file:///tmp/x/model");
        assert_eq!(join("s3://b/a b", "c"), "s3://b/a%20b/c");
    }

    #[test]
    fn splits_off_the_last_name() {
        let pair = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
        assert_eq!(split_last("runs/job/model"), pair("runs/job", "model"));
        assert_eq!(split_last("/abs/job/model/"), pair("/abs/job", "model"));
        assert_eq!(split_last("s3://b/job/model"), pair("s3://b/job", "model"));
        assert_eq!(split_last("s3://b/job/model/"), pair("s3://b/job", "model"));
        assert_eq!(split_last("s3://b/model"), pair("s3://b/", "model"));
        assert_eq!(split_last("model"), None);
        assert_eq!(split_last("/"), None);
        assert_eq!(split_last("s3://b/"), None);
    }

    #[test]
    fn recognizes_the_root_however_written() {
        for root in [
            "/",
            "//",
            "/.",
            "/..",
            "/./",
            "/a/..",
            " / ",
            "file:///",
            "file://localhost/",
            "FILE:///",
        ] {
            assert!(is_filesystem_root(root), "{root:?}");
        }
        for not in [
            "/tmp",
            "runs",
            "",
            ".",
            "..",
            "s3://b/",
            "s3://b",
            "file:///tmp",
            "/a/../b",
        ] {
            assert!(!is_filesystem_root(not), "{not:?}");
        }
    }
}
