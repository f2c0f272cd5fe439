//! Reading one partition of a Parquet file as Arrow record batches, from wherever it lives
//! (executors reading their own partitions; the driver serving them over Arrow Flight).
//!
//! A local file must be a regular file ([`super::local`]); it is opened and decoded batch by
//! batch on a helper thread, each step within [`READ_TIMEOUT`] ([`local_file`]). A file in an
//! object store is read with the async Parquet reader on the I/O runtime: only the footer and
//! the column chunks of the partition's row group that the job needs are fetched, with range
//! requests, each step within the same deadline ([`store`]). Either way the footer is checked
//! against the partition first ([`select`]); [`sizing`] says how large the batches are.

mod error;
mod local_file;
mod select;
mod sizing;
mod store;
#[cfg(test)]
mod tests;

pub use error::{BatchError, OpenError, ReadError, SelectError};
pub use sizing::{
    READ_AHEAD_BYTES, READ_BATCH_ROWS, READ_CHUNK_BYTES, READ_DECODERS, read_ahead_chunks,
    read_ahead_depth, read_batch_rows,
};
pub use store::StoreReader;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::deadline::{self, READ_TIMEOUT, block_on_timeout};
use super::error::{DataError, Result};
use super::local::check_regular;
use super::location::Location;
use crate::pb::Partition;
use local_file::open_local;
use store::open_remote;

/// Batches of a partition that arrive asynchronously (from an object store or the driver).
pub type BatchStream = BoxStream<'static, std::result::Result<RecordBatch, BatchError>>;

/// A local file's batches, decoded on a helper thread of the reader's own.
type LocalBatches = deadline::ThreadedIter<std::result::Result<RecordBatch, BatchError>>;

enum Source {
    Local(LocalBatches),
    Remote(BatchStream),
    /// Every batch was read.
    Done,
    /// A read failed or ran past its deadline, taking the reader with it.
    Lost,
}

/// The record batches of one partition, restricted to `columns` (in file order).
pub struct PartitionReader {
    source: Source,
    partition: Partition,
    schema: SchemaRef,
    next_row: u64,
}

impl PartitionReader {
    /// Opens `partition`, reading only the named top-level columns; a missing column is an
    /// error that lists the file's columns.
    pub fn open(partition: &Partition, columns: &[String]) -> Result<PartitionReader> {
        Self::open_rows(partition, columns, false, READ_BATCH_ROWS)
    }

    /// Opens the whole row group that `partition` lies in (for caching it).
    pub fn open_row_group(partition: &Partition, columns: &[String]) -> Result<PartitionReader> {
        Self::open_rows(partition, columns, true, READ_BATCH_ROWS)
    }

    /// Opens `partition` (its whole row group with `whole`) as [`PartitionReader::open`]
    /// does, in record batches of `batch_rows` rows (at least 1; see [`read_batch_rows`]).
    pub fn open_rows(
        partition: &Partition,
        columns: &[String],
        whole: bool,
        batch_rows: usize,
    ) -> Result<PartitionReader> {
        let batch_rows = batch_rows.max(1);
        let path = partition.path.clone();
        let fail = |e: OpenError| DataError::new(path.clone(), e.to_string());
        let location = Location::parse(&path)?;
        let (p, c) = (partition.clone(), columns.to_vec());
        let (source, schema, first) = match location.local_path() {
            Some(local) => {
                let opened = deadline::blocking(READ_TIMEOUT, move || {
                    open_local(&local, &p, &c, whole, batch_rows)
                })
                .map_err(OpenError::Deadline)
                .and_then(|opened| opened);
                let (reader, schema, first) = opened.map_err(fail)?;
                let batches = reader.map(|r| r.map_err(BatchError::from));
                let batches = deadline::ThreadedIter::start("ringflow-read", batches)
                    .map_err(|e| fail(OpenError::Deadline(e)))?;
                (Source::Local(batches), schema, first)
            }
            None => {
                let opened = block_on_timeout(READ_TIMEOUT, async move {
                    open_remote(location, &p, &c, whole, batch_rows).await
                })
                .map_err(OpenError::Deadline)
                .and_then(|opened| opened);
                let (stream, schema, first) = opened.map_err(fail)?;
                (Source::Remote(stream), schema, first)
            }
        };
        Ok(PartitionReader {
            source,
            partition: partition.clone(),
            schema,
            next_row: partition.file_row_start + first,
        })
    }

