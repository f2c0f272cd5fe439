//! An executor's last words: what it says as it dies, to stderr and to the driver.
//!
//! Two ways an executor dies without returning an error are reported before the process ends:
//!
//! - **A panic** (a bug, in ringflow or a library): the panic hook writes
//!   `error: executor ID panicked at FILE:LINE: MESSAGE` to stderr and sends
//!   `panicked at FILE:LINE: MESSAGE` to the driver.
//! - **An allocation that failed** (the memory limit, `ulimit -v`, an absurd size): Rust then
//!   aborts the process. [`ReportingAllocator`], which a binary installs as its
//!   `#[global_allocator]`, notes the failed size; the abort's SIGABRT handler, on the thread
//!   that failed, formats `out of memory allocating N bytes (…)` without allocating, writes it
//!   to stderr and hands it to the courier thread, then lets the abort proceed. Only an abort
//!   that follows a failed allocation on the same thread is reported, so fallible allocations
//!   (`try_reserve`) that a caller handles say nothing.
//!
//! The courier is a thread started by [`install`] that reads the words from a pipe and sends
//! them (with `send`, an RPC with a short deadline); the dying thread waits for it at most
//! [`DELIVERY_WAIT`]. A pipe, because writing to it and waiting with `poll` are
//! async-signal-safe. The words are first written to stderr, so they are never lost.

use std::alloc::{GlobalAlloc, Layout, System};
use std::any::Any;
use std::fmt::Write as _;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::Duration;

/// The longest a dying thread waits for its words to reach the driver.
pub const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// The longest words sent, in bytes (a pipe write up to `PIPE_BUF` is atomic).
const MAX_WORDS: usize = 1000;

/// The size of the latest failed allocation (0: none), and the thread it failed on.
static FAILED_SIZE: AtomicUsize = AtomicUsize::new(0);
static FAILED_THREAD: AtomicI32 = AtomicI32::new(0);
/// Set by the first abort that reports: a second one (re-entrance) does not.
static ABORT_REPORTED: AtomicBool = AtomicBool::new(false);
/// The installed courier, and the executor's id for stderr.
static COURIER: OnceLock<Courier> = OnceLock::new();
static EXECUTOR_ID: OnceLock<String> = OnceLock::new();

/// The system allocator, noting the size of an allocation that fails so that the abort that
/// follows can be reported as `out of memory allocating N bytes` ([module docs](self)).
///
/// ```no_run
/// #[global_allocator]
/// static ALLOCATOR: ringflow_executor::last_words::ReportingAllocator =
///     ringflow_executor::last_words::ReportingAllocator;
/// ```
pub struct ReportingAllocator;

fn note_failure(size: usize) {
    FAILED_SIZE.store(size, Ordering::SeqCst);
    FAILED_THREAD.store(this_thread(), Ordering::SeqCst);
}

// SAFETY: every call is forwarded to the system allocator unchanged; failures are only noted.
unsafe impl GlobalAlloc for ReportingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            note_failure(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            note_failure(layout.size());
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            note_failure(new_size);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The kernel's id of the calling thread (async-signal-safe).
fn this_thread() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// A fixed buffer that text is formatted into without allocating.
pub struct Words {
    bytes: [u8; 128],
    len: usize,
}

impl Words {
    fn new() -> Words {
        Words {
            bytes: [0; 128],
            len: 0,
        }
    }

    /// The text (cut at the buffer's end if it was longer).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("out of memory")
    }
}

