//! Errors in job specs, worded to point at the key to fix.

use std::path::PathBuf;

/// A job spec that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read job spec {}: {source}", file.display())]
    Io {
        /// The spec file.
        file: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("job spec {} is not valid TOML: {message}", file.display())]
    Toml {
        /// The spec file.
        file: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key that the spec does not have.
    #[error("job spec {}: unknown key `{key}`{}", file.display(), expected_list(expected))]
    UnknownKey {
        /// The spec file.
        file: PathBuf,
        /// Full dotted path of the key.
        key: String,
        /// The keys allowed at that place.
        expected: Vec<String>,
    },
    /// A key with a value that cannot be used.
    #[error("job spec {}: {}{message}", file.display(), key_prefix(key))]
    Invalid {
        /// The spec file.
        file: PathBuf,
        /// Full dotted path of the key (may be empty for the whole spec).
        key: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A `--set` argument (or a flag that sets a field) that cannot be applied.
    #[error("{arg}: {message}")]
    Override {
        /// The argument as given, with its flag: `--set train.epochs`.
        arg: String,
        /// What is wrong with it.
        message: String,
    },
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{key}: ")
    }
}

fn expected_list(expected: &[String]) -> String {
    if expected.is_empty() {
        String::new()
    } else {
        format!(" (expected one of: {})", expected.join(", "))
    }
}
