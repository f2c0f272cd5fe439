//! Parquet footers: row groups, row counts and schemas, without reading any rows; and the
//! checks of a schema against the spec's features, label and model.

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::statistics::Statistics;
use ringflow_core::data::deadline::{self, READ_TIMEOUT, block_on_timeout, read_failed};
use ringflow_core::data::local::open_regular;
use ringflow_core::data::partition::StoreReader;
use ringflow_core::data::{Location, is_string};
use ringflow_core::spec::{DataSpec, JobSpec};
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{ModelShape, SequenceOutput};

use super::schema_error::{FactError, FooterError, NotNumeric, SchemaError};
use super::split::{LabelType, RowGroup, Split};
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

fn is_number(t: &DataType) -> bool {
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

/// Values per row the feature columns of `schema` give: `Some(n)` when every column's width is
/// fixed, `None` when a list column's is known only when rows are read.
fn features_width(
    schema: &Schema,
    features: &[String],
    have: impl Fn() -> String,
) -> std::result::Result<Option<usize>, SchemaError> {
    let mut width = Some(0);
    for name in features {
        let field = schema
            .field_with_name(name)
            .map_err(|_| no_column(name, "data.features", have()))?;
        let w = feature_width(field.data_type()).map_err(|source| SchemaError::Feature {
            column: name.clone(),
            source,
        })?;
        width = width.zip(w).map(|(a, b)| a + b);
    }
    Ok(width)
}

/// Checks that `schema` has the image column `column` (`data.image.column`) and that it holds
/// bytes.
fn check_image_column(
    schema: &Schema,
    column: &str,
    have: impl Fn() -> String,
) -> std::result::Result<(), SchemaError> {
    let field = schema
        .field_with_name(column)
        .map_err(|_| no_column(column, "data.image.column", have()))?;
    match field.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Ok(()),
        t => Err(SchemaError::NotImageBytes {
            column: column.to_string(),
            ty: t.to_string(),
        }),
    }
}

/// The error for the column `column` (named by the setting `key`) missing from a schema with
/// the columns `have`.
fn no_column(column: &str, key: &'static str, have: String) -> SchemaError {
    SchemaError::NoColumn {
        column: column.to_string(),
        key,
        have,
    }
}

/// Checks the values per row (`width`, `None` when known only as rows are read) against
/// `data.shape` and the model: the shape's product must be the width, and the model must take
/// examples of that many values, in that shape when it takes more than a flat vector.
fn check_example_shape(
    width: Option<usize>,
    data: &DataSpec,
    model: &ModelShape,
) -> std::result::Result<(), SchemaError> {
    let inputs = model.input_width();
    let Some(example) = data.example_shape() else {
        return match width {
            Some(width) if width != inputs => Err(SchemaError::WidthNotInputs { width, inputs }),
            _ => Ok(()),
        };
    };
    let values: usize = example.iter().product();
    let key = if data.image.is_some() {
        "data.image"
    } else {
        "data.shape"
    };
    if let Some(width) = width
        && width != values
    {
        return Err(SchemaError::ShapeNotWidth {
            example,
            values,
            width,
        });
    }
    if values != inputs {
        return Err(SchemaError::ShapeNotInputs {
            key,
            example,
            values,
            inputs,
        });
    }
    if model.input.len() > 1 && model.input != example {
        return Err(SchemaError::ShapeNotModel {
            key,
            example,
            input: model.input.clone(),
        });
    }
    Ok(())
}

/// Checks `schema` (a file's, or the output of `data.sql`; `what` names it in errors) for the
/// feature and label columns of the spec, against the model. With `label_required = false` a
/// missing label column is allowed (prediction).
pub fn check_schema(
    what: &str,
    schema: &Schema,
    spec: &JobSpec,
    model: &ModelShape,
    label_required: bool,
) -> Result<LabelType> {
    if let Some(output) = model.sequence {
        let per_step = output == SequenceOutput::PerStep;
        return super::sequences::check_schema(what, schema, spec, per_step, label_required);
    }
    check_columns(schema, spec, model, label_required).map_err(|source| DriverError::Schema {
        what: what.to_string(),
        source,
    })
}

