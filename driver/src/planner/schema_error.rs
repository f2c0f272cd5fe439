//! Why a schema does not fit the job: [`SchemaError`] for a file's schema (or the output of
//! `data.sql`) checked against the spec's features, label and model, and [`FactError`] for a
//! fact about the model (its feature width, its number of outputs) that the footers cannot
//! tell before training, [`FooterError`] for a footer that cannot be read and
//! [`ListingError`] for a data path that lists no files. A leaf: the listing, the footer
//! checks, the model's data facts and the driver's error type use it.

use ringflow_core::data::DataError;
use ringflow_core::data::local::{ListError, NotReadable};

use crate::planner::sql_planner::SqlPlanError;

/// Why a data file's Parquet footer could not be read, as the end of a sentence about the file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FooterError {
    /// A local file that is not a regular file, or cannot be opened.
    #[error(transparent)]
    NotReadable(#[from] NotReadable),
    /// Its store cannot be used or refused to tell its size (what the store said).
    #[error("{0}")]
    Store(String),
    /// Its bytes are not a Parquet file (what the Parquet reader said).
    #[error("is not a readable Parquet file: {0}")]
    NotParquet(String),
    /// The read did not finish within the read deadline (the sentence says so).
    #[error("{0}")]
    Deadline(String),
}

/// A column whose type cannot be a feature.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("has type {ty}; a feature must be a number or a list of numbers")]
pub struct NotNumeric {
    /// The column's Arrow type, as Arrow writes it.
    pub ty: String,
}

/// A schema that does not fit the spec and the model; the message follows the name of the
/// file (or "the output of data.sql") that holds the schema.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A column the spec names is missing (`key` names the setting).
    #[error("has no column `{column}` ({key}); its columns: {have}")]
    NoColumn {
        /// The missing column.
        column: String,
        /// The setting that names it (`data.features`, `data.label`, `data.image.column`).
        key: &'static str,
        /// The schema's columns, comma-separated.
        have: String,
    },
    /// A feature column that is not numeric.
    #[error("column `{column}` {source}")]
    Feature {
        /// The column.
        column: String,
        /// Its type.
        source: NotNumeric,
    },
    /// The image column does not hold bytes.
    #[error(
        "column `{column}` (data.image.column) has type {ty}; an image column must be binary \
         (the bytes of PNG or JPEG files)"
    )]
    NotImageBytes {
        /// `data.image.column`.
        column: String,
        /// Its Arrow type.
        ty: String,
    },
    /// The features give another number of values per row than the model takes.
    #[error("data.features give {width} values per row, but the model takes {inputs} inputs")]
    WidthNotInputs {
        /// Values per row.
        width: usize,
        /// The model's inputs.
        inputs: usize,
    },
    /// `data.shape` holds another number of values than the features give.
    #[error("data.shape {example:?} needs {values} values per row, but data.features give {width}")]
    ShapeNotWidth {
        /// `data.shape`.
        example: Vec<usize>,
        /// Its product.
        values: usize,
        /// Values per row the features give.
        width: usize,
    },
    /// The examples hold another number of values than the model takes.
    #[error(
        "{key} gives examples of shape {example:?} ({values} values), but the model takes \
         {inputs} inputs"
    )]
    ShapeNotInputs {
        /// `data.shape` or `data.image`.
        key: &'static str,
        /// The example's shape.
        example: Vec<usize>,
        /// Its product.
        values: usize,
        /// The model's inputs.
        inputs: usize,
    },
    /// The examples have another shape than the model takes.
    #[error(
        "{key} gives examples of shape {example:?}, but the model takes examples of shape \
         {input:?}"
    )]
    ShapeNotModel {
        /// `data.shape` or `data.image`.
        key: &'static str,
        /// The example's shape.
        example: Vec<usize>,
        /// The model's input shape.
        input: Vec<usize>,
    },
    /// A label of class names with a loss other than cross-entropy.
    #[error(
        "column `{column}` (data.label) holds strings, which are class names: they need \
         train.loss = \"cross_entropy\""
    )]
    NamesNeedCrossEntropy {
        /// `data.label`.
        column: String,
    },
    /// A label column that is neither numbers nor strings.
    #[error(
        "column `{column}` (data.label) has type {ty}; a label must be a number or a string \
         class"
    )]
    NotALabel {
        /// `data.label`.
        column: String,
        /// Its Arrow type.
        ty: String,
    },
}

