//! Errors in job specs, worded to point at the key to fix. Each is one line: control
//! characters in the user's keys, values and arguments are shown as escapes (`\n`).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// A job spec that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read job spec {}: {source}", shown_path(file))]
    Io {
        /// The spec file.
        file: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("job spec {} is not valid TOML: {}", shown_path(file), shown(message))]
    Toml {
        /// The spec file.
        file: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key that the spec does not have.
    #[error(
        "job spec {}: unknown key `{}`{}",
        shown_path(file),
        shown(key),
        expected_list(expected)
    )]
    UnknownKey {
        /// The spec file.
        file: PathBuf,
        /// Full dotted path of the key.
        key: String,
        /// The keys allowed at that place.
        expected: Vec<String>,
    },
    /// A key with a value that cannot be used.
    #[error("job spec {}: {}{}", shown_path(file), key_prefix(key), shown(message))]
    Invalid {
        /// The spec file.
        file: PathBuf,
        /// Full dotted path of the key (may be empty for the whole spec).
        key: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A `--set` argument (or a flag that sets a field) that cannot be applied.
    #[error("{}: {}", shown(arg), shown(message))]
    Override {
        /// The argument as given, with its flag: `--set train.epochs`.
        arg: String,
        /// What is wrong with it.
        message: String,
    },
}

/// Why a job name is not a plain name, as the end of a sentence that starts "it": "is empty",
/// "\"..\" names a directory, not a job". An overlong name is not repeated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty name.
    #[error("is empty")]
    Empty,
    /// A name longer than the limit.
    #[error("is {bytes} bytes long, over the limit of {max}")]
    TooLong {
        /// Its length in bytes.
        bytes: usize,
        /// The longest a name may be ([`super::MAX_NAME_BYTES`]).
        max: usize,
    },
    /// `.` or `..`.
    #[error("{name:?} names a directory, not a job")]
    Directory {
        /// The name.
        name: String,
    },
    /// A name that starts with `.` (a hidden directory).
    #[error("{name:?} starts with '.'")]
    LeadingDot {
        /// The name.
        name: String,
    },
    /// A name with a character that is not a letter, a digit, `-`, `_` or `.`.
    #[error("{name:?} holds the character {c:?}")]
    Character {
        /// The name.
        name: String,
        /// The first such character.
        c: char,
    },
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{}: ", shown(key))
    }
}

/// `text` with its control characters (a newline, a tab, an escape) written as escapes, so
/// that an error stays one line whatever the user's keys and values hold.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if !text.contains(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn shown_path(file: &Path) -> String {
    shown(&file.display().to_string()).into_owned()
}

fn expected_list(expected: &[String]) -> String {
    if expected.is_empty() {
        String::new()
    } else {
        format!(" (expected one of: {})", expected.join(", "))
    }
}
