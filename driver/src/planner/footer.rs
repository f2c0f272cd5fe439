//! Parquet footers: row groups, row counts and schemas, without reading any rows; and what a
//! column's type and statistics tell (its width as a feature, its largest value). The checks
//! of a schema against the spec and the model are each data kind's, in [`kinds`].
//!
//! [`kinds`]: crate::planner::kinds

use datafusion::arrow::datatypes::DataType;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::statistics::Statistics;
use ringflow_core::data::Location;
use ringflow_core::data::deadline::{self, READ_TIMEOUT, block_on_timeout, read_failed};
use ringflow_core::data::local::open_regular;
use ringflow_core::data::partition::StoreReader;

use super::schema_error::{FactError, FooterError, NotNumeric};
use super::split::{RowGroup, Split};
use crate::error::{DriverError, Result};

/// Reads the footer of every file of the split `key`.
pub fn read_footers(key: &str, files: &[String]) -> Result<Split> {
    let mut split = Split::default();
    for name in files {
        let meta = read_metadata(name).map_err(|why| DriverError::Footer {
            key: key.to_string(),
            file: name.clone(),
            why,
        })?;
        let mut start = 0u64;
        for (i, rg) in meta.metadata().row_groups().iter().enumerate() {
            let rows = rg.num_rows() as u64;
            if rows > 0 {
                split.groups.push(RowGroup {
                    path: name.clone(),
                    index: i as u32,
                    rows,
                    file_row_start: start,
                    bytes: u64::try_from(rg.total_byte_size()).unwrap_or(0),
                    after_sql: false,
                });
            }
            start += rows;
        }
        split.schemas.push((name.clone(), meta.schema().clone()));
        split.footers.push(meta.metadata().clone());
    }
    Ok(split)
}

/// Reads the footer of the file `name`. A local file is opened only if it is a regular file;
/// no footer read waits longer than the read deadline.
fn read_metadata(name: &str) -> std::result::Result<ArrowReaderMetadata, FooterError> {
    let location = Location::parse(name).map_err(|e| FooterError::Store(e.message))?;
    let not_parquet = |e: ParquetError| FooterError::NotParquet(e.to_string());
    match location.local_path() {
        Some(path) => deadline::blocking(READ_TIMEOUT, move || {
            let file = open_regular(&path)?;
            ArrowReaderMetadata::load(&file, ArrowReaderOptions::default()).map_err(not_parquet)
        }),
        None => block_on_timeout(READ_TIMEOUT, async move {
            let size = location
                .size()
                .await
                .map_err(|e| FooterError::Store(e.message))?;
            let mut reader = StoreReader::new(&location, size);
            ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::default())
                .await
                .map_err(not_parquet)
        }),
    }
    .map_err(|e| FooterError::Deadline(read_failed(&e)))?
}

/// Bytes of `split`'s Parquet files that reading `columns` fetches: the compressed column
/// chunks of those top-level columns in every row group.
pub fn column_bytes(split: &Split, columns: &[String]) -> u64 {
    split
        .footers
        .iter()
        .flat_map(|f| f.row_groups())
        .flat_map(|rg| rg.columns())
        .filter(|c| {
            c.column_path()
                .parts()
                .first()
                .is_some_and(|root| columns.contains(root))
        })
        .map(|c| u64::try_from(c.compressed_size()).unwrap_or(0))
        .sum()
}

/// The largest value of the number column `column` over every row group of `split`, from the
/// footers' statistics: `Ok(None)` for a split without rows, an error sentence (naming the
/// file) when a row group has no statistics for it or a value is not a whole number ≥ 0.
pub fn column_max(split: &Split, column: &str) -> std::result::Result<Option<u64>, FactError> {
    let mut max: Option<u64> = None;
    for ((file, _), footer) in split.schemas.iter().zip(&split.footers) {
        for rg in footer.row_groups().iter().filter(|rg| rg.num_rows() > 0) {
            let chunk = rg
                .columns()
                .iter()
                .find(|c| c.column_path().parts() == [column]);
            let value = chunk
                .and_then(|c| c.statistics())
                .and_then(statistics_max)
                .ok_or_else(|| FactError::NoStatistics {
                    file: file.clone(),
                    column: column.to_string(),
                })?;
            let whole = (value >= 0.0 && value.fract() == 0.0 && value < 2f64.powi(53))
                .then_some(value as u64)
                .ok_or_else(|| FactError::NotClassIndex {
                    column: column.to_string(),
                    file: file.clone(),
                    value,
                })?;
            max = Some(max.map_or(whole, |m| m.max(whole)));
        }
    }
    Ok(max)
}

/// The largest value a column chunk's statistics record, as a number.
fn statistics_max(s: &Statistics) -> Option<f64> {
    match s {
        Statistics::Int32(v) => v.max_opt().map(|&x| f64::from(x)),
        Statistics::Int64(v) => v.max_opt().map(|&x| x as f64),
        Statistics::Float(v) => v.max_opt().map(|&x| f64::from(x)),
        Statistics::Double(v) => v.max_opt().copied(),
        _ => None,
    }
}

/// Whether `t` is a number type (an integer or a float).
pub(crate) fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

/// Values per row that a feature column of type `t` gives: `Some(n)` when fixed, `None` for
/// variable-length lists (checked by executors as they read), an error when not numeric.
pub fn feature_width(t: &DataType) -> std::result::Result<Option<usize>, NotNumeric> {
    match t {
        t if is_number(t) => Ok(Some(1)),
        DataType::FixedSizeList(f, n) if is_number(f.data_type()) => Ok(Some(*n as usize)),
        DataType::List(f) | DataType::LargeList(f) if is_number(f.data_type()) => Ok(None),
        t => Err(NotNumeric { ty: t.to_string() }),
    }
}
