//! How large what travels on the control plane may be, and how what may be larger travels.
//!
//! Every gRPC client and server of the control plane (executors ↔ driver, CLI ↔ driver)
//! decodes and encodes messages of at most [`MAX_MESSAGE_BYTES`], set explicitly on both sides.
//! What goes into a message is bounded below that when the job is planned, each part by its
//! own documented bound, so that a job that plans never meets the limit:
//!
//! - the job spec, which every task carries: at most [`MAX_SPEC_BYTES`] as JSON, with
//!   `data.sql` at most [`MAX_SQL_BYTES`] and each class name at most [`MAX_CLASS_NAME_BYTES`];
//! - the list of files an executor checks with `data.source = "auto"`: at most
//!   [`MAX_FILE_LIST_BYTES`] of paths;
//! - one rank's partitions of an epoch: at most [`MAX_EPOCH_PLAN_BYTES`];
//! - a rank's statistics of the training split: at most [`MAX_STATISTICS_BYTES`] as JSON.
//!
//! The job's preprocessing (a token vocabulary above all, which may hold millions of tokens)
//! travels inside the task only up to [`INLINE_PREPROCESSING_BYTES`]. Past that the task
//! carries only its length, and the executor fetches it from the driver in chunks of at most
//! [`CHUNK_BYTES`] ([`Reassembly`] puts them together, refusing more bytes than announced); a
//! job's preprocessing may be at most [`MAX_PREPROCESSING_BYTES`], checked when it is planned
//! (the vocabulary, given classes) or when its statistics are merged.
//!
//! [`check_task`] is the driver's last check before it hands a task out: a task over the limit
//! (which planning should have refused) fails its job with a sentence naming its largest part,
//! instead of leaving an executor unable to read it.

pub mod payload;

use crate::pb;
use crate::size::format_bytes;

/// The largest message of the control plane, either way: the decoding and encoding limit of
/// every client and server of the executor and job services.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The largest job spec, as JSON (it travels in every task).
pub const MAX_SPEC_BYTES: usize = 16 << 20;

/// The largest job spec file as written, with its overrides (it travels in every training
/// task and is kept in the job's checkpoints).
pub const MAX_WRITTEN_SPEC_BYTES: usize = 16 << 20;

/// The longest `data.sql`, in bytes.
pub const MAX_SQL_BYTES: usize = 1 << 20;

/// The longest class name (a string label, a tag, an entry of `data.label_classes`), in bytes.
pub const MAX_CLASS_NAME_BYTES: usize = 256;

/// The most bytes of file paths a task may list for `data.source = "auto"`'s check.
pub const MAX_FILE_LIST_BYTES: usize = 16 << 20;

/// The largest epoch plan of one rank (its partitions), as the driver estimates it from the
/// row groups of a split when the job is planned.
pub const MAX_EPOCH_PLAN_BYTES: usize = 32 << 20;

/// The largest statistics partial a rank sends the driver, as JSON.
pub const MAX_STATISTICS_BYTES: usize = MAX_MESSAGE_BYTES - (1 << 20);

/// Preprocessing up to this size travels inside the task (or the statistics' reply); a larger
/// one is fetched in chunks.
pub const INLINE_PREPROCESSING_BYTES: usize = 1 << 20;

/// The largest chunk of a fetched preprocessing.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The largest preprocessing of a job, as JSON: its vocabulary, classes and normalization.
pub const MAX_PREPROCESSING_BYTES: u64 = 1 << 30;

// The bounds nest: a task's parts, each at its bound, fit one message with room for the ring
// (a megabyte), and so do the other messages.
const _: () = assert!(
    MAX_SPEC_BYTES
        + MAX_WRITTEN_SPEC_BYTES
        + MAX_FILE_LIST_BYTES
        + INLINE_PREPROCESSING_BYTES
        + (1 << 20)
        < MAX_MESSAGE_BYTES
);
const _: () = assert!(MAX_EPOCH_PLAN_BYTES < MAX_MESSAGE_BYTES);
const _: () = assert!(MAX_STATISTICS_BYTES < MAX_MESSAGE_BYTES);
const _: () = assert!(MAX_SQL_BYTES < MAX_SPEC_BYTES && CHUNK_BYTES < MAX_MESSAGE_BYTES);
const _: () = assert!(INLINE_PREPROCESSING_BYTES as u64 <= MAX_PREPROCESSING_BYTES);

/// Why a fetched preprocessing could not be put together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// The announced length is over the bound.
    #[error(
        "the driver announced {} of preprocessing, more than the {} a job's preprocessing may \
         have",
        format_bytes(*announced),
        format_bytes(*limit)
    )]
    TooLarge {
        /// The length announced.
        announced: u64,
        /// The bound.
        limit: u64,
    },
    /// A chunk over the bound.
    #[error("a chunk of {got} bytes arrived, more than the {limit} a chunk may have")]
    ChunkTooLarge {
        /// The chunk's length.
        got: usize,
        /// The bound.
        limit: usize,
    },
    /// More bytes than announced.
    #[error("more than the {announced} bytes announced arrived")]
    Overrun {
        /// The length announced.
        announced: u64,
    },
    /// Fewer bytes than announced.
    #[error("the transfer ended after {received} of the {announced} bytes announced")]
    Short {
        /// Bytes that arrived.
        received: u64,
        /// The length announced.
        announced: u64,
    },
    /// The bytes are not UTF-8.
    #[error("the bytes that arrived are not UTF-8 text ({0})")]
    NotText(String),
}

