//! The vocabulary of a planned split, shared by the planner's passes (footers, sequence
//! statistics, row counting, assignment) and the memory estimate: its row groups, each file's
//! schema and footer, and what its label holds. A leaf: it imports no other planner file.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet::file::metadata::ParquetMetaData;
use ringflow_core::pb::Partition;

/// One row group of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowGroup {
    /// The file.
    pub path: String,
    /// Index of the row group in the file.
    pub index: u32,
    /// Rows in the row group: the file's, or, where `after_sql`, the rows `data.sql` yields
    /// over the whole row group.
    pub rows: u64,
    /// File row number of its first row.
    pub file_row_start: u64,
    /// Its size uncompressed, all columns (what decoding it takes, about).
    pub bytes: u64,
    /// Whether `rows` counts the rows `data.sql` yields over the whole row group (a query that
    /// may drop or multiply rows, counted when the job was planned) rather than the file's.
    pub after_sql: bool,
}

/// The row groups of a split and each file's Arrow schema and footer.
#[derive(Clone, Debug, Default)]
pub struct Split {
    /// Row groups in file order.
    pub groups: Vec<RowGroup>,
    /// Each file with its schema.
    pub schemas: Vec<(String, SchemaRef)>,
    /// Each file's footer (row-group and column statistics), in the order of `schemas`.
    pub footers: Vec<Arc<ParquetMetaData>>,
}

impl RowGroup {
    /// The whole row group as a partition of its file's rows (no query applied): what a pass
    /// over the file's own rows reads, before `data.sql` counted anything.
    pub fn file_rows(&self) -> Partition {
        Partition {
            path: self.path.clone(),
            row_group: self.index,
            row_offset: 0,
            row_count: self.rows,
            file_row_start: self.file_row_start,
            query_rows: None,
        }
    }
}

/// What a schema's label column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelType {
    /// Numbers.
    Number,
    /// Strings (class names).
    String,
    /// No label column (prediction).
    Absent,
}
