//! Parquet footers: row groups, row counts and schemas, without reading any rows.

use std::fs::File;
use std::path::PathBuf;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use ringflow_ml::nn::ModelShape;
use ringflow_proto::spec::DataSpec;

use crate::error::{DriverError, Result};

/// One row group of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowGroup {
    /// The file.
    pub path: String,
    /// Index of the row group in the file.
    pub index: u32,
    /// Rows in the row group.
    pub rows: u64,
    /// File row number of its first row.
    pub file_row_start: u64,
}

/// The row groups of a split and each file's Arrow schema.
#[derive(Clone, Debug, Default)]
pub struct Split {
    /// Row groups in file order.
    pub groups: Vec<RowGroup>,
    /// Each file with its schema.
    pub schemas: Vec<(String, SchemaRef)>,
}

/// Reads the footer of every file of the split `key`.
pub fn read_footers(key: &str, files: &[PathBuf]) -> Result<Split> {
    let mut split = Split::default();
    for path in files {
        let name = path.display().to_string();
        let fail = |m: String| DriverError::Data(format!("{key}: {name} {m}"));
        let file = File::open(path).map_err(|e| fail(format!("cannot be opened: {e}")))?;
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::default())
            .map_err(|e| fail(format!("is not a readable Parquet file: {e}")))?;
        let mut start = 0u64;
        for (i, rg) in meta.metadata().row_groups().iter().enumerate() {
            let rows = rg.num_rows() as u64;
            if rows > 0 {
                split.groups.push(RowGroup {
                    path: name.clone(),
                    index: i as u32,
                    rows,
                    file_row_start: start,
                });
            }
            start += rows;
        }
        split.schemas.push((name, meta.schema().clone()));
    }
    Ok(split)
}

fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

/// Values per row that a feature column of type `t` gives: `Some(n)` when fixed, `None` for
/// variable-length lists (checked by executors as they read), an error when not numeric.
fn feature_width(t: &DataType) -> std::result::Result<Option<usize>, String> {
    match t {
        t if is_number(t) => Ok(Some(1)),
        DataType::FixedSizeList(f, n) if is_number(f.data_type()) => Ok(Some(*n as usize)),
        DataType::List(f) | DataType::LargeList(f) if is_number(f.data_type()) => Ok(None),
        t => Err(format!(
            "has type {t}; a feature must be a number or a list of numbers"
        )),
    }
}

/// Checks every file's feature and label columns against the spec and the model.
pub fn check_columns(key: &str, split: &Split, data: &DataSpec, model: ModelShape) -> Result<()> {
    for (file, schema) in &split.schemas {
        let fail = |m: String| DriverError::Data(format!("{key}: {file}: {m}"));
        let column = |name: &str, role: &str| {
            schema.field_with_name(name).map_err(|_| {
                let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                fail(format!(
                    "has no column `{name}` ({role}); its columns: {}",
                    have.join(", ")
                ))
            })
        };
        let mut width = Some(0);
        for name in &data.features {
            let field = column(name, "data.features")?;
            let w = feature_width(field.data_type())
                .map_err(|m| fail(format!("column `{name}` {m}")))?;
            width = width.zip(w).map(|(a, b)| a + b);
        }
        let label = column(&data.label, "data.label")?;
        if !is_number(label.data_type()) {
            return Err(fail(format!(
                "column `{}` (data.label) has type {}; a label must be a number",
                data.label,
                label.data_type()
            )));
        }
        if let Some(w) = width
            && w != model.inputs
        {
            return Err(fail(format!(
                "data.features give {w} values per row, but the model takes {} inputs",
                model.inputs
            )));
        }
    }
    Ok(())
}
