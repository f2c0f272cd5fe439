//! Deadlines for reading data and running queries: no read of a data file and no SQL query
//! is waited for without a limit.
//!
//! A local read can block for ever in the kernel (a hung NFS or FUSE mount); an object-store
//! read is bounded by its client's timeouts, but a stream of them is not. [`blocking`] runs
//! blocking work on a helper thread and stops waiting at the deadline; [`block_on_timeout`]
//! runs a future on the I/O runtime and drops it at the deadline, which cancels it (DataFusion
//! stops a query whose stream is dropped: its operators yield to the runtime cooperatively).

use std::future::Future;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use super::runtime::io_runtime;

/// How long one step of reading a data file may take: opening it and reading its footer, or
/// reading one batch of rows (which may fetch a row group's column chunks from a store). A
/// step beyond it fails with [`read_timed_out`]; object-store requests also have their own,
/// shorter client timeouts.
pub const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// How much longer than its limit the caller of [`block_on_timeout`] waits for a future that
/// never gives the runtime a chance to cancel it (one that never yields).
const GRACE: Duration = Duration::from_secs(5);

/// Work that was not waited for to the end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineError {
    /// The work ran past its limit.
    #[error("did not finish within {} s", .limit.as_secs())]
    TimedOut {
        /// The limit it ran past.
        limit: Duration,
    },
    /// No thread could be started to run it.
    #[error("cannot be run: the OS refused a thread ({0})")]
    NoThread(String),
    /// The helper thread stopped without an answer (its work panicked).
    #[error("stopped without an answer: its thread ended (a bug in the decoder it ran)")]
    Stopped,
}

/// The end of a sentence about a file whose read ran past [`READ_TIMEOUT`].
pub fn read_timed_out() -> String {
    format!(
        "was not read within {} s (the read deadline for one step of reading a data file): \
         its file system or store does not answer",
        READ_TIMEOUT.as_secs()
    )
}

/// The end of a sentence about a file whose read could not be run or timed out.
pub fn read_failed(e: &DeadlineError) -> String {
    match e {
        DeadlineError::TimedOut { .. } => read_timed_out(),
        DeadlineError::NoThread(_) | DeadlineError::Stopped => format!("cannot be read: {e}"),
    }
}

/// An iterator advanced on a helper thread of its own, each item waited for at most a limit:
/// the thread is started once, not once per item, so that a reader of many small batches
/// pays for no thread starts (and its batches are allocated on one thread throughout).
pub struct ThreadedIter<T> {
    ask: SyncSender<()>,
    answers: Receiver<Option<T>>,
}

impl<T: Send + 'static> ThreadedIter<T> {
    /// Moves `iter` onto a new thread named `name`, which advances it once per
    /// [`ThreadedIter::next`] and ends after its last item or once this is dropped.
    pub fn start<I>(name: &str, mut iter: I) -> Result<ThreadedIter<T>, DeadlineError>
    where
        I: Iterator<Item = T> + Send + 'static,
    {
        let (ask, asked) = sync_channel::<()>(1);
        let (answer, answers) = sync_channel(1);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    let item = iter.next();
                    let last = item.is_none();
                    if answer.send(item).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(|e| DeadlineError::NoThread(e.to_string()))?;
        Ok(ThreadedIter { ask, answers })
    }

    /// The next item (`None` after the last), waited for at most `limit`. Past the limit the
    /// thread is left to finish on its own, and this iterator must not be asked again.
    pub fn next(&mut self, limit: Duration) -> Result<Option<T>, DeadlineError> {
        if self.ask.send(()).is_err() {
            return Err(DeadlineError::Stopped);
        }
        match self.answers.recv_timeout(limit) {
            Ok(item) => Ok(item),
            Err(RecvTimeoutError::Timeout) => Err(DeadlineError::TimedOut { limit }),
            Err(RecvTimeoutError::Disconnected) => Err(DeadlineError::Stopped),
        }
    }
}

