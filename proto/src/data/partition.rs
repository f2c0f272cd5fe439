//! Reading one partition of a Parquet file as Arrow record batches, from wherever it lives
//! (executors reading their own partitions; the driver serving them over Arrow Flight).
//!
//! A local file must be a regular file ([`super::local`]); it is opened and decoded batch by
//! batch on a helper thread, each step within [`READ_TIMEOUT`]. A file in an object store is
//! read with the async Parquet reader on the I/O runtime: only the footer and the column
//! chunks of the partition's row group that the job needs are fetched, with range requests,
//! each step within the same deadline.

use std::path::Path;

use super::deadline::{self, READ_TIMEOUT, block_on_timeout, read_failed};
use super::error::{DataError, Result};
use super::local::open_regular;
use super::location::Location;
use crate::pb::Partition;
use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchReader};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use datafusion::parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

/// Rows decoded per record batch, at most.
pub const READ_BATCH_ROWS: usize = 4096;

/// Bytes of converted rows (features and labels as `f32`) that one record batch is sized to
/// ([`read_batch_rows`]): small enough that Parquet's level, index and value buffers and the
/// converted chunk of one batch stay in a core's L2 cache between the decoding passes, large
/// enough that the per-batch costs stay small.
pub const READ_CHUNK_BYTES: u64 = 512 << 10;

/// Threads that decode an executor's partitions ahead of its training loop. Partition `i` of an
/// epoch goes to decoder `i % READ_DECODERS`, and the loop takes the partitions back in order,
/// so that the rows it sees do not depend on which decoder finished first.
pub const READ_DECODERS: usize = 2;

/// Bytes of converted rows (features and labels as `f32`) that the decoders may hold ready
/// ahead of the training loop, all together; each may always hold one chunk.
pub const READ_AHEAD_BYTES: u64 = 64 << 20;

/// The most chunks one decoder holds ready, whatever their size.
const MAX_DEPTH: u64 = 256;

/// Rows per record batch (and per converted chunk) for rows of `row_bytes` bytes once
/// converted: about [`READ_CHUNK_BYTES`] of them, at least 1 and at most [`READ_BATCH_ROWS`].
pub fn read_batch_rows(row_bytes: u64) -> usize {
    let rows = READ_CHUNK_BYTES / row_bytes.max(1);
    rows.clamp(1, READ_BATCH_ROWS as u64) as usize
}

/// Converted chunks of [`read_batch_rows`] rows of `row_bytes` bytes that each decoder may
/// hold ready: its share of [`READ_AHEAD_BYTES`], at least 1 and at most 256.
pub fn read_ahead_depth(row_bytes: u64) -> usize {
    let chunk = (read_batch_rows(row_bytes) as u64).saturating_mul(row_bytes.max(1));
    let depth = READ_AHEAD_BYTES / (READ_DECODERS as u64) / chunk;
    depth.clamp(1, MAX_DEPTH) as usize
}

/// The most converted chunks (of [`read_batch_rows`] rows) alive between the decoders and the
/// training loop: those held ready, the one each decoder is converting, and the one the loop
/// is cutting into batches.
pub fn read_ahead_chunks(row_bytes: u64) -> u64 {
    (READ_DECODERS * (read_ahead_depth(row_bytes) + 1) + 1) as u64
}

/// Batches of a partition that arrive asynchronously (from an object store or the driver).
pub type BatchStream = BoxStream<'static, std::result::Result<RecordBatch, String>>;

/// A local file's batches, decoded on a helper thread of the reader's own.
type LocalBatches = deadline::ThreadedIter<std::result::Result<RecordBatch, String>>;

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

