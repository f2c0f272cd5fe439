//! From Parquet partitions to training batches.
//!
//! - [`reader`] opens one [`Partition`] (a row range of a row group) and yields Arrow record
//!   batches of just the needed columns, straight from storage.
//! - [`features`] turns a record batch into a row-major feature matrix and a label vector:
//!   numeric columns of any width and list columns of numbers, concatenated in the order the
//!   spec gives, scaled, with every null, non-finite value or out-of-range label reported by
//!   file, column and row.
//! - [`batches`] streams an epoch's partitions on a background thread into a bounded shuffle
//!   buffer and cuts mini-batches from it: memory stays bounded however large the data set.
//! - [`cache`] keeps decoded row groups between epochs within a byte budget.
//!
//! [`Partition`]: ringflow_proto::pb::Partition

pub mod batches;
pub mod cache;
pub mod features;
pub mod reader;
