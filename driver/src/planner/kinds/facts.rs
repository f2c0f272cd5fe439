//! What a job's data tells about its model ([`DataFacts`]), learned from the spec and the
//! Parquet footers alone, with which the model's builder completes the job's model spec before
//! anything else is planned (`kind = "sequential"` takes its input shape and its number of
//! classes from here). Every kind's planning step starts from these facts of the files' rows;
//! token sequences replace the outputs and add what their statistics pass decided.

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use ringflow_core::data::is_string;
use ringflow_core::spec::JobSpec;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{DataFacts, UnknownFact};

use super::KindInput;
use crate::planner::footer::{column_max, feature_width};
use crate::planner::schema_error::FactError;
use crate::planner::split::Split;
use crate::planner::sql_planner::SqlPlanner;

/// What the training split (and the test split, if any) tell about the model of the job: the
/// examples' declared shape (named by the key `example_shape_from` in messages), the feature
/// width of the first file (or of `data.sql`'s output) and the number of outputs the labels
/// call for.
pub(super) fn data_facts(input: &KindInput<'_>, example_shape_from: &str) -> DataFacts {
    let KindInput {
        spec,
        train,
        test,
        prep,
        labels,
    } = *input;
    let schema = first_schema(train, prep);
    DataFacts {
        example_shape: spec.data.example_shape(),
        example_shape_from: example_shape_from.into(),
        // The model's builder takes the reasons as clauses (it is the ml crate's type).
        feature_width: schema
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|s| width(spec, s))
            .map_err(UnknownFact::because),
        outputs: match labels {
            Some(counted) => Ok(counted.outputs()),
            None => outputs(spec, schema.as_deref().ok(), train, test, prep.is_some())
                .map_err(UnknownFact::because),
        },
        sequence: None,
    }
}

/// The schema the features are read from: the first training file's, or what `data.sql` makes
/// of it.
fn first_schema(train: &Split, prep: Option<&SqlPlanner>) -> Result<SchemaRef, FactError> {
    let (file, schema) = train.schemas.first().ok_or(FactError::NoFiles)?;
    match prep {
        None => Ok(schema.clone()),
        Some(prep) => prep
            .plan(schema.clone())
            .map(|planned| planned.output)
            .map_err(|source| FactError::Sql {
                file: file.clone(),
                source,
            }),
    }
}

/// Values per row of the features in `schema`.
fn width(spec: &JobSpec, schema: &Schema) -> Result<usize, FactError> {
    let mut total = 0usize;
    for name in &spec.data.features {
        let column = name.clone();
        let Ok(field) = schema.field_with_name(name) else {
            return Err(FactError::MissingFeature { column });
        };
        match feature_width(field.data_type()) {
            Ok(Some(w)) => total = total.saturating_add(w),
            Ok(None) => return Err(FactError::VariableLength { column }),
            Err(source) => return Err(FactError::Feature { column, source }),
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
) -> Result<usize, FactError> {
    let data = &spec.data;
    if spec.train.loss != LossKind::CrossEntropy {
        return Ok(1);
    }
    if let Some(classes) = &data.label_classes {
        return Ok(classes.len());
    }
    let label = &data.label;
    if sql {
        let label = label.clone();
        return Err(FactError::LabelFromSql { label });
    }
    if let Some(field) = schema.and_then(|s| s.field_with_name(label).ok())
        && is_string(field.data_type())
    {
        let label = label.clone();
        return Err(FactError::ClassNames { label });
    }
    let mut max = column_max(train, label)?;
    if let Some(test) = test {
        max = max.max(column_max(test, label)?);
    }
    let max = max.ok_or(FactError::NoRows)?;
    usize::try_from(max)
        .ok()
        .and_then(|m| m.checked_add(1))
        .ok_or_else(|| FactError::ClassIndexTooLarge {
            label: label.clone(),
            max,
        })
}
