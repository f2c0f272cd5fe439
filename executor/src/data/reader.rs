//! Reading one partition of a Parquet file as Arrow record batches.

use std::fs::File;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchReader};
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use ringflow_proto::pb::Partition;

use crate::error::{ExecutorError, Result};

/// Rows decoded per record batch.
const READ_BATCH_ROWS: usize = 4096;

/// The record batches of one partition, restricted to `columns` (in file order).
pub struct PartitionReader {
    inner: ParquetRecordBatchReader,
    partition: Partition,
    schema: SchemaRef,
    next_row: u64,
}

impl PartitionReader {
    /// Opens `partition`, reading only the named top-level columns; a missing column is an
    /// error that lists the file's columns.
    pub fn open(partition: &Partition, columns: &[String]) -> Result<PartitionReader> {
        Self::open_rows(partition, columns, false)
    }

    /// Opens the whole row group that `partition` lies in (for caching it).
    pub fn open_row_group(partition: &Partition, columns: &[String]) -> Result<PartitionReader> {
        Self::open_rows(partition, columns, true)
    }

    fn open_rows(
        partition: &Partition,
        columns: &[String],
        whole: bool,
    ) -> Result<PartitionReader> {
        let path = &partition.path;
        let fail = |m: String| ExecutorError::data(path.clone(), m);
        let file = File::open(path).map_err(|e| fail(format!("cannot be opened: {e}")))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| fail(format!("is not a readable Parquet file: {e}")))?;
        let arrow_schema = builder.schema().clone();
        let mut roots = Vec::with_capacity(columns.len());
        for c in columns {
            let idx = arrow_schema.index_of(c).map_err(|_| {
                let have: Vec<&str> = arrow_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect();
                fail(format!(
                    "has no column `{c}` (its columns: {})",
                    have.join(", ")
                ))
            })?;
            roots.push(idx);
        }
        let meta = builder.metadata().clone();
        let rg = partition.row_group as usize;
        if rg >= meta.num_row_groups() {
            return Err(fail(format!(
                "has {} row groups; row group {rg} does not exist (did the file change since \
                 the job was planned?)",
                meta.num_row_groups()
            )));
        }
        let rg_rows = meta.row_group(rg).num_rows() as u64;
        if partition.row_offset + partition.row_count > rg_rows {
            return Err(fail(format!(
                "row group {rg} has {rg_rows} rows, fewer than the planned partition needs \
                 (did the file change since the job was planned?)"
            )));
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let (offset, count) = if whole {
            (0, rg_rows)
        } else {
            (partition.row_offset, partition.row_count)
        };
        let selection = RowSelection::from(vec![
            RowSelector::skip(offset as usize),
            RowSelector::select(count as usize),
        ]);
        let inner = builder
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .with_row_selection(selection)
            .with_batch_size(READ_BATCH_ROWS)
            .build()
            .map_err(|e| fail(format!("cannot be read: {e}")))?;
        let schema = inner.schema();
        Ok(PartitionReader {
            inner,
            partition: partition.clone(),
            schema,
            next_row: partition.file_row_start + offset,
        })
    }

    /// The schema of the batches (the projected columns).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The next batch and the file row number of its first row.
    pub fn next_batch(&mut self) -> Result<Option<(RecordBatch, u64)>> {
        match self.inner.next() {
            None => Ok(None),
            Some(Err(e)) => Err(ExecutorError::data(
                self.partition.path.clone(),
                format!("cannot decode row group {}: {e}", self.partition.row_group),
            )),
            Some(Ok(batch)) => {
                let first = self.next_row;
                self.next_row += batch.num_rows() as u64;
                Ok(Some((batch, first)))
            }
        }
    }
}
