//! Why an event log cannot be read or written: [`RecordError`] for one line that is not an
//! event, [`LogError`] for a log that cannot be read, and [`SinkError`] for a log that cannot be
//! written (the job goes on without it). A leaf of the event log.

use ringflow_core::data::DataError;

/// Why a line is not a ringflow event, as the end of a sentence about the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The line is not JSON, or its event's fields do not parse.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The line is JSON, but not an object.
    #[error("it is not a JSON object")]
    NotAnObject,
    /// A field every event has is missing.
    #[error("it has no `{0}`")]
    Missing(&'static str),
    /// A field every event has is not text.
    #[error("`{0}` is not a string")]
    NotAString(&'static str),
}

/// Why an event log cannot be read; each message is a sentence naming the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The path cannot be used, or its store failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Nothing is at the path (`from_dir`: it was found from a checkpoint directory).
    #[error(
        "there is no event log {path}{}",
        if *from_dir {
            " (ringflow history reads the events.jsonl that a job writes to its checkpoint \
             directory)"
        } else {
            ""
        }
    )]
    Missing {
        /// The log's path.
        path: String,
        /// Whether the path was found from a checkpoint directory rather than named.
        from_dir: bool,
    },
    /// A local log that cannot be read.
    #[error("{path} cannot be read: {source}")]
    Unreadable {
        /// The log's path.
        path: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The log is not text.
    #[error("{path} is not UTF-8 text")]
    NotUtf8 {
        /// The log's path.
        path: String,
    },
    /// A line of the log is not an event.
    #[error("{file} line {line} is not a ringflow event: {source}")]
    BadLine {
        /// The log's path.
        file: String,
        /// The line's number, from 1.
        line: usize,
        /// Why.
        source: RecordError,
    },
    /// The log holds no events.
    #[error("{file} holds no events")]
    Empty {
        /// The log's path.
        file: String,
    },
}

/// Why the event log cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// The path cannot be used, or its store failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The log's directory cannot be created.
    #[error("cannot create {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The local log cannot be opened or written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
