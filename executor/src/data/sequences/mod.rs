//! Token sequences: record batches to token ids and labels ([`SequenceConverter`], the kind's
//! converter), rows of different lengths ([`Sequence`]) padded into a batch only as far as its
//! own longest ([`pad`]), the length buckets that keep that padding small ([`BucketPool`]), and
//! how an epoch stream draws them ([`draw`]).
//!
//! A batch of sequences is `[n, T]` token ids with `T` its longest sequence; padding is id
//! [`PAD`]. Its labels are those of the real tokens only (tagging), in order, with the flat
//! index of each real token in `[n·T]` beside them, so the loss picks exactly the real
//! tokens' outputs; or one label per sequence (classification).

pub mod draw;
pub mod unknown;

use std::collections::HashMap;

use datafusion::arrow::record_batch::RecordBatch;
use rand::seq::SliceRandom;
use ringflow_core::data::Preprocessing;
use ringflow_core::data::sequences::{Elements, ListColumn, SequenceRules};
use ringflow_core::data::vocab::{PAD, Vocabulary};
use ringflow_core::spec::JobSpec;
use ringflow_ml::nn::SequenceOutput;
use ringflow_ml::rng::Rng;

use crate::data::converter::{BatchConverter, RowLayout};
use crate::data::error::{LabelError, TokenError};
use crate::data::rows::{Batch, Rows};
use crate::error::{ExecutorError, Result, Unrunnable};

/// One row of a sequence column: its token ids and its labels (one per token, one for the
/// sequence, or none when prediction reads no label).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    /// Token ids.
    pub tokens: Vec<f32>,
    /// Labels.
    pub labels: Vec<f32>,
}

/// Converts a token sequence column (and its label) into [`Sequence`]s.
#[derive(Clone, Debug)]
pub struct SequenceConverter {
    column: String,
    label: Option<String>,
    per_step: bool,
    classes: usize,
    rules: SequenceRules,
    vocabulary: Option<Vocabulary>,
    singletons_from: Option<u32>,
    class_ids: Option<HashMap<String, usize>>,
}

impl SequenceConverter {
    /// A converter of `column` with `label` (`None`: prediction), one label per token when
    /// `per_step`, labels in `0..classes`.
    pub fn new(
        column: &str,
        label: Option<&str>,
        per_step: bool,
        classes: usize,
        rules: SequenceRules,
    ) -> SequenceConverter {
        SequenceConverter {
            column: column.to_string(),
            label: label.map(str::to_string),
            per_step,
            classes,
            rules,
            vocabulary: None,
            singletons_from: None,
            class_ids: None,
        }
    }

    /// The converter of `spec`'s sequence column for a model whose `output` is per token or per
    /// sequence, with `classes` outputs; `label` is the label column (`None`: prediction).
    /// Fails unless the sequence is the job's only feature.
    pub fn for_job(
        spec: &JobSpec,
        label: Option<&str>,
        output: SequenceOutput,
        classes: usize,
    ) -> Result<SequenceConverter> {
        let data = &spec.data;
        let [column] = data.features.as_slice() else {
            return Err(Unrunnable::SequenceFeatures {
                features: data.features.len(),
            }
            .into());
        };
        let per_step = output == SequenceOutput::PerStep;
        let rules = SequenceRules::of(data);
        Ok(SequenceConverter::new(
            column, label, per_step, classes, rules,
        ))
    }

    /// Whether the labels are one per token.
    pub fn per_step(&self) -> bool {
        self.per_step
    }

    /// Applies the vocabulary of string tokens and the classes of string labels.
    pub fn with_preprocessing(mut self, p: &Preprocessing) -> SequenceConverter {
        self.vocabulary = p.vocabulary.clone();
        self.singletons_from = p.singletons_from;
        self.class_ids = p
            .classes
            .as_ref()
            .map(|c| c.iter().cloned().zip(0..).collect());
        self
    }

    /// The columns a reader must provide.
    pub fn columns(&self) -> Vec<String> {
        std::iter::once(self.column.clone())
            .chain(self.label.clone())
            .collect()
    }

