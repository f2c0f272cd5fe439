//! An epoch's partitions decoded ahead of the training loop, on [`READ_DECODERS`] threads.
//!
//! Partition `i` goes to decoder `i % READ_DECODERS`; each decoder reads its partitions in
//! turn (from the row-group cache or from storage, through `data.sql` when the job has one),
//! converts every record batch to numbers and hands the chunks over through its own bounded
//! channel, ending each partition with a marker. The training loop takes the partitions back in
//! plan order, so the rows it sees — and every error, which arrives where its partition would
//! have — do not depend on which decoder finished first, while both decoders work ahead of it
//! on both cores.
//!
//! A partition of a local file that neither `data.sql` nor images involve, and that the
//! row-group cache does not already hold, is read straight from its pages into the chunks
//! ([`DirectReader`]), in chunks that end where the plan's batches end (so that the loop can
//! hand a chunk on as a batch without copying it); the first rows it cannot take, and every
//! other partition, go through Arrow as before.
//! Chunks are [`read_batch_rows`] rows (about [`READ_CHUNK_BYTES`]), small enough to stay in a
//! core's cache while they are decoded and converted, and the loop hands each chunk back once
//! it has used it, for a decoder to convert into again: reading allocates almost nothing.
//!
//! Memory is bounded in bytes: each decoder holds at most its share of [`READ_AHEAD_BYTES`] of
//! converted chunks ready (at least one), besides the chunk it is converting
//! ([`read_ahead_chunks`] counts them for the memory estimate); the chunks kept for reuse are
//! among those.
//!
//! [`DirectReader`]: crate::data::features::DirectReader
//! [`read_batch_rows`]: ringflow_core::data::partition::read_batch_rows
//! [`READ_CHUNK_BYTES`]: ringflow_core::data::partition::READ_CHUNK_BYTES
//! [`read_ahead_chunks`]: ringflow_core::data::partition::read_ahead_chunks
//! [`READ_AHEAD_BYTES`]: ringflow_core::data::partition::READ_AHEAD_BYTES
//! [`READ_DECODERS`]: ringflow_core::data::partition::READ_DECODERS

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ringflow_core::data::partition::{
    READ_DECODERS, read_ahead_chunks, read_ahead_depth, read_batch_rows,
};
use ringflow_core::pb::Partition;

use crate::data::background::mark_as_batch_work;
use crate::data::converter::BatchConverter;
use crate::data::partitions::ReadContext;
use crate::data::rows::Rows;
use crate::error::{CommError, CommOp, Peer, Result};

/// What a decoder hands over.
enum Piece {
    /// The converted rows of one record batch.
    Rows(Rows),
    /// The current partition has no more rows.
    End,
}

/// One decoder thread and the receiving end of its channel.
struct Decoder {
    chunks: Option<Receiver<Result<Piece>>>,
    thread: Option<JoinHandle<()>>,
}

/// Chunks the training loop has finished with, for the decoders to convert into again: once
/// the buffers have grown, reading allocates (and the kernel maps) nothing new.
#[derive(Debug)]
struct ChunkPool {
    free: Mutex<Vec<Rows>>,
    /// The most chunks kept: no more than can be alive at once.
    limit: usize,
}

impl ChunkPool {
    /// An emptied chunk to convert into (a new one when none is kept).
    fn take(&self) -> Rows {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default()
    }

