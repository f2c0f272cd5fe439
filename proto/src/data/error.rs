//! Errors about data: a path that cannot be read, a query that cannot be planned.

/// A data path, table or query that cannot be used. The message names the path, table, column
/// or spec key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what}: {message}")]
pub struct DataError {
    /// What is at fault: a path, a URL, a spec key such as `data.sql`.
    pub what: String,
    /// What is wrong with it.
    pub message: String,
}

impl DataError {
    /// An error about `what`.
    pub fn new(what: impl Into<String>, message: impl Into<String>) -> DataError {
        DataError {
            what: what.into(),
            message: message.into(),
        }
    }
}

/// Results of this module.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
