//! The parts of `[data]` for token sequences: `data.vocab` (the vocabulary the statistics pass
//! builds from string tokens), `data.max_length` and `data.on_too_long` (what a longer sequence
//! does), and `data.bucket_by_length` (batches of sequences of similar length); and
//! `train.metrics`, the figures evaluation reports.
//!
//! A feature column of lists of strings is always a token sequence; a list of integers is one
//! when the model starts with an `embedding` layer or the label is a list (one label per
//! token). The driver decides it from the data's types ([`DataSpec::is_sequence_type`] is the
//! rule).

use serde::{Deserialize, Serialize};

use super::DataSpec;
use super::images::KeyError;
use crate::data::vocab::{MAX_DISTINCT_TOKENS, RESERVED};

/// `data.vocab`: which string tokens get an id of their own, and how long one may be.
///
/// ```toml
/// [data]
/// vocab = { max_size = 50000, min_count = 1, max_token_bytes = 1024, singleton_unk = 0.5 }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VocabSpec {
    /// The most ids, the padding and unknown-token ids included (default 50,000): the most
    /// frequent tokens of the training split get the rest.
    #[serde(default = "default_max_size")]
    pub max_size: usize,
    /// Tokens seen fewer times than this in the training split map to the unknown token
    /// (default 1: every token seen gets an id while there is room).
    #[serde(default = "default_min_count")]
    pub min_count: u64,
    /// The longest token, in bytes (default 1024, at most [`MAX_TOKEN_BYTES`]): a longer one
    /// in the training split fails the job before training, naming its file and row. It bounds
    /// the memory of the statistics pass and the size of the vocabulary every executor gets.
    #[serde(default = "default_max_token_bytes")]
    pub max_token_bytes: usize,
    /// The chance that a training token the training split holds only once reaches the model
    /// as the unknown token instead, drawn afresh each epoch (default 0.5; 0: never). It trains
    /// the unknown token's row, which test tokens outside the vocabulary take.
    #[serde(default = "default_singleton_unk")]
    pub singleton_unk: f32,
}

impl Default for VocabSpec {
    fn default() -> VocabSpec {
        VocabSpec {
            max_size: default_max_size(),
            min_count: default_min_count(),
            max_token_bytes: default_max_token_bytes(),
            singleton_unk: default_singleton_unk(),
        }
    }
}

fn default_max_size() -> usize {
    50_000
}

fn default_min_count() -> u64 {
    1
}

fn default_max_token_bytes() -> usize {
    DEFAULT_MAX_TOKEN_BYTES
}

fn default_singleton_unk() -> f32 {
    0.5
}

/// Default of `data.vocab.max_token_bytes`.
pub const DEFAULT_MAX_TOKEN_BYTES: usize = 1024;

/// The largest `data.vocab.max_token_bytes`.
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

/// The largest `data.vocab.max_size`: the most distinct tokens the statistics pass counts
/// ([`MAX_DISTINCT_TOKENS`]; more stop the job) and the padding and unknown-token ids. A larger
/// size could never be filled.
pub const MAX_VOCAB: usize = MAX_DISTINCT_TOKENS + RESERVED.len();

/// The longest `data.max_length` may be.
pub const MAX_SEQUENCE_LENGTH: usize = 1 << 20;

/// Default of `data.max_length`.
pub const DEFAULT_MAX_LENGTH: usize = 1024;

/// `data.on_too_long`: what a sequence longer than `data.max_length` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTooLong {
    /// The job fails, naming the file, row and length (the default).
    #[default]
    Fail,
    /// The sequence (and its labels) keep their first `data.max_length` steps.
    Truncate,
}

/// A figure evaluation computes besides the loss (`train.metrics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// The share of examples (of tokens, for tagging) whose predicted class is right.
    Accuracy,
    /// Entity-level precision, recall and F1 of IOB2 tags, with CoNLL's rules (tagging only).
    EntityF1,
}

impl DataSpec {
    /// The longest sequence a job reads (`data.max_length`, default
    /// [`DEFAULT_MAX_LENGTH`]).
    pub fn max_length(&self) -> usize {
        self.max_length.unwrap_or(DEFAULT_MAX_LENGTH)
    }

