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
    pub fn decode(bytes: &[u8]) -> Result<PartitionTicket, TicketError> {
        serde_json::from_slice(bytes).map_err(TicketError)
    }

    /// The partition it asks for.
    pub fn partition(&self) -> Partition {
        Partition {
            path: self.path.clone(),
            row_group: self.row_group,
            row_offset: self.row_offset,
            row_count: self.row_count,
            file_row_start: self.file_row_start,
            // The driver serves file rows; the executor runs `data.sql` over them.
            query_rows: None,
        }
    }
}

/// Bytes that are not a [`PartitionTicket`] (what the JSON reader said).
#[derive(Debug, thiserror::Error)]
#[error("not a ringflow partition ticket: {0}")]
pub struct TicketError(#[source] pub serde_json::Error);

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ticket() -> PartitionTicket {
        PartitionTicket {
            job_id: "mnist-20250101T000000-a1b2-0001".into(),
            secret: hex(&[7; 32]),
            path: "data/train.parquet".into(),
            row_group: 3,
            row_offset: 100,
            row_count: 4096,
            file_row_start: 12288,
            columns: vec!["image".into(), "label".into()],
            whole: false,
        }
    }

    proptest! {
        #![proptest_config(ringflow_ml::fuzz::config(1024))]

        /// Any bytes: a ticket that encodes back to an equal one, or an error sentence.
        #[test]
        fn fuzz_ticket_any_bytes(bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4).prop_map(
                |edits| {
                    let mut b = ticket().encode();
                    for (at, v) in edits {
                        let i = at.index(b.len());
                        b[i] = v;
                    }
                    b
                }
            ),
        ]) {
            match PartitionTicket::decode(&bytes) {
                Ok(t) => prop_assert_eq!(PartitionTicket::decode(&t.encode()).ok(), Some(t)),
                Err(e) => prop_assert!(e.to_string().starts_with("not a ringflow partition ticket: ")),
            }
        }
    }
}
