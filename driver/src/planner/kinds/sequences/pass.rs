//! The passes over a split of token sequences, on every core of the driver: the statistics
//! pass over the training split ([`count`]) and the check of the test split against what it
//! decided ([`check_test`]). Each reads only the sequence and label columns, checks every row
//! by the sequence rules, and names a bad row by file and row.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use datafusion::arrow::record_batch::RecordBatch;
use ringflow_core::data::Preprocessing;
use ringflow_core::data::partition::PartitionReader;
use ringflow_core::data::sequences::{Elements, ListColumn, ListColumnError, SequenceRules};
use ringflow_core::data::stats::MAX_CLASSES;
use ringflow_core::data::vocab::{MAX_DISTINCT_TOKENS, TokenCounts, UNK, Vocabulary};
use ringflow_core::spec::JobSpec;
use ringflow_core::wire::MAX_CLASS_NAME_BYTES;

use super::{SequenceColumns, SequenceCounts, SequenceError};
use crate::planner::split::{RowGroup, Split};

/// What a pass over a split does with the rows it reads.
#[derive(Clone, Copy)]
enum Pass<'a> {
    /// The training split's statistics pass: counts the tokens and the classes.
    Count,
    /// Another split checked against what training decided: every row by the training
    /// split's rules, every class one the model has an output for; with the vocabulary, the
    /// string tokens it lacks are counted.
    Check(&'a Outputs, Option<&'a Vocabulary>),
}

/// The classes a model has outputs for.
enum Outputs {
    /// Class names (string labels).
    Names(BTreeSet<String>),
    /// Integer classes `0..n`.
    Count(usize),
}

/// Reads the sequence and label columns of every row group of `split` on every core of the
/// driver, checking each row, and merges what each found.
pub fn count(
    spec: &JobSpec,
    split: &Split,
    columns: &SequenceColumns,
) -> Result<SequenceCounts, SequenceError> {
    read_split("data.train", spec, split, columns, Pass::Count)
}

/// Checks every row of the test split `split` before training, as [`count`] checks the
/// training split's (lengths, empty and null sequences, token and class name lengths), and
/// that each of its classes is one of the model's `outputs`: one of the classes of
/// `preprocessing` (string labels), or an integer below `outputs`. Returns the split's
/// counts, its tokens outside the vocabulary among them.
pub fn check_test(
    spec: &JobSpec,
    split: &Split,
    columns: &SequenceColumns,
    preprocessing: &Preprocessing,
    outputs: usize,
) -> Result<SequenceCounts, SequenceError> {
    let outputs = match &preprocessing.classes {
        Some(names) => Outputs::Names(names.iter().cloned().collect()),
        None => Outputs::Count(outputs),
    };
    let pass = Pass::Check(&outputs, preprocessing.vocabulary.as_ref());
    read_split("data.test", spec, split, columns, pass)
}

/// The pass `pass` over every row group of split `key`, on every core of the driver.
fn read_split(
    key: &str,
    spec: &JobSpec,
    split: &Split,
    columns: &SequenceColumns,
    pass: Pass,
) -> Result<SequenceCounts, SequenceError> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let total = Mutex::new(Ok(SequenceCounts::default()));
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(split.groups.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut mine = SequenceCounts::default();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(group) = split.groups.get(i) else {
                        break;
                    };
                    let read = count_group((key, spec), group, (columns, pass), &mut mine);
                    if let Err(e) = read {
                        stop.store(true, Ordering::Relaxed);
                        *total.lock().expect("not poisoned") = Err(e);
                        return;
                    }
                }
                let mut total = total.lock().expect("not poisoned");
                if let Ok(t) = total.as_mut()
                    && let Err(e) = t.merge(mine)
                {
                    *total = Err(e.at(key));
                }
            });
        }
    });
    total.into_inner().expect("not poisoned")
}

