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
//! test row stops the job before training rather than after it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use ringflow_ml::nn::SequenceFacts;
use ringflow_proto::data::is_string;
use ringflow_proto::data::partition::PartitionReader;
use ringflow_proto::data::sequences::{Elements, ListColumn, SequenceRules, TokenType};
use ringflow_proto::data::stats::MAX_CLASSES;
use ringflow_proto::data::vocab::{MAX_DISTINCT_TOKENS, TokenCounts};
use ringflow_proto::data::{DataStats, Preprocessing};
use ringflow_proto::metrics::entities::TagScheme;
use ringflow_proto::spec::{JobSpec, MAX_TOKEN_BYTES, Metric};
use ringflow_proto::wire::MAX_CLASS_NAME_BYTES;

use super::split::{LabelType, RowGroup, Split};
use crate::error::{DriverError, Result};

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
) -> std::result::Result<Option<SequenceColumns>, String> {
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
        return Err(format!(
            "data.features: the token sequence column `{column}` must be the only feature \
             (it has {} columns)",
            data.features.len()
        ));
    }
    if data.sql.is_some() {
        return Err(format!(
            "data.sql with the token sequence column `{column}` is not supported: prepare the \
             sequences in the Parquet files"
        ));
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

/// What a pass over a split does with the rows it reads.
#[derive(Clone, Copy)]
enum Pass<'a> {
    /// The training split's statistics pass: counts the tokens and the classes.
    Count,
    /// Another split checked against what training decided: every row by the training
    /// split's rules, every class one the model has an output for.
    Check(&'a Outputs),
}

/// The classes a model has outputs for.
enum Outputs {
    /// Class names (string labels).
    Names(BTreeSet<String>),
    /// Integer classes `0..n`.
    Count(usize),
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
}

impl SequenceCounts {
    fn merge(&mut self, other: SequenceCounts) -> std::result::Result<(), String> {
        self.stats.merge(other.stats).map_err(|e| e.to_string())?;
        self.max_id = self.max_id.max(other.max_id);
        self.max_label = self.max_label.max(other.max_label);
        self.sequences += other.sequences;
        self.tokens += other.tokens;
        self.longest = self.longest.max(other.longest);
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
    pub fn outputs(&self, p: &Preprocessing) -> std::result::Result<usize, String> {
        match (&p.classes, self.max_label) {
            (Some(c), _) => Ok(c.len()),
            (None, Some(m)) => Ok(m as usize + 1),
            (None, None) => Err(empty_training_split()),
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

/// Reads the sequence and label columns of every row group of `split` on every core of the
/// driver, checking each row, and merges what each found.
pub fn count(spec: &JobSpec, split: &Split, columns: &SequenceColumns) -> Result<SequenceCounts> {
    read_split("data.train", spec, split, columns, Pass::Count)
}

/// Checks every row of the test split `split` before training, as [`count`] checks the
/// training split's (lengths, empty and null sequences, token and class name lengths), and
/// that each of its classes is one of the model's `outputs`: one of the classes of
/// `preprocessing` (string labels), or an integer below `outputs`.
pub fn check_test(
    spec: &JobSpec,
    split: &Split,
    columns: &SequenceColumns,
    preprocessing: &Preprocessing,
    outputs: usize,
) -> Result<()> {
    let outputs = match &preprocessing.classes {
        Some(names) => Outputs::Names(names.iter().cloned().collect()),
        None => Outputs::Count(outputs),
    };
    read_split("data.test", spec, split, columns, Pass::Check(&outputs)).map(|_| ())
}

/// The pass `pass` over every row group of split `key`, on every core of the driver.
fn read_split(
    key: &str,
    spec: &JobSpec,
    split: &Split,
    columns: &SequenceColumns,
    pass: Pass,
) -> Result<SequenceCounts> {
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
                    *total = Err(DriverError::Data(format!("{key}: {e}")));
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
) -> Result<()> {
    let fail = |m: String| DriverError::Data(format!("{key}: {}: {m}", group.path));
    let partition = group.file_rows();
    let wanted = vec![columns.column.clone(), spec.data.label.clone()];
    let mut reader = PartitionReader::open(&partition, &wanted).map_err(|e| fail(e.to_string()))?;
    while let Some((batch, first_row)) = reader.next_batch().map_err(|e| fail(e.to_string()))? {
        count_batch(spec, &batch, first_row, (columns, pass), into).map_err(fail)?;
    }
    Ok(())
}

fn count_batch(
    spec: &JobSpec,
    batch: &RecordBatch,
    first_row: u64,
    (columns, pass): (&SequenceColumns, Pass),
    into: &mut SequenceCounts,
) -> std::result::Result<(), String> {
    let data = &spec.data;
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| format!("has no column `{name}`"))
    };
    let tokens = ListColumn::read(column(&columns.column)?, first_row)
        .map_err(|m| format!("column `{}` {m}", columns.column))?;
    let label = column(&data.label)?;
    let tags = if columns.per_step {
        let read = ListColumn::read(label, first_row);
        Some(read.map_err(|m| format!("column `{}` {m}", data.label))?)
    } else {
        None
    };
    let rules = SequenceRules::of(data);
    for row in 0..tokens.rows() {
        let at = first_row + row as u64;
        let labels = tags.as_ref().map(|t| (data.label.as_str(), t.len(row)));
        let steps = rules.steps(at, (&columns.column, tokens.len(row)), labels)?;
        let kept = tokens.range(row).start..tokens.range(row).start + steps;
        let max_token = data.vocab.max_token_bytes;
        let counted = matches!(pass, Pass::Count);
        add_tokens(
            tokens.elements(),
            kept,
            (at, &columns.column),
            (max_token, counted),
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

/// Counts (`counted`; else only checks) the string tokens of `range` (of row `row` of
/// `column`), each at most `max_token` bytes (`data.vocab.max_token_bytes`), or notes the
/// largest integer id.
fn add_tokens(
    elements: &Elements,
    range: std::ops::Range<usize>,
    (row, column): (u64, &str),
    (max_token, counted): (usize, bool),
    into: &mut SequenceCounts,
) -> std::result::Result<(), String> {
    match elements {
        Elements::Strings(s) => {
            let mut counts =
                counted.then(|| into.stats.tokens.get_or_insert_with(TokenCounts::default));
            for t in &s[range] {
                let t = t.as_deref().ok_or_else(|| null_element(row, column))?;
                if t.len() > max_token {
                    return Err(format!(
                        "row {row} (0-based): column `{column}` holds a token of {} bytes, more \
                         than data.vocab.max_token_bytes = {max_token}; split or shorten such \
                         tokens, or raise data.vocab.max_token_bytes (at most {MAX_TOKEN_BYTES})",
                        t.len()
                    ));
                }
                if let Some(counts) = counts.as_mut() {
                    counts
                        .add(t, MAX_DISTINCT_TOKENS)
                        .map_err(|e| e.to_string())?;
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
) -> std::result::Result<(), String> {
    if let Pass::Check(outputs) = pass {
        return check_labels(elements, range, (row, column), outputs);
    }
    match elements {
        Elements::Strings(s) => {
            let classes = into.stats.labels.get_or_insert_with(BTreeSet::new);
            for t in &s[range] {
                let t = t.as_deref().ok_or_else(|| null_element(row, column))?;
                if t.len() > MAX_CLASS_NAME_BYTES {
                    return Err(class_name_too_long(row, column, t.len()));
                }
                if !classes.contains(t) {
                    if classes.len() >= MAX_CLASSES {
                        return Err(format!(
                            "column `{column}` has more than {MAX_CLASSES} distinct labels; is it really a tag?"
                        ));
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
) -> std::result::Result<(), String> {
    let refuse = |class: String, classes: usize| {
        Err(format!(
            "row {row} (0-based): column `{column}` holds the class {class}, not one of the \
             {classes} classes the model has outputs for (those of data.train, or \
             data.label_classes); train on rows that hold it, or leave it out of data.test"
        ))
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
) -> std::result::Result<(), String> {
    let values = Elements::read(label)
        .map_err(|t| format!("column `{column}` (data.label) holds {t}; a class must be one"))?;
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
    what: &str,
) -> std::result::Result<Option<u64>, String> {
    let mut most = None;
    for v in values {
        let v = v.ok_or_else(|| null_element(row, column))?;
        let v = u64::try_from(v).map_err(|_| {
            format!("row {row} (0-based): column `{column}` holds the {what} {v}; it must be ≥ 0")
        })?;
        most = most.max(Some(v));
    }
    Ok(most)
}

/// The error of a class name (a tag, a string label) of `bytes` bytes in row `row` of
/// `column`, longer than [`MAX_CLASS_NAME_BYTES`].
fn class_name_too_long(row: u64, column: &str, bytes: usize) -> String {
    format!(
        "row {row} (0-based): column `{column}` holds a class name of {bytes} bytes, more than \
         the {MAX_CLASS_NAME_BYTES} bytes a class name may have"
    )
}

fn null_element(row: u64, column: &str) -> String {
    format!("row {row} (0-based): column `{column}` has a null element")
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
    let fail = |m: String| DriverError::Data(format!("{what}: {m}"));
    let [column] = data.features.as_slice() else {
        return Err(fail(format!(
            "the model reads token sequences, so data.features must name one column, not {}",
            data.features.len()
        )));
    };
    let field = schema
        .field_with_name(column)
        .map_err(|_| fail(format!("has no column `{column}` (data.features)")))?;
    if TokenType::of_list(field.data_type()).is_none() {
        return Err(fail(format!(
            "column `{column}` has type {}; the model reads token sequences, a list of strings \
             or of integers",
            field.data_type()
        )));
    }
    let label = match schema.field_with_name(&data.label) {
        Ok(f) => f.data_type(),
        Err(_) if !label_required => return Ok(LabelType::Absent),
        Err(_) => return Err(fail(format!("has no column `{}` (data.label)", data.label))),
    };
    let element = match (label, per_step) {
        (DataType::List(f) | DataType::LargeList(f), true) => f.data_type(),
        (t, false) if !matches!(t, DataType::List(_) | DataType::LargeList(_)) => t,
        (t, true) => {
            return Err(fail(format!(
                "column `{}` (data.label) has type {t}, but the model tags every token: the \
                 label must be a list with one tag per token",
                data.label
            )));
        }
        (t, false) => {
            return Err(fail(format!(
                "column `{}` (data.label) has type {t}, a label per token, but the model gives \
                 one output per sequence",
                data.label
            )));
        }
    };
    if is_string(element) {
        Ok(LabelType::String)
    } else if element.is_integer() {
        Ok(LabelType::Number)
    } else {
        Err(fail(format!(
            "column `{}` (data.label) holds {element}; a class must be a string or an integer",
            data.label
        )))
    }
}

/// The error of a sequence job whose training split has no rows.
fn empty_training_split() -> String {
    "data.train: the training split has no rows, so there are no sequences to train on or \
     labels to learn the classes of; point data.train at files that hold rows"
        .into()
}

/// Checks `train.metrics` against the job: `"entity_f1"` needs a tagger (`columns` per step)
/// whose tag classes are IOB2 names.
pub fn check_metrics(
    spec: &JobSpec,
    columns: Option<&SequenceColumns>,
    p: &Preprocessing,
) -> std::result::Result<(), String> {
    if !spec.train.metrics.contains(&Metric::EntityF1) {
        return Ok(());
    }
    if !columns.is_some_and(|c| c.per_step) {
        return Err(
            "train.metrics: \"entity_f1\" needs a tagger: a token sequence feature and a list \
             label with one tag per token"
                .into(),
        );
    }
    let Some(classes) = &p.classes else {
        // String tags with no classes: not one row was read.
        if columns.is_some_and(|c| c.string_labels) {
            return Err(empty_training_split());
        }
        return Err(format!(
            "train.metrics: \"entity_f1\" needs the tags of `{}` as names (O, B-<type>, \
             I-<type>), not integers",
            spec.data.label
        ));
    };
    TagScheme::parse(classes)
        .map(|_| ())
        .map_err(|e| format!("train.metrics: data.label `{}`: {e}", spec.data.label))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::Field;

    use super::*;

    fn list(t: DataType) -> DataType {
        DataType::List(Arc::new(Field::new_list_field(t, true)))
    }

    fn spec(features: &str, model: &str) -> JobSpec {
        let text = format!(
            "[data]\ntrain = \"t\"\nfeatures = {features}\nlabel = \"y\"\n[model]\n{model}\n"
        );
        JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap()
    }

    fn schema(x: DataType, y: DataType) -> Schema {
        Schema::new(vec![
            Field::new("x", x, false),
            Field::new("z", DataType::Float32, false),
            Field::new("y", y, false),
        ])
    }

    const MLP: &str = "kind = \"mlp\"\nlayers = [3, 2]";
    const EMBEDDING: &str = "kind = \"sequential\"\nlayers = [{ type = \"embedding\", dim = 4 }]";

    /// The memory estimate of the shipped tagger with `max_length`: activations per row.
    fn activations(max_length: usize) -> u64 {
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/data/hironsan-ner");
        let text = format!(
            "[data]\ntrain = \"{data}/train.parquet\"\nfeatures = [\"tokens\"]\nlabel = \
             \"tags\"\nmax_length = {max_length}\non_too_long = \"truncate\"\n[model]\nkind = \"sequential\"\nlayers = \
             [{{ type = \"embedding\", dim = 8 }}, {{ type = \"lstm\", hidden = 8 }}, {{ type = \
             \"linear\" }}]\n"
        );
        let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
        let plan = super::super::JobPlan::new(spec, &ringflow_ml::nn::ModelRegistry::default());
        plan.unwrap().footprint.unwrap().activations_per_row
    }

    #[test]
    fn the_memory_estimate_takes_the_longest_sentence_not_max_length() {
        // The corpus's longest sentence has 102 tokens: both estimates are for 102 steps.
        assert_eq!(activations(1024), activations(128));
        assert!(activations(50) < activations(128));
    }

    #[test]
    fn strings_are_tokens_and_integers_only_when_the_job_says_so() {
        let ints = schema(list(DataType::Int32), DataType::Int64);
        // A list of integers under an MLP is a feature vector, as before.
        assert_eq!(detect(&spec("[\"x\"]", MLP), &ints), Ok(None));
        let found = detect(&spec("[\"x\"]", EMBEDDING), &ints).unwrap().unwrap();
        assert_eq!((found.tokens, found.per_step), (TokenType::Ids, false));
        let tagged = schema(list(DataType::Int32), list(DataType::Utf8));
        let found = detect(&spec("[\"x\"]", MLP), &tagged).unwrap().unwrap();
        assert!(found.per_step && found.string_labels);
        let strings = schema(list(DataType::Utf8), DataType::Utf8);
        let found = detect(&spec("[\"x\"]", MLP), &strings).unwrap().unwrap();
        assert_eq!((found.tokens, found.per_step), (TokenType::Strings, false));
        let e = detect(&spec("[\"x\", \"z\"]", MLP), &strings).unwrap_err();
        assert!(e.contains("`x` must be the only feature"), "{e}");
    }

    /// Regression (issue 39): an empty training split of a tagger with `"entity_f1"` said the
    /// tags "need to be names, not integers"; it says the split has no rows. Integer tags are
    /// still told to be names.
    #[test]
    fn an_empty_tagged_split_is_called_empty_not_integer_tags() {
        let text = format!(
            "[data]\ntrain = \"t\"\nfeatures = [\"x\"]\nlabel = \"y\"\n[model]\n{EMBEDDING}\n\
             [train]\nmetrics = [\"entity_f1\"]\n"
        );
        let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
        let columns = |string_labels| SequenceColumns {
            column: "x".into(),
            tokens: TokenType::Strings,
            per_step: true,
            string_labels,
        };
        let empty = Preprocessing::default();
        let e = check_metrics(&spec, Some(&columns(true)), &empty).unwrap_err();
        assert!(
            e.starts_with("data.train: the training split has no rows") && !e.contains("integers"),
            "{e}"
        );
        let e = check_metrics(&spec, Some(&columns(false)), &empty).unwrap_err();
        assert!(
            e.contains("as names (O, B-<type>, I-<type>), not integers"),
            "{e}"
        );
        let counts = SequenceCounts::default();
        assert_eq!(counts.outputs(&empty), Err(empty_training_split()));
    }
}
