//! From Parquet partitions to training batches.
//!
//! - Partitions (a row range of a row group) are read by [`PartitionReader`] straight from
//!   storage, or from the driver over Arrow Flight ([`source`]).
//! - Each data kind has one converter ([`converter::BatchConverter`]) in a folder of its own,
//!   picked once per task ([`kinds`]):
//!   - [`features`] turns a record batch into a row-major feature matrix and a label vector:
//!     numeric columns of any width and list columns of numbers, concatenated in the order the
//!     spec gives, scaled, with every null, non-finite value or out-of-range label reported by
//!     file, column and row;
//!   - [`images`] decodes a column of PNG or JPEG images (`data.image`) into `[C, H, W]`
//!     pixels as row groups are read, and converts the pixels as features;
//!   - [`sequences`] reads token sequences (`list<string>`, `list<int>`) and their labels, and
//!     pads each batch only to its own longest sequence, with length buckets.
//! - [`batches`] streams an epoch's partitions on a background thread into a bounded shuffle
//!   buffer and cuts mini-batches from it as the converter's layout says: memory stays bounded
//!   however large the data set; [`batches_ahead`] draws the next batch on a thread of its own
//!   while the current trains.
//! - [`augment`] crops and flips training images at random (`data.augment`), in the batch.
//! - [`cache`] keeps decoded row groups between epochs within a byte budget.
//! - [`prep`] runs the job's `data.sql` on each partition as it streams.
//! - [`partitions`] ties these together: the prepared batches of a list of partitions, for
//!   training, statistics, evaluation and prediction alike.
//!
//! [`PartitionReader`]: ringflow_core::data::partition::PartitionReader

pub mod augment;
pub mod background;
pub mod batches;
pub mod batches_ahead;
pub mod cache;
pub mod converter;
pub mod error;
pub mod features;
#[cfg(test)]
mod fuzz;
pub mod images;
pub mod kinds;
pub mod partitions;
pub mod prep;
pub mod read_ahead;
pub mod rows;
pub mod sequences;
pub mod source;