fn count_group(
    (key, spec): (&str, &JobSpec),
    group: &RowGroup,
    (columns, pass): (&SequenceColumns, Pass),
    into: &mut SequenceCounts,
) -> Result<(), SequenceError> {
    let mut read = || {
        let wanted = vec![columns.column.clone(), spec.data.label.clone()];
        let mut reader = PartitionReader::open(&group.file_rows(), &wanted)?;
        while let Some((batch, first_row)) = reader.next_batch()? {
            count_batch(spec, &batch, first_row, (columns, pass), into)?;
        }
        Ok(())
    };
    read().map_err(|e: SequenceError| e.at(format!("{key}: {}", group.path)))
}

fn count_batch(
    spec: &JobSpec,
    batch: &RecordBatch,
    first_row: u64,
    (columns, pass): (&SequenceColumns, Pass),
    into: &mut SequenceCounts,
) -> Result<(), SequenceError> {
    let data = &spec.data;
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| SequenceError::MissingColumn(name.to_string()))
    };
    let tokens = ListColumn::read(column(&columns.column)?, first_row)
        .map_err(|source| not_a_list(&columns.column, source))?;
    let label = column(&data.label)?;
    let tags = if columns.per_step {
        let read = ListColumn::read(label, first_row);
        Some(read.map_err(|source| not_a_list(&data.label, source))?)
    } else {
        None
    };
    let rules = SequenceRules::of(data);
    for row in 0..tokens.rows() {
        let at = first_row + row as u64;
        let labels = tags.as_ref().map(|t| (data.label.as_str(), t.len(row)));
        let steps = rules
            .steps(at, (&columns.column, tokens.len(row)), labels)
            .map_err(SequenceError::Rules)?;
        let kept = tokens.range(row).start..tokens.range(row).start + steps;
        let max_token = data.vocab.max_token_bytes;
        add_tokens(
            tokens.elements(),
            kept,
            (at, &columns.column),
            (max_token, pass),
            into,
        )?;
        if let Some(t) = &tags {
            let kept = t.range(row).start..t.range(row).start + steps;
            add_labels(t.elements(), kept, (at, &data.label), pass, into)?;
        }
        into.sequences += 1;
        into.tokens += steps as u64;
        into.longest = into.longest.max(steps);
    }
    if tags.is_none() {
        add_scalar_labels(label, first_row, (&data.label, pass), into)?;
    }
    Ok(())
}

/// Counts (the training split's pass; another split's counts those the vocabulary lacks) the
/// string tokens of `range` (of row `row` of `column`), each at most `max_token` bytes
/// (`data.vocab.max_token_bytes`), or notes the largest integer id.
fn add_tokens(
    elements: &Elements,
    range: std::ops::Range<usize>,
    (row, column): (u64, &str),
    (max_token, pass): (usize, Pass),
    into: &mut SequenceCounts,
) -> Result<(), SequenceError> {
    match elements {
        Elements::Strings(s) => {
            if let Pass::Check(_, Some(vocabulary)) = pass {
                let unknown = s[range.clone()]
                    .iter()
                    .flatten()
                    .filter(|t| vocabulary.id(t) == UNK)
                    .count();
                into.unknown_tokens += unknown as u64;
            }
            let counted = matches!(pass, Pass::Count);
            let mut counts =
                counted.then(|| into.stats.tokens.get_or_insert_with(TokenCounts::default));
            for t in &s[range] {
                let t = t.as_deref().ok_or_else(|| null_element(row, column))?;
                if t.len() > max_token {
                    return Err(SequenceError::TokenTooLong {
                        row,
                        column: column.to_string(),
                        bytes: t.len(),
                        max: max_token,
                    });
                }
                if let Some(counts) = counts.as_mut() {
                    counts.add(t, MAX_DISTINCT_TOKENS)?;
                }
            }
        }
        Elements::Ids(ids) => {
            let most = largest(&ids[range], (row, column), "token id")?;
            into.max_id = into.max_id.max(most);
        }
    }
    Ok(())
}

