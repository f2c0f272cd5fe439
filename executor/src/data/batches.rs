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

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use ringflow_core::pb::EpochPlan;
use ringflow_ml::backend::cpu::prefetch_lines;
use ringflow_ml::rng::Rng;

use crate::data::features::Converter;
use crate::data::partitions::ReadContext;
use crate::data::read_ahead::ReadAhead;
use crate::data::rows::{Batch, Rows};
use crate::data::sequences::{self, BucketPool, Sequence};
use crate::error::Result;

/// How long the training thread waits for the next chunk before declaring the reader stuck.
pub const READ_DEADLINE: Duration = Duration::from_secs(600);

/// The rows of one epoch plan, in shuffled (training) or file (evaluation) order.
pub struct EpochStream {
    chunks: ReadAhead,
    width: usize,
    shuffle: Option<(ShuffleBuffer, Rng)>,
    current: Rows,
    cursor: usize,
    exhausted: bool,
    /// Rows the plan holds that no batch has taken yet: a bound for reservations (a query in
    /// `data.sql` may change the count, so it is never trusted for more).
    planned_left: u64,
    /// For token sequences: how batches are drawn, and where the next row's tokens start in
    /// `current`.
    sequences: Option<SequenceDraw>,
}

/// How an [`EpochStream`] of token sequences draws its rows.
struct SequenceDraw {
    /// Labels are one per token.
    per_step: bool,
    /// Batches come from length buckets of the shuffle buffer.
    bucket: bool,
    /// The shuffle buffer's rows.
    buffer: Vec<Sequence>,
    /// Batches cut from the buffer, ready.
    pool: BucketPool,
    /// Offset of the next row's tokens in the current chunk.
    offset: usize,
}

struct ShuffleBuffer {
    features: Vec<f32>,
    labels: Vec<f32>,
    capacity: usize,
}

impl EpochStream {
    /// Starts reading `plan`. With `shuffle = Some((buffer_rows, rng))` batches draw from a
    /// shuffle buffer; with `None` rows come in plan order. A stream of token sequences
    /// groups the buffer's rows into length buckets when `bucket_by_length` (and shuffling).
    pub fn start(
        plan: &EpochPlan,
        converter: Arc<Converter>,
        width: usize,
        shuffle: Option<(usize, Rng)>,
        bucket_by_length: bool,
        read: ReadContext,
    ) -> EpochStream {
        let sequences = converter.sequences().map(|s| SequenceDraw {
            per_step: s.per_step(),
            bucket: bucket_by_length,
            buffer: Vec::new(),
            pool: BucketPool::default(),
            offset: 0,
        });
        // A converted row: its features (a sequence's tokens: at most the model's input width)
        // and label as f32.
        let row_bytes = 4 * (width as u64 + 1);
        // Sequences are kept as rows of their own length, not in the fixed-width buffer.
        let width = if sequences.is_some() { 0 } else { width };
        let chunks = ReadAhead::start(&plan.partitions, converter, read, row_bytes);
        EpochStream {
            chunks,
            width,
            shuffle: shuffle.map(|(capacity, rng)| {
                let capacity = capacity.max(1);
                let reserved = bounded(capacity, plan.rows);
                (
                    ShuffleBuffer {
                        features: Vec::with_capacity(reserved.saturating_mul(width)),
                        labels: Vec::with_capacity(reserved),
                        capacity,
                    },
                    rng,
                )
            }),
            current: Rows::default(),
            cursor: 0,
            exhausted: false,
            planned_left: plan.rows,
            sequences,
        }
    }

    /// The next batch of at most `max_rows` rows; `None` once the epoch's rows are used up.
    pub fn next_batch(&mut self, max_rows: usize) -> Result<Option<Batch>> {
        if self.sequences.is_some() {
            return self.next_sequences(max_rows.max(1));
        }
        let w = self.width;
        let reserved = bounded(max_rows, self.planned_left);
        let mut batch = Batch::default();
        if self.shuffle.is_some() {
            batch.features = Vec::with_capacity(reserved.saturating_mul(w));
            batch.labels = Vec::with_capacity(reserved);
        }
        while batch.rows < max_rows {
            let got = if self.shuffle.is_some() {
                self.take_shuffled(&mut batch, max_rows)?
            } else {
                self.take_in_order(&mut batch, max_rows, reserved)?
            };
            if !got {
                break;
            }
        }
        self.planned_left = self.planned_left.saturating_sub(batch.rows as u64);
        Ok((batch.rows > 0).then_some(batch))
    }

