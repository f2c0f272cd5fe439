//! Token sequences in Arrow columns: which column types are sequences ([`TokenType`]), a
//! uniform view of a list column's rows ([`ListColumn`]), and the checks every reader applies
//! to a row's length ([`SequenceRules`]), so that the driver's statistics pass and the
//! executors' batches refuse the same rows with the same sentence ([`LengthError`]).

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};

pub use super::sequence_error::{ElementsError, LengthError, ListColumnError};
use crate::data::is_string;
use crate::spec::{DataSpec, OnTooLong};

/// What the elements of a sequence column are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// Strings, mapped to ids by a vocabulary.
    Strings,
    /// Integers, used as ids as they are.
    Ids,
}

impl TokenType {
    /// The element type of a `list` or `large_list` column of strings or integers.
    pub fn of_list(t: &DataType) -> Option<TokenType> {
        let element = match t {
            DataType::List(f) | DataType::LargeList(f) => f.data_type(),
            _ => return None,
        };
        if is_string(element) {
            Some(TokenType::Strings)
        } else if element.is_integer() {
            Some(TokenType::Ids)
        } else {
            None
        }
    }
}

/// The rows of a list column of strings or integers, each as a range of its elements.
pub struct ListColumn {
    offsets: Vec<usize>,
    values: Elements,
}

/// The elements of a [`ListColumn`], all rows together.
pub enum Elements {
    /// String elements.
    Strings(Vec<Option<String>>),
    /// Integer elements (as `i64`).
    Ids(Vec<Option<i64>>),
}

impl Elements {
    /// The values of a column of strings or integers (a list column's elements, or a scalar
    /// label column: one per row); the error is the type it has instead, as "T, not strings
    /// or integers".
    pub fn read(values: &ArrayRef) -> Result<Elements, ElementsError> {
        if is_string(values.data_type()) {
            let utf8 = datafusion::arrow::compute::cast(values, &DataType::Utf8).map_err(|e| {
                ElementsError::Strings {
                    reason: e.to_string(),
                }
            })?;
            let s = utf8.as_string::<i32>();
            Ok(Elements::Strings(
                s.iter().map(|v| v.map(str::to_string)).collect(),
            ))
        } else if values.data_type().is_integer() {
            let ints = datafusion::arrow::compute::cast(values, &DataType::Int64).map_err(|e| {
                ElementsError::Integers {
                    reason: e.to_string(),
                }
            })?;
            Ok(Elements::Ids(
                ints.as_primitive::<Int64Type>().iter().collect(),
            ))
        } else {
            Err(ElementsError::NotTokens {
                ty: values.data_type().clone(),
            })
        }
    }

