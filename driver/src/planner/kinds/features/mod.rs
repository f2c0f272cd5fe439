//! Rows of numeric feature columns (`data.features`): numbers and lists of numbers,
//! concatenated into one vector per row, optionally read in the shape `data.shape`. The
//! planning step takes the facts of the files' rows as they are; the schema check adds up the
//! columns' widths and holds them to the shape and the model.

use datafusion::arrow::datatypes::Schema;
use ringflow_core::spec::JobSpec;
use ringflow_ml::nn::{DataFacts, ModelShape};

use super::columns::{check_example_shape, check_label, no_column};
use super::facts::data_facts;
use super::{KindInput, KindPlan};
use crate::planner::footer::feature_width;
use crate::planner::schema_error::SchemaError;
use crate::planner::split::LabelType;

/// The planning step's result for feature columns: the facts of the files' rows.
#[derive(Debug)]
pub(crate) struct FeaturesPlan {
    facts: DataFacts,
}

impl FeaturesPlan {
    /// Plans the feature columns of `input`'s job.
    pub(crate) fn new(input: &KindInput<'_>) -> FeaturesPlan {
        FeaturesPlan {
            facts: data_facts(input, "data.shape"),
        }
    }
}

impl KindPlan for FeaturesPlan {
    fn facts(&self) -> &DataFacts {
        &self.facts
    }
}

/// Checks `schema` for the feature columns and the label of `spec`, against `model`.
pub(super) fn check_schema(
    schema: &Schema,
    spec: &JobSpec,
    model: &ModelShape,
    label_required: bool,
) -> Result<LabelType, SchemaError> {
    let data = &spec.data;
    let width = features_width(schema, &data.features)?;
    check_example_shape(width, (data.example_shape(), "data.shape"), model)?;
    check_label(schema, spec, label_required)
}

/// Values per row the feature columns of `schema` give: `Some(n)` when every column's width is
/// fixed, `None` when a list column's is known only when rows are read.
fn features_width(schema: &Schema, features: &[String]) -> Result<Option<usize>, SchemaError> {
    let mut width = Some(0);
    for name in features {
        let field = schema
            .field_with_name(name)
            .map_err(|_| no_column(name, "data.features", schema))?;
        let w = feature_width(field.data_type()).map_err(|source| SchemaError::Feature {
            column: name.clone(),
            source,
        })?;
        width = width.zip(w).map(|(a, b)| a + b);
    }
    Ok(width)
}
