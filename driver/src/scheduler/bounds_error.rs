//! Why a planned job's messages would not fit their bounds: [`TooLarge`]. A leaf: the checks
//! of [`super::bounds`] and the driver's error type use it.

use ringflow_core::size::format_bytes;
use ringflow_core::wire::{
    MAX_EPOCH_PLAN_BYTES, MAX_FILE_LIST_BYTES, MAX_PREPROCESSING_BYTES, MAX_WRITTEN_SPEC_BYTES,
};

/// A part of a planned job's messages that is larger than its bound; each message is one
/// sentence naming the part, its size, the bound, and the setting or the data that bounds it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TooLarge {
    /// The spec as written (text and overrides), which every training task carries.
    #[error(
        "the job spec {file} is {} as written, with its overrides, more than the {} a job spec \
         may have",
        format_bytes(*.bytes as u64),
        format_bytes(MAX_WRITTEN_SPEC_BYTES as u64)
    )]
    WrittenSpec {
        /// The spec's file, as given.
        file: String,
        /// Its length with its overrides.
        bytes: usize,
    },
    /// A job's preprocessing, as JSON.
    #[error(
        "{what} is {} as JSON, more than the {} a job's preprocessing may have; {fix}",
        format_bytes(*.bytes as u64),
        format_bytes(MAX_PREPROCESSING_BYTES)
    )]
    Preprocessing {
        /// What it is ("data.train: the vocabulary of column `tokens` (3000000 ids)").
        what: String,
        /// Its length as JSON.
        bytes: usize,
        /// What makes it smaller ("lower data.vocab.max_size").
        fix: String,
    },
    /// The paths every task lists for `data.source = "auto"`.
    #[error(
        "data.source = \"auto\": the job's {files} files have {} of paths, more than the {} a \
         task may list for executors to check; set data.source = \"direct\" or \"driver\", or \
         use fewer, larger files",
        format_bytes(*.bytes as u64),
        format_bytes(MAX_FILE_LIST_BYTES as u64)
    )]
    FileList {
        /// The job's files.
        files: usize,
        /// The length of their paths together.
        bytes: usize,
    },
    /// One rank's partitions of a split, in an epoch plan.
    #[error(
        "{key}: its {groups} row groups would make an epoch's partitions of {} for one \
         executor, more than the {} a message of partitions may have; write the data in fewer, \
         larger row groups",
        format_bytes(*.bytes as u64),
        format_bytes(MAX_EPOCH_PLAN_BYTES as u64)
    )]
    Partitions {
        /// The split's spec key (`data.train`, `--data`).
        key: String,
        /// Its row groups.
        groups: usize,
        /// The encoded length of an epoch plan holding one partition of each.
        bytes: usize,
    },
}
