//! What of a Parquet file a partition reads: its root columns and the rows of its row group,
//! checked against the file's footer, wherever the file lives.

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::parquet::file::metadata::ParquetMetaData;

use super::error::SelectError;
use crate::pb::Partition;

/// What an open found: the reader, the schema of its batches and the first row it reads within
/// the row group.
pub(super) type Opened<R> = (R, SchemaRef, u64);

/// What to read of a row group: its index, the first row and the number of rows.
pub(super) struct Rows {
    pub(super) group: usize,
    pub(super) offset: u64,
    pub(super) count: u64,
}

/// The row selection that reads `rows` of their row group.
pub(super) fn selection(rows: &Rows) -> RowSelection {
    RowSelection::from(vec![
        RowSelector::skip(rows.offset as usize),
        RowSelector::select(rows.count as usize),
    ])
}

/// The root columns to read and the rows of the row group (all of them with `whole`), checked
/// against the footer.
pub(super) fn select(
    partition: &Partition,
    columns: &[String],
    meta: &ParquetMetaData,
    arrow_schema: &SchemaRef,
    whole: bool,
) -> Result<(Vec<usize>, Rows), SelectError> {
    let mut roots = Vec::with_capacity(columns.len());
    for c in columns {
        let idx = arrow_schema
            .index_of(c)
            .map_err(|_| SelectError::NoColumn {
                column: c.clone(),
                have: column_names(arrow_schema),
            })?;
        roots.push(idx);
    }
    let rg = partition.row_group as usize;
    if rg >= meta.num_row_groups() {
        return Err(SelectError::NoRowGroup {
            groups: meta.num_row_groups(),
            group: rg,
        });
    }
    let rg_rows = meta.row_group(rg).num_rows() as u64;
    // A range of `data.sql`'s output is checked against the output, by whoever runs the query.
    let end = match partition.query_rows {
        Some(_) => Some(0),
        None => partition.row_offset.checked_add(partition.row_count),
    };
    if end.is_none_or(|end| end > rg_rows) {
        return Err(SelectError::TooFewRows {
            group: rg,
            rows: rg_rows,
        });
    }
    if partition.file_row_start.checked_add(rg_rows).is_none() {
        return Err(SelectError::PastU64 {
            group: rg,
            start: partition.file_row_start,
        });
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

/// The schema's column names, comma-separated.
fn column_names(schema: &SchemaRef) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.join(", ")
}
