//! An epoch's partitions streamed into a bounded shuffle buffer and cut into mini-batches.
//!
//! Decoder threads ([`read_ahead`](crate::data::read_ahead)) read the partitions of an
//! [`EpochPlan`] ahead of the training loop, convert each record batch to numbers and hand the
//! chunks back in plan order (the driver shuffles that order each epoch), within a bounded
//! number of bytes. The training thread keeps a shuffle buffer of `shuffle_buffer` rows:
//! each row of a batch is drawn uniformly from the buffer and its place is refilled from the
//! stream (TensorFlow's `shuffle(buffer_size)` semantics). Memory therefore stays at the buffer
//! plus a few read chunks, whatever the size of the data set; with a buffer at least as large
//! as the executor's share of an epoch the order is a uniform random permutation.
//!
//! No buffer is sized from a setting alone: the shuffle buffer and each batch reserve at most
//! the rows the plan holds, so a `batch_size` or `shuffle_buffer` far beyond the data costs
//! only what the data is (a batch larger than the share is the whole share: one step per
//! epoch, like PyTorch's `DataLoader` with `drop_last=False`).
//!
//! How rows are cut into batches is the data kind's [`RowLayout`], chosen once as the stream
//! starts: rows of one width (`fixed.rs`: feature columns, images) or token sequences of their
//! own lengths ([`SequenceDraw`], in the sequence kind's folder). Both take their rows from the
//! same [`Chunks`].

use std::sync::Arc;

use ringflow_core::pb::EpochPlan;
use ringflow_ml::rng::Rng;

use crate::data::converter::{BatchConverter, RowLayout};
use crate::data::partitions::ReadContext;
use crate::data::read_ahead::ReadAhead;
use crate::data::rows::Batch;
use crate::data::sequences::draw::SequenceDraw;
use crate::data::sequences::unknown::SingletonUnk;
use crate::error::Result;
use chunks::Chunks;
use fixed::FixedDraw;

pub use chunks::READ_DEADLINE;

pub mod chunks;
mod fixed;
#[cfg(test)]
pub(crate) mod tests;

/// The rows of one epoch plan, in shuffled (training) or file (evaluation) order.
pub struct EpochStream {
    chunks: Chunks,
    draw: Draw,
    /// Rows the plan holds that no batch has taken yet: a bound for reservations (a query in
    /// `data.sql` may change the count, so it is never trusted for more).
    planned_left: u64,
}

/// How an [`EpochStream`] cuts its rows into batches, as its converter's [`RowLayout`] says.
enum Draw {
    /// Rows of one width.
    Fixed(FixedDraw),
    /// Token sequences, each batch padded to its longest.
    Sequences(SequenceDraw),
}

impl EpochStream {
    /// Starts reading `plan` with `converter`, for a model of `width` inputs. With
    /// `shuffle = Some((buffer_rows, rng))` batches draw from a shuffle buffer; with `None`
    /// rows come in plan order. A stream of token sequences groups the buffer's rows into
    /// length buckets when `bucket_by_length` (and shuffling), and, with `unknown` (training),
    /// replaces the tokens the training split holds once by `<unk>` as it chooses.
    pub fn start(
        plan: &EpochPlan,
        converter: Arc<dyn BatchConverter>,
        width: usize,
        (shuffle, bucket_by_length): (Option<(usize, Rng)>, bool),
        unknown: Option<SingletonUnk>,
        read: ReadContext,
    ) -> EpochStream {
        let draw = match converter.layout() {
            RowLayout::Fixed => Draw::Fixed(FixedDraw::new(width, shuffle, plan.rows)),
            // Sequences are kept as rows of their own length, not in a fixed-width buffer.
            RowLayout::Sequences {
                per_step,
                singletons_from,
            } => {
                let unknown = singletons_from.zip(unknown);
                Draw::Sequences(SequenceDraw::new(
                    per_step,
                    bucket_by_length,
                    shuffle,
                    unknown,
                ))
            }
        };
        // A converted row: its features (a sequence's tokens: at most the model's input width)
        // and label as f32.
        let row_bytes = 4 * (width as u64 + 1);
        let source = ReadAhead::start(&plan.partitions, converter, read, row_bytes);
        EpochStream {
            chunks: Chunks::new(source),
            draw,
            planned_left: plan.rows,
        }
    }

    /// The next batch of at most `max_rows` rows; `None` once the epoch's rows are used up.
    pub fn next_batch(&mut self, max_rows: usize) -> Result<Option<Batch>> {
        let chunks = &mut self.chunks;
        let batch = match &mut self.draw {
            Draw::Fixed(draw) => draw.next_batch(chunks, max_rows, self.planned_left)?,
            Draw::Sequences(draw) => draw.next_batch(chunks, max_rows)?,
        };
        let taken = batch.as_ref().map_or(0, |b| b.rows);
        self.planned_left = self.planned_left.saturating_sub(taken as u64);
        Ok(batch)
    }
}

/// `wanted` rows, but never more than the `available` rows a plan holds: what a buffer may
/// reserve up front.
fn bounded(wanted: usize, available: u64) -> usize {
    wanted.min(usize::try_from(available).unwrap_or(usize::MAX))
}
