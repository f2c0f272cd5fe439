//! What the ranks and the driver say to each other before training, in the two preparation
//! phases: whether each rank can read the job's files ([`ReadCheck`]) and where every rank
//! then reads its partitions from ([`PartitionSource`]); the statistics phase's documents are
//! [`crate::data::DataStats`] and [`crate::data::Preprocessing`].

use serde::{Deserialize, Serialize};

use crate::wire::payload::Payload;

/// A rank's answer in the source phase (`data.source = "auto"`): whether it can read every
/// file of the job itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCheck {
    /// Why it cannot (the first file it cannot read, as one sentence); `None`: it can.
    pub unreadable: Option<String>,
}

impl Payload for ReadCheck {
    const WHAT: &'static str = "read check";
}

/// Where every rank of a job reads its partitions from, as the driver decided from the ranks'
/// [`ReadCheck`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionSource {
    /// Each rank reads its own partitions from storage.
    Direct,
    /// The driver serves them over Arrow Flight (some rank cannot read the data).
    Driver,
}

impl Payload for PartitionSource {
    const WHAT: &'static str = "partition source";
}

impl PartitionSource {
    /// How job summaries name it: `"direct"` or `"driver"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionSource::Direct => "direct",
            PartitionSource::Driver => "driver",
        }
    }
}
