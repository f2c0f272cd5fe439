//! Why a column holds no token sequences or a row breaks the sequence rules: [`ElementsError`],
//! [`ListColumnError`] and [`LengthError`], whose sentences the driver's statistics pass and
//! the executors' batches share. A leaf: the sequence readers use it.

use datafusion::arrow::datatypes::DataType;

/// Values that are not strings or integers, as the end of a sentence that says what a column
/// holds: "Float32, not strings or integers".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ElementsError {
    /// String values that cannot be cast to UTF-8 strings.
    #[error("strings that cannot be read: {reason}")]
    Strings {
        /// What Arrow said.
        reason: String,
    },
    /// Integer values that cannot be cast to `i64`.
    #[error("integers that cannot be read: {reason}")]
    Integers {
        /// What Arrow said.
        reason: String,
    },
    /// Values of another type.
    #[error("{ty}, not strings or integers")]
    NotTokens {
        /// Their Arrow type.
        ty: DataType,
    },
}

/// A column that is not a list of strings or integers with a list in every row, as the end of
/// a sentence about the column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ListColumnError {
    /// The column is not a list column.
    #[error("has type {ty}, not a list")]
    NotList {
        /// Its Arrow type.
        ty: DataType,
    },
    /// A row holds no list.
    #[error(
        "is null at row {row} (0-based); every row needs a list, so drop the row or give it one"
    )]
    NullRow {
        /// The row, within its file.
        row: u64,
    },
    /// The lists hold neither strings nor integers.
    #[error("holds lists of {0}")]
    Elements(#[source] ElementsError),
}

/// A row whose lengths break the sequence rules; the sentence names the row and the columns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LengthError {
    /// A sequence with no tokens.
    #[error(
        "row {row} (0-based): the sequence in column `{column}` is empty; every sequence needs \
         at least one token"
    )]
    Empty {
        /// The row, within its file.
        row: u64,
        /// The sequence column.
        column: String,
    },
    /// Tags of another length than the tokens.
    #[error(
        "row {row} (0-based): column `{column}` has {tokens} tokens but column \
         `{label_column}` has {labels} labels; tagging needs one label per token"
    )]
    LabelCount {
        /// The row, within its file.
        row: u64,
        /// The sequence column.
        column: String,
        /// Its tokens in the row.
        tokens: usize,
        /// The label column.
        label_column: String,
        /// Its labels in the row.
        labels: usize,
    },
    /// A sequence longer than `data.max_length`, which must not be truncated.
    #[error(
        "row {row} (0-based): the sequence in column `{column}` has {tokens} tokens, more than \
         data.max_length = {max_length}; raise data.max_length or set data.on_too_long = \
         \"truncate\""
    )]
    TooLong {
        /// The row, within its file.
        row: u64,
        /// The sequence column.
        column: String,
        /// Its tokens in the row.
        tokens: usize,
        /// `data.max_length`.
        max_length: usize,
    },
}