impl std::fmt::Write for Words {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.bytes.len() - self.len;
        let n = s.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// `out of memory allocating N bytes (X.Y GiB)`, formatted without allocating.
pub fn out_of_memory(size: usize) -> Words {
    let mut w = Words::new();
    let _ = write!(w, "out of memory allocating {size} bytes");
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    if let Some((unit, scale)) = UNITS.iter().find(|(_, s)| size as u64 >= *s) {
        // One decimal, in integers: no floating-point formatting needed.
        let tenths = (size as u128 * 10 + u128::from(*scale) / 2) / u128::from(*scale);
        let _ = write!(w, " ({}.{} {unit})", tenths / 10, tenths % 10);
    }
    w
}

/// `panicked at FILE:LINE:COLUMN: MESSAGE` for a panic at `location` with `payload`.
pub fn panicked(location: Option<(&str, u32, u32)>, payload: &dyn Any) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)");
    let message = message.lines().collect::<Vec<_>>().join(" ");
    match location {
        Some((file, line, column)) => format!("panicked at {file}:{line}:{column}: {message}"),
        None => format!("panicked: {message}"),
    }
}

/// The pipes between dying threads and the courier thread.
#[derive(Debug)]
pub struct Courier {
    /// Where words are written: a 2-byte length, then the bytes.
    words: i32,
    /// Where the courier acknowledges each delivery with one byte.
    acks: i32,
    /// The courier thread (its own words are not waited for).
    thread: AtomicI32,
}

impl Courier {
    /// Starts the courier thread, which hands each message to `send` and acknowledges it.
    pub fn start(send: impl Fn(&str) + Send + 'static) -> std::io::Result<Courier> {
        let (words_rx, words_tx) = pipe()?;
        let (acks_rx, acks_tx) = pipe()?;
        let courier = Courier {
            words: words_tx,
            acks: acks_rx,
            thread: AtomicI32::new(0),
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ringflow-last-words".into())
            .spawn(move || {
                let _ = tid_tx.send(this_thread());
                // SAFETY: the read end is owned by this thread from now on.
                let mut from = unsafe { std::fs::File::from_raw_fd(words_rx) };
                let mut len = [0u8; 2];
                while from.read_exact(&mut len).is_ok() {
                    let mut text = vec![0u8; usize::from(u16::from_le_bytes(len))];
                    if from.read_exact(&mut text).is_err() {
                        return;
                    }
                    send(&String::from_utf8_lossy(&text));
                    // SAFETY: writing one byte from a valid buffer to our own pipe.
                    unsafe { libc::write(acks_tx, [1u8].as_ptr().cast(), 1) };
                }
            })?;
        let tid = tid_rx.recv().unwrap_or(0);
        courier.thread.store(tid, Ordering::SeqCst);
        Ok(courier)
    }

    /// Hands `words` to the courier and waits at most [`DELIVERY_WAIT`] for it to send them;
    /// returns whether it did. Async-signal-safe: no allocation, no lock.
    pub fn deliver(&self, words: &str) -> bool {
        if this_thread() == self.thread.load(Ordering::SeqCst) {
            return false; // The courier itself is dying: nobody would send them.
        }
        let mut end = words.len().min(MAX_WORDS);
        while !words.is_char_boundary(end) {
            end -= 1;
        }
        let mut frame = [0u8; MAX_WORDS + 2];
        frame[..2].copy_from_slice(&(end as u16).to_le_bytes());
        frame[2..2 + end].copy_from_slice(&words.as_bytes()[..end]);
        // SAFETY: writing from a valid buffer to our own pipe (atomically: below PIPE_BUF).
        let written = unsafe { libc::write(self.words, frame.as_ptr().cast(), end + 2) };
        if written != (end + 2) as isize {
            return false;
        }
        let mut poll = libc::pollfd {
            fd: self.acks,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor, then reading one byte into a valid buffer.
        unsafe {
            if libc::poll(&mut poll, 1, DELIVERY_WAIT.as_millis() as i32) != 1 {
                return false;
            }
            let mut ack = 0u8;
            libc::read(self.acks, (&mut ack as *mut u8).cast(), 1) == 1
        }
    }
}

/// A pipe (read end, write end), closed on exec.
fn pipe() -> std::io::Result<(i32, i32)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into a valid array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

/// Installs this process's panic hook and abort handler, which report to stderr as executor
/// `executor_id` and to the driver through `send` ([module docs](self)). Only the first call
/// installs anything.
pub fn install(executor_id: &str, send: impl Fn(&str) + Send + 'static) -> std::io::Result<()> {
    if COURIER.get().is_some() {
        return Ok(());
    }
    let courier = Courier::start(send)?;
    let _ = EXECUTOR_ID.set(executor_id.to_string());
    let _ = COURIER.set(courier);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let location = info.location().map(|l| (l.file(), l.line(), l.column()));
        let words = panicked(location, info.payload());
        let id = EXECUTOR_ID.get().map_or("", String::as_str);
        eprintln!("error: executor {id} {words}");
        if let Some(c) = COURIER.get() {
            c.deliver(&words);
        }
        // The standard report too (with its backtrace) when one is asked for.
        if std::env::var_os("RUST_BACKTRACE").is_some() {
            previous(info);
        }
    }));
    // SAFETY: installing a handler that only makes async-signal-safe calls (atomics, write,
    // poll, read), with a zeroed, then filled, sigaction.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_abort as *const () as usize;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGABRT, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// SIGABRT: when this thread's allocation just failed, report it; then the abort proceeds (the
