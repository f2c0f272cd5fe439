//! The data kinds a job's examples come in, each with one planning step in a folder of its own:
//! rows of numeric feature columns ([`features`]), a column of encoded images ([`images`]) and
//! a column of token sequences ([`sequences`]).
//!
//! A kind's planning step ([`plan`]) reads the spec and the listed splits (their footers, and
//! for token sequences a statistics pass over the training split) and returns a [`KindPlan`]:
//! the facts the model's builder completes the model spec from, then, once the model is
//! resolved, the kind's own check of the test split, the spec the memory estimate sizes, and
//! what the job's tasks need of the plan. Every split's schema is checked as the kind the
//! resolved model reads ([`check_schema`]), for evaluation and prediction too. The checks the
//! kinds of fixed-width rows share are in `columns.rs`, the facts every kind starts from in
//! `facts.rs`.
//!
//! A new kind is a folder here with its planning step and its schema check, and one line in
//! each of [`plan`] and [`check_schema`]. The streamed Arrow input of the Spark issue (record
//! batches handed to the job instead of Parquet files, so no footers to list) is to be such a
//! kind: picked in [`plan`] from the spec's source before the file kinds, its planning step
//! taking the stream's schema in place of the first file's; it is not implemented yet.

mod columns;
mod facts;
pub mod features;
pub mod images;
pub mod label_error;
pub mod labels;
pub mod sequences;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use datafusion::arrow::datatypes::Schema;
use ringflow_core::spec::JobSpec;
use ringflow_ml::nn::{DataFacts, ModelShape, SequenceOutput};

use crate::error::{DriverError, Result};
use crate::planner::split::{LabelType, Split};
use crate::planner::sql_planner::SqlPlanner;
use sequences::PlannedSequences;

/// What a kind's planning step reads: the job's spec, its listed splits (footers only) and the
/// plan of its `data.sql`, if any.
#[derive(Clone, Copy)]
pub(crate) struct KindInput<'a> {
    /// The job's spec, before its model is completed.
    pub spec: &'a JobSpec,
    /// The training split.
    pub train: &'a Split,
    /// The test split, if the job has one.
    pub test: Option<&'a Split>,
    /// The job's `data.sql`, planned.
    pub prep: Option<&'a SqlPlanner>,
    /// What the label pass found, once it ran ([`labels::pass`]).
    pub labels: Option<&'a labels::CountedLabels>,
}

/// The tokens of a test split of string token sequences, and those outside the training
/// split's vocabulary (which reach the model as `<unk>`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TestTokens {
    /// Tokens kept (after truncation).
    pub tokens: u64,
    /// Those the vocabulary lacks.
    pub unknown: u64,
}

impl TestTokens {
    /// The share of the test split's tokens outside the vocabulary (0 without tokens).
    pub fn unknown_rate(&self) -> f64 {
        self.unknown as f64 / self.tokens.max(1) as f64
    }

    /// The line of the job's messages.
    pub fn describe(&self) -> String {
        format!(
            "data.test: {} of its {} tokens ({:.1}%) are not in the vocabulary and reach the \
             model as <unk>",
            self.unknown,
            self.tokens,
            100.0 * self.unknown_rate()
        )
    }
}

/// One data kind's part of planning a training job, as its planning step left it.
pub(crate) trait KindPlan: std::fmt::Debug {
    /// What the data tells the model's builder, which completes the model spec from it: the
    /// example shape or feature width, the outputs the labels call for, and for token sequences
    /// the vocabulary and the length bound.
    fn facts(&self) -> &DataFacts;

    /// Checks the test split against the resolved `model` before training, beyond the schema
    /// check every split gets; says how many of its tokens the vocabulary lacks, for kinds
    /// with one. Nothing more by default.
    fn check_test(
        &self,
        spec: &JobSpec,
        test: &Split,
        model: &ModelShape,
    ) -> Result<Option<TestTokens>> {
        let _ = (spec, test, model);
        Ok(None)
    }

    /// The spec whose model the memory estimate sizes: the job's by default.
    fn footprint_spec<'a>(&self, spec: &'a JobSpec) -> Cow<'a, JobSpec> {
        Cow::Borrowed(spec)
    }

    /// What the job keeps of the plan for its tasks: the vocabulary and classes of token
    /// sequences; `None` for kinds whose tasks need only the spec.
    fn into_sequences(self: Box<Self>) -> Option<PlannedSequences> {
        None
    }
}

/// The planning step of the job's data kind: token sequences when the first training file's
/// feature is one, images with `data.image`, feature columns otherwise; with what the label
/// pass found for the latter two (the class names the resolved spec lists, and the line for
/// the job's messages), `None` when it did not run.
pub(crate) fn plan(
    input: &KindInput<'_>,
) -> Result<(Box<dyn KindPlan>, Option<labels::CountedLabels>)> {
    if let Some(planned) = sequences::plan::plan(input)? {
        return Ok((Box::new(planned), None));
    }
    let counted = labels::pass(input)?;
    let input = &KindInput {
        labels: counted.as_ref(),
        ..*input
    };
    let plan: Box<dyn KindPlan> = match input.spec.data.image.is_some() {
        true => Box::new(images::ImagesPlan::new(input)),
        false => Box::new(features::FeaturesPlan::new(input)),
    };
    Ok((plan, counted))
}

/// Checks `schema` (a file's, or the output of `data.sql`; `what` names it in errors) against
/// the spec and `model`, as the kind the model reads: token sequences when it takes them,
/// images with `data.image`, feature columns otherwise. With `label_required = false` a missing
/// label column is allowed (prediction). Says what the label holds.
pub fn check_schema(
    what: &str,
    schema: &Schema,
    spec: &JobSpec,
    model: &ModelShape,
    label_required: bool,
) -> Result<LabelType> {
    if let Some(output) = model.sequence {
        let per_step = output == SequenceOutput::PerStep;
        return sequences::check_schema(what, schema, spec, per_step, label_required);
    }
    let checked = match &spec.data.image {
        Some(image) => images::check_schema(schema, spec, image, model, label_required),
        None => features::check_schema(schema, spec, model, label_required),
    };
    checked.map_err(|source| DriverError::Schema {
        what: what.to_string(),
        source,
    })
}