    /// Whether a sequence job's training batches group rows of similar length (default yes).
    pub fn buckets_by_length(&self) -> bool {
        self.bucket_by_length.unwrap_or(true)
    }

    /// Checks the sequence keys on their own.
    pub(super) fn check_sequences(&self) -> Result<(), KeyError> {
        if !(2..=MAX_VOCAB).contains(&self.vocab.max_size) {
            return Err((
                "data.vocab.max_size",
                format!(
                    "must be between 2 (the padding and unknown tokens) and {MAX_VOCAB} (the \
                     {MAX_DISTINCT_TOKENS} distinct tokens a vocabulary is counted from, at \
                     most, and those two), not {}",
                    self.vocab.max_size
                ),
            ));
        }
        if self.vocab.min_count == 0 {
            return Err(("data.vocab.min_count", "must be at least 1".into()));
        }
        let unk = self.vocab.singleton_unk;
        if !(0.0..=1.0).contains(&unk) {
            return Err((
                "data.vocab.singleton_unk",
                format!("must be a probability between 0 and 1, not {unk}"),
            ));
        }
        if let Some(n) = self.max_length
            && !(1..=MAX_SEQUENCE_LENGTH).contains(&n)
        {
            return Err((
                "data.max_length",
                format!("must be between 1 and {MAX_SEQUENCE_LENGTH}, not {n}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{JobSpec, SpecError};

    fn spec(extra: &str) -> Result<JobSpec, SpecError> {
        let text = format!(
            "[data]\ntrain = \"t.parquet\"\nfeatures = [\"tokens\"]\nlabel = \"tags\"\n{extra}\n\
             [model]\nkind = \"sequential\"\nlayers = [{{ type = \"linear\" }}]\n"
        );
        JobSpec::parse(&text, std::path::Path::new("job.toml"), &[])
    }

    #[test]
    fn sequence_keys_have_defaults_and_read_back() {
        let s = spec("").unwrap();
        assert_eq!(s.data.vocab, VocabSpec::default());
        assert_eq!(s.data.max_length(), DEFAULT_MAX_LENGTH);
        assert_eq!(s.data.on_too_long, OnTooLong::Fail);
        assert!(s.data.buckets_by_length());
        let s = spec(
            "vocab = { max_size = 100, min_count = 2 }\nmax_length = 64\non_too_long = \
             \"truncate\"\nbucket_by_length = false",
        )
        .unwrap();
        assert_eq!((s.data.vocab.max_size, s.data.vocab.min_count), (100, 2));
        assert_eq!(s.data.max_length(), 64);
        assert_eq!(s.data.on_too_long, OnTooLong::Truncate);
        assert!(!s.data.buckets_by_length());
    }

    /// Regression (issue 39): `data.vocab.max_size` was taken up to 2^24, while more than
    /// 2,000,000 distinct tokens always stop the job; the bound is the one the job can fill.
    #[test]
    fn the_largest_vocabulary_is_the_one_the_statistics_pass_can_count() {
        assert_eq!(MAX_VOCAB, 2_000_002);
        let largest = spec("vocab = { max_size = 2000002 }").unwrap();
        assert_eq!(largest.data.vocab.max_size, 2_000_002);
        let e = spec("vocab = { max_size = 2000003 }")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "data.vocab.max_size: must be between 2 (the padding and unknown tokens) and \
                 2000002 (the 2000000 distinct tokens a vocabulary is counted from, at most, \
                 and those two), not 2000003"
            ),
            "{e}"
        );
        let e = spec("vocab = { max_size = 16777216 }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data.vocab.max_size"), "{e}");
    }

    #[test]
    fn bad_sequence_keys_are_named() {
        for (extra, key) in [
            ("vocab = { max_size = 1 }", "data.vocab.max_size"),
            ("vocab = { min_count = 0 }", "data.vocab.min_count"),
            ("vocab = { size = 3 }", "size"),
            ("max_length = 0", "data.max_length"),
            ("on_too_long = \"wrap\"", "on_too_long"),
        ] {
            let e = spec(extra).unwrap_err().to_string();
            assert!(e.contains(key), "{extra}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
