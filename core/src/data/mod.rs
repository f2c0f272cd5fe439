//! How a job's data is found, prepared and summarized: the part of the contract that the
//! driver (planning), the executors (reading) and the CLI (`ringflow sql`, `predict`) must
//! interpret identically.
//!
//! - [`location`]: local paths and `s3://`, `gs://`, `az://`, `http(s)://` URLs, resolved to
//!   object stores with credential checks; [`local`]: only regular local files are data.
//! - [`partition`]: one partition (a row range of a row group) read as Arrow record batches,
//!   locally or from an object store; [`flight`]: the ticket that asks the driver for one.
//! - [`sql`]: DataFusion sessions, lookup tables, and the planning and streaming execution of a
//!   job's `data.sql` over one partition at a time.
//! - [`stats`]: the partial and merged whole-data statistics behind `normalize` and string
//!   label classes; [`prepare`]: the ranks' answers of the source phase before training.
//! - [`vocab`]: token counts of string sequence columns and the vocabulary built from them.
//! - [`paths`]: output paths joined below a directory with path and URL APIs, and the
//!   file-system root that no job may write into.
//! - [`runtime`]: the small async runtime that storage and SQL calls from synchronous code
//!   run on; [`deadline`]: the limits on reading a file and running a query.

pub mod deadline;
mod error;
pub mod flight;
pub mod local;
pub mod location;
pub mod partition;
pub mod paths;
pub mod prepare;
pub mod runtime;
mod sequence_error;
pub mod sequences;
pub mod sql;
pub mod stats;
mod store_error;
pub mod vocab;

pub use error::{DataError, DataErrorKind, Result};

use datafusion::arrow::datatypes::DataType;

/// Rows per batch when an executor evaluates a model (the test split, `ringflow eval`).
pub const EVAL_BATCH_ROWS: usize = 1024;

/// Rows per batch when an executor writes predictions (`ringflow predict`).
pub const PREDICT_BATCH_ROWS: usize = 4096;

/// The name of the file in which rank `rank` of a prediction writes its rows
/// (`part-00000.parquet`); a rank with no rows writes none.
pub fn prediction_part(rank: usize) -> String {
    format!("part-{rank:05}.parquet")
}

/// Training batches an executor draws ahead of the step it is taking: this many kept ready,
/// plus the one being drawn (see the executor's `data::batches_ahead`).
pub const BATCHES_AHEAD: usize = 1;

/// True for the Arrow types that hold strings (a string label's class names), dictionary
/// encoded or not.
pub fn is_string(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_string(v),
        _ => false,
    }
}
pub use location::Location;
pub use stats::{DataStats, Preprocessing};
