//! Shared by this crate's property tests (the fuzz targets of `docs/testing.md`): their
//! settings (`ringflow_ml::fuzz`), and a measure of the largest allocation a piece of code makes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The fuzz targets' settings, shared by the workspace.
pub(crate) use ringflow_ml::fuzz::config;

thread_local! {
    /// While measuring on this thread: the largest allocation so far, in bytes.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The system allocator, noting the size of every allocation made on a measuring thread.
struct Measuring;

fn note(size: usize) {
    let _ = LARGEST.try_with(|largest| {
        if let Some(l) = largest.get() {
            largest.set(Some(l.max(size)));
        }
    });
}

// SAFETY: every call is passed on unchanged to the system allocator; noting a size touches
// only a thread-local `Cell` initialized without allocating.
unsafe impl GlobalAlloc for Measuring {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Measuring = Measuring;

/// Runs `f` and returns its result with the largest single allocation it made on this thread,
/// in bytes (a decoder that sizes a buffer from a peer's number shows here, even when the
/// operating system would hand out the memory lazily).
pub(crate) fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(Some(0)));
    let out = f();
    let largest = LARGEST.with(|l| l.replace(None)).unwrap_or(0);
    (out, largest)
}