    /// The rows of `batch` (whose first row is row `first_row` of `file`): token ids one
    /// sequence after another with their lengths, and their labels.
    pub fn convert(&self, batch: &RecordBatch, file: &str, first_row: u64) -> Result<Rows> {
        let fail =
            |column: &str, m: String| ExecutorError::data(file, format!("column `{column}` {m}"));
        let col = batch
            .column_by_name(&self.column)
            .ok_or_else(|| fail(&self.column, "is missing from the data".into()))?;
        let tokens =
            ListColumn::read(col, first_row).map_err(|e| fail(&self.column, e.to_string()))?;
        let labels = self.read_labels(batch, first_row, file)?;
        let mut rows = Rows {
            rows: tokens.rows(),
            ..Rows::default()
        };
        for row in 0..tokens.rows() {
            let at = first_row + row as u64;
            let tagged = match &labels {
                Labels::PerStep(t) => Some((self.label.as_deref().unwrap_or(""), t.len(row))),
                _ => None,
            };
            let steps = self
                .rules
                .steps(at, (&self.column, tokens.len(row)), tagged)
                .map_err(|e| ExecutorError::data(file, e.to_string()))?;
            let range = tokens.range(row).start..tokens.range(row).start + steps;
            self.push_tokens(tokens.elements(), range, &mut rows.features)
                .map_err(|m| fail(&self.column, format!("row {at} (0-based): {m}")))?;
            match &labels {
                Labels::PerStep(t) => {
                    let range = t.range(row).start..t.range(row).start + steps;
                    let label = self.label.as_deref().unwrap_or("");
                    self.push_labels(t.elements(), range, &mut rows.labels)
                        .map_err(|m| fail(label, format!("row {at} (0-based): {m}")))?;
                }
                Labels::PerSequence(l) => rows.labels.push(l[row]),
                Labels::None => {}
            }
            rows.lengths.push(steps);
        }
        Ok(rows)
    }

    fn read_labels(&self, batch: &RecordBatch, first_row: u64, file: &str) -> Result<Labels> {
        let Some(label) = &self.label else {
            return Ok(Labels::None);
        };
        let fail = |m: String| ExecutorError::data(file, format!("column `{label}` {m}"));
        let col = batch
            .column_by_name(label)
            .ok_or_else(|| fail("(data.label) is missing from the data".into()))?;
        if self.per_step {
            return Ok(Labels::PerStep(
                ListColumn::read(col, first_row).map_err(|e| fail(e.to_string()))?,
            ));
        }
        let values = Elements::read(col).map_err(|t| {
            fail(format!(
                "(data.label) has type {t}; a class must be a string or an integer"
            ))
        })?;
        let mut out = Vec::with_capacity(values.len());
        for row in 0..values.len() {
            self.push_labels(&values, row..row + 1, &mut out)
                .map_err(|m| fail(format!("row {} (0-based): {m}", first_row + row as u64)))?;
        }
        Ok(Labels::PerSequence(out))
    }

    fn push_tokens(
        &self,
        elements: &Elements,
        range: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), TokenError> {
        match elements {
            Elements::Strings(s) => {
                let vocabulary = self.vocabulary.as_ref().ok_or(TokenError::NoVocabulary)?;
                for t in &s[range] {
                    let t = t.as_deref().ok_or(TokenError::Null)?;
                    out.push(vocabulary.id(t) as f32);
                }
            }
            Elements::Ids(ids) => {
                for id in &ids[range] {
                    let id = id.ok_or(TokenError::Null)?;
                    if !(0..1 << 24).contains(&id) {
                        return Err(TokenError::IdOutOfRange(id));
                    }
                    out.push(id as f32);
                }
            }
        }
        Ok(())
    }

    fn push_labels(
        &self,
        elements: &Elements,
        range: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), LabelError> {
        match elements {
            Elements::Strings(s) => {
                for t in &s[range] {
                    out.push(self.class_of(Scalar::String(t.as_deref()))?);
                }
            }
            Elements::Ids(ids) => {
                for l in &ids[range] {
                    out.push(self.class_of(Scalar::Int(*l))?);
                }
            }
        }
        Ok(())
    }

    /// The class index of one label, or why it is not one of the model's classes.
    fn class_of(&self, v: Scalar<'_>) -> std::result::Result<f32, LabelError> {
        match v {
            Scalar::String(None) | Scalar::Int(None) => Err(LabelError::Null),
            Scalar::String(Some(s)) => {
                let ids = self.class_ids.as_ref().ok_or(LabelError::NoClasses)?;
                ids.get(s)
                    .map(|&i| i as f32)
                    .ok_or_else(|| LabelError::UnknownName {
                        name: s.to_string(),
                        classes: self.classes,
                    })
            }
            Scalar::Int(Some(i)) => {
                if (0..self.classes as i64).contains(&i) {
                    Ok(i as f32)
                } else {
                    Err(LabelError::OutOfRange {
                        label: i,
                        classes: self.classes,
                    })
                }
            }
        }
    }
}

impl BatchConverter for SequenceConverter {
    fn columns(&self) -> Vec<String> {
        SequenceConverter::columns(self)
    }

    fn convert_into(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
        out: &mut Rows,
    ) -> Result<()> {
        *out = SequenceConverter::convert(self, batch, file, first_row)?;
        Ok(())
    }

    fn layout(&self) -> RowLayout {
        RowLayout::Sequences {
            per_step: self.per_step,
            singletons_from: self.singletons_from,
        }
    }

    fn with_preprocessing(&self, p: &Preprocessing) -> Result<Box<dyn BatchConverter>> {
        Ok(Box::new(SequenceConverter::with_preprocessing(
            self.clone(),
            p,
        )))
    }

    /// The same converter: the statistics pass reads sequences as training does.
    fn features_only(&self) -> Box<dyn BatchConverter> {
        Box::new(self.clone())
    }
}

