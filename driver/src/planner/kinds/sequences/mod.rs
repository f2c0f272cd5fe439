//! Jobs whose feature is a token sequence: recognizing one from the column types
//! ([`detect`]), and the statistics pass over the training split that the model's size depends
//! on ([`count`]): the token vocabulary (`data.vocab`), the classes of string labels (the tags
//! of a tagger), the largest integer id and label, and the lengths. It runs in the planner,
//! on every core of the driver, reading only the sequence and label columns, because the
//! model (its embedding's rows, its outputs) must be complete before any executor builds it;
//! the same pass refuses a bad row (empty, too long, tags of another length, a token longer
//! than `data.vocab.max_token_bytes`, a tag longer than a class name may be) naming the file,
//! the row and the lengths, before training starts. A second pass ([`check_test`]) holds the
//! test split to the same rules and to the classes the model has outputs for, so that a bad
//! test row stops the job before training rather than after it. The passes are in [`pass`],
//! their errors ([`SequenceError`]) in `error.rs`, and the kind's planning step — the pass,
//! what it tells the model, the test split's check and the memory estimate at the longest
//! sequence — in [`plan`].

pub mod error;
mod pass;
pub mod plan;
#[cfg(test)]
mod tests;

use datafusion::arrow::datatypes::{DataType, Schema};
use ringflow_core::data::is_string;
use ringflow_core::data::sequences::TokenType;
use ringflow_core::data::{DataStats, Preprocessing};
use ringflow_core::metrics::entities::TagScheme;
use ringflow_core::spec::{JobSpec, Metric};
use ringflow_ml::nn::SequenceFacts;

pub use error::SequenceError;
pub use pass::{check_test, count};
pub use plan::PlannedSequences;

use crate::error::{DriverError, Result};
use crate::planner::split::LabelType;

/// A job's token sequence column and what its label is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceColumns {
    /// The feature column of sequences.
    pub column: String,
    /// Strings or integer ids.
    pub tokens: TokenType,
    /// The label is a list, one label per token (tagging).
    pub per_step: bool,
    /// The labels are strings (class names).
    pub string_labels: bool,
}

/// Recognizes a sequence job in `schema` (the first training file's): a single feature
/// column that is a list of strings, or a list of integers when the label is a list too or the
/// model starts with an `embedding`. `None` for any other job.
pub fn detect(
    spec: &JobSpec,
    schema: &Schema,
) -> std::result::Result<Option<SequenceColumns>, SequenceError> {
    let data = &spec.data;
    let typed: Vec<(&String, TokenType)> = data
        .features
        .iter()
        .filter_map(|f| schema.field_with_name(f).ok().map(|field| (f, field)))
        .filter_map(|(f, field)| TokenType::of_list(field.data_type()).map(|t| (f, t)))
        .collect();
    let label = schema
        .field_with_name(&data.label)
        .ok()
        .map(|f| f.data_type());
    let label_element = label.and_then(|t| match t {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type().clone()),
        _ => None,
    });
    let starts_with_embedding = spec.model.kind == "sequential"
        && spec
            .model
            .params
            .get("layers")
            .and_then(|l| l.get(0))
            .and_then(|l| l.get("type"))
            == Some(&serde_json::Value::from("embedding"));
    let Some(&(column, tokens)) = typed.iter().find(|(_, t)| {
        *t == TokenType::Strings || label_element.is_some() || starts_with_embedding
    }) else {
        return Ok(None);
    };
    if data.features.len() > 1 {
        return Err(SequenceError::NotTheOnlyFeature {
            column: column.clone(),
            features: data.features.len(),
        });
    }
    if data.sql.is_some() {
        return Err(SequenceError::WithSql {
            column: column.clone(),
        });
    }
    let string_labels = match (&label_element, label) {
        (Some(element), _) => is_string(element),
        (None, Some(t)) => is_string(t),
        (None, None) => false,
    };
    Ok(Some(SequenceColumns {
        column: column.clone(),
        tokens,
        per_step: label_element.is_some(),
        string_labels,
    }))
}

/// What the statistics pass found in the training split.
#[derive(Clone, Debug, Default)]
pub struct SequenceCounts {
    /// Token counts (string tokens) and label classes (string labels).
    pub stats: DataStats,
    /// The largest integer token id (integer tokens).
    pub max_id: Option<u64>,
    /// The largest integer label (integer labels).
    pub max_label: Option<u64>,
    /// Sequences read.
    pub sequences: u64,
    /// Tokens kept (after truncation).
    pub tokens: u64,
    /// The longest sequence kept.
    pub longest: usize,
    /// String tokens outside the vocabulary (counted by the test split's check).
    pub unknown_tokens: u64,
}

impl SequenceCounts {
    pub(super) fn merge(
        &mut self,
        other: SequenceCounts,
    ) -> std::result::Result<(), SequenceError> {
        self.stats.merge(other.stats)?;
        self.max_id = self.max_id.max(other.max_id);
        self.max_label = self.max_label.max(other.max_label);
        self.sequences += other.sequences;
        self.tokens += other.tokens;
        self.longest = self.longest.max(other.longest);
        self.unknown_tokens += other.unknown_tokens;
        Ok(())
    }