    /// Keeps `rows` for reuse, unless it holds no buffer or enough are kept.
    fn give(&self, rows: Rows) {
        if rows.features.capacity() == 0 && rows.labels.capacity() == 0 {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.limit {
            free.push(rows);
        }
    }
}

/// The converted chunks of an epoch's partitions, in plan order.
pub struct ReadAhead {
    pool: Arc<ChunkPool>,
    decoders: Vec<Decoder>,
    /// The partition whose chunks come next.
    next: usize,
    partitions: usize,
    stop: Arc<AtomicBool>,
}

impl ReadAhead {
    /// Starts decoding `partitions` with `converter`, whose rows take about `row_bytes` bytes
    /// once converted: this sizes the record batches read ([`read_batch_rows`]) and the
    /// channels (see [`READ_AHEAD_BYTES`](ringflow_core::data::partition::READ_AHEAD_BYTES)).
    pub fn start(
        partitions: &[Partition],
        converter: Arc<dyn BatchConverter>,
        mut read: ReadContext,
        row_bytes: u64,
    ) -> ReadAhead {
        let stop = Arc::new(AtomicBool::new(false));
        let depth = read_ahead_depth(row_bytes);
        // Chunks of about READ_CHUNK_BYTES, and no larger than the caller asks for.
        read.batch_rows = read_batch_rows(row_bytes).min(read.batch_rows.max(1));
        let pool = Arc::new(ChunkPool {
            free: Mutex::new(Vec::new()),
            limit: read_ahead_chunks(row_bytes) as usize,
        });
        let count = READ_DECODERS.min(partitions.len());
        let starts: Vec<u64> = partitions
            .iter()
            .scan(0u64, |rows, p| {
                let start = *rows;
                *rows = rows.saturating_add(p.row_count);
                Some(start)
            })
            .collect();
        let decoders = (0..count)
            .map(|k| {
                // Each partition with the number of rows before it in the plan.
                let share: Vec<(Partition, u64)> = partitions
                    .iter()
                    .zip(&starts)
                    .skip(k)
                    .step_by(count)
                    .map(|(p, &start)| (p.clone(), start))
                    .collect();
                spawn(
                    k,
                    share,
                    converter.clone(),
                    read.clone(),
                    depth,
                    pool.clone(),
                    stop.clone(),
                )
            })
            .collect();
        ReadAhead {
            pool,
            decoders,
            next: 0,
            partitions: partitions.len(),
            stop,
        }
    }

    /// The next chunk of rows in plan order, waiting at most `deadline` for each; `None` once
    /// every partition is read.
    pub fn next_chunk(&mut self, deadline: Duration) -> Result<Option<Rows>> {
        while self.next < self.partitions {
            let k = self.next % self.decoders.len();
            let chunks = self.decoders[k]
                .chunks
                .as_ref()
                .expect("open until dropped");
            match chunks.recv_timeout(deadline) {
                Ok(Ok(Piece::Rows(rows))) => return Ok(Some(rows)),
                Ok(Ok(Piece::End)) => self.next += 1,
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Disconnected) => {
                    let why = format!(
                        "the decoder of partition {} stopped before reading it",
                        self.next
                    );
                    return Err(CommError::new(Peer::Local, CommOp::ReadData, why).into());
                }
                Err(RecvTimeoutError::Timeout) => {
                    let why = format!(
                        "reading this executor's partitions produced nothing for {} s",
                        deadline.as_secs()
                    );
                    return Err(CommError::new(Peer::Local, CommOp::ReadData, why).into());
                }
            }
        }
        Ok(None)
    }

    /// Hands back a chunk that [`ReadAhead::next_chunk`] gave, once its rows are used, for a
    /// decoder to convert into again.
    pub fn recycle(&self, rows: Rows) {
        self.pool.give(rows);
    }
}

