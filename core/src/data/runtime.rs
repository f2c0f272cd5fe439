//! A small tokio runtime for storage and SQL I/O called from synchronous code.
//!
//! The planner and the executor's reader thread are synchronous; object stores and DataFusion
//! are asynchronous. [`block_on`] runs a future on a process-wide two-thread runtime and waits
//! for it from any thread that is not itself driving async tasks (a blocking thread, a plain
//! thread, `main`).

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Runtime;

/// The process-wide I/O runtime, started on first use.
pub fn io_runtime() -> &'static Runtime {
    static IO: OnceLock<Runtime> = OnceLock::new();
    IO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ringflow-io")
            .enable_all()
            .build()
            .expect("the OS can start the I/O runtime's threads")
    })
}

/// Runs `future` on the I/O runtime and waits for its output.
pub fn block_on<F>(future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    io_runtime().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv()
        .expect("the I/O runtime runs every future it is given to completion")
}
