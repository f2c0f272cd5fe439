//! Why a `data` key's value cannot run although its type is right ([`SqlError`],
//! [`SqlTimeoutError`], [`ClassesError`]), as the end of a sentence about the key. A leaf: the
//! spec's checks use it.

use crate::size::format_bytes;

/// A `data.sql` that cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum SqlError {
    /// No query at all.
    #[error("is empty; remove it or give a query")]
    Empty,
    /// A query longer than a query may be.
    #[error(
        "is {} long, more than the {} a query may have; put long lists of values in a table of \
         data.tables and join it instead",
        format_bytes(*.bytes),
        format_bytes(*.max)
    )]
    TooLong {
        /// The query's length in bytes.
        bytes: u64,
        /// The longest a query may be, in bytes.
        max: u64,
    },
}

/// A `data.sql_timeout_s` out of its range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be between 1 and {max} (a week), not {seconds}")]
pub(super) struct SqlTimeoutError {
    /// The timeout asked for.
    pub(super) seconds: u64,
    /// The longest timeout, in seconds.
    pub(super) max: u64,
}

/// A `data.label_classes` that cannot be a label's classes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum ClassesError {
    /// Fewer than two classes.
    #[error("must list at least two classes")]
    TooFew,
    /// More classes than a job may have.
    #[error("lists {count} classes, more than the {max} a job may have")]
    TooMany {
        /// The classes listed.
        count: usize,
        /// The most a job may have.
        max: usize,
    },
    /// A class name longer than a class name may be.
    #[error("class {index} is {bytes} bytes long, more than the {max} bytes a class name may have")]
    NameTooLong {
        /// The class's index in the list.
        index: usize,
        /// Its name's length in bytes.
        bytes: usize,
        /// The longest a class name may be, in bytes.
        max: usize,
    },
    /// A class listed twice.
    #[error("lists the class {class:?} twice")]
    Twice {
        /// The class.
        class: String,
    },
}
