//! What the data pipeline hands on, shared by the converters ([`features`](super::features),
//! [`sequences`](super::sequences)), the decoder threads and the batcher: converted [`Rows`]
//! and the mini-[`Batch`]es cut from them. A leaf: it imports no other file of the pipeline.

/// Rows converted to numbers: `features` is row-major `rows × width`.
#[derive(Clone, Debug, Default)]
pub struct Rows {
    /// Row-major feature values.
    pub features: Vec<f32>,
    /// One label per row (class indices as integer-valued floats).
    pub labels: Vec<f32>,
    /// Number of rows.
    pub rows: usize,
    /// For token sequences: each row's length. `features` then holds the rows' token ids one
    /// after another, and `labels` one label per token (tagging) or per row.
    pub lengths: Vec<usize>,
}

impl Rows {
    /// Empties these rows for a conversion that writes `values` feature values, keeping the
    /// buffers. Every value is then written; filling with zeros first keeps this free of
    /// `unsafe` and costs a pass over memory the conversion is about to touch anyway.
    pub(super) fn reset(&mut self, values: usize) {
        self.rows = 0;
        self.lengths.clear();
        self.labels.clear();
        self.features.clear();
        self.features.resize(values, 0.0);
    }

    /// [`reset`](Self::reset) for a conversion that has written every value when it succeeds
    /// (and whose rows are dropped when it fails): the values already in the buffer are kept
    /// up to `values` instead of being zeroed first, which spares the decoders a pass over the
    /// chunk.
    pub(super) fn reset_to_overwrite(&mut self, values: usize) {
        self.rows = 0;
        self.lengths.clear();
        self.labels.clear();
        if self.features.len() >= values {
            self.features.truncate(values);
        } else {
            self.features.resize(values, 0.0);
        }
    }
}

/// One mini-batch: `rows × width` features (row-major) and `rows` labels; or, for token
/// sequences, `rows × steps` token ids padded to the batch's longest sequence (see
/// [`sequences`](crate::data::sequences)).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Row-major feature values.
    pub features: Vec<f32>,
    /// Labels (of the real tokens only, for tagging).
    pub labels: Vec<f32>,
    /// Number of rows.
    pub rows: usize,
    /// For token sequences: each row's real length (empty otherwise).
    pub lengths: Vec<usize>,
    /// For token sequences: the padded length, the longest of `lengths`.
    pub steps: usize,
    /// For tagging: the flat index in `[rows · steps]` of each real token, beside `labels`.
    pub positions: Vec<f32>,
}

impl Batch {
    /// True for a batch of token sequences.
    pub fn is_sequences(&self) -> bool {
        !self.lengths.is_empty()
    }

    /// The real tokens of a batch of sequences (0 otherwise).
    pub fn tokens(&self) -> usize {
        self.lengths.iter().sum()
    }

    /// The padding steps of a batch of sequences: `rows · steps` minus the real tokens.
    pub fn padding(&self) -> usize {
        (self.rows * self.steps).saturating_sub(self.tokens())
    }
}