/// Runs blocking `work` on a helper thread and waits for it at most `limit`. Past the limit
/// the thread is left to finish on its own (a blocked system call cannot be interrupted) and
/// its result is dropped.
pub fn blocking<T, W>(limit: Duration, work: W) -> Result<T, DeadlineError>
where
    T: Send + 'static,
    W: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name("ringflow-read".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| DeadlineError::NoThread(e.to_string()))?;
    match rx.recv_timeout(limit) {
        Ok(out) => Ok(out),
        Err(RecvTimeoutError::Timeout) => Err(DeadlineError::TimedOut { limit }),
        Err(RecvTimeoutError::Disconnected) => {
            // The work panicked on the helper thread: a bug, reported like one on this thread.
            panic!("a read on a helper thread panicked")
        }
    }
}

/// Runs `future` on the I/O runtime and waits for its output at most `limit`: at the limit the
/// future is dropped, which cancels what it was doing.
pub fn block_on_timeout<F>(limit: Duration, future: F) -> Result<F::Output, DeadlineError>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = sync_channel(1);
    io_runtime().spawn(async move {
        // The future is dropped at the end of this statement, before the caller is answered.
        let result = tokio::time::timeout(limit, future).await;
        let _ = tx.send(result);
    });
    match rx.recv_timeout(limit.saturating_add(GRACE)) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(_)) | Err(RecvTimeoutError::Timeout) => Err(DeadlineError::TimedOut { limit }),
        Err(RecvTimeoutError::Disconnected) => {
            panic!("the I/O runtime runs every future it is given to completion")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    #[test]
    fn blocking_work_is_waited_for_until_its_deadline() {
        assert_eq!(blocking(Duration::from_secs(5), || 7).unwrap(), 7);
        let start = Instant::now();
        let e = blocking(Duration::from_millis(200), || {
            std::thread::sleep(Duration::from_secs(30))
        })
        .unwrap_err();
        assert_eq!(
            e,
            DeadlineError::TimedOut {
                limit: Duration::from_millis(200)
            }
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited to the end"
        );
        assert!(read_failed(&e).contains("300 s"), "{}", read_failed(&e));
    }

    #[test]
    fn a_threaded_iterator_answers_each_item_within_its_deadline() {
        let mut it = ThreadedIter::start("test", 0..3).unwrap();
        let limit = Duration::from_secs(5);
        let got: Vec<_> = (0..4).map(|_| it.next(limit).unwrap()).collect();
        assert_eq!(got, [Some(0), Some(1), Some(2), None]);
        // After its last item the thread has ended.
        assert_eq!(it.next(limit).unwrap_err(), DeadlineError::Stopped);
        let slow = (0..2).inspect(|&i| {
            if i == 1 {
                std::thread::sleep(Duration::from_secs(30));
            }
        });
        let mut it = ThreadedIter::start("test", slow).unwrap();
        assert_eq!(it.next(limit).unwrap(), Some(0));
        let start = Instant::now();
        let e = it.next(Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, DeadlineError::TimedOut { .. }), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited to the end"
        );
        let panics = (0..2).map(|i| if i == 1 { panic!("a decoder bug") } else { i });
        let mut it = ThreadedIter::start("test", panics).unwrap();
        assert_eq!(it.next(limit).unwrap(), Some(0));
        assert_eq!(it.next(limit).unwrap_err(), DeadlineError::Stopped);
    }

    #[test]
    fn futures_past_their_deadline_are_dropped() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Flag(dropped.clone());
        let e = block_on_timeout(Duration::from_millis(200), async move {
            let _flag = flag;
            std::future::pending::<()>().await
        })
        .unwrap_err();
        assert!(matches!(e, DeadlineError::TimedOut { .. }), "{e}");
        assert!(dropped.load(Ordering::SeqCst), "the future was not dropped");
        let out = block_on_timeout(Duration::from_secs(5), async { 3 }).unwrap();
        assert_eq!(out, 3);
    }
}