/// [`check_schema`] of a schema that does not hold a token sequence.
fn check_columns(
    schema: &Schema,
    spec: &JobSpec,
    model: &ModelShape,
    label_required: bool,
) -> std::result::Result<LabelType, SchemaError> {
    let data = &spec.data;
    let have = || -> String {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        names.join(", ")
    };
    let width = match &data.image {
        Some(image) => {
            check_image_column(schema, &image.column, have)?;
            // Saturating: a saved model's spec (eval, predict) was not checked on loading.
            Some(
                image
                    .channels
                    .saturating_mul(image.size[0])
                    .saturating_mul(image.size[1]),
            )
        }
        None => features_width(schema, &data.features, have)?,
    };
    check_example_shape(width, data, model)?;
    let label = match schema.field_with_name(&data.label) {
        Ok(f) => f,
        Err(_) if !label_required => return Ok(LabelType::Absent),
        Err(_) => return Err(no_column(&data.label, "data.label", have())),
    };
    let t = label.data_type();
    if is_number(t) {
        return Ok(LabelType::Number);
    }
    let column = data.label.clone();
    if !is_string(t) {
        let ty = t.to_string();
        return Err(SchemaError::NotALabel { column, ty });
    }
    if spec.train.loss != LossKind::CrossEntropy {
        return Err(SchemaError::NamesNeedCrossEntropy { column });
    }
    Ok(LabelType::String)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::Field;
    use ringflow_core::spec::JobSpec;

    use super::*;

    /// A file with a PNG column, a fixed list of 784 bytes, a variable list and a label.
    fn schema() -> Schema {
        let item = |t: DataType| Arc::new(Field::new_list_field(t, false));
        Schema::new(vec![
            Field::new("png", DataType::Binary, false),
            Field::new("name", DataType::Utf8, false),
            Field::new(
                "pixels",
                DataType::FixedSizeList(item(DataType::UInt8), 784),
                false,
            ),
            Field::new("v", DataType::List(item(DataType::Float32)), false),
            Field::new("label", DataType::Int64, false),
        ])
    }

    /// Checks `schema()` against a spec with `data` lines, for `model`.
    fn check(data: &str, model: ModelShape) -> Result<LabelType> {
        let text =
            format!("[data]\ntrain = \"t\"\nlabel = \"label\"\n{data}\n[model]\nkind = \"mlp\"\n");
        let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
        check_schema("data.train: f.parquet", &schema(), &spec, &model, true)
    }

    fn image(input: Vec<usize>) -> ModelShape {
        ModelShape {
            input,
            outputs: 10,
            sequence: None,
        }
    }

    #[test]
    fn image_columns_must_hold_bytes_and_fit_the_model() {
        let png = "image = { column = \"png\", size = [28, 28], channels = 1 }";
        assert_eq!(
            check(png, ModelShape::flat(784, 10)).unwrap(),
            LabelType::Number
        );
        assert_eq!(
            check(png, image(vec![1, 28, 28])).unwrap(),
            LabelType::Number
        );
        let msg = check(
            &png.replace("\"png\"", "\"name\""),
            ModelShape::flat(784, 10),
        );
        assert_eq!(
            msg.unwrap_err().to_string(),
            "data.train: f.parquet: column `name` (data.image.column) has type Utf8; an image \
             column must be binary (the bytes of PNG or JPEG files)"
        );
        let msg = check(
            &png.replace("\"png\"", "\"jpg\""),
            ModelShape::flat(784, 10),
        );
        assert!(msg.unwrap_err().to_string().contains(
            "has no column `jpg` (data.image.column); its columns: png, name, pixels, v, \
                 label"
        ));
        let msg = check(png, ModelShape::flat(100, 10))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "data.image gives examples of shape [1, 28, 28] (784 values), but the model \
                 takes 100 inputs"
            ),
            "{msg}"
        );
        let msg = check(png, image(vec![28, 28, 1])).unwrap_err().to_string();
        assert!(
            msg.contains(
                "data.image gives examples of shape [1, 28, 28], but the model takes examples \
                 of shape [28, 28, 1]"
            ),
            "{msg}"
        );
    }

    #[test]
    fn a_shape_must_match_the_fixed_width_and_the_model() {
        let fixed = "features = [\"pixels\"]\nshape = [1, 28, 28]";
        assert_eq!(
            check(fixed, ModelShape::flat(784, 10)).unwrap(),
            LabelType::Number
        );
        assert_eq!(
            check(fixed, image(vec![1, 28, 28])).unwrap(),
            LabelType::Number
        );
        let msg = check(&fixed.replace("28]", "27]"), image(vec![1, 28, 27]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "data.shape [1, 28, 27] needs 756 values per row, but data.features give 784"
            ),
            "{msg}"
        );
        let msg = check(fixed, ModelShape::flat(100, 10))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "data.shape gives examples of shape [1, 28, 28] (784 values), but the \
                          model takes 100 inputs"
            ),
            "{msg}"
        );
        // A variable list's width is checked by executors as they read; the model still is.
        let listed = "features = [\"v\"]\nshape = [2, 3]";
        assert_eq!(check(listed, image(vec![2, 3])).unwrap(), LabelType::Number);
        let msg = check(listed, image(vec![3, 2])).unwrap_err().to_string();
        assert!(
            msg.contains("but the model takes examples of shape [3, 2]"),
            "{msg}"
        );
        // Without a shape, as before.
        let msg = check("features = [\"pixels\"]", ModelShape::flat(100, 10))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("data.features give 784 values per row, but the model takes 100 inputs"),
            "{msg}"
        );
    }
}
