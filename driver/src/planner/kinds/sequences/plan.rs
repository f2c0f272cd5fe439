//! The planning step of token sequences ([`plan`]): recognizing the kind, the statistics pass
//! over the training split and what it decides ([`PlannedSequences`]), the facts the model is
//! completed from, the check of the test split once the model is resolved, and the model the
//! memory estimate sizes (batches are padded to their own longest sequence, at most the
//! training split's).

use std::borrow::Cow;

use ringflow_core::data::Preprocessing;
use ringflow_core::spec::JobSpec;
use ringflow_ml::nn::{DataFacts, ModelShape, UnknownFact};

use super::{SequenceColumns, SequenceCounts, check_metrics, check_test, count, detect};
use crate::error::Result;
use crate::planner::kinds::facts::data_facts;
use crate::planner::kinds::{KindInput, KindPlan, TestTokens};
use crate::planner::split::Split;

/// What the planner decided for a job of token sequences.
#[derive(Clone, Debug)]
pub struct PlannedSequences {
    /// The sequence column and the label's layout.
    pub columns: SequenceColumns,
    /// The vocabulary and label classes every rank applies (and the model saves).
    pub preprocessing: Preprocessing,
    /// What the statistics pass found, for the job's messages.
    pub described: String,
}

/// The planning step's result for token sequences: what the pass decided, the facts the model
/// is completed from, and the longest sequence kept.
#[derive(Debug)]
pub(crate) struct SequencesPlan {
    planned: PlannedSequences,
    facts: DataFacts,
    longest: usize,
}

/// The planning step of token sequences: `None` when the job's feature is not a token sequence
/// (in the first training file's schema), after checking that `train.metrics` asks nothing of
/// a tagger; otherwise the statistics pass over the training split and what it decides.
pub(crate) fn plan(input: &KindInput<'_>) -> Result<Option<SequencesPlan>> {
    let spec = input.spec;
    let Some((_, schema)) = input.train.schemas.first() else {
        return Ok(None);
    };
    let Some(columns) = detect(spec, schema)? else {
        let none = Preprocessing::default();
        check_metrics(spec, None, &none)?;
        return Ok(None);
    };
    let counts = count(spec, input.train, &columns)?;
    let preprocessing = counts.preprocessing(spec);
    check_metrics(spec, Some(&columns), &preprocessing)?;
    let described = counts.describe(&preprocessing);
    let facts = facts(input, &counts, &columns, &preprocessing);
    let planned = PlannedSequences {
        columns,
        preprocessing,
        described,
    };
    Ok(Some(SequencesPlan {
        planned,
        facts,
        longest: counts.longest,
    }))
}

/// The facts of the files' rows, with what the pass decided in place of the sequence's and
/// the outputs.
fn facts(
    input: &KindInput<'_>,
    counts: &SequenceCounts,
    columns: &SequenceColumns,
    preprocessing: &Preprocessing,
) -> DataFacts {
    let mut facts = data_facts(input, "data.shape");
    facts.sequence = Some(counts.facts(input.spec, columns, preprocessing));
    facts.outputs = counts.outputs(preprocessing).map_err(UnknownFact::because);
    facts
}

impl KindPlan for SequencesPlan {
    fn facts(&self) -> &DataFacts {
        &self.facts
    }

    /// Holds every row of the test split to the training split's rules and to the classes the
    /// model has outputs for.
    fn check_test(
        &self,
        spec: &JobSpec,
        test: &Split,
        model: &ModelShape,
    ) -> Result<Option<TestTokens>> {
        let (columns, preprocessing) = (&self.planned.columns, &self.planned.preprocessing);
        let counts = check_test(spec, test, columns, preprocessing, model.outputs)?;
        Ok(preprocessing.vocabulary.as_ref().map(|_| TestTokens {
            tokens: counts.tokens,
            unknown: counts.unknown_tokens,
        }))
    }

    /// The model at the longest sequence of the training split: batches are padded to their
    /// own longest sentence, at most that.
    fn footprint_spec<'a>(&self, spec: &'a JobSpec) -> Cow<'a, JobSpec> {
        Cow::Owned(at_most_steps(spec, self.longest))
    }

    fn into_sequences(self: Box<Self>) -> Option<PlannedSequences> {
        Some(self.planned)
    }
}

/// `spec` with a sequence model's input shortened to `steps` (when shorter than
/// `data.max_length`), for estimating the memory of batches no longer than that.
fn at_most_steps(spec: &JobSpec, steps: usize) -> JobSpec {
    let mut shorter = spec.clone();
    let steps = steps.clamp(1, spec.data.max_length());
    if shorter.model.params.get("sequence") == Some(&serde_json::Value::Bool(true)) {
        let input = serde_json::json!([steps]);
        shorter.model.params.insert("input".into(), input);
    }
    shorter
}
