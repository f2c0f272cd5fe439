//! Local files as data: only regular files (or symbolic links to them) are read.
//!
//! Opening a FIFO blocks until some other process opens it for writing, reading a character
//! device such as `/dev/zero` never ends, and a socket cannot be opened at all: none of them is
//! a data file. A path named directly that is not a regular file is refused with its kind
//! ([`check_regular`]); the listings of directories and globs skip such entries and report them
//! ([`Skipped`], [`list`]). [`open_regular`] opens without ever blocking and checks the kind of what it
//! opened, so a file replaced by a FIFO after planning is refused too.

use std::fs::{File, Metadata, OpenOptions};
use std::path::{Path, PathBuf};

use super::error::{DataError, DataErrorKind};

/// What a path on the local file system is, after following symbolic links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file: the only kind that is data.
    Regular,
    /// A directory.
    Directory,
    /// A FIFO (named pipe).
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A block device.
    BlockDevice,
    /// A character device.
    CharDevice,
    /// Anything else the platform knows.
    Other,
}

impl FileKind {
    /// The kind described by `meta` (from `std::fs::metadata`, which follows links).
    pub fn of(meta: &Metadata) -> FileKind {
        let t = meta.file_type();
        if t.is_file() {
            return FileKind::Regular;
        }
        if t.is_dir() {
            return FileKind::Directory;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() {
                return FileKind::Fifo;
            }
            if t.is_socket() {
                return FileKind::Socket;
            }
            if t.is_block_device() {
                return FileKind::BlockDevice;
            }
            if t.is_char_device() {
                return FileKind::CharDevice;
            }
        }
        FileKind::Other
    }

    /// The kind with its article, for sentences: "a FIFO (named pipe)".
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::Socket => "a socket",
            FileKind::BlockDevice => "a block device",
            FileKind::CharDevice => "a character device",
            FileKind::Other => "a special file",
        }
    }
}

/// A path that a directory listing or a glob left out because it is not a regular file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The path, as listed.
    pub path: String,
    /// What it is.
    pub kind: FileKind,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "skipped {}: it is {}, not a regular file",
            self.path,
            self.kind.describe()
        )
    }
}

/// The kind of `path`, following symbolic links.
pub fn kind(path: &Path) -> std::io::Result<FileKind> {
    std::fs::metadata(path).map(|m| FileKind::of(&m))
}

/// Why a local path cannot be read as a data file, as the end of a sentence about it: "does
/// not exist", "is a FIFO (named pipe), not a regular file".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReadable {
    /// Nothing is at the path.
    #[error("does not exist")]
    Missing,
    /// Something other than a regular file is at the path: what it is (never
    /// [`FileKind::Regular`]).
    #[error("is {}, not a regular file", .0.describe())]
    NotRegular(FileKind),
    /// The path cannot be opened or looked at.
    #[error("cannot be opened: {reason}")]
    CannotOpen {
        /// What the operating system said.
        reason: String,
    },
}

impl NotReadable {
    fn cannot_open(e: &std::io::Error) -> NotReadable {
        NotReadable::CannotOpen {
            reason: e.to_string(),
        }
    }

    /// [`DataErrorKind::NotFound`] when nothing is at the path, [`DataErrorKind::Other`]
    /// otherwise.
    pub fn kind(&self) -> DataErrorKind {
        match self {
            NotReadable::Missing => DataErrorKind::NotFound,
            _ => DataErrorKind::Other,
        }
    }

    /// The [`DataError`] about `what` (the path as the user wrote it), of the same kind.
    pub fn about(self, what: impl Into<String>) -> DataError {
        DataError {
            kind: self.kind(),
            ..DataError::new(what, self.to_string())
        }
    }
}

/// Checks that `path` is a regular file (or a link to one) without opening it. The error is
/// the end of a sentence about the file: "does not exist", "is a FIFO (named pipe), not a
/// regular file".
pub fn check_regular(path: &Path) -> Result<(), NotReadable> {
    match kind(path) {
        Ok(FileKind::Regular) => Ok(()),
        Ok(other) => Err(NotReadable::NotRegular(other)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NotReadable::Missing),
        Err(e) => Err(NotReadable::cannot_open(&e)),
    }
}

