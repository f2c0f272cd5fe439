//! The next mini-batch drawn on a thread of its own while the current one trains (tf.data's
//! `prefetch`, PyTorch's `DataLoader` workers).
//!
//! Drawing a batch from the shuffle buffer ([`EpochStream`]) copies every row from a random
//! place in a buffer far larger than the caches, and waits for the decoders when they fall
//! behind. On the training thread that time adds to every step; on a thread of its own it
//! overlaps the step, whose GEMM leaves a core idle part of the time. [`BatchesAhead`] owns
//! the stream and keeps at most [`AHEAD`] batches ready besides the one being drawn: memory
//! grows by that many batches, and the rows, their order and every error (which arrives where
//! its batch would have) are those of the stream itself.

use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::data::background::mark_as_batch_work;
use crate::data::batches::EpochStream;
use crate::data::rows::Batch;
use crate::error::{CommError, CommOp, Peer, Result};

/// Batches kept ready ahead of the one the training thread is using (the memory estimate
/// counts them, and the one being drawn).
pub use ringflow_core::data::BATCHES_AHEAD as AHEAD;

/// An epoch's batches of a fixed size, drawn ahead on a thread of their own.
pub struct BatchesAhead {
    batches: Receiver<Result<Option<Batch>>>,
    /// The stream has ended (or failed): nothing more will come.
    done: bool,
    /// The drawing thread: dropping the receiver ends it after the batch it is drawing, which
    /// [`Drop`] waits for, so that no two epochs' shuffle buffers are alive at once.
    thread: Option<JoinHandle<()>>,
}

impl Drop for BatchesAhead {
    fn drop(&mut self) {
        // Closing the channel first fails the thread's next send (or the one it waits in).
        let (_, closed) = sync_channel(0);
        drop(std::mem::replace(&mut self.batches, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl BatchesAhead {
    /// Starts drawing batches of at most `rows` rows from `stream`. Where the OS cannot start
    /// a thread, the first [`next_batch`](Self::next_batch) reports it.
    pub fn start(mut stream: EpochStream, rows: usize) -> BatchesAhead {
        let (tx, batches) = sync_channel(AHEAD);
        let report = tx.clone();
        let thread = std::thread::Builder::new()
            .name("ringflow-batches".into())
            .spawn(move || {
                mark_as_batch_work();
                loop {
                    let next = stream.next_batch(rows);
                    let last = !matches!(next, Ok(Some(_)));
                    // A closed channel means the epoch was abandoned: stop drawing.
                    if tx.send(next).is_err() || last {
                        return;
                    }
                }
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                let why = format!("the OS cannot start the thread that draws batches: {e}");
                // The channel is empty, so this does not block.
                let _ = report.send(Err(
                    CommError::new(Peer::Local, CommOp::ReadData, why).into()
                ));
                None
            }
        };
        BatchesAhead {
            batches,
            done: false,
            thread,
        }
    }

    /// The next batch, waiting at most `deadline` for it; `None` once the epoch's rows are
    /// used up.
    pub fn next_batch(&mut self, deadline: Duration) -> Result<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        let next = match self.batches.recv_timeout(deadline) {
            Ok(next) => next,
            Err(RecvTimeoutError::Timeout) => {
                let why = format!("no batch was drawn for {} s", deadline.as_secs());
                return Err(CommError::new(Peer::Local, CommOp::ReadData, why).into());
            }
            Err(RecvTimeoutError::Disconnected) => {
                let why = "the thread that draws batches stopped before the epoch's end";
                return Err(CommError::new(Peer::Local, CommOp::ReadData, why).into());
            }
        };
        self.done = !matches!(next, Ok(Some(_)));
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::batches::tests::{data, stream};

    const DEADLINE: Duration = Duration::from_secs(60);

    /// The features of every batch, batch by batch.
    fn drawn(mut next: impl FnMut() -> Result<Option<Batch>>) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        while let Some(b) = next().unwrap() {
            assert_eq!(b.labels.len(), b.rows);
            out.push(b.features);
        }
        out
    }

    /// Waits until `thread` has ended on its own.
    fn wait_for_end(thread: JoinHandle<()>) {
        let start = std::time::Instant::now();
        while !thread.is_finished() {
            assert!(start.elapsed() < DEADLINE, "the drawing thread goes on");
            std::thread::sleep(Duration::from_millis(5));
        }
        thread.join().expect("no panic");
    }

    #[test]
    fn the_same_batches_in_the_same_order_as_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let plan = data(dir.path(), 950);
        for shuffle in [None, Some(64)] {
            let mut direct = stream(&plan, shuffle);
            let want = drawn(|| direct.next_batch(32));
            let mut ahead = BatchesAhead::start(stream(&plan, shuffle), 32);
            let got = drawn(|| ahead.next_batch(DEADLINE));
            assert_eq!(got.len(), 950_usize.div_ceil(32), "shuffle {shuffle:?}");
            assert_eq!(got, want, "shuffle {shuffle:?}");
            // After the end, still the end, and the thread has ended with it.
            assert!(ahead.next_batch(DEADLINE).unwrap().is_none());
            wait_for_end(ahead.thread.take().expect("a drawing thread"));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_drawing_thread_is_batch_work() {
        let dir = tempfile::tempdir().unwrap();
        let plan = data(dir.path(), 950);
        let mut ahead = BatchesAhead::start(stream(&plan, Some(64)), 8);
        // The thread has drawn a batch, so it has marked itself; it then waits to send more.
        assert!(ahead.next_batch(DEADLINE).unwrap().is_some());
        let thread = ahead.thread.as_ref().expect("a drawing thread");
        assert_eq!(
            crate::data::background::policy_of(thread),
            libc::SCHED_BATCH
        );
    }

    #[test]
    fn an_error_arrives_where_its_batch_would_have() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = data(dir.path(), 950);
        plan.partitions[4].row_group = 99;
        let mut ahead = BatchesAhead::start(stream(&plan, None), 100);
        for _ in 0..4 {
            assert_eq!(ahead.next_batch(DEADLINE).unwrap().unwrap().rows, 100);
        }
        let error = ahead.next_batch(DEADLINE).unwrap_err().to_string();
        assert!(error.contains("row group 99"), "{error}");
        assert!(ahead.next_batch(DEADLINE).unwrap().is_none());
    }

    #[test]
    fn an_epoch_abandoned_early_stops_the_drawing_thread() {
        let dir = tempfile::tempdir().unwrap();
        let plan = data(dir.path(), 950);
        let mut ahead = BatchesAhead::start(stream(&plan, Some(64)), 10);
        assert!(ahead.next_batch(DEADLINE).unwrap().is_some());
        let thread = ahead.thread.take().expect("a drawing thread");
        drop(ahead);
        // Its next send fails and it ends, dropping the stream and its decoders.
        wait_for_end(thread);
        // Dropping joins the thread without waiting for the epoch's end.
        let ahead = BatchesAhead::start(stream(&plan, Some(64)), 1);
        drop(ahead);
    }
}