/// What to read of a row group: its index, the first row and the number of rows.
struct Rows {
    group: usize,
    offset: u64,
    count: u64,
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
        let fail = |m: String| DataError::new(path.clone(), m);
        let location = Location::parse(&path).map_err(|e| fail(e.message))?;
        let (p, c) = (partition.clone(), columns.to_vec());
        let (source, schema, first) = match location.local_path() {
            Some(local) => {
                let opened = deadline::blocking(READ_TIMEOUT, move || {
                    open_local(&local, &p, &c, whole, batch_rows)
                })
                .map_err(|e| fail(read_failed(&e)))?;
                let (reader, schema, first) = opened.map_err(fail)?;
                let batches = reader.map(|r| r.map_err(|e| e.to_string()));
                let batches = deadline::ThreadedIter::start("ringflow-read", batches)
                    .map_err(|e| fail(read_failed(&e)))?;
                (Source::Local(batches), schema, first)
            }
            None => {
                let opened = block_on_timeout(READ_TIMEOUT, async move {
                    open_remote(location, &p, &c, whole, batch_rows).await
                })
                .map_err(|e| fail(read_failed(&e)))?;
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
        let fail = |m: String| {
            DataError::new(
                path.clone(),
                format!("cannot decode row group {group}: {m}"),
            )
        };
        let (next, source) = match std::mem::replace(&mut self.source, Source::Lost) {
            Source::Local(mut batches) => {
                let item = batches
                    .next(READ_TIMEOUT)
                    .map_err(|e| DataError::new(path.clone(), read_failed(&e)))?;
                (item, Source::Local(batches))
            }
            Source::Remote(mut stream) => {
                let read =
                    block_on_timeout(READ_TIMEOUT, async move { (stream.next().await, stream) });
                let (item, stream) =
                    read.map_err(|e| DataError::new(path.clone(), read_failed(&e)))?;
                (item, Source::Remote(stream))
            }
            Source::Done => return Ok(None),
            Source::Lost => return Err(fail("a previous read of it failed".into())),
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
            Some(Err(m)) => return Err(fail(m)),
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
        use futures::StreamExt;
        let schema = self.schema.clone();
        let external = |e: DataError| datafusion::error::DataFusionError::External(Box::new(e));
        match std::mem::replace(&mut self.source, Source::Lost) {
            Source::Remote(stream) => {
                let (path, group) = (self.partition.path.clone(), self.partition.row_group);
                let batches = stream.map(move |item| {
                    item.map_err(|m| {
                        external(DataError::new(
                            path.clone(),
                            format!("cannot decode row group {group}: {m}"),
                        ))
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

type Opened<R> = (R, SchemaRef, u64);

/// Opens a partition of the local Parquet file at `path` (a regular file, opened without
/// blocking), reading its footer.
fn open_local(
    path: &Path,
    partition: &Partition,
    columns: &[String],
    whole: bool,
    batch_rows: usize,
) -> std::result::Result<Opened<ParquetRecordBatchReader>, String> {
    let file = open_regular(path).map_err(|e| e.message)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("is not a readable Parquet file: {e}"))?;
    let (roots, rows) = select(
        partition,
        columns,
        builder.metadata(),
        builder.schema(),
        whole,
    )?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_row_groups(vec![rows.group])
        .with_projection(mask)
        .with_row_selection(selection(&rows))
        .with_batch_size(batch_rows)
        .build()
        .map_err(|e| format!("cannot be read: {e}"))?;
    let schema = reader.schema();
    Ok((reader, schema, rows.offset))
}

fn selection(rows: &Rows) -> RowSelection {
    RowSelection::from(vec![
        RowSelector::skip(rows.offset as usize),
        RowSelector::select(rows.count as usize),
    ])
}

/// The root columns to read and the rows of the row group, checked against the footer.
fn select(
    partition: &Partition,
    columns: &[String],
    meta: &datafusion::parquet::file::metadata::ParquetMetaData,
    arrow_schema: &SchemaRef,
    whole: bool,
) -> std::result::Result<(Vec<usize>, Rows), String> {
    let mut roots = Vec::with_capacity(columns.len());
    for c in columns {
        let idx = arrow_schema.index_of(c).map_err(|_| {
            let have: Vec<&str> = arrow_schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            format!("has no column `{c}` (its columns: {})", have.join(", "))
        })?;
        roots.push(idx);
    }
    let rg = partition.row_group as usize;
    if rg >= meta.num_row_groups() {
        return Err(format!(
            "has {} row groups; row group {rg} does not exist (did the file change since the \
             job was planned?)",
            meta.num_row_groups()
        ));
    }
    let rg_rows = meta.row_group(rg).num_rows() as u64;
    // A range of `data.sql`'s output is checked against the output, by whoever runs the query.
    let end = match partition.query_rows {
        Some(_) => Some(0),
        None => partition.row_offset.checked_add(partition.row_count),
    };
    if end.is_none_or(|end| end > rg_rows) {
        return Err(format!(
            "row group {rg} has {rg_rows} rows, fewer than the planned partition needs (did the \
             file change since the job was planned?)"
        ));
    }
    if partition.file_row_start.checked_add(rg_rows).is_none() {
        return Err(format!(
            "row group {rg} cannot start at row {}: its rows would be numbered past 2^64",
            partition.file_row_start
        ));
    }
    let rows = if whole || partition.query_rows.is_some() {
        Rows {
            group: rg,
            offset: 0,
            count: rg_rows,
        }
    } else {
        Rows {
            group: rg,
            offset: partition.row_offset,
            count: partition.row_count,
        }
    };
    Ok((roots, rows))
}

/// A Parquet file in an object store, read with range requests (the footer once, then only
/// the column chunks asked for).
pub struct StoreReader {
    store: std::sync::Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
}

impl StoreReader {
    /// A reader of the `size`-byte object at `location`.
    pub fn new(location: &Location, size: u64) -> StoreReader {
        StoreReader {
            store: location.store().clone(),
            path: location.path().clone(),
            size,
        }
    }
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        Box::pin(async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, datafusion::parquet::errors::Result<std::sync::Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            let meta = ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(64 << 10))
                .load_and_finish(self, size)
                .await?;
            Ok(std::sync::Arc::new(meta))
        })
    }
}

async fn open_remote(
    location: Location,
    partition: &Partition,
    columns: &[String],
    whole: bool,
    batch_rows: usize,
) -> std::result::Result<Opened<BatchStream>, String> {
    let size = location.size().await.map_err(|e| e.message)?;
    let mut reader = StoreReader::new(&location, size);
    let meta = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::default())
        .await
        .map_err(|e| format!("is not a readable Parquet file: {e}"))?;
    let (roots, rows) = select(partition, columns, meta.metadata(), meta.schema(), whole)?;
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta);
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let stream = builder
        .with_row_groups(vec![rows.group])
        .with_projection(mask)
        .with_row_selection(selection(&rows))
        .with_batch_size(batch_rows)
        .build()
        .map_err(|e| format!("cannot be read: {e}"))?;
    let schema = stream.schema().clone();
    let stream = stream.map(|r| r.map_err(|e| e.to_string())).boxed();
    Ok((stream, schema, rows.offset))
}

/// Checks that this process can open every file (for `data.source = "auto"`): the first
/// failure, naming the file, or `None`. A local file must be a regular file; no check waits
/// longer than [`READ_TIMEOUT`].
pub fn unreadable(paths: &[String]) -> Option<String> {
    for path in paths {
        let location = match Location::parse(path) {
            Ok(l) => l,
            Err(e) => return Some(e.to_string()),
        };
        let checked = match location.local_path() {
            Some(local) => deadline::blocking(READ_TIMEOUT, move || {
                super::local::check_regular(&local).map_err(|e| e.message)
            }),
            None => block_on_timeout(READ_TIMEOUT, async move {
                location.size().await.map(|_| ()).map_err(|e| e.message)
            }),
        };
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(m)) => return Some(format!("{path}: {m}")),
            Err(e) => return Some(format!("{path}: {}", read_failed(&e))),
        }
    }
    None
}

#[cfg(all(test, unix))]
mod fifo_tests {
    use std::time::Duration;

    use super::*;

    /// A data file swapped for a FIFO after planning is refused when an executor (or the
    /// driver's Flight service) opens it, and by the readability probe, instead of hanging.
    #[test]
    fn a_fifo_is_refused_when_opened_for_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.parquet");
        crate::data::local::tests::mkfifo(&fifo);
        let path = fifo.display().to_string();
        let partition = Partition {
            path: path.clone(),
            row_group: 0,
            row_offset: 0,
            row_count: 10,
            file_row_start: 0,
            query_rows: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let probe = vec![path.clone()];
        std::thread::spawn(move || {
            let opened = PartitionReader::open(&partition, &["x".into()]).map(|_| ());
            let _ = tx.send((opened, unreadable(&probe)));
        });
        // A plain open of a FIFO waits for a writer for ever: fail instead of hanging.
        let (opened, probed) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("opening the FIFO hung");
        let refusal = format!("{path}: is a FIFO (named pipe), not a regular file");
        assert_eq!(opened.unwrap_err().to_string(), refusal);
        assert_eq!(probed, Some(refusal));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;

    use super::*;

    /// Rows of the test file, in row groups of [`GROUP_ROWS`].
    const ROWS: i32 = 25;
    const GROUP_ROWS: usize = 10;

    /// Writes a file of [`ROWS`] rows, `n` (0, 1, …) and `s` (`"r<n>"`), in 3 row groups.
    fn write_file(path: &std::path::Path) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int32, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let n: Vec<i32> = (0..ROWS).collect();
        let s: Vec<String> = n.iter().map(|i| format!("r{i}")).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(n)),
                Arc::new(StringArray::from(s)),
            ],
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(GROUP_ROWS))
            .build();
        let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props))
            .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn chunks_are_sized_in_bytes_within_their_row_and_depth_bounds() {
        // MNIST: 784 pixels and a label, as f32.
        let mnist = 4 * 785;
        assert_eq!(read_batch_rows(mnist), 166);
        assert_eq!(read_ahead_depth(mnist), 64);
        assert_eq!(read_ahead_chunks(mnist), 2 * 65 + 1);
        // Narrow rows stop at READ_BATCH_ROWS; rows wider than a chunk come one at a time,
        // and each decoder holds at least one.
        assert_eq!(read_batch_rows(8), READ_BATCH_ROWS);
        assert_eq!(read_ahead_depth(8), 256);
        assert_eq!(read_batch_rows(u64::MAX), 1);
        assert_eq!(read_ahead_depth(u64::MAX), 1);
        assert_eq!(read_batch_rows(0), READ_BATCH_ROWS);
        // What one decoder holds ready stays within its share of READ_AHEAD_BYTES.
        for row in [8, 100, mnist, 4 * 257, 1 << 20, 1 << 30] {
            let ready = read_ahead_depth(row) as u64 * read_batch_rows(row) as u64 * row;
            let one_chunk = read_batch_rows(row) as u64 * row;
            assert!(
                ready <= (READ_AHEAD_BYTES / 2).max(one_chunk),
                "{row}: {ready}"
            );
        }
    }

    /// Mostly a number that fits the file (so that reads get going), sometimes one at the edge
    /// of `u64`.
    fn edge_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            6 => 0u64..12,
            1 => 0u64..30,
            1 => Just(u64::MAX),
            1 => Just(u64::MAX - 5),
            1 => any::<u64>(),
        ]
    }

    /// Any partition a ticket or a plan could name, read in whole or in part: the rows it
    /// names, numbered from its `file_row_start`, or an error naming the file; never a panic.
    #[test]
    fn fuzz_partition_reader_any_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        write_file(&path);
        let file = path.display().to_string();
        let columns = prop::collection::vec(
            prop::sample::select(vec!["n", "s", "nope", ""]).prop_map(String::from),
            0..3,
        );
        let partition = (
            prop_oneof![0u32..4, any::<u32>()],
            edge_u64(),
            edge_u64(),
            edge_u64(),
        );
        let mut runner = TestRunner::new(ringflow_ml::fuzz::config(1024));
        runner
            .run(
                &(partition, columns, any::<bool>()),
                |((row_group, row_offset, row_count, file_row_start), columns, whole)| {
                    let p = Partition {
                        path: file.clone(),
                        row_group,
                        row_offset,
                        row_count,
                        file_row_start,
                        query_rows: None,
                    };
                    check_read(&p, &columns, whole)
                },
            )
            .unwrap();
    }

    fn check_read(p: &Partition, columns: &[String], whole: bool) -> Result<(), TestCaseError> {
        let opened = if whole {
            PartitionReader::open_row_group(p, columns)
        } else {
            PartitionReader::open(p, columns)
        };
        let mut reader = match opened {
            Ok(r) => r,
            Err(e) => {
                prop_assert_eq!(&e.what, &p.path);
                return Ok(());
            }
        };
        let group_rows = (ROWS as u64 - p.row_group as u64 * GROUP_ROWS as u64).min(10);
        let (first, count) = match whole {
            true => (0, group_rows),
            false => (p.row_offset, p.row_count),
        };
        prop_assert!(p.row_offset.checked_add(p.row_count) <= Some(group_rows));
        let mut expected_row = p.file_row_start + first;
        while let Some((batch, at)) = reader
            .next_batch()
            .map_err(|e| TestCaseError::fail(e.message))?
        {
            prop_assert_eq!(at, expected_row);
            prop_assert_eq!(
                batch.num_columns(),
                columns
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
            );
            if let Some(n) = batch.column_by_name("n") {
                let n = n.as_any().downcast_ref::<Int32Array>().unwrap();
                let group_start = p.row_group as u64 * GROUP_ROWS as u64;
                prop_assert_eq!(n.value(0) as u64, group_start + (at - p.file_row_start));
            }
            expected_row += batch.num_rows() as u64;
        }
        prop_assert_eq!(expected_row - p.file_row_start - first, count);
        Ok(())
    }

    /// Regression (fuzz_partition_reader_any_range): a partition whose `row_offset +
    /// row_count`, or whose `file_row_start` plus its rows, passes 2^64 — which any holder of a
    /// job's secret can put into a Flight ticket — overflowed (a panic in debug builds, a
    /// wrapped range in release ones) instead of being refused.
    #[test]
    fn ranges_past_u64_are_refused_by_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        write_file(&path);
        let file = path.display().to_string();
        for (offset, count, start) in [(u64::MAX, 1, 0), (1, u64::MAX, 0), (0, 10, u64::MAX - 3)] {
            let p = Partition {
                path: file.clone(),
                row_group: 0,
                row_offset: offset,
                row_count: count,
                file_row_start: start,
                query_rows: None,
            };
            for whole in [false, true] {
                let e = check_open(&p, whole);
                assert_eq!(e.what, file);
                assert!(e.message.contains("row group 0"), "{}", e.message);
            }
        }
    }

    fn check_open(p: &Partition, whole: bool) -> DataError {
        let columns = ["n".to_string()];
        let opened = match whole {
            true => PartitionReader::open_row_group(p, &columns),
            false => PartitionReader::open(p, &columns),
        };
        opened.err().expect("the partition was opened")
    }
}
