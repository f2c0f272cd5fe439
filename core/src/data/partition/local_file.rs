//! Opening a partition of a local Parquet file: a regular file, opened without blocking, whose
//! footer is read and whose batches are then decoded one by one (on the reader's own thread).

use std::path::Path;

use datafusion::arrow::record_batch::RecordBatchReader;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};

use super::super::local::open_regular;
use super::error::OpenError;
use super::select::{Opened, select, selection};
use crate::pb::Partition;

/// Opens a partition of the local Parquet file at `path` (a regular file, opened without
/// blocking), reading its footer, in batches of `batch_rows` rows.
pub(super) fn open_local(
    path: &Path,
    partition: &Partition,
    columns: &[String],
    whole: bool,
    batch_rows: usize,
) -> Result<Opened<ParquetRecordBatchReader>, OpenError> {
    let file = open_regular(path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(OpenError::NotParquet)?;
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
        .map_err(OpenError::NoReader)?;
    let schema = reader.schema();
    Ok((reader, schema, rows.offset))
}