/// Why the footers cannot tell a fact about the model before training (the model's builder
/// says so where it needs the fact).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FactError {
    /// The training split has no files.
    #[error("data.train has no files")]
    NoFiles,
    /// `data.sql` could not be planned on the first training file.
    #[error("data.sql cannot be planned on {file} ({source})")]
    Sql {
        /// The file.
        file: String,
        /// Why.
        source: SqlPlanError,
    },
    /// A feature column the schema lacks.
    #[error("data.features name the missing column `{column}`")]
    MissingFeature {
        /// The column.
        column: String,
    },
    /// A list column whose length is known only as rows are read.
    #[error(
        "data.features include the variable-length list column `{column}`, whose width the \
         driver does not know before reading"
    )]
    VariableLength {
        /// The column.
        column: String,
    },
    /// A feature column that is not numeric.
    #[error("the feature column `{column}` {source}")]
    Feature {
        /// The column.
        column: String,
        /// Its type.
        source: NotNumeric,
    },
    /// The label is made by `data.sql`, so the footers do not describe it.
    #[error(
        "the label `{label}` comes out of data.sql, so the driver cannot count its classes \
         before training"
    )]
    LabelFromSql {
        /// `data.label`.
        label: String,
    },
    /// The label holds class names, counted only while training.
    #[error(
        "the label column `{label}` holds class names, which the driver counts only while \
         training (data.label_classes would list them)"
    )]
    ClassNames {
        /// `data.label`.
        label: String,
    },
    /// A row group without statistics of the label column.
    #[error("{file} has no statistics of the column `{column}`")]
    NoStatistics {
        /// The file.
        file: String,
        /// The column.
        column: String,
    },
    /// A label value that is not a whole number ≥ 0.
    #[error("the column `{column}` of {file} holds {value}, not a class index")]
    NotClassIndex {
        /// The column.
        column: String,
        /// The file.
        file: String,
        /// The value its statistics record.
        value: f64,
    },
    /// The training split has no rows.
    #[error("the training split has no rows")]
    NoRows,
    /// A class index too large for this machine's `usize`.
    #[error("the label column `{label}` holds the class index {max}")]
    ClassIndexTooLarge {
        /// `data.label`.
        label: String,
        /// The index.
        max: u64,
    },
}

/// Why a data path lists no usable files; each message is a sentence about the path.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ListingError {
    /// The path or its store cannot be used.
    #[error(transparent)]
    Location(#[from] DataError),
    /// A `file://` URL that names no file-system path.
    #[error("{path} is not a file path")]
    NotAFilePath {
        /// The URL.
        path: String,
    },
    /// A local path that cannot be listed.
    #[error(transparent)]
    Local(#[from] ListError),
    /// A glob that does not parse.
    #[error("bad glob {path:?}: {reason}")]
    BadGlob {
        /// The glob.
        path: String,
        /// What the glob parser said.
        reason: String,
    },
    /// A glob that matches no (regular) files.
    #[error("the glob {path:?} matches no {regular}files{skipped}")]
    GlobMatchesNone {
        /// The glob as written.
        path: String,
        /// `"regular "` where entries were skipped as not regular, else empty.
        regular: &'static str,
        /// `" (skipped …)"` naming what was skipped, else empty.
        skipped: String,
    },
    /// A local directory without (regular) Parquet files.
    #[error("the directory {path:?} holds no {regular}.parquet files{skipped}")]
    EmptyDirectory {
        /// The directory as written.
        path: String,
        /// `"regular "` where entries were skipped as not regular, else empty.
        regular: &'static str,
        /// `" (skipped …)"` naming what was skipped, else empty.
        skipped: String,
    },
    /// An object-store path without Parquet objects.
    #[error("{path:?} does not exist or holds no .parquet files")]
    NoObjects {
        /// The path.
        path: String,
    },
}
