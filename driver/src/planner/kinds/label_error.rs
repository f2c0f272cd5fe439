//! [`LabelError`]: why the label pass ([`super::labels`]) refused a job's labels. A leaf, so
//! that the driver's error type can hold it.

use datafusion::arrow::datatypes::DataType;
use ringflow_core::data::stats::MAX_CLASSES;
use ringflow_core::wire::MAX_CLASS_NAME_BYTES;

use crate::planner::count_error::CountError;

/// Why the label pass refused the data; each message is one sentence naming the column and,
/// where it is one row group's, the file.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// A row group could not be read, or the query failed over it.
    #[error("{site}: reading the labels: {source}")]
    Read {
        /// `data.train: <file> (row group N)`.
        site: String,
        /// Why.
        source: CountError,
    },
    /// The query of the distinct labels could not be planned against a file's schema.
    #[error("{file}: planning the query of the distinct labels: {source}")]
    Plan {
        /// The file.
        file: String,
        /// Why.
        source: crate::planner::sql_planner::SqlPlanError,
    },
    /// More distinct classes than a model may have.
    #[error(
        "data.label: column `{column}` has more than {MAX_CLASSES} distinct values (counted \
         up to {site}); is it really a class?"
    )]
    TooMany {
        /// `data.label`.
        column: String,
        /// Where the bound was passed.
        site: String,
    },
    /// A class name longer than the bound.
    #[error(
        "{site}: column `{column}` holds a class name of {bytes} bytes, more than the \
         {MAX_CLASS_NAME_BYTES} a class name may have"
    )]
    NameTooLong {
        /// `data.label`.
        column: String,
        /// The file and row group.
        site: String,
        /// Its length.
        bytes: usize,
    },
    /// Neither class indices nor names.
    #[error(
        "{site}: the label column `{column}` holds {data_type} values, which are neither class \
         indices (integers) nor class names (strings), as cross_entropy needs"
    )]
    NotAClass {
        /// `data.label`.
        column: String,
        /// The file and row group.
        site: String,
        /// Its Arrow type.
        data_type: DataType,
    },
    /// The training split holds no label at all.
    #[error("data.train: the label column `{column}` holds no value in any row")]
    NoLabels {
        /// `data.label`.
        column: String,
    },
    /// The classes counted are not as many as the model's outputs.
    #[error(
        "data.label: column `{column}` holds {classes} classes in data.train, but the model \
         has {outputs} outputs"
    )]
    NotOutputs {
        /// `data.label`.
        column: String,
        /// Classes counted.
        classes: usize,
        /// The model's outputs.
        outputs: usize,
    },
    /// A test class the model has no output for.
    #[error(
        "data.test: {site} holds the class `{class}` in column `{column}`, which data.train \
         never has, so the model has no output for it; train on rows that hold it, leave it \
         out of data.test, or list every class in data.label_classes"
    )]
    Unseen {
        /// `data.label`.
        column: String,
        /// The class.
        class: String,
        /// The file and row group.
        site: String,
    },
}
