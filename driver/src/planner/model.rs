//! What a job's data tells about its model ([`DataFacts`]), learned from the spec and the
//! Parquet footers alone, with which the model's builder completes the job's model spec before
//! anything else is planned (`kind = "sequential"` takes its input shape and its number of
//! classes from here).

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::DataFacts;
use ringflow_proto::data::is_string;
use ringflow_proto::spec::JobSpec;

use super::SqlPlanner;
use super::footer::{column_max, feature_width};
use super::split::Split;

/// What the training split (and the test split, if any) tell about the model of `spec`: the
/// examples' declared shape, the feature width of the first file (or of `data.sql`'s output)
/// and the number of outputs the labels call for.
pub(super) fn data_facts(
    spec: &JobSpec,
    train: &Split,
    test: Option<&Split>,
    prep: Option<&SqlPlanner>,
) -> DataFacts {
    let data = &spec.data;
    let example_shape_from = if data.shape.is_some() {
        "data.shape"
    } else {
        "data.image"
    };
    let schema = first_schema(train, prep);
    DataFacts {
        example_shape: data.example_shape(),
        example_shape_from: example_shape_from.into(),
        feature_width: schema
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|s| width(spec, s)),
        outputs: outputs(spec, schema.as_deref().ok(), train, test, prep.is_some()),
        sequence: None,
    }
}

/// The schema the features are read from: the first training file's, or what `data.sql` makes
/// of it.
fn first_schema(train: &Split, prep: Option<&SqlPlanner>) -> Result<SchemaRef, String> {
    let (file, schema) = train
        .schemas
        .first()
        .ok_or_else(|| "data.train has no files".to_string())?;
    match prep {
        None => Ok(schema.clone()),
        Some(prep) => prep
            .plan(schema.clone())
            .map(|planned| planned.output)
            .map_err(|e| format!("data.sql cannot be planned on {file} ({e})")),
    }
}

/// Values per row of the features in `schema`.
fn width(spec: &JobSpec, schema: &Schema) -> Result<usize, String> {
    let mut total = 0usize;
    for name in &spec.data.features {
        let field = schema
            .field_with_name(name)
            .map_err(|_| format!("data.features name the missing column `{name}`"))?;
        match feature_width(field.data_type()) {
            Ok(Some(w)) => total = total.saturating_add(w),
            Ok(None) => {
                return Err(format!(
                    "data.features include the variable-length list column `{name}`, whose \
                     width the driver does not know before reading"
                ));
            }
            Err(why) => return Err(format!("the feature column `{name}` {why}")),
        }
    }
    Ok(total)
}

/// The outputs the labels call for: 1 for a regression or binary loss, the length of
/// `data.label_classes`, or the largest class index in the footers' statistics plus one.
fn outputs(
    spec: &JobSpec,
    schema: Option<&Schema>,
    train: &Split,
    test: Option<&Split>,
    sql: bool,
) -> Result<usize, String> {
    let data = &spec.data;
    if spec.train.loss != LossKind::CrossEntropy {
        return Ok(1);
    }
    if let Some(classes) = &data.label_classes {
        return Ok(classes.len());
    }
    let label = &data.label;
    if sql {
        return Err(format!(
            "the label `{label}` comes out of data.sql, so the driver cannot count its classes \
             before training"
        ));
    }
    if let Some(field) = schema.and_then(|s| s.field_with_name(label).ok())
        && is_string(field.data_type())
    {
        return Err(format!(
            "the label column `{label}` holds class names, which the driver counts only while \
             training (data.label_classes would list them)"
        ));
    }
    let mut max = column_max(train, label)?;
    if let Some(test) = test {
        max = max.max(column_max(test, label)?);
    }
    let max = max.ok_or_else(|| "the training split has no rows".to_string())?;
    usize::try_from(max)
        .ok()
        .and_then(|m| m.checked_add(1))
        .ok_or_else(|| format!("the label column `{label}` holds the class index {max}"))
}
