//! [`CountError`]: why the counting pass ([`super::counting`]) could not count the rows a
//! query yields over a row group. A leaf, so that the driver's error type can hold it.

use ringflow_core::data::DataError;

/// Why the rows of one row group could not be counted.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The file's schema was not among those the planner read.
    #[error("its schema was not read")]
    NoSchema,
    /// Reading the row group, or running the query over it, failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The count (or the label pass's query) ran past `data.sql_timeout_s`.
    #[error(
        "data.sql: {what} ran longer than data.sql_timeout_s = {seconds} s and was stopped; \
         raise data.sql_timeout_s if it needs longer"
    )]
    TimedOut {
        /// What the driver ran the query for ("counting the query's rows").
        what: &'static str,
        /// `data.sql_timeout_s`.
        seconds: u64,
    },
}
