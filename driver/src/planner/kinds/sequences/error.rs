//! [`SequenceError`]: why a token-sequence job cannot be planned as written, or which row of
//! its data breaks the rules (named by file, row and column, as the user finds it).

use ringflow_core::data::DataError;
use ringflow_core::data::sequences::{ElementsError, LengthError, ListColumnError};
use ringflow_core::data::stats::MAX_CLASSES;
use ringflow_core::data::vocab::VocabError;
use ringflow_core::metrics::entities::NotIob2;
use ringflow_core::spec::MAX_TOKEN_BYTES;
use ringflow_core::wire::MAX_CLASS_NAME_BYTES;

/// A sequence job the planner refuses, or a row of its data that breaks the rules.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SequenceError {
    /// The error `source` found at `place` (the split's key, and the file where there is one).
    #[error("{place}: {source}")]
    At {
        /// `data.train: <file>`.
        place: String,
        /// What is wrong there.
        source: Box<SequenceError>,
    },
    /// A token sequence column beside other features.
    #[error(
        "data.features: the token sequence column `{column}` must be the only feature (it has \
         {features} columns)"
    )]
    NotTheOnlyFeature {
        /// The sequence column.
        column: String,
        /// Columns in `data.features`.
        features: usize,
    },
    /// A sequence model given more or fewer than one feature column.
    #[error(
        "the model reads token sequences, so data.features must name one column, not {features}"
    )]
    OneFeature {
        /// The columns `data.features` names.
        features: usize,
    },
    /// A schema without the column the spec names (`key`).
    #[error("has no column `{column}` ({key})")]
    NoColumn {
        /// The missing column.
        column: String,
        /// The setting that names it (`data.features`, `data.label`).
        key: &'static str,
    },
    /// A feature column that holds no token sequences.
    #[error(
        "column `{column}` has type {ty}; the model reads token sequences, a list of strings \
         or of integers"
    )]
    NotTokens {
        /// `data.features`' one column.
        column: String,
        /// Its Arrow type, as Arrow writes it.
        ty: String,
    },
    /// A label that is not a list, for a model that tags every token.
    #[error(
        "column `{column}` (data.label) has type {ty}, but the model tags every token: the \
         label must be a list with one tag per token"
    )]
    NotTagsPerToken {
        /// `data.label`.
        column: String,
        /// Its Arrow type.
        ty: String,
    },
    /// A label per token, for a model that gives one output per sequence.
    #[error(
        "column `{column}` (data.label) has type {ty}, a label per token, but the model gives \
         one output per sequence"
    )]
    LabelPerToken {
        /// `data.label`.
        column: String,
        /// Its Arrow type.
        ty: String,
    },
    /// A label (or tag) type that is neither strings nor integers.
    #[error("column `{column}` (data.label) holds {ty}; a class must be a string or an integer")]
    NotAClassType {
        /// `data.label`.
        column: String,
        /// The Arrow type of its values (of a list's elements, for tags).
        ty: String,
    },
    /// `data.sql` over token sequences.
    #[error(
        "data.sql with the token sequence column `{column}` is not supported: prepare the \
         sequences in the Parquet files"
    )]
    WithSql {
        /// The sequence column.
        column: String,
    },
    /// A file could not be read.
    #[error(transparent)]
    Read(#[from] DataError),
    /// A record batch without a column the job reads.
    #[error("has no column `{0}`")]
    MissingColumn(String),
    /// A column that is not a list as the job needs (the reader's words).
    #[error("column `{column}` {source}")]
    NotAList {
        /// The column.
        column: String,
        /// What the list reader found.
        source: ListColumnError,
    },
    /// A row that breaks `data.max_length`, is empty or has tags of another length (the
    /// sequence rules' own sentence, naming the row and the lengths).
    #[error(transparent)]
    Rules(LengthError),
    /// A token longer than `data.vocab.max_token_bytes`.
    #[error(
        "row {row} (0-based): column `{column}` holds a token of {bytes} bytes, more than \
         data.vocab.max_token_bytes = {max}; split or shorten such tokens, or raise \
         data.vocab.max_token_bytes (at most {most})",
        most = MAX_TOKEN_BYTES
    )]
    TokenTooLong {
        /// The row, within its file.
        row: u64,
        /// The column.
        column: String,
        /// The token's length.
        bytes: usize,
        /// `data.vocab.max_token_bytes`.
        max: usize,
    },
    /// More distinct tokens than the statistics pass counts.
    #[error(transparent)]
    Vocabulary(#[from] VocabError),
    /// A null token or label inside a list.
    #[error("row {row} (0-based): column `{column}` has a null element")]
    NullElement {
        /// The row, within its file.
        row: u64,
        /// The column.
        column: String,
    },
    /// A tag or string label longer than a class name may be.
    #[error(
        "row {row} (0-based): column `{column}` holds a class name of {bytes} bytes, more than \
         the {most} bytes a class name may have",
        most = MAX_CLASS_NAME_BYTES
    )]
    ClassNameTooLong {
        /// The row, within its file.
        row: u64,
        /// The column.
        column: String,
        /// The name's length.
        bytes: usize,
    },
    /// More distinct labels than a model's classes may be.
    #[error(
        "column `{column}` has more than {most} distinct labels; is it really a tag?",
        most = MAX_CLASSES
    )]
    TooManyClasses {
        /// The label column.
        column: String,
    },
    /// A test row's class that the model has no output for.
    #[error(
        "row {row} (0-based): column `{column}` holds the class {class}, not one of the \
         {classes} classes the model has outputs for (those of data.train, or \
         data.label_classes); train on rows that hold it, or leave it out of data.test"
    )]
    UnknownClass {
        /// The row, within its file.
        row: u64,
        /// The label column.
        column: String,
        /// The class as it reads: a quoted name, or an integer.
        class: String,
        /// The classes the model has outputs for.
        classes: usize,
    },
    /// A negative token id or integer class.
    #[error("row {row} (0-based): column `{column}` holds the {what} {value}; it must be ≥ 0")]
    Negative {
        /// The row, within its file.
        row: u64,
        /// The column.
        column: String,
        /// `token id` or `class`.
        what: &'static str,
        /// The value.
        value: i64,
    },
    /// A label column of a type that holds no classes.
    #[error("column `{column}` (data.label) holds {found}; a class must be one")]
    NotClasses {
        /// The label column.
        column: String,
        /// Its type, as the reader names it.
        #[source]
        found: ElementsError,
    },
    /// A training split with no rows.
    #[error(
        "data.train: the training split has no rows, so there are no sequences to train on or \
         labels to learn the classes of; point data.train at files that hold rows"
    )]
    EmptyTrainingSplit,
    /// `"entity_f1"` for a job that does not tag every token.
    #[error(
        "train.metrics: \"entity_f1\" needs a tagger: a token sequence feature and a list label \
         with one tag per token"
    )]
    EntityF1NeedsATagger,
    /// `"entity_f1"` over integer tags.
    #[error(
        "train.metrics: \"entity_f1\" needs the tags of `{label}` as names (O, B-<type>, \
         I-<type>), not integers"
    )]
    EntityF1NeedsNames {
        /// The label column.
        label: String,
    },
    /// `"entity_f1"` over tags that are not IOB2.
    #[error("train.metrics: data.label `{label}`: {source}")]
    NotIob2 {
        /// The label column.
        label: String,
        /// The first tag class that is not IOB2.
        source: NotIob2,
    },
}

impl SequenceError {
    /// This error, found at `place`.
    pub fn at(self, place: impl Into<String>) -> SequenceError {
        SequenceError::At {
            place: place.into(),
            source: Box::new(self),
        }
    }
}
