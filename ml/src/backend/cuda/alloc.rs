//! The caching allocator: PyTorch's idea, reduced to what a training loop needs.
//!
//! A training step allocates and frees the same sizes every time (activations, gradients,
//! temporaries). Asking the driver for each one costs a call and can synchronize, so freed blocks
//! go back to a pool keyed by *size class* and the next request of that class takes one from
//! there. Classes are powers of two up to 4 MiB and multiples of 2 MiB above, which bounds the
//! waste to half a block for small tensors and 2 MiB for large ones.
//!
//! Every kernel runs on the device's one stream, so a block freed after a kernel was *queued*
//! may be handed to the next kernel at once: the stream orders the two. When the driver reports
//! that memory is exhausted, the pool is emptied back to the driver and the request retried once.
//! The hit rate (requests served from the pool) is logged at debug level every
//! [`REPORT_EVERY`] requests and is available from [`Allocator::stats`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, CudaStream, DriverError, sys};

use crate::backend::allocator::AllocatorStats;

/// Requests between two debug reports of the hit rate.
pub const REPORT_EVERY: u64 = 10_000;

/// Floats in the largest power-of-two class (4 MiB).
const SMALL_LIMIT: usize = 1 << 20;
/// Granularity of the large classes, in floats (2 MiB).
const LARGE_STEP: usize = 1 << 19;

/// The number of floats a block for `len` floats holds.
pub fn size_class(len: usize) -> usize {
    let len = len.max(1);
    if len <= SMALL_LIMIT {
        len.next_power_of_two()
    } else {
        len.div_ceil(LARGE_STEP) * LARGE_STEP
    }
}

/// Whether the driver refused an allocation for want of memory.
pub fn out_of_memory(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// The pool of one device.
pub struct Allocator {
    ordinal: usize,
    free: Mutex<HashMap<usize, Vec<CudaSlice<f32>>>>,
    requests: AtomicU64,
    hits: AtomicU64,
    cached_bytes: AtomicU64,
}

impl Allocator {
    /// An empty pool for device `ordinal`.
    pub fn new(ordinal: usize) -> Allocator {
        Allocator {
            ordinal,
            free: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            cached_bytes: AtomicU64::new(0),
        }
    }

    /// A block of at least `len` floats (uninitialized), from the pool when one is free.
    pub fn take(
        &self,
        stream: &std::sync::Arc<CudaStream>,
        len: usize,
    ) -> Result<CudaSlice<f32>, DriverError> {
        let class = size_class(len);
        let requests = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        if requests.is_multiple_of(REPORT_EVERY) {
            let s = self.stats();
            tracing::debug!(
                "cuda:{} allocator: {:.2}% of {} requests reused a cached block, {:.1} MiB cached",
                self.ordinal,
                100.0 * s.hit_rate(),
                s.requests,
                s.cached_bytes as f64 / (1 << 20) as f64
            );
        }
        if let Some(block) = self.lock().get_mut(&class).and_then(Vec::pop) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.cached_bytes
                .fetch_sub((class * 4) as u64, Ordering::Relaxed);
            return Ok(block);
        }
        // SAFETY: the block is uninitialized; every caller writes it (a kernel's output, a copy
        // or a fill) before anything reads it.
        match unsafe { stream.alloc::<f32>(class) } {
            Err(e) if out_of_memory(&e) => {
                self.release_cached();
                // SAFETY: as above.
                unsafe { stream.alloc::<f32>(class) }
            }
            other => other,
        }
    }

    /// Returns a block to the pool.
    pub fn give_back(&self, block: CudaSlice<f32>) {
        let class = block.len();
        self.cached_bytes
            .fetch_add((class * 4) as u64, Ordering::Relaxed);
        self.lock().entry(class).or_default().push(block);
    }

    /// Frees every pooled block back to the driver.
    pub fn release_cached(&self) {
        let drained: Vec<CudaSlice<f32>> = self.lock().drain().flat_map(|(_, v)| v).collect();
        self.cached_bytes.store(0, Ordering::Relaxed);
        drop(drained);
    }

    /// Requests, hits and pooled bytes so far.
    pub fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            requests: self.requests.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            cached_bytes: self.cached_bytes.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Vec<CudaSlice<f32>>>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two_then_2_mib() {
        assert_eq!(size_class(0), 1);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(SMALL_LIMIT), SMALL_LIMIT);
        assert_eq!(size_class(SMALL_LIMIT + 1), SMALL_LIMIT + LARGE_STEP);
        assert_eq!(size_class(784 * 1024), SMALL_LIMIT);
    }
}
