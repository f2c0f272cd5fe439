//! An executor's partitions, read in order and prepared: from the row-group cache or from
//! storage (or the driver), then through `data.sql` when the job has one. Training, whole-data
//! statistics, evaluation and prediction all consume partitions through [`ReadContext`].
//!
//! A column of encoded images (`data.image`) is decoded here: as a row group is read, before
//! it goes into the cache (so later epochs find pixels), or, with `data.sql`, in the query's
//! output (the cache then holds the query's input, and images are decoded every epoch).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use datafusion::arrow::record_batch::RecordBatch;
use ringflow_core::pb::Partition;

use crate::data::cache::{RowGroupCache, slice_rows};
use crate::data::error::QueryError;
use crate::data::images::ImageColumn;
use crate::data::prep::SqlPrep;
use crate::data::source::DriverSource;
use crate::error::{ExecutorError, Result};
use ringflow_core::data::partition::PartitionReader;

/// Everything needed to turn partitions into prepared record batches.
#[derive(Clone, Debug)]
pub struct ReadContext {
    /// The Parquet columns to read: the query's input columns, or the features and label.
    pub columns: Vec<String>,
    /// The job's SQL prep.
    pub prep: Option<Arc<SqlPrep>>,
    /// Decoded row groups kept between epochs.
    pub cache: Arc<RowGroupCache>,
    /// Set when partitions come from the driver instead of storage.
    pub driver: Option<Arc<DriverSource>>,
    /// The column of encoded images to decode (`data.image`).
    pub images: Option<Arc<ImageColumn>>,
    /// Rows per record batch read from storage ([`read_batch_rows`] of the converted row;
    /// [`READ_BATCH_ROWS`] where no conversion sizes it).
    ///
    /// [`read_batch_rows`]: ringflow_core::data::partition::read_batch_rows
    /// [`READ_BATCH_ROWS`]: ringflow_core::data::partition::READ_BATCH_ROWS
    pub batch_rows: usize,
    /// Whether partitions of local files may be read straight from their pages (see
    /// [`ReadContext::direct_path`]); off, everything goes through Arrow.
    pub direct: bool,
}

/// Where a prepared batch came from, for error messages: a file and the row number of the
/// batch's first row within it, or (after `data.sql`) within the query's output.
pub struct Origin<'a> {
    /// The file and, after SQL, the row group and the words "after data.sql".
    pub file: &'a str,
    /// Row number of the batch's first row.
    pub first_row: u64,
}