    /// A reader over batches that arrive from `stream` (Arrow Flight), whose first row is row
    /// `offset` of the partition's row group.
    pub fn from_stream(
        partition: &Partition,
        schema: SchemaRef,
        stream: BatchStream,
        offset: u64,
    ) -> PartitionReader {
        PartitionReader {
            source: Source::Remote(stream),
            partition: partition.clone(),
            schema,
            next_row: partition.file_row_start + offset,
        }
    }

    /// The schema of the batches (the projected columns).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The next batch and the file row number of its first row.
    pub fn next_batch(&mut self) -> Result<Option<(RecordBatch, u64)>> {
        let (path, group) = (self.partition.path.clone(), self.partition.row_group);
        let fail = |e: ReadError| DataError::new(path.clone(), e.to_string());
        let (next, source) = match std::mem::replace(&mut self.source, Source::Lost) {
            Source::Local(mut batches) => {
                let item = batches
                    .next(READ_TIMEOUT)
                    .map_err(|e| fail(ReadError::Deadline(e)))?;
                (item, Source::Local(batches))
            }
            Source::Remote(mut stream) => {
                let read =
                    block_on_timeout(READ_TIMEOUT, async move { (stream.next().await, stream) });
                let (item, stream) = read.map_err(|e| fail(ReadError::Deadline(e)))?;
                (item, Source::Remote(stream))
            }
            Source::Done => return Ok(None),
            Source::Lost => return Err(fail(ReadError::Lost { group })),
        };
        let next = match next {
            None => {
                self.source = Source::Done;
                None
            }
            Some(Ok(batch)) => {
                self.source = source;
                Some(batch)
            }
            Some(Err(source)) => return Err(fail(ReadError::Decode { group, source })),
        };
        Ok(next.map(|batch| {
            let first = self.next_row;
            self.next_row += batch.num_rows() as u64;
            (batch, first)
        }))
    }

    /// The remaining batches as a DataFusion stream (the input of `data.sql`). A remote
    /// file's or a Flight stream's batches are polled where the query runs (never waited for
    /// from inside the I/O runtime, which the query may share); a local file's come from its
    /// reader thread.
    pub fn into_stream(mut self) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let external = |e: DataError| datafusion::error::DataFusionError::External(Box::new(e));
        match std::mem::replace(&mut self.source, Source::Lost) {
            Source::Remote(stream) => {
                let (path, group) = (self.partition.path.clone(), self.partition.row_group);
                let batches = stream.map(move |item| {
                    item.map_err(|source| {
                        let decode = ReadError::Decode { group, source };
                        external(DataError::new(path.clone(), decode.to_string()))
                    })
                });
                return Box::pin(RecordBatchStreamAdapter::new(schema, batches));
            }
            other => self.source = other,
        }
        let iter = std::iter::from_fn(move || match self.next_batch() {
            Ok(Some((b, _))) => Some(Ok(b)),
            Ok(None) => None,
            Err(e) => Some(Err(external(e))),
        });
        Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(iter),
        ))
    }
}

/// Checks that this process can open every file (for `data.source = "auto"`): the first
/// failure, naming the file, or `None`. A local file must be a regular file; no check waits
/// longer than [`READ_TIMEOUT`].
pub fn unreadable(paths: &[String]) -> Option<DataError> {
    for path in paths {
        let location = match Location::parse(path) {
            Ok(l) => l,
            Err(e) => return Some(e),
        };
        let checked = match location.local_path() {
            Some(local) => deadline::blocking(READ_TIMEOUT, move || {
                check_regular(&local).map_err(OpenError::from)
            }),
            None => block_on_timeout(READ_TIMEOUT, async move {
                location.size().await.map(|_| ()).map_err(OpenError::Store)
            }),
        };
        let failed = match checked {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => OpenError::Deadline(e),
        };
        return Some(DataError::new(path, failed.to_string()));
    }
    None
}
