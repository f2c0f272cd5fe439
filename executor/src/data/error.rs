//! Why data read by an executor cannot be used: [`NotStrings`] for a column that does not read
//! as text, [`QueryError`] for the output of `data.sql` over a partition, [`TokenError`] and
//! [`LabelError`] for a value of a token sequence or its label, and [`ServeError`] for a
//! partition the driver could not serve. A leaf: the readers, the converters and the
//! executor's error type use it.

use arrow_flight::error::FlightError;
use datafusion::arrow::error::ArrowError;
use ringflow_core::data::deadline::DeadlineError;

/// A column that cannot be read as strings, as the end of a sentence about the column.
#[derive(Debug, thiserror::Error)]
#[error("cannot be read as strings: {source}")]
pub struct NotStrings {
    /// What Arrow's cast to strings said.
    #[from]
    pub source: ArrowError,
}

/// Why the output of `data.sql` over one partition cannot be used; the message follows the
/// name of the partition.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// Work on `data.sql` ran past `data.sql_timeout_s`.
    #[error(
        "data.sql: {what} ran longer than data.sql_timeout_s = {timeout_s} s and was stopped; \
         raise data.sql_timeout_s if it needs longer"
    )]
    TimedOut {
        /// What ran ("the query on this partition").
        what: &'static str,
        /// `data.sql_timeout_s`.
        timeout_s: u64,
    },
    /// The query failed: DataFusion's message, or the reader's (which names the file).
    #[error("{0}")]
    Failed(String),
    /// The query yielded other rows over the row group than the driver counted.
    #[error(
        "data.sql yielded {rows} rows over this row group where the driver counted {counted} \
         when it planned the job; the query must yield the same rows every time it runs (no \
         random(), no now(), no LIMIT without ORDER BY)"
    )]
    NotAsCounted {
        /// The rows it yielded.
        rows: u64,
        /// The rows the driver counted.
        counted: u64,
    },
}

/// Why a row's tokens cannot be model inputs, as the end of a sentence about the row.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// String tokens, but the model has no vocabulary.
    #[error(
        "holds string tokens, but the model has no vocabulary for them: its checkpoint holds \
         no preprocessing; use the model directory its training job wrote, unchanged"
    )]
    NoVocabulary,
    /// A null token.
    #[error("has a null token")]
    Null,
    /// A token id beyond what a model's inputs hold exactly.
    #[error("holds the token id {0}, outside 0..2^24")]
    IdOutOfRange(i64),
}

/// Why a label of a token sequence is not one of the model's classes.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// A null label.
    #[error("the label is null")]
    Null,
    /// String labels, but the model has no class names.
    #[error("holds string labels, but the model has no classes for them")]
    NoClasses,
    /// A class name the model does not have.
    #[error("the label {name:?} is not one of the model's {classes} classes")]
    UnknownName {
        /// The label.
        name: String,
        /// The model's classes.
        classes: usize,
    },
    /// A class index outside the model's classes.
    #[error(
        "the label {label} is not one of the model's {classes} classes (0..={})",
        classes.saturating_sub(1)
    )]
    OutOfRange {
        /// The label.
        label: i64,
        /// The model's classes.
        classes: usize,
    },
}

/// Why the driver did not serve a partition's first batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The driver refused the request (its message).
    #[error("{}", .0.message())]
    Refused(#[source] Box<tonic::Status>),
    /// The stream of batches failed.
    #[error(transparent)]
    Stream(#[from] FlightError),
    /// The first batch did not come in time.
    #[error("the first batch {0}")]
    Deadline(#[from] DeadlineError),
}