/// Opens `path` for reading if it is a regular file. The kind is checked before opening (so a
/// device is never opened) and again on the opened file (so a FIFO swapped in meanwhile is
/// refused); the open itself never blocks. Errors are the end of a sentence about the file.
pub fn open_regular(path: &Path) -> Result<File, NotReadable> {
    check_regular(path)?;
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading waits for a writer unless it is non-blocking. On a
        // regular file the flag changes nothing (POSIX), so the file is used as it is.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let cannot = |e: std::io::Error| NotReadable::cannot_open(&e);
    let file = options.open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    match FileKind::of(&meta) {
        FileKind::Regular => Ok(file),
        other => Err(NotReadable::NotRegular(other)),
    }
}

/// What a listed path named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    /// One file.
    File,
    /// A directory: its files below it.
    Directory,
    /// A glob: the paths it matches.
    Glob,
}

/// The regular files a path names, and the entries left out because they are not.
#[derive(Clone, Debug)]
pub struct Listing {
    /// What the path named.
    pub named: Named,
    /// The regular files (or links to them), sorted.
    pub files: Vec<PathBuf>,
    /// Entries of a directory or glob that are not regular files, sorted.
    pub skipped: Vec<Skipped>,
}

/// True when `path` is a glob: it contains `*`, `?` or `[`.
pub fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