    /// The preprocessing the counts decide (vocabulary, label classes) for `spec`.
    pub fn preprocessing(&self, spec: &JobSpec) -> Preprocessing {
        Preprocessing::from_stats(
            &self.stats,
            spec.data.label_classes.as_deref(),
            &spec.data.vocab,
        )
    }

    /// What the model learns from the counts: the length bound, the ids the tokens take, and
    /// where the labels are.
    pub fn facts(
        &self,
        spec: &JobSpec,
        columns: &SequenceColumns,
        p: &Preprocessing,
    ) -> SequenceFacts {
        let vocab = match columns.tokens {
            TokenType::Strings => p.vocabulary.as_ref().map(|v| v.len()),
            TokenType::Ids => self.max_id.map(|m| m as usize + 1),
        };
        SequenceFacts {
            max_length: spec.data.max_length(),
            vocab,
            per_step: columns.per_step,
        }
    }

    /// The classes the labels call for (string classes, or the largest integer label + 1).
    pub fn outputs(&self, p: &Preprocessing) -> std::result::Result<usize, SequenceError> {
        match (&p.classes, self.max_label) {
            (Some(c), _) => Ok(c.len()),
            (None, Some(m)) => Ok(m as usize + 1),
            (None, None) => Err(SequenceError::EmptyTrainingSplit),
        }
    }

    /// One line for the job's messages.
    pub fn describe(&self, p: &Preprocessing) -> String {
        let mut parts = vec![format!(
            "{} sequences, {} tokens (longest {}, mean {:.1})",
            self.sequences,
            self.tokens,
            self.longest,
            self.tokens as f64 / self.sequences.max(1) as f64
        )];
        if let Some(v) = &p.vocabulary {
            parts.push(format!("a vocabulary of {} ids", v.len()));
        }
        if let Some(c) = &p.classes {
            parts.push(format!("{} label classes", c.len()));
        }
        format!("statistics of data.train: {}", parts.join(", "))
    }
}

/// Checks `schema` (`what` names it) for a sequence model's columns: the one feature a list
/// of strings or integers, the label a list when the model tags every token and a number or
/// string otherwise. With `label_required = false` the label may be missing (prediction).
pub fn check_schema(
    what: &str,
    schema: &Schema,
    spec: &JobSpec,
    per_step: bool,
    label_required: bool,
) -> Result<LabelType> {
    let data = &spec.data;
    let fail = |e: SequenceError| DriverError::from(e.at(what));
    let [column] = data.features.as_slice() else {
        return Err(fail(SequenceError::OneFeature {
            features: data.features.len(),
        }));
    };
    let no_column = |column: &str, key| {
        fail(SequenceError::NoColumn {
            column: column.to_string(),
            key,
        })
    };
    let field = schema
        .field_with_name(column)
        .map_err(|_| no_column(column, "data.features"))?;
    if TokenType::of_list(field.data_type()).is_none() {
        return Err(fail(SequenceError::NotTokens {
            column: column.clone(),
            ty: field.data_type().to_string(),
        }));
    }
    let label = match schema.field_with_name(&data.label) {
        Ok(f) => f.data_type(),
        Err(_) if !label_required => return Ok(LabelType::Absent),
        Err(_) => return Err(no_column(&data.label, "data.label")),
    };
    let column = data.label.clone();
    let element = match (label, per_step) {
        (DataType::List(f) | DataType::LargeList(f), true) => f.data_type(),
        (t, false) if !matches!(t, DataType::List(_) | DataType::LargeList(_)) => t,
        (t, true) => {
            let ty = t.to_string();
            return Err(fail(SequenceError::NotTagsPerToken { column, ty }));
        }
        (t, false) => {
            let ty = t.to_string();
            return Err(fail(SequenceError::LabelPerToken { column, ty }));
        }
    };
    if is_string(element) {
        Ok(LabelType::String)
    } else if element.is_integer() {
        Ok(LabelType::Number)
    } else {
        let ty = element.to_string();
        Err(fail(SequenceError::NotAClassType { column, ty }))
    }
}

/// Checks `train.metrics` against the job: `"entity_f1"` needs a tagger (`columns` per step)
/// whose tag classes are IOB2 names.
pub fn check_metrics(
    spec: &JobSpec,
    columns: Option<&SequenceColumns>,
    p: &Preprocessing,
) -> std::result::Result<(), SequenceError> {
    if !spec.train.metrics.contains(&Metric::EntityF1) {
        return Ok(());
    }
    if !columns.is_some_and(|c| c.per_step) {
        return Err(SequenceError::EntityF1NeedsATagger);
    }
    let Some(classes) = &p.classes else {
        // String tags with no classes: not one row was read.
        if columns.is_some_and(|c| c.string_labels) {
            return Err(SequenceError::EmptyTrainingSplit);
        }
        return Err(SequenceError::EntityF1NeedsNames {
            label: spec.data.label.clone(),
        });
    };
    TagScheme::parse(classes)
        .map(|_| ())
        .map_err(|source| SequenceError::NotIob2 {
            label: spec.data.label.clone(),
            source,
        })
}