    /// How many values there are.
    pub fn len(&self) -> usize {
        match self {
            Elements::Strings(v) => v.len(),
            Elements::Ids(v) => v.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ListColumn {
    /// Reads `column` (a list of strings or integers), whose first row is row `first_row` of
    /// its file; an error sentence otherwise, or for a null row, naming the row in the file.
    pub fn read(column: &ArrayRef, first_row: u64) -> Result<ListColumn, ListColumnError> {
        let (offsets, values): (Vec<usize>, ArrayRef) = match column.data_type() {
            DataType::List(_) => {
                let list = column.as_list::<i32>();
                let o = list.value_offsets().iter().map(|&o| o as usize).collect();
                (o, list.values().clone())
            }
            DataType::LargeList(_) => {
                let list = column.as_list::<i64>();
                let o = list.value_offsets().iter().map(|&o| o as usize).collect();
                (o, list.values().clone())
            }
            t => return Err(ListColumnError::NotList { ty: t.clone() }),
        };
        if let Some(row) = (0..column.len()).find(|&i| column.is_null(i)) {
            return Err(ListColumnError::NullRow {
                row: first_row + row as u64,
            });
        }
        let values = Elements::read(&values).map_err(ListColumnError::Elements)?;
        Ok(ListColumn { offsets, values })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Elements of row `row`.
    pub fn len(&self, row: usize) -> usize {
        self.offsets[row + 1] - self.offsets[row]
    }

    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// The range of row `row`'s elements in [`ListColumn::elements`].
    pub fn range(&self, row: usize) -> std::ops::Range<usize> {
        self.offsets[row]..self.offsets[row + 1]
    }

    /// Every row's elements together.
    pub fn elements(&self) -> &Elements {
        &self.values
    }
}

/// How a job treats a sequence's length: the longest it accepts and what a longer one does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceRules {
    /// `data.max_length`.
    pub max_length: usize,
    /// `data.on_too_long`.
    pub on_too_long: OnTooLong,
}

impl SequenceRules {
    /// The rules of `data`.
    pub fn of(data: &DataSpec) -> SequenceRules {
        SequenceRules {
            max_length: data.max_length(),
            on_too_long: data.on_too_long,
        }
    }

    /// The steps of a row with `tokens` tokens and, for tagging, `labels` labels that a batch
    /// keeps; an error sentence (naming `row` and the lengths) for an empty sequence, labels of
    /// another length than the tokens, or a sequence longer than `max_length` when it must
    /// not be truncated. `tokens` and `labels` name the columns.
    pub fn steps(
        &self,
        row: u64,
        (tokens_column, tokens): (&str, usize),
        labels: Option<(&str, usize)>,
    ) -> Result<usize, LengthError> {
        if tokens == 0 {
            return Err(LengthError::Empty {
                row,
                column: tokens_column.to_string(),
            });
        }
        if let Some((label_column, n)) = labels
            && n != tokens
        {
            return Err(LengthError::LabelCount {
                row,
                column: tokens_column.to_string(),
                tokens,
                label_column: label_column.to_string(),
                labels: n,
            });
        }
        if tokens > self.max_length {
            return match self.on_too_long {
                OnTooLong::Truncate => Ok(self.max_length),
                OnTooLong::Fail => Err(LengthError::TooLong {
                    row,
                    column: tokens_column.to_string(),
                    tokens,
                    max_length: self.max_length,
                }),
            };
        }
        Ok(tokens)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ListBuilder, StringBuilder};

    use super::*;

    #[test]
    fn list_columns_read_rows_of_strings() {
        let mut b = ListBuilder::new(StringBuilder::new());
        for row in [&["東京", "に"][..], &["行く"]] {
            for t in row {
                b.values().append_value(t);
            }
            b.append(true);
        }
        let col: ArrayRef = Arc::new(b.finish());
        assert_eq!(
            TokenType::of_list(col.data_type()),
            Some(TokenType::Strings)
        );
        let list = ListColumn::read(&col, 0).unwrap();
        assert_eq!((list.rows(), list.len(0), list.len(1)), (2, 2, 1));
        let Elements::Strings(s) = list.elements() else {
            panic!("strings")
        };
        assert_eq!(s[list.range(1)], [Some("行く".to_string())]);
    }

    /// Regression (issue 39): a null list at row 40,005 of a file, in a batch starting at row
    /// 40,000, was "row 5 of the batch"; it is the file's row, as in the other row errors.
    #[test]
    fn a_null_list_is_named_by_its_row_in_the_file() {
        let mut b = ListBuilder::new(StringBuilder::new());
        for row in 0..8 {
            if row != 5 {
                b.values().append_value("t");
            }
            b.append(row != 5);
        }
        let col: ArrayRef = Arc::new(b.finish());
        let Err(e) = ListColumn::read(&col, 40_000) else {
            panic!("a null row is refused")
        };
        assert_eq!(
            e.to_string(),
            "is null at row 40005 (0-based); every row needs a list, so drop the row or give it \
             one"
        );
    }

    #[test]
    fn lengths_are_checked_with_row_and_columns_named() {
        let rules = SequenceRules {
            max_length: 4,
            on_too_long: OnTooLong::Fail,
        };
        assert_eq!(rules.steps(3, ("tokens", 4), Some(("tags", 4))), Ok(4));
        let e = rules
            .steps(7, ("tokens", 3), Some(("tags", 2)))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("row 7 (0-based): column `tokens` has 3 tokens but column `tags` has 2"),
            "{e}"
        );
        let e = rules.steps(8, ("tokens", 0), None).unwrap_err().to_string();
        assert!(e.contains("row 8") && e.contains("is empty"), "{e}");
        let e = rules.steps(9, ("tokens", 5), None).unwrap_err().to_string();
        assert!(
            e.contains("row 9") && e.contains("5 tokens, more than data.max_length = 4"),
            "{e}"
        );
        let truncate = SequenceRules {
            on_too_long: OnTooLong::Truncate,
            ..rules
        };
        assert_eq!(truncate.steps(9, ("tokens", 5), Some(("tags", 5))), Ok(4));
    }
}
