//! The schema checks the kinds of fixed-width rows share ([`features`](super::features) and
//! [`images`](super::images)): the example shape against the model, the label column, and the
//! error for a missing column.

use datafusion::arrow::datatypes::Schema;
use ringflow_core::data::is_string;
use ringflow_core::spec::JobSpec;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::ModelShape;

use crate::planner::footer::is_number;
use crate::planner::schema_error::SchemaError;
use crate::planner::split::LabelType;

/// The columns of `schema`, for the error naming a column it lacks.
pub(super) fn names(schema: &Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.join(", ")
}

/// The error for the column `column` (named by the setting `key`) missing from `schema`.
pub(super) fn no_column(column: &str, key: &'static str, schema: &Schema) -> SchemaError {
    SchemaError::NoColumn {
        column: column.to_string(),
        key,
        have: names(schema),
    }
}

/// Checks the values per row (`width`, `None` when known only as rows are read) against the
/// examples' shape (`example`, declared by the setting `key`) and the model: the shape's
/// product must be the width, and the model must take examples of that many values, in that
/// shape when it takes more than a flat vector.
pub(super) fn check_example_shape(
    width: Option<usize>,
    (example, key): (Option<Vec<usize>>, &'static str),
    model: &ModelShape,
) -> Result<(), SchemaError> {
    let inputs = model.input_width();
    let Some(example) = example else {
        return match width {
            Some(width) if width != inputs => Err(SchemaError::WidthNotInputs { width, inputs }),
            _ => Ok(()),
        };
    };
    let values: usize = example.iter().product();
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

/// Checks the label column of `schema`: a number, or a string (class names) under a
/// cross-entropy loss. With `label_required = false` it may be missing (prediction).
pub(super) fn check_label(
    schema: &Schema,
    spec: &JobSpec,
    label_required: bool,
) -> Result<LabelType, SchemaError> {
    let data = &spec.data;
    let label = match schema.field_with_name(&data.label) {
        Ok(f) => f,
        Err(_) if !label_required => return Ok(LabelType::Absent),
        Err(_) => return Err(no_column(&data.label, "data.label", schema)),
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