    /// Makes `current` hold unread rows; false when the stream has ended.
    fn ensure_rows(&mut self) -> Result<bool> {
        while self.cursor >= self.current.rows {
            if self.exhausted {
                return Ok(false);
            }
            match self.chunks.next_chunk(READ_DEADLINE)? {
                Some(rows) => {
                    let used = std::mem::replace(&mut self.current, rows);
                    self.chunks.recycle(used);
                    self.cursor = 0;
                    if let Some(s) = self.sequences.as_mut() {
                        s.offset = 0;
                    }
                }
                None => {
                    self.exhausted = true;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Moves rows of the current chunk into `batch`, which `reserved` rows will fill.
    fn take_in_order(
        &mut self,
        batch: &mut Batch,
        max_rows: usize,
        reserved: usize,
    ) -> Result<bool> {
        if !self.ensure_rows()? {
            return Ok(false);
        }
        let w = self.width;
        let n = (self.current.rows - self.cursor).min(max_rows - batch.rows);
        if self.cursor == 0 && n == self.current.rows && n == max_rows {
            // The chunk is exactly the batch (the reader cuts chunks to the batch size where
            // it can): hand its buffers over instead of copying them.
            batch.features = std::mem::take(&mut self.current.features);
            batch.labels = std::mem::take(&mut self.current.labels);
            batch.rows = n;
            self.cursor = n;
            return Ok(true);
        }
        if batch.features.capacity() == 0 {
            batch.features.reserve_exact(reserved.saturating_mul(w));
            batch.labels.reserve_exact(reserved);
        }
        let (a, b) = (self.cursor, self.cursor + n);
        batch
            .features
            .extend_from_slice(&self.current.features[a * w..b * w]);
        // A converter without a label (`bench ingest` of features alone) gives none.
        if let Some(labels) = self.current.labels.get(a..b) {
            batch.labels.extend_from_slice(labels);
        }
        batch.rows += n;
        self.cursor = b;
        Ok(true)
    }

    /// Draws rows into `batch` until it holds `max_rows` or the epoch's rows run out: each
    /// row drawn uniformly from the buffer, its slot refilled at once with the stream's next
    /// row (one copy in, one out; once the stream has ended, the last row fills the hole).
    fn take_shuffled(&mut self, batch: &mut Batch, max_rows: usize) -> Result<bool> {
        let w = self.width;
        // Fill the buffer (at the start of the epoch) from the stream.
        loop {
            let (buf, _) = self.shuffle.as_ref().expect("shuffling");
            let room = buf.capacity - buf.labels.len();
            if room == 0 || !self.ensure_rows()? {
                break;
            }
            let n = room.min(self.current.rows - self.cursor);
            let (a, b) = (self.cursor, self.cursor + n);
            let (buf, _) = self.shuffle.as_mut().expect("shuffling");
            buf.features
                .extend_from_slice(&self.current.features[a * w..b * w]);
            buf.labels.extend_from_slice(&self.current.labels[a..b]);
            self.cursor = b;
        }
        let mut drawn = false;
        while batch.rows < max_rows {
            let more = self.ensure_rows()?;
            let (buf, rng) = self.shuffle.as_mut().expect("shuffling");
            let len = buf.labels.len();
            if len == 0 {
                break;
            }
            if more {
                let left = (self.current.rows - self.cursor).min(max_rows - batch.rows);
                let (current, cursor) = (&self.current, &mut self.cursor);
                draw_refilled(
                    (buf, rng, w),
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
}

impl EpochStream {
    /// The next batch of at most `max_rows` sequences, padded to its longest.
    fn next_sequences(&mut self, max_rows: usize) -> Result<Option<Batch>> {
        let shuffled = self.shuffle.is_some();
        let draw = self.sequences.as_ref().expect("a sequence stream");
        let (per_step, bucket) = (draw.per_step, draw.bucket);
        let rows = match (shuffled, bucket) {
            (false, _) => {
                let mut rows = Vec::new();
                while rows.len() < max_rows && self.ensure_rows()? {
                    rows.push(self.take_sequence());
                }
                rows
            }
            (true, true) => self.bucketed(max_rows)?,
            (true, false) => self.drawn(max_rows)?,
        };
        self.planned_left = self.planned_left.saturating_sub(rows.len() as u64);
        Ok((!rows.is_empty()).then(|| sequences::pad(&rows, per_step)))
    }

    /// The next unread row of the current chunk.
    fn take_sequence(&mut self) -> Sequence {
        let draw = self.sequences.as_mut().expect("a sequence stream");
        let row = self
            .current
            .sequence(self.cursor, draw.offset, draw.per_step);
        draw.offset += self.current.lengths[self.cursor];
        self.cursor += 1;
        row
    }

    /// Fills the shuffle buffer up to `capacity` rows from the stream.
    fn top_up(&mut self, capacity: usize) -> Result<()> {
        while self.sequences.as_ref().expect("sequences").buffer.len() < capacity
            && self.ensure_rows()?
        {
            let row = self.take_sequence();
            self.sequences.as_mut().expect("sequences").buffer.push(row);
        }
        Ok(())
    }

    /// Rows drawn one by one from the shuffle buffer, refilled after each.
    fn drawn(&mut self, max_rows: usize) -> Result<Vec<Sequence>> {
        let capacity = self.shuffle.as_ref().map_or(1, |(b, _)| b.capacity);
        let mut rows = Vec::new();
        while rows.len() < max_rows {
            self.top_up(capacity)?;
            let buffer = &mut self.sequences.as_mut().expect("sequences").buffer;
            if buffer.is_empty() {
                break;
            }
            let rng = &mut self.shuffle.as_mut().expect("shuffling").1;
            let i = rng.random_range(0..buffer.len());
            rows.push(buffer.swap_remove(i));
        }
        Ok(rows)
    }

    /// A batch from the length buckets of the shuffle buffer, which is refilled (to a whole
    /// number of batches) and bucketed again once its batches are used up.
    fn bucketed(&mut self, max_rows: usize) -> Result<Vec<Sequence>> {
        if let Some(rows) = self
            .sequences
            .as_mut()
            .expect("sequences")
            .pool
            .next_batch()
        {
            return Ok(rows);
        }
        let capacity = self.shuffle.as_ref().map_or(1, |(b, _)| b.capacity);
        let capacity = (capacity / max_rows).max(1).saturating_mul(max_rows);
        self.top_up(capacity)?;
        let draw = self.sequences.as_mut().expect("sequences");
        let rows = std::mem::take(&mut draw.buffer);
        let rng = &mut self.shuffle.as_mut().expect("shuffling").1;
        draw.pool.fill(rows, max_rows, rng);
        Ok(draw.pool.next_batch().unwrap_or_default())
    }
}

/// `wanted` rows, but never more than the `available` rows a plan holds: what a buffer may
/// reserve up front.
fn bounded(wanted: usize, available: u64) -> usize {
    wanted.min(usize::try_from(available).unwrap_or(usize::MAX))
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

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float32Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use ringflow_core::pb::Partition;

    use super::*;
    use crate::data::cache::RowGroupCache;
    use crate::data::features::LabelKind;

    /// How the tests read columns `x` and `y`: no SQL, no cache, no driver, no images.
    pub(crate) fn read_context() -> ReadContext {
        ReadContext {
            columns: vec!["x".into(), "y".into()],
            prep: None,
            cache: RowGroupCache::new(0),
            driver: None,
            images: None,
            batch_rows: ringflow_core::data::partition::READ_BATCH_ROWS,
            direct: true,
        }
    }

    /// A Parquet file with `rows` rows of `x = i` and `y = 2i`, in row groups of 100, and the
    /// plan that reads all of it.
    pub(crate) fn data(dir: &std::path::Path, rows: usize) -> EpochPlan {
        let path = dir.join("d.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Float32, false),
            Field::new("y", DataType::Float32, false),
        ]));
        let x: Vec<f32> = (0..rows).map(|i| i as f32).collect();
        let y: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Float32Array::from(x)),
            Arc::new(Float32Array::from(y)),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let groups = rows.div_ceil(100);
        let partitions = (0..groups)
            .map(|g| Partition {
                path: path.display().to_string(),
                row_group: g as u32,
                row_offset: 0,
                row_count: (rows - 100 * g).min(100) as u64,
                file_row_start: 100 * g as u64,
                query_rows: None,
            })
            .collect();
        EpochPlan {
            epoch: 0,
            partitions,
            rows: rows as u64,
            steps: 1,
            reform: false,
        }
    }

    pub(crate) fn stream(plan: &EpochPlan, shuffle: Option<usize>) -> EpochStream {
        let converter = Converter::new(
            &["x".to_string()],
            Some("y"),
            LabelKind::Regression,
            None,
            1,
        );
        let read = read_context();
        let shuffle = shuffle.map(|rows| (rows, ringflow_ml::rng::seeded(7, 0)));
        EpochStream::start(plan, Arc::new(converter), 1, shuffle, false, read)
    }

    /// Every row of the batch, checked against its label.
    fn values(batch: &Batch) -> Vec<u32> {
        for (x, y) in batch.features.iter().zip(&batch.labels) {
            assert_eq!(2.0 * x, *y, "a feature lost its label");
        }
        let mut v: Vec<u32> = batch.features.iter().map(|&x| x as u32).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_batch_far_beyond_the_data_is_the_whole_share() {
        let dir = tempfile::tempdir().unwrap();
        let plan = data(dir.path(), 250);
        for shuffle in [None, Some(64), Some(usize::MAX)] {
            let mut s = stream(&plan, shuffle);
            // Reserving this many rows up front would fail outright.
            let batch = s.next_batch(usize::MAX / 2).unwrap().expect("one batch");
            assert_eq!(batch.rows, 250, "shuffle {shuffle:?}");
            assert_eq!(values(&batch), (0..250).collect::<Vec<_>>());
            assert!(
                batch.features.capacity() <= 250,
                "reserved {} rows for 250",
                batch.features.capacity()
            );
            assert!(s.next_batch(usize::MAX / 2).unwrap().is_none());
        }
    }

    #[test]
    fn batches_cover_the_epoch_once_whatever_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let plan = data(dir.path(), 250);
        for shuffle in [None, Some(1), Some(64), Some(usize::MAX)] {
            let mut s = stream(&plan, shuffle);
            let mut seen = Vec::new();
            while let Some(b) = s.next_batch(32).unwrap() {
                assert!(b.rows <= 32);
                seen.extend(values(&b));
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..250).collect::<Vec<_>>(), "shuffle {shuffle:?}");
        }
    }

    /// The rows come in the order of TensorFlow's `shuffle(buffer_size)` drawing one row at a
    /// time (here simulated on the row numbers with the stream's generator), also where rows
    /// are drawn several at a time while the current chunk refills them: every batch holds the
    /// same rows in the same order.
    #[test]
    fn batches_draw_rows_in_the_order_of_one_at_a_time() {
        use rand::RngExt;
        let dir = tempfile::tempdir().unwrap();
        let (rows, capacity, size) = (250, 64, 32);
        let plan = data(dir.path(), rows);
        let mut rng = ringflow_ml::rng::seeded(7, 0);
        let mut upcoming = 0..rows as u32;
        let mut buffer: Vec<u32> = upcoming.by_ref().take(capacity).collect();
        let mut want = Vec::new();
        while !buffer.is_empty() {
            let mut batch = Vec::new();
            while batch.len() < size && !buffer.is_empty() {
                let i = rng.random_range(0..buffer.len());
                batch.push(buffer[i]);
                match upcoming.next() {
                    Some(row) => buffer[i] = row,
                    None => drop(buffer.swap_remove(i)),
                }
            }
            want.push(batch);
        }
        let mut s = stream(&plan, Some(capacity));
        let mut got = Vec::new();
        while let Some(b) = s.next_batch(size).unwrap() {
            values(&b);
            got.push(b.features.iter().map(|&x| x as u32).collect::<Vec<_>>());
        }
        assert_eq!(got, want);
    }
}
