//! Batches of rows of one width ([`RowLayout::Fixed`](crate::data::converter::RowLayout)):
//! feature columns and images. In plan order, a chunk that is exactly the batch is handed over
//! without a copy; shuffled, each row of a batch is drawn uniformly from a buffer of
//! `shuffle_buffer` rows and its slot refilled from the stream.

use rand::RngExt;
use ringflow_ml::backend::cpu::prefetch_lines;
use ringflow_ml::rng::Rng;

use super::bounded;
use super::chunks::Chunks;
use crate::data::rows::{Batch, Rows};
use crate::error::Result;

/// How an epoch stream of rows of `width` values draws its batches.
pub(super) struct FixedDraw {
    width: usize,
    shuffle: Option<(ShuffleBuffer, Rng)>,
}

struct ShuffleBuffer {
    features: Vec<f32>,
    labels: Vec<f32>,
    capacity: usize,
}

impl FixedDraw {
    /// Draws rows of `width` values from a shuffle buffer of `shuffle = Some((rows, rng))`
    /// (reserving no more than the `plan_rows` the plan holds), or in plan order with `None`.
    pub(super) fn new(width: usize, shuffle: Option<(usize, Rng)>, plan_rows: u64) -> FixedDraw {
        FixedDraw {
            width,
            shuffle: shuffle.map(|(capacity, rng)| {
                let capacity = capacity.max(1);
                let reserved = bounded(capacity, plan_rows);
                (
                    ShuffleBuffer {
                        features: Vec::with_capacity(reserved.saturating_mul(width)),
                        labels: Vec::with_capacity(reserved),
                        capacity,
                    },
                    rng,
                )
            }),
        }
    }

    /// The next batch of at most `max_rows` rows of `chunks`, reserving no more than the
    /// `planned_left` rows the plan has left; `None` once the rows are used up.
    pub(super) fn next_batch(
        &mut self,
        chunks: &mut Chunks,
        max_rows: usize,
        planned_left: u64,
    ) -> Result<Option<Batch>> {
        let w = self.width;
        let reserved = bounded(max_rows, planned_left);
        let mut batch = Batch::default();
        if self.shuffle.is_some() {
            batch.features = Vec::with_capacity(reserved.saturating_mul(w));
            batch.labels = Vec::with_capacity(reserved);
        }
        while batch.rows < max_rows {
            let got = match &mut self.shuffle {
                Some(shuffle) => take_shuffled(shuffle, w, chunks, &mut batch, max_rows)?,
                None => take_in_order(chunks, w, &mut batch, max_rows, reserved)?,
            };
            if !got {
                break;
            }
        }
        Ok((batch.rows > 0).then_some(batch))
    }
}

/// Moves rows of `w` values of the current chunk into `batch`, which `reserved` rows will fill.
fn take_in_order(
    chunks: &mut Chunks,
    w: usize,
    batch: &mut Batch,
    max_rows: usize,
    reserved: usize,
) -> Result<bool> {
    if !chunks.ensure_rows()? {
        return Ok(false);
    }
    let n = (chunks.current.rows - chunks.cursor).min(max_rows - batch.rows);
    if chunks.cursor == 0 && n == chunks.current.rows && n == max_rows {
        // The chunk is exactly the batch (the reader cuts chunks to the batch size where it
        // can): hand its buffers over instead of copying them.
        batch.features = std::mem::take(&mut chunks.current.features);
        batch.labels = std::mem::take(&mut chunks.current.labels);
        batch.rows = n;
        chunks.cursor = n;
        return Ok(true);
    }
    if batch.features.capacity() == 0 {
        batch.features.reserve_exact(reserved.saturating_mul(w));
        batch.labels.reserve_exact(reserved);
    }
    let (a, b) = (chunks.cursor, chunks.cursor + n);
    batch
        .features
        .extend_from_slice(&chunks.current.features[a * w..b * w]);
    // A converter without a label (`bench ingest` of features alone) gives none.
    if let Some(labels) = chunks.current.labels.get(a..b) {
        batch.labels.extend_from_slice(labels);
    }
    batch.rows += n;
    chunks.cursor = b;
    Ok(true)
}

