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
//! Memory is bounded in bytes: each decoder holds at most its share of [`READ_AHEAD_BYTES`] of
//! converted chunks ready (at least one), besides the chunk it is converting
//! ([`read_ahead_chunks`] counts them for the memory estimate).
//!
//! [`read_ahead_chunks`]: ringflow_proto::data::partition::read_ahead_chunks
//! [`READ_AHEAD_BYTES`]: ringflow_proto::data::partition::READ_AHEAD_BYTES
//! [`READ_DECODERS`]: ringflow_proto::data::partition::READ_DECODERS

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use ringflow_proto::data::partition::{READ_DECODERS, read_ahead_depth};
use ringflow_proto::pb::Partition;

use crate::data::features::{Converter, Rows};
use crate::data::partitions::ReadContext;
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

/// The converted chunks of an epoch's partitions, in plan order.
pub struct ReadAhead {
    decoders: Vec<Decoder>,
    /// The partition whose chunks come next.
    next: usize,
    partitions: usize,
    stop: Arc<AtomicBool>,
}

impl ReadAhead {
    /// Starts decoding `partitions` with `converter`, whose rows take about `row_bytes` bytes
    /// once converted (this sizes the channels; see
    /// [`READ_AHEAD_BYTES`](ringflow_proto::data::partition::READ_AHEAD_BYTES)).
    pub fn start(
        partitions: &[Partition],
        converter: Arc<Converter>,
        read: ReadContext,
        row_bytes: u64,
    ) -> ReadAhead {
        let stop = Arc::new(AtomicBool::new(false));
        let depth = read_ahead_depth(row_bytes);
        let count = READ_DECODERS.min(partitions.len());
        let decoders = (0..count)
            .map(|k| {
                let share: Vec<Partition> =
                    partitions.iter().skip(k).step_by(count).cloned().collect();
                spawn(
                    k,
                    share,
                    converter.clone(),
                    read.clone(),
                    depth,
                    stop.clone(),
                )
            })
            .collect();
        ReadAhead {
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

/// Starts decoder `k` on its `share` of the partitions, with a channel of `depth` chunks.
fn spawn(
    k: usize,
    share: Vec<Partition>,
    converter: Arc<Converter>,
    read: ReadContext,
    depth: usize,
    stop: Arc<AtomicBool>,
) -> Decoder {
    let (tx, rx) = sync_channel(depth);
    let report = tx.clone();
    let thread = std::thread::Builder::new()
        .name(format!("ringflow-reader-{k}"))
        .spawn(move || decode(&share, &converter, &read, &tx, &stop));
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

/// Converts every batch of `share`, partition after partition, into `tx`; stops at the first
/// error (sent in its place), when the receiver is gone, or when `stop` is set.
fn decode(
    share: &[Partition],
    converter: &Converter,
    read: &ReadContext,
    tx: &SyncSender<Result<Piece>>,
    stop: &AtomicBool,
) {
    for p in share {
        let result = read.for_each_batch(std::slice::from_ref(p), stop, |batch, origin| {
            let rows = converter.convert(batch, origin.file, origin.first_row)?;
            Ok(tx.send(Ok(Piece::Rows(rows))).is_ok())
        });
        let sent = match result {
            Ok(()) => !stop.load(Ordering::Relaxed) && tx.send(Ok(Piece::End)).is_ok(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::data::batches::tests::{data, read_context};
    use crate::data::features::LabelKind;

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
