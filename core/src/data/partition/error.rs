//! Why a partition cannot be opened ([`OpenError`], [`SelectError`]) or its next batch read
//! ([`ReadError`], [`BatchError`]). Each message is the end of a sentence about the file, which
//! the [`DataError`] that carries it names. A leaf: the partition's readers use it.

use datafusion::arrow::error::ArrowError;
use datafusion::parquet::errors::ParquetError;

use super::super::deadline::{DeadlineError, read_failed};
use super::super::error::DataError;
use super::super::local::NotReadable;

/// A partition that its file's footer does not hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// A column the job reads is not in the file.
    #[error("has no column `{column}` (its columns: {have})")]
    NoColumn {
        /// The missing column.
        column: String,
        /// The file's columns, comma-separated.
        have: String,
    },
    /// The partition's row group is not in the file.
    #[error(
        "has {groups} row groups; row group {group} does not exist (did the file change since \
         the job was planned?)"
    )]
    NoRowGroup {
        /// The file's row groups.
        groups: usize,
        /// The partition's row group.
        group: usize,
    },
    /// The row group holds fewer rows than the partition's range ends at.
    #[error(
        "row group {group} has {rows} rows, fewer than the planned partition needs (did the \
         file change since the job was planned?)"
    )]
    TooFewRows {
        /// The row group.
        group: usize,
        /// Its rows.
        rows: u64,
    },
    /// The row group's rows would be numbered past `u64::MAX`.
    #[error("row group {group} cannot start at row {start}: its rows would be numbered past 2^64")]
    PastU64 {
        /// The row group.
        group: usize,
        /// The file row number the partition gives its first row.
        start: u64,
    },
}

/// Why a partition of a Parquet file cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The local file is not a regular file, or cannot be opened.
    #[error(transparent)]
    NotReadable(#[from] NotReadable),
    /// Its store cannot be used, or did not tell the object's size (the store's words).
    #[error("{}", .0.message)]
    Store(#[source] DataError),
    /// Its bytes are not a Parquet file (the Parquet reader's words).
    #[error("is not a readable Parquet file: {0}")]
    NotParquet(#[source] ParquetError),
    /// Its footer was read, but no reader of its row group could be made.
    #[error("cannot be read: {0}")]
    NoReader(#[source] ParquetError),
    /// The partition does not fit the file.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// Opening it was not waited for to the end.
    #[error("{}", read_failed(.0))]
    Deadline(#[source] DeadlineError),
}

/// Why a batch of a partition could not be decoded (its decoder's words).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// A batch of a local file (the Arrow reader's error).
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    /// A batch of a file in an object store (the Parquet reader's error).
    #[error(transparent)]
    Parquet(#[from] ParquetError),
    /// A batch that came from elsewhere: the driver's Arrow Flight service.
    #[error(transparent)]
    Served(Box<dyn std::error::Error + Send + Sync>),
}

impl BatchError {
    /// The error of a batch that came from elsewhere (an Arrow Flight stream).
    pub fn served(e: impl std::error::Error + Send + Sync + 'static) -> BatchError {
        BatchError::Served(Box::new(e))
    }
}

/// Why the next batch of a partition cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Its decoder failed.
    #[error("cannot decode row group {group}: {source}")]
    Decode {
        /// The partition's row group.
        group: u32,
        /// What the decoder said.
        source: BatchError,
    },
    /// An earlier read of the partition failed, taking its reader with it.
    #[error("cannot decode row group {group}: a previous read of it failed")]
    Lost {
        /// The partition's row group.
        group: u32,
    },
    /// The read was not waited for to the end.
    #[error("{}", read_failed(.0))]
    Deadline(#[source] DeadlineError),
}