/// Collects (the training split) or checks against the model's outputs (another split) the
/// labels of `range`, of row `row` of `column`.
fn add_labels(
    elements: &Elements,
    range: std::ops::Range<usize>,
    (row, column): (u64, &str),
    pass: Pass,
    into: &mut SequenceCounts,
) -> Result<(), SequenceError> {
    if let Pass::Check(outputs, _) = pass {
        return check_labels(elements, range, (row, column), outputs);
    }
    match elements {
        Elements::Strings(s) => {
            let classes = into.stats.labels.get_or_insert_with(BTreeSet::new);
            for t in &s[range] {
                let t = t.as_deref().ok_or_else(|| null_element(row, column))?;
                if t.len() > MAX_CLASS_NAME_BYTES {
                    return Err(SequenceError::ClassNameTooLong {
                        row,
                        column: column.to_string(),
                        bytes: t.len(),
                    });
                }
                if !classes.contains(t) {
                    if classes.len() >= MAX_CLASSES {
                        return Err(SequenceError::TooManyClasses {
                            column: column.to_string(),
                        });
                    }
                    classes.insert(t.to_string());
                }
            }
        }
        Elements::Ids(ids) => {
            let most = largest(&ids[range], (row, column), "class")?;
            into.max_label = into.max_label.max(most);
        }
    }
    Ok(())
}

/// Checks that every label of `range` (of row `row` of `column`) is one of `outputs`.
fn check_labels(
    elements: &Elements,
    range: std::ops::Range<usize>,
    (row, column): (u64, &str),
    outputs: &Outputs,
) -> Result<(), SequenceError> {
    let refuse = |class: String, classes: usize| {
        Err(SequenceError::UnknownClass {
            row,
            column: column.to_string(),
            class,
            classes,
        })
    };
    match (elements, outputs) {
        (Elements::Strings(s), Outputs::Names(names)) => {
            for t in &s[range] {
                let t = t.as_deref().ok_or_else(|| null_element(row, column))?;
                if !names.contains(t) {
                    return refuse(format!("{t:?}"), names.len());
                }
            }
        }
        (Elements::Ids(ids), Outputs::Count(n)) => {
            if let Some(most) = largest(&ids[range], (row, column), "class")?
                && most >= *n as u64
            {
                return refuse(most.to_string(), *n);
            }
        }
        // The test split's labels are of another kind than the training split's: the schema
        // check names that.
        _ => {}
    }
    Ok(())
}

/// The label of a sequence classification: string classes, or integer class indices.
fn add_scalar_labels(
    label: &datafusion::arrow::array::ArrayRef,
    first_row: u64,
    (column, pass): (&str, Pass),
    into: &mut SequenceCounts,
) -> Result<(), SequenceError> {
    let values = Elements::read(label).map_err(|found| SequenceError::NotClasses {
        column: column.to_string(),
        found,
    })?;
    for row in 0..values.len() {
        let at = first_row + row as u64;
        add_labels(&values, row..row + 1, (at, column), pass, into)?;
    }
    Ok(())
}

/// The largest of a row's integers (`what` each is, for the error on a null or negative one).
fn largest(
    values: &[Option<i64>],
    (row, column): (u64, &str),
    what: &'static str,
) -> Result<Option<u64>, SequenceError> {
    let mut most = None;
    for v in values {
        let v = v.ok_or_else(|| null_element(row, column))?;
        let v = u64::try_from(v).map_err(|_| SequenceError::Negative {
            row,
            column: column.to_string(),
            what,
            value: v,
        })?;
        most = most.max(Some(v));
    }
    Ok(most)
}

/// The error of `column`, which the list reader could not read as lists (`message`).
fn not_a_list(column: &str, source: ListColumnError) -> SequenceError {
    SequenceError::NotAList {
        column: column.to_string(),
        source,
    }
}

fn null_element(row: u64, column: &str) -> SequenceError {
    SequenceError::NullElement {
        row,
        column: column.to_string(),
    }
}
