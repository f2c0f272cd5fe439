//! Batches of token sequences ([`RowLayout::Sequences`](crate::data::converter::RowLayout)):
//! rows of their own lengths taken from the stream's chunks, in plan order, drawn one by one
//! from a shuffle buffer, or cut from the buffer's length buckets ([`BucketPool`]); each batch
//! padded to its own longest ([`pad`]).

use rand::RngExt;
use ringflow_ml::rng::Rng;

use super::unknown::SingletonUnk;
use super::{BucketPool, Sequence, pad};
use crate::data::batches::chunks::Chunks;
use crate::data::rows::Batch;
use crate::error::Result;

/// How an epoch stream of token sequences draws its rows.
pub struct SequenceDraw {
    /// Labels are one per token.
    per_step: bool,
    /// Batches come from length buckets of the shuffle buffer.
    bucket: bool,
    /// The shuffle buffer's capacity in rows and the generator drawing from it (`None`: rows
    /// in plan order).
    shuffle: Option<(usize, Rng)>,
    /// The shuffle buffer's rows.
    buffer: Vec<Sequence>,
    /// Batches cut from the buffer, ready.
    pool: BucketPool,
    /// While training: the first id of the tokens seen once, and their replacement by `<unk>`.
    unknown: Option<(u32, SingletonUnk)>,
}

impl SequenceDraw {
    /// Draws sequences (with labels per token when `per_step`) from a shuffle buffer of
    /// `shuffle = Some((rows, rng))`, in length buckets when `bucket`, or in plan order with
    /// `None`; with `unknown = Some((from, unk))` (training), token ids `from` and above become
    /// `<unk>` as `unk` chooses.
    pub fn new(
        per_step: bool,
        bucket: bool,
        shuffle: Option<(usize, Rng)>,
        unknown: Option<(u32, SingletonUnk)>,
    ) -> SequenceDraw {
        SequenceDraw {
            per_step,
            bucket,
            shuffle: shuffle.map(|(capacity, rng)| (capacity.max(1), rng)),
            buffer: Vec::new(),
            pool: BucketPool::default(),
            unknown,
        }
    }

    /// The next batch of at most `max_rows` sequences of `chunks` (at least 1), padded to its
    /// longest; `None` once the rows are used up.
    pub fn next_batch(&mut self, chunks: &mut Chunks, max_rows: usize) -> Result<Option<Batch>> {
        let max_rows = max_rows.max(1);
        let rows = match (self.shuffle.is_some(), self.bucket) {
            (false, _) => {
                let mut rows = Vec::new();
                while rows.len() < max_rows && chunks.ensure_rows()? {
                    rows.push(take_sequence(chunks, self.per_step, self.unknown));
                }
                rows
            }
            (true, true) => self.bucketed(chunks, max_rows)?,
            (true, false) => self.drawn(chunks, max_rows)?,
        };
        Ok((!rows.is_empty()).then(|| pad(&rows, self.per_step)))
    }

    /// The shuffle buffer's capacity in rows.
    fn capacity(&self) -> usize {
        self.shuffle.as_ref().map_or(1, |(capacity, _)| *capacity)
    }

    /// Fills the shuffle buffer up to `capacity` rows from the stream.
    fn top_up(&mut self, chunks: &mut Chunks, capacity: usize) -> Result<()> {
        while self.buffer.len() < capacity && chunks.ensure_rows()? {
            let row = take_sequence(chunks, self.per_step, self.unknown);
            self.buffer.push(row);
        }
        Ok(())
    }

    /// Rows drawn one by one from the shuffle buffer, refilled after each.
    fn drawn(&mut self, chunks: &mut Chunks, max_rows: usize) -> Result<Vec<Sequence>> {
        let capacity = self.capacity();
        let mut rows = Vec::new();
        while rows.len() < max_rows {
            self.top_up(chunks, capacity)?;
            if self.buffer.is_empty() {
                break;
            }
            let rng = &mut self.shuffle.as_mut().expect("shuffling").1;
            let i = rng.random_range(0..self.buffer.len());
            rows.push(self.buffer.swap_remove(i));
        }
        Ok(rows)
    }

    /// A batch from the length buckets of the shuffle buffer, which is refilled (to a whole
    /// number of batches) and bucketed again once its batches are used up.
    fn bucketed(&mut self, chunks: &mut Chunks, max_rows: usize) -> Result<Vec<Sequence>> {
        if let Some(rows) = self.pool.next_batch() {
            return Ok(rows);
        }
        let capacity = (self.capacity() / max_rows).max(1).saturating_mul(max_rows);
        self.top_up(chunks, capacity)?;
        let rows = std::mem::take(&mut self.buffer);
        let rng = &mut self.shuffle.as_mut().expect("shuffling").1;
        self.pool.fill(rows, max_rows, rng);
        Ok(self.pool.next_batch().unwrap_or_default())
    }
}

/// The next unread row of the current chunk, labels per token when `per_step`, its rare tokens
/// replaced as `unknown` says.
fn take_sequence(
    chunks: &mut Chunks,
    per_step: bool,
    unknown: Option<(u32, SingletonUnk)>,
) -> Sequence {
    let mut row = chunks
        .current
        .sequence(chunks.cursor, chunks.offset, per_step);
    chunks.offset += chunks.current.lengths[chunks.cursor];
    chunks.cursor += 1;
    if let Some((from, unk)) = unknown {
        unk.apply(from, &mut row.tokens);
    }
    row
}
