//! [`AllocatorStats`]: how well a GPU's caching allocator is doing.

/// The counters of a device's caching allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AllocatorStats {
    /// Blocks requested.
    pub requests: u64,
    /// Requests served from the pool (no driver call).
    pub hits: u64,
    /// Bytes held in the pool, free for reuse.
    pub cached_bytes: u64,
}

impl AllocatorStats {
    /// The fraction of requests served from the pool.
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}
