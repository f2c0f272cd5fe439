//! Errors about data: a path that cannot be read, a query that cannot be planned.

/// What kind of failure a [`DataError`] is, for code that must tell them apart (never by the
/// message's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataErrorKind {
    /// Nothing is there: no such file, directory or object, though its store could be asked.
    NotFound,
    /// Anything else: a path or query that cannot be used, a store that failed or refused.
    Other,
}

/// A data path, table or query that cannot be used. The message names the path, table, column
/// or spec key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what}: {message}")]
pub struct DataError {
    /// What is at fault: a path, a URL, a spec key such as `data.sql`.
    pub what: String,
    /// What is wrong with it.
    pub message: String,
    /// What kind of failure it is.
    pub kind: DataErrorKind,
}

impl DataError {
    /// An error about `what`.
    pub fn new(what: impl Into<String>, message: impl Into<String>) -> DataError {
        DataError {
            what: what.into(),
            message: message.into(),
            kind: DataErrorKind::Other,
        }
    }

    /// `what` does not exist; `message` says so.
    pub fn not_found(what: impl Into<String>, message: impl Into<String>) -> DataError {
        DataError {
            kind: DataErrorKind::NotFound,
            ..DataError::new(what, message)
        }
    }

    /// True when nothing is at the path ([`DataErrorKind::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        self.kind == DataErrorKind::NotFound
    }
}

/// Results of this module.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