#[cfg(test)]
impl ReadAhead {
    /// [`ReadAhead::start`] with rows sized so that a chunk holds 7 of them, so that chunks
    /// cross pages, record batches and row groups.
    pub(crate) fn start_in_chunks_of_7(
        partitions: &[Partition],
        converter: &crate::data::features::Converter,
        read: ReadContext,
    ) -> ReadAhead {
        let row_bytes = ringflow_core::data::partition::READ_CHUNK_BYTES / 7;
        ReadAhead::start(partitions, Arc::new(converter.clone()), read, row_bytes)
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing a channel unblocks a decoder waiting to send; each then notices the stop
        // after its current record batch at most.
        for d in &mut self.decoders {
            drop(d.chunks.take());
        }
        for d in &mut self.decoders {
            if let Some(t) = d.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Starts decoder `k` on its `share` of the partitions, with a channel of `depth` chunks,
/// converting into chunks from `pool`.
fn spawn(
    k: usize,
    share: Vec<(Partition, u64)>,
    converter: Arc<dyn BatchConverter>,
    read: ReadContext,
    depth: usize,
    pool: Arc<ChunkPool>,
    stop: Arc<AtomicBool>,
) -> Decoder {
    let (tx, rx) = sync_channel(depth);
    let report = tx.clone();
    let thread = std::thread::Builder::new()
        .name(format!("ringflow-reader-{k}"))
        .spawn(move || {
            mark_as_batch_work();
            decode(&share, converter.as_ref(), &read, &tx, &pool, &stop)
        });
    let thread = match thread {
        Ok(t) => Some(t),
        Err(e) => {
            // The channel is empty, so this does not block; the loop reads it in turn.
            let why = format!("the OS cannot start a reader thread: {e}");
            let _ = report.send(Err(
                CommError::new(Peer::Local, CommOp::ReadData, why).into()
            ));
            None
        }
    };
    Decoder {
        chunks: Some(rx),
        thread,
    }
}

/// What a decoder needs besides its partitions.
struct Work<'a> {
    converter: &'a dyn BatchConverter,
    read: &'a ReadContext,
    tx: &'a SyncSender<Result<Piece>>,
    pool: &'a ChunkPool,
    stop: &'a AtomicBool,
}

/// Converts every batch of `share`, partition after partition, into `tx`; stops at the first
/// error (sent in its place), when the receiver is gone, or when `stop` is set.
fn decode(
    share: &[(Partition, u64)],
    converter: &dyn BatchConverter,
    read: &ReadContext,
    tx: &SyncSender<Result<Piece>>,
    pool: &ChunkPool,
    stop: &AtomicBool,
) {
    let work = Work {
        converter,
        read,
        tx,
        pool,
        stop,
    };
    for (p, start) in share {
        let sent = match work.partition(p, *start) {
            Ok(true) => !stop.load(Ordering::Relaxed) && tx.send(Ok(Piece::End)).is_ok(),
            Ok(false) => false,
            Err(e) => {
                let _ = tx.send(Err(e));
                false
            }
        };
        if !sent {
            return;
        }
    }
}

impl Work<'_> {
    /// Sends the converted rows of `p`, which has `start` rows before it in the plan; false
    /// once stopped or the receiver is gone.
    fn partition(&self, p: &Partition, start: u64) -> Result<bool> {
        let Some(done) = self.direct(p, start) else {
            return Ok(false);
        };
        if done == p.row_count {
            return Ok(true);
        }
        // The rest through Arrow: all of it, or from the first rows the direct reader could
        // not take (which Arrow converts, or reports, as it always does).
        let rest = Partition {
            row_offset: p.row_offset + done,
            row_count: p.row_count - done,
            ..p.clone()
        };
        let mut open = true;
        self.read
            .for_each_batch(std::slice::from_ref(&rest), self.stop, |batch, origin| {
                let mut rows = self.pool.take();
                self.converter
                    .convert_into(batch, origin.file, origin.first_row, &mut rows)?;
                open = self.tx.send(Ok(Piece::Rows(rows))).is_ok();
                Ok(open)
            })?;
        Ok(open && !self.stop.load(Ordering::Relaxed))
    }

    /// Sends the rows of `p` that the direct reader takes, from the first: how many (all,
    /// or up to the first it cannot take, or none where it cannot read `p`), or `None` once
    /// stopped or the receiver is gone.
    fn direct(&self, p: &Partition, start: u64) -> Option<u64> {
        let mut done = 0;
        let Some(mut direct) = self
            .read
            .direct_path(p)
            .and_then(|path| self.converter.direct_rows(&path, p))
        else {
            return Some(0);
        };
        let batch = self.read.batch_rows.max(1) as u64;
        while done < p.row_count {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            // Chunks end where the plan's batches of `batch` rows end, so that in-order
            // batches are whole chunks.
            let to_edge = batch - start.wrapping_add(done) % batch;
            let n = (p.row_count - done).min(to_edge);
            let mut rows = self.pool.take();
            if !direct.read(n as usize, &mut rows) {
                self.pool.give(rows);
                break;
            }
            if self.tx.send(Ok(Piece::Rows(rows))).is_err() {
                return None;
            }
            done += n;
        }
        Some(done)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::data::batches::tests::{data, read_context};
    use crate::data::features::{Converter, LabelKind};

    fn start(partitions: &[Partition]) -> ReadAhead {
        let converter = Converter::new(&["x".into()], Some("y"), LabelKind::Regression, None, 1);
        let read = read_context();
        ReadAhead::start(partitions, Arc::new(converter), read, 8)
    }

    /// The `x` of every row until the end or the first error.
    fn drain(r: &mut ReadAhead) -> (Vec<f32>, Option<String>) {
        let mut xs = Vec::new();
        loop {
            match r.next_chunk(Duration::from_secs(60)) {
                Ok(Some(rows)) => {
                    assert_eq!(rows.labels.len(), rows.rows);
                    xs.extend(rows.features);
                }
                Ok(None) => return (xs, None),
                Err(e) => return (xs, Some(e.to_string())),
            }
        }
    }

    #[test]
    fn partitions_come_back_in_plan_order_from_both_decoders() {
        let dir = tempfile::tempdir().unwrap();
        let mut partitions = data(dir.path(), 950).partitions;
        partitions.reverse();
        partitions.swap(2, 7);
        let want: Vec<f32> = partitions
            .iter()
            .flat_map(|p| (0..p.row_count).map(|i| (p.file_row_start + i) as f32))
            .collect();
        let (got, error) = drain(&mut start(&partitions));
        assert_eq!(error, None);
        assert_eq!(got, want);
    }

    #[test]
    fn an_error_arrives_where_its_partition_would_have() {
        let dir = tempfile::tempdir().unwrap();
        let mut partitions = data(dir.path(), 950).partitions;
        partitions[4].row_group = 99;
        let (got, error) = drain(&mut start(&partitions));
        assert_eq!(got, (0..400).map(|i| i as f32).collect::<Vec<_>>());
        let error = error.expect("partition 4 fails");
        assert!(
            error.contains("d.parquet") && error.contains("row group 99"),
            "{error}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn decoders_are_batch_work() {
        let dir = tempfile::tempdir().unwrap();
        let partitions = data(dir.path(), 9500).partitions;
        let converter = Converter::new(&["x".into()], Some("y"), LabelKind::Regression, None, 1);
        let mut r = ReadAhead::start_in_chunks_of_7(&partitions, &converter, read_context());
        // Partition 0 (100 rows: 15 chunks of 7) comes from decoder 0, partition 1 from
        // decoder 1: with a chunk of each, both have marked themselves. Each has ~700 chunks to
        // convert, far more than its channel holds, so both are still running.
        for _ in 0..16 {
            assert!(r.next_chunk(Duration::from_secs(60)).unwrap().is_some());
        }
        assert_eq!(r.decoders.len(), 2, "the test expects two decoders");
        for d in &r.decoders {
            let thread = d.thread.as_ref().expect("a decoder thread");
            assert_eq!(
                crate::data::background::policy_of(thread),
                libc::SCHED_BATCH
            );
        }
    }

    #[test]
    fn stopping_early_ends_every_decoder() {
        let dir = tempfile::tempdir().unwrap();
        let partitions = data(dir.path(), 950).partitions;
        let mut r = start(&partitions);
        assert!(r.next_chunk(Duration::from_secs(60)).unwrap().is_some());
        drop(r);
        assert!(drain(&mut start(&[])).0.is_empty());
    }
}
