//! Why a job's spec cannot be run as given on this executor: [`Unrunnable`]. A leaf of the
//! executor's error types.

use ringflow_core::data::DataError;
use ringflow_core::metrics::entities::NotIob2;
use ringflow_core::size::format_bytes;
use ringflow_core::wire::MAX_STATISTICS_BYTES;

/// Why the job's spec (or a command's settings) cannot be run on this executor; each message
/// is a sentence naming the setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unrunnable {
    /// A rank's statistics of the training split are larger than a rank may send.
    #[error(
        "rank {rank}'s statistics of data.train are {} as JSON, more than the {} a rank may \
         send; they hold the distinct values of data.label (set data.label_classes) and the \
         moments of every feature (data.normalize)",
        format_bytes(*bytes),
        format_bytes(MAX_STATISTICS_BYTES as u64)
    )]
    StatisticsTooLarge {
        /// The rank.
        rank: u32,
        /// Their length as JSON.
        bytes: u64,
    },
    /// `bench ingest --batch 0`.
    #[error("--batch must be at least 1")]
    NoBatch,
    /// A test hook's variable that does not parse.
    #[error("{var} = {value:?} is not RANK:MILLISECONDS[:FRACTION]")]
    Straggler {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// `train.metrics = ["entity_f1"]` for a model that does not tag tokens.
    #[error("train.metrics: \"entity_f1\" needs a tagger (one label per token)")]
    EntityF1NeedsTagger,
    /// `train.metrics = ["entity_f1"]` without named tag classes.
    #[error("train.metrics: \"entity_f1\" needs tags named O, B-<type>, I-<type>")]
    EntityF1NeedsTags,
    /// `train.metrics = ["entity_f1"]` with a class that is no IOB2 tag.
    #[error("train.metrics: {0}")]
    NotIob2(#[source] NotIob2),
    /// A sequence model given more or fewer than one feature column.
    #[error(
        "the model reads token sequences, so data.features must name one column, not {features}"
    )]
    SequenceFeatures {
        /// The columns `data.features` names.
        features: usize,
    },
    /// The label's classes are not as many as the model's outputs.
    #[error("data.label has {classes} classes ({names}), but the model has {outputs} outputs")]
    ClassesNotOutputs {
        /// The label's classes.
        classes: usize,
        /// The first of them, quoted.
        names: String,
        /// The model's outputs.
        outputs: usize,
    },
    /// The normalization is of another number of features than the model's inputs.
    #[error("the normalization has {features} features, but the model takes {inputs} inputs")]
    NormalizationWidth {
        /// Features of the normalization.
        features: usize,
        /// The model's inputs.
        inputs: usize,
    },
    /// A loss that needs one output, for a model with another number of outputs.
    #[error("train.loss = \"{loss}\" needs a model with 1 output, this one has {outputs}")]
    LossOutputs {
        /// `train.loss`, as the spec writes it.
        loss: &'static str,
        /// The model's outputs.
        outputs: usize,
    },
    /// A saved model predicted a class that its preprocessing does not name (the check on
    /// load rules it out).
    #[error(
        "the model predicted class {class}, but extra.preprocessing.classes of its \
         checkpoint.json names only {classes}"
    )]
    UnnamedClass {
        /// The predicted class index.
        class: usize,
        /// The classes the preprocessing names.
        classes: usize,
    },
    /// `data.tables` cannot be loaded, or `data.sql` cannot be planned over a partition.
    #[error(transparent)]
    Sql(DataError),
}
