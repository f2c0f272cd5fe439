//! Threads that prepare data beside training, marked so that they never interrupt it.
//!
//! The threads that decode partitions (and their images) and draw batches sleep until the
//! training thread takes what they made, and its taking wakes them. A thread woken with time
//! owed to it preempts the thread on its core at once: here the training thread itself,
//! stopped for the whole batch the drawing thread then draws, though its next batch is ready,
//! and that wait counts in the step's `data` phase. Marked as batch work (Linux's
//! `SCHED_BATCH`), a woken thread waits for the scheduler's next decision instead, and still
//! gets its fair share of the cores.

/// Marks the calling thread as batch work (see the module's documentation). Best effort: where
/// the OS has no such class or refuses, the thread runs as before.
pub fn mark_as_batch_work() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    }
}

/// The scheduling policy of a running thread (`libc::SCHED_*`), for tests.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn policy_of<T>(thread: &std::thread::JoinHandle<T>) -> libc::c_int {
    use std::os::unix::thread::JoinHandleExt;
    let mut policy = -1;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: the handle's thread has not been joined (the handle is borrowed), so its
    // pthread_t is valid (a thread that has ended gives an error); both out-pointers are
    // valid.
    let r = unsafe { libc::pthread_getschedparam(thread.as_pthread_t(), &mut policy, &mut param) };
    assert_eq!(r, 0, "pthread_getschedparam failed: has the thread ended?");
    policy
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::sync::mpsc::channel;

    use super::*;

    /// Starts a thread that runs `f`, then waits until it is told to end; its policy meanwhile.
    fn policy_after(f: fn()) -> libc::c_int {
        let (started, ran) = channel();
        let (stop, stopped) = channel::<()>();
        let thread = std::thread::spawn(move || {
            f();
            started.send(()).unwrap();
            let _ = stopped.recv();
        });
        ran.recv().unwrap();
        let policy = policy_of(&thread);
        drop(stop);
        thread.join().unwrap();
        policy
    }

    #[test]
    fn a_thread_marked_as_batch_work_is_scheduled_as_batch() {
        assert_eq!(policy_after(mark_as_batch_work), libc::SCHED_BATCH);
        assert_eq!(policy_after(|| {}), libc::SCHED_OTHER);
    }
}
