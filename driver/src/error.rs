//! The driver's error type.

/// Everything that can make the driver refuse or fail a job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The job spec is unusable; the message names the key.
    #[error(transparent)]
    Spec(#[from] ringflow_proto::spec::SpecError),
    /// The data cannot be used; the message names the file or setting.
    #[error("{0}")]
    Data(String),
    /// The model cannot be built from the spec.
    #[error(transparent)]
    Model(#[from] ringflow_ml::MlError),
    /// An output location cannot be used, or another job holds it; the message names the key
    /// and the location.
    #[error(transparent)]
    Output(#[from] crate::outputs::OutputError),
    /// An executor failed or disappeared; the message names it.
    #[error("{0}")]
    Executor(String),
}

/// The driver's result type.
pub type Result<T> = std::result::Result<T, DriverError>;
