//! Model kinds: the [`ModelBuilder`] trait, the [`ModelRegistry`] of kinds by name (the built-in
//! `mlp` and `sequential`, and user-registered builders), and the [`DataFacts`] a driver
//! resolves a spec with.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{MlError, Result};
use crate::nn::mlp::MlpBuilder;
use crate::nn::sequential::SequentialBuilder;
use crate::nn::{ModelFootprint, ModelSpec, ModelSummary, Module, ParamBuilder};

/// What one example looks like to a model: the shape of its input and the number of outputs.
///
/// A batch of `n` examples is a tensor of shape `[n, input...]` ([`ModelShape::batch`]): `[n,
/// features]` for flat feature vectors, `[n, C, H, W]` for images, `[n, T]` for token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// The shape of one example's input (one dimension, the feature count, for flat vectors).
    pub input: Vec<usize>,
    /// Outputs per example (classes for classification).
    pub outputs: usize,
    /// For a model of token sequences (`input = [max_length]`, batches `[n, T]` with `T` at
    /// most `max_length`): whether it gives its outputs at every step (`[n, T, outputs]`,
    /// tagging) or once per sequence. `None`: examples of a fixed shape.
    pub sequence: Option<SequenceOutput>,
}

/// Where a sequence model gives its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceOutput {
    /// At every step: one label per token (tagging).
    PerStep,
    /// Once per sequence (sequence classification).
    PerSequence,
}

impl ModelShape {
    /// A model of flat feature vectors: `inputs` features in, `outputs` out.
    pub fn flat(inputs: usize, outputs: usize) -> ModelShape {
        ModelShape {
            input: vec![inputs],
            outputs,
            sequence: None,
        }
    }

    /// The values in one example's input (the product of its dimensions): the width of a row
    /// of features as the data pipeline hands them over.
    pub fn input_width(&self) -> usize {
        self.input.iter().product()
    }

    /// The shape of a batch of `rows` examples: `[rows, input...]`.
    pub fn batch(&self, rows: usize) -> Vec<usize> {
        std::iter::once(rows)
            .chain(self.input.iter().copied())
            .collect()
    }
}

/// Builds the models of one `kind`.
///
/// Implement this to train a model of your own with ringflow: register it in a
/// [`ModelRegistry`] under a kind name and hand the registry to the driver and executors (see
/// `examples/custom_model.rs`).
pub trait ModelBuilder: Send + Sync {
    /// Checks the spec's fields and returns the widths; errors name the offending field.
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape>;

    /// Creates the model's parameters through `params` and returns the network.
    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>>;

    /// The memory the model needs, computed from the spec without building it, so that the
    /// driver can refuse a job that cannot fit an executor (see `docs/job-spec.md`, "Memory").
    /// The default, `None`, leaves the model out of the estimate: implement it for large
    /// custom models.
    fn footprint(&self, spec: &ModelSpec) -> Result<Option<ModelFootprint>> {
        let _ = spec;
        Ok(None)
    }

    /// The model's layers, output shapes and parameter counts, computed from the spec without
    /// building it (printed when a job starts). The default, `None`, lets
    /// [`Model::summary`](crate::nn::Model::summary) list the built model's parameters instead.
    fn summary(&self, spec: &ModelSpec) -> Result<Option<ModelSummary>> {
        let _ = spec;
        Ok(None)
    }

    /// Completes `spec` with what the job's data tells (the driver calls it before planning,
    /// and every executor, checkpoint, `eval` and `predict` then sees the completed spec):
    /// e.g. `sequential` fills in its input shape and number of classes. The default returns
    /// the spec unchanged.
    fn resolve(&self, spec: &ModelSpec, facts: &DataFacts) -> Result<ModelSpec> {
        let _ = facts;
        Ok(spec.clone())
    }
}

/// What a job's data tells about the model it needs, known to the driver before training
/// (from the spec and the Parquet footers alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFacts {
    /// The shape of one example that the data declares (`data.shape`, or `[channels, height,
    /// width]` of `data.image`), if it declares one.
    pub example_shape: Option<Vec<usize>>,
    /// Which key declared `example_shape` (`"data.shape"`, `"data.image"`), for messages.
    pub example_shape_from: String,
    /// Values per row of the features, or why it is not known before reading (e.g. "data.features
    /// include the variable-length list column `x`").
    pub feature_width: std::result::Result<usize, UnknownFact>,
    /// Outputs the labels call for (the classes of a classification, 1 for regression), or
    /// why they are not known before training.
    pub outputs: std::result::Result<usize, UnknownFact>,
    /// When the feature is a token sequence: what the data tells about it.
    pub sequence: Option<SequenceFacts>,
}

/// Why a fact of [`DataFacts`] is not known before training: a clause that completes "model.input
/// is not set and …" (e.g. "data.features include the variable-length list column `x`").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct UnknownFact {
    /// The reason, as a clause.
    pub why: String,
}

impl UnknownFact {
    /// The fact is unknown because of `reason` (an error whose message is the clause).
    pub fn because(reason: impl std::fmt::Display) -> UnknownFact {
        UnknownFact {
            why: reason.to_string(),
        }
    }
}

impl From<&str> for UnknownFact {
    fn from(why: &str) -> UnknownFact {
        UnknownFact { why: why.into() }
    }
}

/// What a job's data tells about a sequence model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceFacts {
    /// The longest sequence the job reads (`data.max_length`).
    pub max_length: usize,
    /// Distinct token ids (the vocabulary's size, padding and unknown included), when known.
    pub vocab: Option<usize>,
    /// Whether the labels are one per token (tagging) rather than one per sequence.
    pub per_step: bool,
}

/// The model kinds a process knows, by name.
#[derive(Clone)]
pub struct ModelRegistry {
    kinds: BTreeMap<String, Arc<dyn ModelBuilder>>,
}

impl Default for ModelRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl ModelRegistry {
    /// A registry with the stock kinds (`mlp`, `sequential`).
    pub fn with_builtins() -> Self {
        let mut r = ModelRegistry {
            kinds: BTreeMap::new(),
        };
        r.register("mlp", MlpBuilder);
        r.register("sequential", SequentialBuilder);
        r
    }

    /// Adds (or replaces) the builder for `kind`.
    pub fn register(&mut self, kind: impl Into<String>, builder: impl ModelBuilder + 'static) {
        self.kinds.insert(kind.into(), Arc::new(builder));
    }

    /// The builder for a spec's kind, or an error listing the known kinds.
    pub fn builder(&self, spec: &ModelSpec) -> Result<&dyn ModelBuilder> {
        self.kinds
            .get(&spec.kind)
            .map(|b| b.as_ref())
            .ok_or_else(|| {
                let known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
                MlError::spec(format!(
                    "model.kind {:?} is not known to this binary (known: {})",
                    spec.kind,
                    known.join(", ")
                ))
            })
    }

    /// The names of the registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }
}
