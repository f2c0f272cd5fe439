//! Per-thread scratch buffers that kernels keep between calls (the convolution's unrolled
//! input, Winograd's transformed tiles), so that a hot loop allocates once per thread. A leaf:
//! the kernels that use it import it, it imports none of them.

use std::cell::Cell;
use std::thread::LocalKey;

/// Calls `f` with `len` elements of the thread's scratch buffer `key` (stale values: `f` must
/// write before it reads), growing it if needed and keeping it for the next call. A nested call
/// on the same thread (a threaded GEMM stealing work) gets a buffer of its own.
pub(super) fn with_scratch<R>(
    key: &'static LocalKey<Cell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut buf = key.take();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let out = f(&mut buf[..len]);
    key.with(|cell| {
        let other = cell.take();
        cell.set(if other.len() > buf.len() { other } else { buf });
    });
    out
}