/// One label value as read.
enum Scalar<'a> {
    String(Option<&'a str>),
    Int(Option<i64>),
}

/// A batch's labels as read.
enum Labels {
    PerStep(ListColumn),
    PerSequence(Vec<f32>),
    None,
}

impl Rows {
    /// Row `i` of sequence rows (`lengths` set) as a [`Sequence`]; `offset` is where its
    /// tokens start (the sum of the lengths before it).
    pub fn sequence(&self, i: usize, offset: usize, per_step: bool) -> Sequence {
        let len = self.lengths[i];
        let tokens = self.features[offset..offset + len].to_vec();
        let labels = match (self.labels.is_empty(), per_step) {
            (true, _) => Vec::new(),
            (false, true) => self.labels[offset..offset + len].to_vec(),
            (false, false) => vec![self.labels[i]],
        };
        Sequence { tokens, labels }
    }
}

/// The batch of `sequences`: `[n, T]` ids padded with [`PAD`] to the longest `T`, their
/// lengths, their labels (of the real tokens, or one per sequence), and for tagging
/// (`per_step`) the flat index of every real token.
pub fn pad(sequences: &[Sequence], per_step: bool) -> Batch {
    let n = sequences.len();
    let steps = sequences.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
    let mut features = vec![PAD as f32; n * steps];
    let mut labels = Vec::new();
    let mut positions = Vec::new();
    for (i, s) in sequences.iter().enumerate() {
        features[i * steps..i * steps + s.tokens.len()].copy_from_slice(&s.tokens);
        labels.extend_from_slice(&s.labels);
        if per_step {
            positions.extend((0..s.tokens.len()).map(|t| (i * steps + t) as f32));
        }
    }
    Batch {
        features,
        labels,
        rows: n,
        lengths: sequences.iter().map(|s| s.tokens.len()).collect(),
        steps,
        positions,
    }
}

/// A pool of sequences cut into batches of similar length: filled from the shuffle buffer,
/// shuffled, sorted by length (ties in their shuffled order), cut into batches of the batch
/// size, and the batches handed out in a shuffled order. Every batch but the epoch's last is
/// full, so an epoch takes as many steps as without buckets.
#[derive(Default)]
pub struct BucketPool {
    ready: Vec<Vec<Sequence>>,
}

impl BucketPool {
    /// The next batch ready, if any.
    pub fn next_batch(&mut self) -> Option<Vec<Sequence>> {
        self.ready.pop()
    }

    /// Cuts `rows` into batches of `batch` rows of similar length, in a random order.
    pub fn fill(&mut self, mut rows: Vec<Sequence>, batch: usize, rng: &mut Rng) {
        rows.shuffle(rng);
        rows.sort_by_key(|s| s.tokens.len());
        let mut batches: Vec<Vec<Sequence>> = Vec::with_capacity(rows.len().div_ceil(batch));
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            batches.push(rows.by_ref().take(batch.max(1)).collect());
        }
        batches.shuffle(rng);
        self.ready = batches;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(len: usize, first: f32) -> Sequence {
        Sequence {
            tokens: (0..len).map(|t| first + t as f32).collect(),
            labels: vec![first; len],
        }
    }

    #[test]
    fn a_batch_pads_to_its_own_longest_and_keeps_only_real_labels() {
        let b = pad(&[seq(2, 10.0), seq(3, 20.0), seq(1, 30.0)], true);
        assert_eq!((b.rows, b.steps), (3, 3));
        assert_eq!(b.features, [10., 11., 0., 20., 21., 22., 30., 0., 0.]);
        assert_eq!(b.lengths, [2, 3, 1]);
        assert_eq!(b.labels, [10., 10., 20., 20., 20., 30.]);
        assert_eq!(b.positions, [0., 1., 3., 4., 5., 6.]);
        assert_eq!(b.padding(), 3);
    }

    #[test]
    fn buckets_keep_every_row_once_and_group_similar_lengths() {
        let mut r = ringflow_ml::rng::seeded(1, 0);
        let rows: Vec<Sequence> = (0..50).map(|i| seq(1 + (i * 7) % 40, i as f32)).collect();
        let unsorted: usize = rows.chunks(8).map(|b| pad(b, true).padding()).sum();
        let mut pool = BucketPool::default();
        pool.fill(rows, 8, &mut r);
        let mut seen = Vec::new();
        let mut padded = 0;
        let mut sizes = Vec::new();
        while let Some(batch) = pool.next_batch() {
            sizes.push(batch.len());
            padded += pad(&batch, true).padding();
            seen.extend(batch.iter().map(|s| s.labels[0] as usize));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        // Six full batches and the remainder.
        assert_eq!(sizes.iter().filter(|&&s| s == 8).count(), 6);
        assert_eq!(sizes.iter().sum::<usize>(), 50);
        // Sorted buckets: lengths within a batch differ by little, so padding stays small.
        assert!(
            padded * 4 < unsorted,
            "{padded} padded steps, against {unsorted} in the rows' own order"
        );
    }
}