/// A fetched document put together from its chunks: it grows only by the bytes that arrived,
/// never past the length announced.
#[derive(Debug)]
pub struct Reassembly {
    announced: u64,
    chunk_limit: usize,
    bytes: Vec<u8>,
}

impl Reassembly {
    /// Expects `announced` bytes in chunks of at most [`CHUNK_BYTES`]; refuses a length over
    /// [`MAX_PREPROCESSING_BYTES`].
    pub fn new(announced: u64) -> Result<Reassembly, TransferError> {
        Reassembly::with_limits(announced, MAX_PREPROCESSING_BYTES, CHUNK_BYTES)
    }

    /// Expects `announced` bytes, at most `limit`, in chunks of at most `chunk_limit`.
    pub fn with_limits(
        announced: u64,
        limit: u64,
        chunk_limit: usize,
    ) -> Result<Reassembly, TransferError> {
        if announced > limit {
            return Err(TransferError::TooLarge { announced, limit });
        }
        Ok(Reassembly {
            announced,
            chunk_limit,
            bytes: Vec::new(),
        })
    }

    /// Adds the next chunk.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), TransferError> {
        if chunk.len() > self.chunk_limit {
            return Err(TransferError::ChunkTooLarge {
                got: chunk.len(),
                limit: self.chunk_limit,
            });
        }
        if (self.bytes.len() + chunk.len()) as u64 > self.announced {
            return Err(TransferError::Overrun {
                announced: self.announced,
            });
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// The document, once every announced byte arrived.
    pub fn finish(self) -> Result<String, TransferError> {
        if (self.bytes.len() as u64) < self.announced {
            return Err(TransferError::Short {
                received: self.bytes.len() as u64,
                announced: self.announced,
            });
        }
        String::from_utf8(self.bytes).map_err(|e| TransferError::NotText(e.to_string()))
    }
}

/// `text` cut into the chunks it travels in (none for an empty text).
pub fn chunks(text: &str) -> impl Iterator<Item = &[u8]> {
    text.as_bytes().chunks(CHUNK_BYTES)
}

/// Whether a preprocessing of `bytes` travels inside its message (else it is fetched).
pub fn travels_inline(bytes: usize) -> bool {
    bytes <= INLINE_PREPROCESSING_BYTES
}

/// A task larger than a message may be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "its task is {}, more than the {} a control-plane message may have; its largest part is {} \
     ({})",
    format_bytes(*bytes as u64),
    format_bytes(*limit as u64),
    part,
    format_bytes(*part_bytes as u64)
)]
pub struct TaskTooLarge {
    /// The task's encoded length.
    pub bytes: usize,
    /// The bound.
    pub limit: usize,
    /// Its largest part, for people.
    pub part: &'static str,
    /// That part's length.
    pub part_bytes: usize,
}

/// The parts of `task` that may be large, for people, with their lengths, largest first.
pub fn task_parts(task: &pb::Task) -> Vec<(&'static str, usize)> {
    let header = task.header.clone().unwrap_or_default();
    let data = match &task.work {
        Some(pb::task::Work::Train(t)) => t.data.clone(),
        Some(pb::task::Work::Infer(i)) => i.data.clone(),
        Some(pb::task::Work::Bench(_)) | None => None,
    }
    .unwrap_or_default();
    let strings = |v: &[String]| v.iter().map(String::len).sum::<usize>();
    let written = match &task.work {
        Some(pb::task::Work::Train(t)) => t
            .written
            .as_ref()
            .map_or(0, |w| w.file.len() + w.toml.len() + strings(&w.overrides)),
        _ => 0,
    };
    let mut parts = vec![
        (
            "the job spec (data.sql, data.label_classes, the model's layers)",
            header.job.len(),
        ),
        (
            "the preprocessing (the vocabulary, the label classes, the normalization)",
            data.preprocessing.len(),
        ),
        (
            "the files listed for data.source = \"auto\"",
            strings(&data.files),
        ),
        (
            "the ring (every rank's address and host identity)",
            strings(&header.ring) + strings(&header.hosts),
        ),
        ("the input columns", strings(&data.input_columns)),
        ("the job spec file as written", written),
    ];
    parts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    parts
}

/// Checks that `task` fits a message ([`MAX_MESSAGE_BYTES`]).
pub fn check_task(task: &pb::Task) -> Result<(), TaskTooLarge> {
    check_task_within(task, MAX_MESSAGE_BYTES)
}

/// Checks that `task` encodes to at most `limit` bytes.
pub fn check_task_within(task: &pb::Task, limit: usize) -> Result<(), TaskTooLarge> {
    let bytes = prost::Message::encoded_len(task);
    if bytes <= limit {
        return Ok(());
    }
    let (part, part_bytes) = task_parts(task)[0];
    Err(TaskTooLarge {
        bytes,
        limit,
        part,
        part_bytes,
    })
}

#[cfg(test)]
mod tests;
