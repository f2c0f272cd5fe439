//! Why a job's plan cannot be made from its data and its checkpoint: [`LabelMismatch`] for a
//! label that is of another kind across files or splits, or that `data.label_classes` does not
//! fit, [`ResumeError`] for a checkpoint `--resume` cannot continue from, and [`TooFewRows`]
//! for a split with fewer rows than executors to share them. A leaf: the planner and the
//! driver's error type use it.

use ringflow_core::data::DataError;
use ringflow_ml::nn::ModelSpec;

/// A label column that is not the same kind of value throughout, or that
/// `data.label_classes` does not fit; each message is a sentence naming the key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelMismatch {
    /// A file's label is of another kind than the split's first file's.
    #[error("{key}: {file}: its label column `{label}` is of another kind than in {first}")]
    AcrossFiles {
        /// The split's spec key (`data.train`).
        key: String,
        /// The file.
        file: String,
        /// `data.label`.
        label: String,
        /// The split's first file.
        first: String,
    },
    /// The test split's label holds another kind of value than the training split's.
    #[error(
        "data.test: the label column `{label}` holds {test} but in data.train it holds {train}"
    )]
    AcrossSplits {
        /// `data.label`.
        label: String,
        /// What the test split's holds ("numbers", "strings", "nothing").
        test: &'static str,
        /// What the training split's holds.
        train: &'static str,
    },
    /// `data.label_classes` for a label of class indices.
    #[error(
        "data.label_classes: the label column `{label}` holds numbers (class indices); \
         label_classes name the classes of a string label"
    )]
    ClassesOfNumbers {
        /// `data.label`.
        label: String,
    },
    /// `data.label_classes` lists another number of classes than the model has outputs.
    #[error("data.label_classes lists {listed} classes, but the model has {outputs} outputs")]
    ClassesNotOutputs {
        /// The classes listed.
        listed: usize,
        /// The model's outputs.
        outputs: usize,
    },
}

/// Why `--resume` cannot continue from the job's last checkpoint; the message follows
/// "--resume: ".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// `cluster.checkpoint_dir` cannot be used.
    #[error(transparent)]
    Location(DataError),
    /// There is no `checkpoint.json` to read.
    #[error("{0}: the job has no checkpoint to resume from")]
    NoCheckpoint(#[source] DataError),
    /// `checkpoint.json` does not parse.
    #[error("{name} is not valid JSON: {source}")]
    NotJson {
        /// `checkpoint.json`'s location.
        name: String,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// `checkpoint.json` has no model spec that parses.
    #[error("{name} holds no readable model spec: {source}")]
    NoModel {
        /// `checkpoint.json`'s location.
        name: String,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// The checkpoint is of another model than the job's.
    #[error("{name} was saved for another model ({saved:?}); the job's is {job:?}")]
    OtherModel {
        /// `checkpoint.json`'s location.
        name: String,
        /// The model it was saved for.
        saved: Box<ModelSpec>,
        /// The job's model.
        job: Box<ModelSpec>,
    },
    /// `checkpoint.json` has no epoch and step.
    #[error("{name} has no epoch and step")]
    NoEpoch {
        /// `checkpoint.json`'s location.
        name: String,
    },
    /// The checkpoint is past the job's last epoch.
    #[error("{name} is at epoch {epoch}, beyond the job's train.epochs = {epochs}")]
    BeyondEpochs {
        /// `checkpoint.json`'s location.
        name: String,
        /// The checkpoint's epoch.
        epoch: u64,
        /// `train.epochs`.
        epochs: u64,
    },
}

/// A split that holds fewer rows than the executors that would share them: some rank would
/// have none.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "{key} holds {rows} rows{}, fewer than the {world} executors that would share them",
    if *.after_sql { " after data.sql" } else { "" }
)]
pub struct TooFewRows {
    /// The split's spec key (`data.train`).
    pub key: String,
    /// Its rows.
    pub rows: u64,
    /// Whether `rows` counts the rows `data.sql` yields.
    pub after_sql: bool,
    /// The executors of the job.
    pub world: usize,
}