impl ReadContext {
    /// Calls `f` with every prepared batch of `partitions`, in order, until it returns false,
    /// `stop` is set, or reading fails.
    pub fn for_each_batch(
        &self,
        partitions: &[Partition],
        stop: &AtomicBool,
        mut f: impl FnMut(&RecordBatch, Origin<'_>) -> Result<bool>,
    ) -> Result<()> {
        for p in partitions {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if !self.partition(p, stop, &mut f)? {
                return Ok(());
            }
        }
        Ok(())
    }

    fn partition(
        &self,
        p: &Partition,
        stop: &AtomicBool,
        f: &mut impl FnMut(&RecordBatch, Origin<'_>) -> Result<bool>,
    ) -> Result<bool> {
        // Hands a batch on unless stopped; false ends the reading.
        let mut emit = |batch: &RecordBatch, file: &str, first_row: u64| -> Result<bool> {
            Ok(!stop.load(Ordering::Relaxed) && f(batch, Origin { file, first_row })?)
        };
        // From the cache, or into it while there is room, or straight from the source.
        let group = match self.cache.get(&p.path, p.row_group) {
            Some(g) => Some(g),
            None if self.cache.accepting() => {
                let batches = self.read_all(p)?;
                Some(self.cache.insert(&p.path, p.row_group, batches))
            }
            None => None,
        };
        if let Some(prep) = &self.prep {
            // The query runs over the file's rows of `p`, or, where `p` is a range of its
            // output, over the whole row group.
            let input = match &group {
                Some(g) => {
                    let slices: Vec<RecordBatch> = match p.query_rows {
                        Some(_) => g.to_vec(),
                        None => slice_rows(g, p.row_offset, p.row_count)
                            .into_iter()
                            .map(|(b, _)| b)
                            .collect(),
                    };
                    let Some(schema) = slices.first().map(RecordBatch::schema) else {
                        return Ok(true);
                    };
                    ringflow_core::data::sql::memory_stream(schema, slices)
                }
                None => self.open(p, p.query_rows.is_some())?.into_stream(),
            };
            return self.prepared(prep, p, input, &mut emit);
        }
        if let Some(group) = group {
            for (batch, at) in slice_rows(&group, p.row_offset, p.row_count) {
                if !emit(&batch, &p.path, p.file_row_start + at)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        let mut reader = self.open(p, false)?;
        while let Some((batch, first_row)) = next(&mut reader)? {
            let batch = self.decoded(batch, &p.path, first_row)?;
            if !emit(&batch, &p.path, first_row)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Hands on the rows of `p` that `data.sql` yields over `input`: all of them, or, where
    /// `p` is a range of the query's output over its whole row group ([`Partition::query_rows`]),
    /// that range, after checking that the query yields the rows the driver counted.
    fn prepared(
        &self,
        prep: &SqlPrep,
        p: &Partition,
        input: datafusion::execution::SendableRecordBatchStream,
        emit: &mut impl FnMut(&RecordBatch, &str, u64) -> Result<bool>,
    ) -> Result<bool> {
        let site = format!("{} (row group {}, after data.sql)", p.path, p.row_group);
        let range = OutputRange::of(p);
        let mut prepared = prep.run(input)?;
        let mut row = 0u64;
        while let Some(batch) = prepared
            .next_batch()
            .map_err(|source| ExecutorError::Query {
                site: site.clone(),
                source,
            })?
        {
            let first_row = row;
            row += batch.num_rows() as u64;
            let Some(batch) = range.take(batch, first_row) else {
                continue;
            };
            let first_row = first_row.max(range.start);
            let batch = self.decoded(batch, &site, first_row)?;
            if !emit(&batch, &site, first_row)? {
                return Ok(false);
            }
        }
        range
            .check(row)
            .map_err(|source| ExecutorError::Query { site, source })?;
        Ok(true)
    }

    /// The local file of `p` when its rows may be read straight from the file's pages
    /// ([`DirectReader`](crate::data::features::DirectReader)): no `data.sql`, no images, not
    /// from the driver, and not already in the row-group cache.
    ///
    /// Such rows are decoded again every epoch rather than cached: decoding their pages
    /// straight into the batch costs little more than converting cached Arrow columns, so
    /// epoch 1 runs about as fast as the later ones and the cache is left to the data that
    /// needs Arrow (SQL, images, irregular row groups, remote files).
    pub fn direct_path(&self, p: &Partition) -> Option<std::path::PathBuf> {
        if !self.direct || self.prep.is_some() || self.images.is_some() || self.driver.is_some() {
            return None;
        }
        if self.cache.get(&p.path, p.row_group).is_some() {
            return None;
        }
        ringflow_core::data::Location::parse(&p.path)
            .ok()?
            .local_path()
    }

    fn open(&self, p: &Partition, whole: bool) -> Result<PartitionReader> {
        let opened = match &self.driver {
            Some(d) => return d.open(p, &self.columns, whole),
            None => PartitionReader::open_rows(p, &self.columns, whole, self.batch_rows),
        };
        opened.map_err(|e| ExecutorError::data(e.what, e.message))
    }

    /// The whole row group of `p`, for the cache: with its images decoded, unless `data.sql`
    /// reads them.
    fn read_all(&self, p: &Partition) -> Result<Vec<RecordBatch>> {
        let mut reader = self.open(p, true)?;
        let mut out = Vec::new();
        while let Some((batch, first_row)) = next(&mut reader)? {
            out.push(match self.prep {
                None => self.decoded(batch, &p.path, first_row)?,
                Some(_) => batch,
            });
        }
        Ok(out)
    }

    /// `batch` (from `file`, first row `first_row`) with its images decoded, when the job has
    /// an image column.
    fn decoded(&self, batch: RecordBatch, file: &str, first_row: u64) -> Result<RecordBatch> {
        match &self.images {
            Some(images) => images.decode_batch(&batch, file, first_row),
            None => Ok(batch),
        }
    }
}

fn next(reader: &mut PartitionReader) -> Result<Option<(RecordBatch, u64)>> {
    reader
        .next_batch()
        .map_err(|e| ExecutorError::data(e.what, e.message))
}

/// The rows of a query's output a partition takes: all, or `[start, end)` of the output over
/// the whole row group, which must hold `counted` rows.
struct OutputRange {
    start: u64,
    end: u64,
    counted: Option<u64>,
}

impl OutputRange {
    fn of(p: &Partition) -> OutputRange {
        match p.query_rows {
            Some(counted) => OutputRange {
                start: p.row_offset,
                end: p.row_offset.saturating_add(p.row_count),
                counted: Some(counted),
            },
            None => OutputRange {
                start: 0,
                end: u64::MAX,
                counted: None,
            },
        }
    }

    /// The part of `batch` (output rows from `first_row` on) inside the range, if any.
    fn take(&self, batch: RecordBatch, first_row: u64) -> Option<RecordBatch> {
        let rows = batch.num_rows() as u64;
        let from = self.start.max(first_row);
        let to = self.end.min(first_row + rows);
        if from >= to {
            return None;
        }
        if from == first_row && to == first_row + rows {
            return Some(batch);
        }
        Some(batch.slice((from - first_row) as usize, (to - from) as usize))
    }

    /// Fails unless the query yielded the `rows` the driver counted.
    fn check(&self, rows: u64) -> std::result::Result<(), QueryError> {
        match self.counted {
            Some(counted) if counted != rows => Err(QueryError::NotAsCounted { rows, counted }),
            _ => Ok(()),
        }
    }
}
