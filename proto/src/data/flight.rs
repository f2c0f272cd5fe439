//! The Arrow Flight ticket with which an executor asks the driver for one partition, when it
//! cannot read the data itself (`data.source = "driver"`, or `"auto"` when some executor could
//! not open the files).
//!
//! The driver serves only files of a running job, and only to callers that present the job's
//! secret, which it handed to the job's executors with their tasks.

use serde::{Deserialize, Serialize};

use crate::pb::Partition;

/// A request for one partition's record batches (sent as a Flight `Ticket`, JSON-encoded).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartitionTicket {
    /// The job whose data it is.
    pub job_id: String,
    /// The job's secret, hex-encoded.
    pub secret: String,
    /// The file, as the job's plan names it.
    pub path: String,
    /// Row group index.
    pub row_group: u32,
    /// First row within the row group.
    pub row_offset: u64,
    /// Rows to read.
    pub row_count: u64,
    /// File row number of the row group's first row.
    pub file_row_start: u64,
    /// Columns to read.
    pub columns: Vec<String>,
    /// Read the whole row group (for the executor's cache) instead of the row range.
    pub whole: bool,
}

impl PartitionTicket {
    /// The ticket's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("tickets serialize")
    }

    /// Reads a ticket.
    pub fn decode(bytes: &[u8]) -> Result<PartitionTicket, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a ringflow partition ticket: {e}"))
    }

    /// The partition it asks for.
    pub fn partition(&self) -> Partition {
        Partition {
            path: self.path.clone(),
            row_group: self.row_group,
            row_offset: self.row_offset,
            row_count: self.row_count,
            file_row_start: self.file_row_start,
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
