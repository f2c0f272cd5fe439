//! The executor's error type.

use ringflow_ml::MlError;

/// Everything that can stop an executor's task.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// Bad or unreadable data; the message names the file, column and row.
    #[error("{file}: {message}")]
    Data {
        /// The file (or URL) at fault.
        file: String,
        /// What is wrong, naming the column and row where one applies.
        message: String,
    },
    /// A tensor-engine failure (shapes, devices, checkpoints).
    #[error(transparent)]
    Ml(#[from] MlError),
    /// The job spec cannot be run as given.
    #[error("{0}")]
    Spec(String),
    /// The driver asked the task to stop.
    #[error("the job was cancelled")]
    Cancelled,
    /// Talking to the driver or to other executors failed.
    #[error("{0}")]
    Comm(String),
}

impl ExecutorError {
    /// Shorthand for an [`ExecutorError::Data`].
    pub fn data(file: impl Into<String>, message: impl Into<String>) -> Self {
        ExecutorError::Data {
            file: file.into(),
            message: message.into(),
        }
    }
}

/// The executor's result type.
pub type Result<T> = std::result::Result<T, ExecutorError>;
