//! How an executor's `malloc` treats the buffers a training step frees.
//!
//! A training step allocates its activations and gradients and frees them at its end; the next
//! step asks for the same sizes again. glibc's `malloc` serves a request above its mmap
//! threshold with a fresh mapping and unmaps it when it is freed, and gives the top of its heap
//! back to the kernel once more than its trim threshold is free there. The threshold adapts to
//! the largest buffer freed so far, up to 32 MiB, but the trim threshold follows it, so a step
//! whose buffers are a few MiB each still hands its memory back and faults every page in again
//! on the next step, and tears down the mappings on every core (a shootdown): work that every
//! step repeats, outside the model's own.
//!
//! [`keep_freed_buffers`] fixes both thresholds at start-up: buffers up to 256 MiB (32 MiB
//! with a glibc older than 2.35, which refuses more) come from the heap and are reused, and up
//! to 512 MiB of freed heap is kept for the next step. The resident size then stays at the
//! step's peak, which the memory estimate already counts. Settings the user gave through
//! glibc's environment (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`) are
//! left as they are; other C libraries and operating systems are not touched.

/// Requests above this are mapped on their own.
pub const MMAP_THRESHOLD: usize = 256 << 20;

/// The mmap threshold where glibc refuses [`MMAP_THRESHOLD`] (before 2.35: its largest).
const OLD_GLIBC_MMAP_THRESHOLD: usize = 32 << 20;

/// Freed memory at the heap's top kept for reuse before any is returned to the kernel.
pub const TRIM_THRESHOLD: usize = 512 << 20;

/// The environment variables through which glibc's thresholds can be set by the user.
const USER_SETTINGS: [&str; 3] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "GLIBC_TUNABLES",
];

/// Fixes glibc's mmap and trim thresholds so that the buffers of one training step are reused
/// by the next ([module docs](self)); answers whether it did (false: the user set them, or the
/// C library is not glibc).
pub fn keep_freed_buffers() -> bool {
    if USER_SETTINGS.iter().any(|v| std::env::var_os(v).is_some()) {
        return false;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    let set = |parameter, value: usize| {
        // SAFETY: `mallopt` only changes the allocator's parameters; it answers 0 for a value
        // it refuses.
        unsafe { libc::mallopt(parameter, value as libc::c_int) == 1 }
    };
    (set(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        || set(libc::M_MMAP_THRESHOLD, OLD_GLIBC_MMAP_THRESHOLD))
        && set(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// glibc accepts the thresholds, and a 16 MiB buffer then comes from the heap instead of a
    /// mapping of its own (glibc's count of mapped chunks does not grow while it lives).
    #[test]
    fn a_step_sized_buffer_comes_from_the_heap() {
        assert!(super::set_thresholds());
        // SAFETY: `mallinfo2` only reads the allocator's statistics.
        let mapped = || unsafe { libc::mallinfo2() }.hblks;
        let before = mapped();
        let buffer = std::hint::black_box(vec![1u8; 16 << 20]);
        assert!(mapped() <= before, "a 16 MiB buffer was mapped on its own");
        drop(buffer);
    }
}