/// Draws rows of `w` values into `batch` until it holds `max_rows` or the epoch's rows run
/// out: each row drawn uniformly from the buffer, its slot refilled at once with the stream's
/// next row (one copy in, one out; once the stream has ended, the last row fills the hole).
fn take_shuffled(
    (buf, rng): &mut (ShuffleBuffer, Rng),
    w: usize,
    chunks: &mut Chunks,
    batch: &mut Batch,
    max_rows: usize,
) -> Result<bool> {
    // Fill the buffer (at the start of the epoch) from the stream.
    loop {
        let room = buf.capacity - buf.labels.len();
        if room == 0 || !chunks.ensure_rows()? {
            break;
        }
        let n = room.min(chunks.current.rows - chunks.cursor);
        let (a, b) = (chunks.cursor, chunks.cursor + n);
        buf.features
            .extend_from_slice(&chunks.current.features[a * w..b * w]);
        buf.labels.extend_from_slice(&chunks.current.labels[a..b]);
        chunks.cursor = b;
    }
    let mut drawn = false;
    while batch.rows < max_rows {
        let more = chunks.ensure_rows()?;
        let len = buf.labels.len();
        if len == 0 {
            break;
        }
        if more {
            let left = (chunks.current.rows - chunks.cursor).min(max_rows - batch.rows);
            let (current, cursor) = (&chunks.current, &mut chunks.cursor);
            draw_refilled(
                (&mut *buf, &mut *rng, w),
                batch,
                (current, cursor),
                left.min(DRAW_AHEAD),
            );
            drawn = true;
            continue;
        }
        let i = rng.random_range(0..len);
        batch
            .features
            .extend_from_slice(&buf.features[i * w..(i + 1) * w]);
        batch.labels.push(buf.labels[i]);
        // The stream has ended: move the last row into the hole.
        let last = len - 1;
        if i != last {
            buf.features.copy_within(last * w..len * w, i * w);
            buf.labels[i] = buf.labels[last];
        }
        buf.features.truncate(last * w);
        buf.labels.truncate(last);
        batch.rows += 1;
        drawn = true;
    }
    Ok(drawn)
}

/// Rows drawn from the shuffle buffer at a time while the current chunk refills every slot
/// drawn ([`draw_refilled`]).
const DRAW_AHEAD: usize = 16;

/// Draws `count` rows of `w` features from the shuffle buffer into `batch`, refilling each
/// slot drawn with the next row of the current chunk (which holds `count` more rows from
/// `*cursor`). The buffer's length stays the same meanwhile, so the `count` draws are those one
/// row at a time would make, made first: each row is then asked of the memory ahead of its
/// copy, where drawing them one by one would wait for every row of a buffer far larger than
/// the caches.
fn draw_refilled(
    (buf, rng, w): (&mut ShuffleBuffer, &mut Rng, usize),
    batch: &mut Batch,
    (chunk, cursor): (&Rows, &mut usize),
    count: usize,
) {
    let len = buf.labels.len();
    let mut slots = [0; DRAW_AHEAD];
    for slot in &mut slots[..count] {
        *slot = rng.random_range(0..len);
    }
    let row = |i: usize| i * w..(i + 1) * w;
    if let Some(&first) = slots[..count].first() {
        prefetch_lines(&buf.features[row(first)]);
    }
    for (j, &i) in slots[..count].iter().enumerate() {
        if j + 1 < count {
            prefetch_lines(&buf.features[row(slots[j + 1])]);
        }
        batch.features.extend_from_slice(&buf.features[row(i)]);
        batch.labels.push(buf.labels[i]);
        let c = *cursor;
        buf.features[row(i)].copy_from_slice(&chunk.features[row(c)]);
        buf.labels[i] = chunk.labels[c];
        *cursor += 1;
    }
    batch.rows += count;
}
