//! Why an output location cannot be used, as the end of a sentence about it: [`DirError`] for a
//! local directory that cannot be written or created, [`HeldError`] for an output whose
//! contents cannot be listed, [`CleanError`] for an object-store output that `--overwrite`
//! cannot clean. A leaf of the outputs; [`OutputError`](super::OutputError) tells them.

use std::path::PathBuf;

use ringflow_core::data::DataError;

/// Why a local directory cannot be written or created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// The directory exists and cannot be written.
    #[error("is not writable ({0})")]
    NotWritable(#[source] std::io::Error),
    /// The directory is missing, and its first existing ancestor cannot be written.
    #[error("cannot be created: {} is not writable ({source})", .at.display())]
    AncestorNotWritable {
        /// The ancestor.
        at: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// Something else than a directory is there (its kind, with its article).
    #[error("is {0}, not a directory")]
    NotADirectory(&'static str),
    /// The directory is missing, and its first existing ancestor is not a directory.
    #[error("cannot be created: {} is {kind}", .at.display())]
    AncestorNotADirectory {
        /// The ancestor.
        at: PathBuf,
        /// What it is, with its article ("a regular file").
        kind: &'static str,
    },
    /// The path cannot be looked at.
    #[error("cannot be checked: {0}")]
    Unchecked(#[source] std::io::Error),
}

/// Why what an output holds cannot be listed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeldError {
    /// The local directory cannot be read.
    #[error("cannot be listed: {0}")]
    Unlisted(#[source] std::io::Error),
    /// The store cannot list the prefix (what it said).
    #[error("{}", .0.message)]
    Store(#[source] DataError),
}

/// Why `--overwrite` cannot delete the previous objects of an object-store output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CleanError {
    /// The store cannot list the prefix (what it said).
    #[error("{}", .0.message)]
    List(#[source] DataError),
    /// An object could not be deleted.
    #[error("cannot be cleaned: deleting {name} failed ({source})")]
    Delete {
        /// The object, relative to the output.
        name: String,
        /// What the store said.
        source: object_store::Error,
    },
}
