//! The error type of the tensor engine.

use std::path::PathBuf;

/// Everything that can go wrong inside the tensor engine.
///
/// Messages are written for the person running a job: they name the operation, the shapes or the
/// file involved, and what would make the call valid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MlError {
    /// Two shapes that an operation needs to agree do not.
    #[error("{op}: shapes {lhs:?} and {rhs:?} {reason}")]
    ShapeMismatch {
        /// The operation that was called.
        op: &'static str,
        /// The first shape involved.
        lhs: Vec<usize>,
        /// The second shape involved.
        rhs: Vec<usize>,
        /// Why they do not fit, e.g. "cannot be broadcast together".
        reason: &'static str,
    },
    /// An argument is outside what the operation accepts.
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The operation that was called.
        op: &'static str,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A device is unavailable, or tensors on different devices were combined.
    #[error("{0}")]
    Device(String),
    /// A model, optimizer or schedule description cannot be used.
    #[error("{0}")]
    Spec(String),
    /// A checkpoint could not be written, read or trusted.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The file or directory at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// `model.init_from` names weights that cannot be read or do not fit the model.
    #[error("model.init_from {origin}: {message}")]
    InitFrom {
        /// The file or directory the weights come from.
        origin: String,
        /// What is wrong, naming the tensor at fault.
        message: String,
    },
    /// `backward` was called on something it cannot start from.
    #[error("backward: {0}")]
    Backward(String),
}

/// The result type of the tensor engine.
pub type Result<T> = std::result::Result<T, MlError>;

impl MlError {
    /// Shorthand for an [`MlError::InvalidArgument`].
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        MlError::InvalidArgument {
            op,
            message: message.into(),
        }
    }

    /// Shorthand for an [`MlError::Spec`].
    pub fn spec(message: impl Into<String>) -> Self {
        MlError::Spec(message.into())
    }

    /// Shorthand for an [`MlError::InitFrom`].
    pub fn init_from(origin: impl Into<String>, message: impl Into<String>) -> Self {
        MlError::InitFrom {
            origin: origin.into(),
            message: message.into(),
        }
    }

    /// Shorthand for an [`MlError::Checkpoint`].
    pub fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        MlError::Checkpoint {
            path: path.into(),
            message: message.into(),
        }
    }
}