/// Lists the regular files that `path` names: the file itself; in a directory, every file
/// below it whose name ends with `extension`, skipping names that start with `_` or `.`
/// (Spark's `_SUCCESS` and hidden files); or every path a glob matches (whose wildcards, as in
/// a shell, do not match a leading `.`). In a directory or glob, an entry that is not a regular
/// file is left out and reported in [`Listing::skipped`]; a glob's directories are left out
/// silently. A path named directly that is not a regular file or a directory is refused. An
/// error is a sentence about `path`.
pub fn list(path: &str, extension: &str) -> Result<Listing, ListError> {
    let mut listing = Listing {
        named: Named::File,
        files: Vec::new(),
        skipped: Vec::new(),
    };
    if is_glob(path) {
        listing.named = Named::Glob;
        glob_files(path, &mut listing)?;
    } else {
        let p = Path::new(path);
        match kind(p) {
            Ok(FileKind::Regular) => listing.files.push(p.to_path_buf()),
            Ok(FileKind::Directory) => {
                listing.named = Named::Directory;
                walk(path, p, extension, &mut listing)?;
            }
            Ok(other) => {
                return Err(ListError::NotRegular {
                    path: path.to_string(),
                    kind: other,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ListError::Missing {
                    path: path.to_string(),
                });
            }
            Err(e) => return Err(cannot_open(path.to_string(), &e)),
        }
    }
    not_utf8(&listing.files)?;
    listing.files.sort();
    listing.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

fn glob_files(pattern: &str, listing: &mut Listing) -> Result<(), ListError> {
    // The glob crate's own rule for a leading `.` panics on a name that is not UTF-8, so the
    // rule is applied here ([`hidden_by`]).
    let options = glob::MatchOptions {
        require_literal_leading_dot: false,
        ..Default::default()
    };
    let entries = glob::glob_with(pattern, options).map_err(|e| ListError::BadGlob {
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    for entry in entries {
        let p = entry.map_err(|e| ListError::CannotList {
            path: pattern.to_string(),
            reason: e.to_string(),
        })?;
        if hidden_by(pattern, &p) {
            continue;
        }
        let kind = kind(&p).map_err(|e| cannot_open(p.display().to_string(), &e))?;
        match kind {
            FileKind::Regular => listing.files.push(p),
            FileKind::Directory => {}
            other => listing.skipped.push(Skipped {
                path: p.display().to_string(),
                kind: other,
            }),
        }
    }
    Ok(())
}

/// Whether `path`, which `pattern` matched, is hidden from it: a name that starts with `.`
/// where the pattern's wildcards matched, while none of the pattern's wildcard components
/// spells a leading `.` out (as in a shell).
fn hidden_by(pattern: &str, path: &Path) -> bool {
    let parts: Vec<&str> = pattern.split('/').collect();
    let literal = parts.iter().take_while(|c| !is_glob(c)).count();
    if parts[literal..].iter().any(|c| c.starts_with('.')) {
        return false;
    }
    let prefix = parts[..literal].join("/");
    let matched = path.strip_prefix(&prefix).unwrap_or(path);
    matched.components().any(|c| {
        matches!(c, std::path::Component::Normal(name) if name.as_encoded_bytes().starts_with(b"."))
    })
}

/// The first of `files` whose path is not UTF-8 text, as an error sentence that names it once.
fn not_utf8(files: &[PathBuf]) -> Result<(), ListError> {
    match files.iter().find(|p| p.to_str().is_none()) {
        None => Ok(()),
        Some(p) => Err(ListError::NotUtf8 {
            path: p.display().to_string(),
        }),
    }
}

/// The error for `path`, which could not be opened.
fn cannot_open(path: String, e: &std::io::Error) -> ListError {
    ListError::CannotOpen {
        path,
        reason: e.to_string(),
    }
}

/// Why a local path could not be listed; each message is a sentence about the path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// Nothing is at the path.
    #[error("{path:?} does not exist")]
    Missing {
        /// The path.
        path: String,
    },
    /// The path names something other than a regular file or a directory.
    #[error("{path} is {}, not a regular file", .kind.describe())]
    NotRegular {
        /// The path.
        path: String,
        /// What it is instead.
        kind: FileKind,
    },
    /// The path, or an entry a glob matched, could not be opened.
    #[error("{path} cannot be opened: {reason}")]
    CannotOpen {
        /// The path.
        path: String,
        /// What the operating system said.
        reason: String,
    },
    /// A directory or glob could not be walked.
    #[error("cannot list {path:?}: {reason}")]
    CannotList {
        /// The directory or the glob.
        path: String,
        /// What the operating system said.
        reason: String,
    },
    /// An entry below a directory could not be looked at.
    #[error("cannot list {path:?}: {entry} cannot be opened: {reason}")]
    CannotListEntry {
        /// The directory that was listed.
        path: String,
        /// The entry, below it.
        entry: String,
        /// What the operating system said.
        reason: String,
    },
    /// A glob that does not parse.
    #[error("bad glob {pattern:?}: {reason}")]
    BadGlob {
        /// The glob.
        pattern: String,
        /// What the glob parser said.
        reason: String,
    },
    /// A file whose name is not UTF-8 text.
    #[error(
        "{path} has a name that is not UTF-8 text; ringflow names files by UTF-8 paths, so \
         rename it"
    )]
    NotUtf8 {
        /// The path, written lossily.
        path: String,
    },
}

/// Adds the files below `dir` (a directory below `root`, the path as it was written) to
/// `listing`.
fn walk(root: &str, dir: &Path, extension: &str, listing: &mut Listing) -> Result<(), ListError> {
    let cannot = |e: std::io::Error| ListError::CannotList {
        path: root.to_string(),
        reason: e.to_string(),
    };
    for entry in std::fs::read_dir(dir).map_err(cannot)? {
        let entry = entry.map_err(cannot)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('_') || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = kind(&path).map_err(|e| ListError::CannotListEntry {
            path: root.to_string(),
            entry: path.display().to_string(),
            reason: e.to_string(),
        })?;
        match kind {
            FileKind::Directory => walk(root, &path, extension, listing)?,
            _ if !name.ends_with(extension) => {}
            FileKind::Regular => listing.files.push(path),
            other => listing.skipped.push(Skipped {
                path: path.display().to_string(),
                kind: other,
            }),
        }
    }
    Ok(())
}

#[cfg(all(test, unix))]
pub(crate) mod tests {
    use super::*;

    /// Makes a FIFO at `path` with `mkfifo`, as a user would.
    pub(crate) fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo runs");
        assert!(status.success(), "mkfifo {}", path.display());
    }

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.parquet");
        mkfifo(&fifo);
        let link = dir.path().join("link.parquet");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let file = dir.path().join("b.parquet");
        std::fs::write(&file, b"PAR1").unwrap();
        let file_link = dir.path().join("c.parquet");
        std::os::unix::fs::symlink(&file, &file_link).unwrap();

        // Neither call blocks: a FIFO without a writer would hang a plain open.
        let fifo_error = "is a FIFO (named pipe), not a regular file";
        let message = |e: NotReadable| e.to_string();
        assert_eq!(message(open_regular(&fifo).unwrap_err()), fifo_error);
        assert_eq!(message(open_regular(&link).unwrap_err()), fifo_error);
        assert_eq!(
            message(open_regular(dir.path()).unwrap_err()),
            "is a directory, not a regular file"
        );
        assert_eq!(
            message(check_regular(Path::new("/dev/null")).unwrap_err()),
            "is a character device, not a regular file"
        );
        let missing = check_regular(&dir.path().join("nope")).unwrap_err();
        assert_eq!(missing.to_string(), "does not exist");
        assert_eq!(missing.kind(), DataErrorKind::NotFound);
        assert_eq!(missing.about("nope").kind, DataErrorKind::NotFound);
        let fifo_kind = open_regular(&fifo).unwrap_err().kind();
        assert_eq!(fifo_kind, DataErrorKind::Other);
        let mut opened = open_regular(&file_link).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut opened, &mut text).unwrap();
        assert_eq!(text, "PAR1");
        assert_eq!(kind(&link).unwrap(), FileKind::Fifo);
    }

    /// Regression (issue 39): a data file whose name is not UTF-8 was listed under a lossy
    /// name and then "did not exist", and a glob over its directory panicked inside the glob
    /// crate; the listing of the directory names it once and says what to do, the glob does
    /// not panic, and a glob's wildcards still do not match a leading `.`.
    #[test]
    fn names_that_are_not_utf8_are_refused_and_never_panic() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.parquet"), b"").unwrap();
        std::fs::write(root.join(".hidden.parquet"), b"").unwrap();
        let bad = root.join(std::ffi::OsStr::from_bytes(b"x\xff.parquet"));
        std::fs::write(&bad, b"").unwrap();
        let text = root.display().to_string();

        let e = list(&text, ".parquet").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} has a name that is not UTF-8 text; ringflow names files by UTF-8 paths, so \
                 rename it",
                bad.display()
            )
        );
        let glob = list(&format!("{text}/*.parquet"), ".parquet").unwrap();
        assert_eq!(glob.files, [root.join("a.parquet")]);
        let dotted = list(&format!("{text}/.*.parquet"), ".parquet").unwrap();
        assert_eq!(dotted.files, [root.join(".hidden.parquet")]);
        std::fs::create_dir(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/b.parquet"), b"").unwrap();
        let deep = list(&format!("{text}/*/*.parquet"), ".parquet").unwrap();
        assert!(deep.files.is_empty(), "{:?}", deep.files);
        let spelled = list(&format!("{text}/.g*/*.parquet"), ".parquet").unwrap();
        assert_eq!(spelled.files, [root.join(".git/b.parquet")]);
    }

    #[test]
    fn listings_skip_and_name_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("b.parquet"), b"").unwrap();
        std::fs::write(root.join("notes.txt"), b"").unwrap();
        mkfifo(&root.join("a.parquet"));
        mkfifo(&root.join("pipe.txt"));
        mkfifo(&root.join("_hidden.parquet"));
        std::fs::create_dir(root.join("sub")).unwrap();
        mkfifo(&root.join("sub/c.parquet"));
        std::fs::write(root.join("sub/d.parquet"), b"").unwrap();
        let text = |p: &Path| p.display().to_string();

        let listed = list(&text(root), ".parquet").unwrap();
        assert_eq!(listed.named, Named::Directory);
        assert_eq!(
            listed.files,
            [root.join("b.parquet"), root.join("sub/d.parquet")]
        );
        let skipped: Vec<String> = listed.skipped.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            skipped,
            [
                format!(
                    "skipped {}: it is a FIFO (named pipe), not a regular file",
                    text(&root.join("a.parquet"))
                ),
                format!(
                    "skipped {}: it is a FIFO (named pipe), not a regular file",
                    text(&root.join("sub/c.parquet"))
                ),
            ]
        );

        let glob = list(&format!("{}/*.parquet", text(root)), ".parquet").unwrap();
        assert_eq!(glob.named, Named::Glob);
        assert_eq!(glob.files, [root.join("b.parquet")]);
        // A glob's `*` matches a leading `_` (only a leading `.` needs spelling out).
        let paths: Vec<&str> = glob.skipped.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                text(&root.join("_hidden.parquet")),
                text(&root.join("a.parquet"))
            ]
        );
        assert!(glob.skipped.iter().all(|s| s.kind == FileKind::Fifo));

        let fifo = text(&root.join("a.parquet"));
        assert_eq!(
            list(&fifo, ".parquet").unwrap_err().to_string(),
            format!("{fifo} is a FIFO (named pipe), not a regular file")
        );
        let file = list(&text(&root.join("b.parquet")), ".parquet").unwrap();
        assert_eq!(file.named, Named::File);
        assert_eq!(file.files, [root.join("b.parquet")]);
        assert!(
            list(&text(&root.join("nope")), ".parquet")
                .unwrap_err()
                .to_string()
                .ends_with("does not exist")
        );
    }
}