/// handler resets itself, and `abort` ends the process once it returns).
extern "C" fn on_abort(_: libc::c_int) {
    let size = FAILED_SIZE.load(Ordering::SeqCst);
    if size == 0
        || FAILED_THREAD.load(Ordering::SeqCst) != this_thread()
        || ABORT_REPORTED.swap(true, Ordering::SeqCst)
    {
        return;
    }
    let words = out_of_memory(size);
    let id = EXECUTOR_ID.get().map_or("", String::as_str);
    for part in ["error: executor ", id, " ", words.as_str(), "\n"] {
        // SAFETY: writing a valid buffer to stderr.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    if let Some(c) = COURIER.get() {
        c.deliver(words.as_str());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn out_of_memory_names_the_size_in_bytes_and_units() {
        assert_eq!(
            out_of_memory(3_136_000_000_000).as_str(),
            "out of memory allocating 3136000000000 bytes (2.9 TiB)"
        );
        assert_eq!(
            out_of_memory(1536 << 20).as_str(),
            "out of memory allocating 1610612736 bytes (1.5 GiB)"
        );
        assert_eq!(
            out_of_memory(100).as_str(),
            "out of memory allocating 100 bytes"
        );
        assert_eq!(
            out_of_memory(usize::MAX).as_str(),
            "out of memory allocating 18446744073709551615 bytes (16777216.0 TiB)"
        );
    }

    #[test]
    fn a_panic_reads_as_where_and_what() {
        let words = panicked(Some(("src/a.rs", 12, 5)), &"index out of bounds");
        assert_eq!(words, "panicked at src/a.rs:12:5: index out of bounds");
        let owned: Box<dyn Any> = Box::new(String::from("two\nlines"));
        assert_eq!(
            panicked(Some(("b.rs", 1, 1)), owned.as_ref()),
            "panicked at b.rs:1:1: two lines"
        );
        assert_eq!(
            panicked(None, &42u8),
            "panicked: (a panic without a message)"
        );
    }

    #[test]
    fn the_courier_sends_the_words_before_the_dying_thread_goes_on() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let sink = sent.clone();
        let courier = Courier::start(move |w| sink.lock().unwrap().push(w.to_string())).unwrap();
        assert!(courier.deliver("panicked at a.rs:1:1: boom"));
        assert!(courier.deliver(&"x".repeat(5000)));
        let sent = sent.lock().unwrap();
        assert_eq!(sent[0], "panicked at a.rs:1:1: boom");
        assert_eq!(sent[1].len(), MAX_WORDS, "long words are cut");
    }

    #[test]
    fn a_courier_that_cannot_send_does_not_hold_the_dying_thread() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        // The send never returns until the test ends: delivery gives up after its wait.
        let courier = Courier::start(move |_| {
            let _ = wait.lock().unwrap().recv();
        })
        .unwrap();
        assert!(!courier.deliver("out of memory allocating 1 bytes"));
        drop(release);
    }
}
