//! The collectives of one host's ranks over their [`Segment`].
//!
//! A buffer goes through in pieces of one slot per rank, pipelined over the segment's three slot
//! sets with **one barrier per piece**. Between two barriers every rank, at once: copies piece
//! k into its slot of set k mod 3; sums its 1/n share of piece k−1 across all n slots (in rank
//! order, so the result does not depend on who sums), writing the sum once into its buffer and
//! its own slot; and copies the other ranks' sums of piece k−2 out of their slots. A buffer of
//! one piece takes exactly two barriers; one of p pieces, p + 1. The sums run in L1-sized blocks
//! with AVX2 where the CPU has it (detected at run time). Broadcast from the host's first rank
//! uses a whole slot set (n slots) per piece, one barrier each.
//!
//! A barrier is a per-rank counter in the segment: a rank arrives by storing the barrier's
//! number, and waits until every rank's counter has reached it — spinning briefly (only when
//! the host has a core per rank), yielding its core a few times, then sleeping on a futex in
//! short slices; the rank whose arrival completes a barrier wakes the sleepers, so a sleeper
//! wakes once per barrier. Every slice a sleeper checks that the ranks it waits for are alive
//! (`kill(pid, 0)`, and not a zombie) and that none gave up; a dead rank fails the wait at
//! once, naming it, and a silent one after the deadline.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::segment::{SETS, SLOT_FLOATS, Segment};
use crate::collective::ReduceOp;
use crate::error::{CommError, CommOp, Peer};

type Result<T> = std::result::Result<T, CommError>;

/// How long a sleeping rank sleeps before it checks its peers again.
const SLEEP_SLICE: Duration = Duration::from_millis(2);
/// Spins before yielding, when every rank of the host has a core of its own.
const SPINS: u32 = 4_000;
/// Yields of the core before sleeping.
const YIELDS: u32 = 16;
/// Floats summed at once: every source's block and the sum stay in L1.
const BLOCK: usize = 1024;
/// Overrides the wait policy, `SPINS,YIELDS` (to measure policies with `bench allreduce`).
pub const WAIT_POLICY_ENV: &str = "RINGFLOW_SHM_WAIT";

/// Who gets the sums of a reduction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Deliver {
    /// Every rank (all-reduce).
    All,
    /// The host's first rank only; the others' buffers are left as they were.
    First,
}

/// This rank's view of its host's segment.
pub struct ShmGroup {
    seg: Arc<Segment>,
    /// This rank's index among the host's ranks.
    me: usize,
    /// Each local rank's name (global rank and ring address), by local index.
    peers: Vec<Peer>,
    /// The last barrier's number.
    barrier: u32,
    /// Pieces moved so far (which slot set the next one uses).
    pieces: u64,
    /// Deadline for one barrier wait.
    timeout: Duration,
    spins: u32,
    yields: u32,
}

/// Where the `n` shares of a piece of `len` floats start and end (sizes differ by at most 1).
fn share(i: usize, n: usize, len: usize) -> Range<usize> {
    let at = |i: usize| i * len / n;
    at(i)..at(i + 1)
}

/// Whether counter `v` has reached barrier `target` (counters wrap around).
fn reached(v: u32, target: u32) -> bool {
    v.wrapping_sub(target) as i32 >= 0
}

/// The wait policy: `RINGFLOW_SHM_WAIT=SPINS,YIELDS` if set and well formed, else spins only
/// when every rank has a core of its own.
fn wait_policy(ranks: usize) -> (u32, u32) {
    let set = std::env::var(WAIT_POLICY_ENV).ok().and_then(|v| {
        let (s, y) = v.split_once(',')?;
        Some((s.trim().parse().ok()?, y.trim().parse().ok()?))
    });
    set.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (if ranks <= cores { SPINS } else { 0 }, YIELDS)
    })
}

impl ShmGroup {
    /// The group of rank `me` of the ranks `peers` on `seg`, whose waits last at most
    /// `timeout`.
    pub fn new(seg: Arc<Segment>, me: usize, peers: Vec<Peer>, timeout: Duration) -> ShmGroup {
        let (spins, yields) = wait_policy(seg.ranks());
        ShmGroup {
            seg,
            me,
            peers,
            barrier: 0,
            pieces: 0,
            timeout,
            spins,
            yields,
        }
    }

    /// The segment, to abort it from another thread.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// All-reduce of `buf` among the host's ranks; with `Average`, divides by `divisor`.
    pub fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp, divisor: usize) -> Result<()> {
        let scale = match op {
            ReduceOp::Sum => None,
            ReduceOp::Average => Some(1.0 / divisor as f32),
        };
        self.reduce(buf, scale, Deliver::All)
    }

    /// Sums `buf` over the host's ranks into the first rank's `buf`; the others' are left as
    /// they were (the first step of a hierarchical all-reduce).
    pub fn reduce_to_first(&mut self, buf: &mut [f32]) -> Result<()> {
        self.reduce(buf, None, Deliver::First)
    }

    /// The pipelined reduction of the module's documentation.
    fn reduce(&mut self, buf: &mut [f32], scale: Option<f32>, to: Deliver) -> Result<()> {
        let total = buf.len();
        let pieces = total.div_ceil(SLOT_FLOATS).max(1);
        let first = self.pieces;
        self.pieces += pieces as u64;
        let set = |k: usize| ((first + k as u64) % SETS as u64) as usize;
        let at = |k: usize| k * SLOT_FLOATS..((k + 1) * SLOT_FLOATS).min(total);
        let gets = to == Deliver::All || self.me == 0;
        for step in 0..pieces + 2 {
            if step >= 2 && gets {
                self.copy_out(set(step - 2), &mut buf[at(step - 2)]);
            }
            if step < pieces {
                let piece = &buf[at(step)];
                // SAFETY: this set was last read before everyone's previous barrier, and
                // between barriers only this rank touches its own slot.
                unsafe { self.seg.slot_mut(set(step), self.me, 0..piece.len()) }
                    .copy_from_slice(piece);
            }
            if (1..=pieces).contains(&step) {
                let piece = &mut buf[at(step - 1)];
                self.sum_mine(set(step - 1), piece, scale, gets);
            }
            if step <= pieces {
                self.arrive(Some(total as u64).filter(|_| step == 0));
                let what = match step {
                    0 => "copying its values into shared memory",
                    _ => "reducing its share",
                };
                self.wait(what, self.timeout)?;
                if step == 0 {
                    self.check_lengths(total)?;
                }
            }
        }
        Ok(())
    }

    /// Sums this rank's share of `piece` (in `set`) over every slot into its own slot and,
    /// when `keep`, into `piece`.
    fn sum_mine(&self, set: usize, piece: &mut [f32], scale: Option<f32>, keep: bool) {
        let (n, me) = (self.seg.ranks(), self.me);
        let mine = share(me, n, piece.len());
        let mut acc = [0.0f32; BLOCK];
        let mut at = mine.start;
        while at < mine.end {
            let end = (at + BLOCK).min(mine.end);
            let acc = &mut acc[..end - at];
            // SAFETY: every rank wrote its slot before the barrier; this share of every slot is
            // read only by this rank, and written (below, its own) only by it, until the next
            // barrier.
            acc.copy_from_slice(unsafe { self.seg.slot(set, 0, at..end) });
            for j in 1..n {
                add_assign(acc, unsafe { self.seg.slot(set, j, at..end) });
            }
            if let Some(scale) = scale {
                acc.iter_mut().for_each(|v| *v *= scale);
            }
            unsafe { self.seg.slot_mut(set, me, at..end) }.copy_from_slice(acc);
            if keep {
                piece[at..end].copy_from_slice(acc);
            }
            at = end;
        }
    }

    /// Copies the other ranks' sums of `piece` (in `set`) out of their slots.
    fn copy_out(&self, set: usize, piece: &mut [f32]) {
        let n = self.seg.ranks();
        for j in (0..n).filter(|&j| j != self.me) {
            let theirs = share(j, n, piece.len());
            // SAFETY: rank j wrote its share before the last barrier; nobody writes this set
            // until everyone has passed this rank's next barrier.
            let sums = unsafe { self.seg.slot(set, j, theirs.clone()) };
            piece[theirs].copy_from_slice(sums);
        }
    }

    /// Replaces `buf` on every local rank by the host's first rank's, waiting for it at most
    /// `limit` (it may be reducing across hosts meanwhile).
    pub fn broadcast_from_first(&mut self, buf: &mut [f32], limit: Duration) -> Result<()> {
        let area = self.seg.area_floats();
        for piece in buf.chunks_mut(area) {
            let set = self.next_set();
            let m = piece.len();
            if self.me == 0 {
                // SAFETY: the set was last read before everyone's previous barrier.
                unsafe { self.seg.area_mut(set, 0..m) }.copy_from_slice(piece);
            }
            self.arrive(None);
            self.wait("receiving reduced values from its host's first rank", limit)?;
            if self.me != 0 {
                // SAFETY: written before the barrier; rewritten only after the next two.
                piece.copy_from_slice(unsafe { self.seg.area(set, 0..m) });
            }
        }
        Ok(())
    }

    /// Marks the segment as given up by this rank, waking every rank that waits in it.
    pub fn abort(seg: &Segment, me: usize) {
        let h = seg.header();
        let _ = h
            .aborted
            .compare_exchange(0, me as u32 + 1, Ordering::SeqCst, Ordering::SeqCst);
        h.wake.fetch_add(1, Ordering::SeqCst);
        futex_wake(&h.wake);
    }

    /// This rank's index among the host's ranks.
    pub fn me(&self) -> usize {
        self.me
    }

    fn next_set(&mut self) -> usize {
        let set = (self.pieces % SETS as u64) as usize;
        self.pieces += 1;
        set
    }

    fn arrive(&mut self, len: Option<u64>) {
        self.barrier = self.barrier.wrapping_add(1);
        let h = self.seg.header();
        let line = &h.lines[self.me];
        if let Some(len) = len {
            line.len.store(len, Ordering::SeqCst);
        }
        line.arrived.store(self.barrier, Ordering::SeqCst);
        // Only the arrival that completes the barrier wakes the sleepers. Of ranks arriving
        // together, the last to store its counter sees every counter (sequential consistency),
        // and a sleeper reads `wake` before it looks at the counters.
        let all = (0..self.seg.ranks())
            .all(|j| reached(h.lines[j].arrived.load(Ordering::SeqCst), self.barrier));
        if all {
            h.wake.fetch_add(1, Ordering::SeqCst);
            if h.sleepers.load(Ordering::SeqCst) > 0 {
                futex_wake(&h.wake);
            }
        }
    }

    /// Every rank announced the same length for this all-reduce.
    fn check_lengths(&self, len: usize) -> Result<()> {
        let h = self.seg.header();
        for j in 0..self.seg.ranks() {
            let theirs = h.lines[j].len.load(Ordering::SeqCst);
            if theirs != len as u64 {
                let why = format!(
                    "collective mismatch: {} all-reduces {theirs} values where {} all-reduces {len}",
                    self.peers[j], self.peers[self.me]
                );
                return Err(CommError::new(
                    self.peers[j].clone(),
                    CommOp::AllReduce,
                    why,
                ));
            }
        }
        Ok(())
    }

    /// Waits until every local rank has arrived at this rank's last barrier.
    fn wait(&self, what: &str, limit: Duration) -> Result<()> {
        let h = self.seg.header();
        let start = Instant::now();
        let (mut spins, mut yields) = (0, 0);
        let mut last_check = start;
        loop {
            let wake = h.wake.load(Ordering::SeqCst);
            self.check_aborted()?;
            let arrived =
                |j: usize| reached(h.lines[j].arrived.load(Ordering::SeqCst), self.barrier);
            let Some(late) = (0..self.seg.ranks()).find(|&j| !arrived(j)) else {
                return Ok(());
            };
            if spins < self.spins {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if yields < self.yields {
                yields += 1;
                std::thread::yield_now();
                continue;
            }
            // Sleepers wake at every completed barrier: look at the processes once per slice.
            if last_check.elapsed() >= SLEEP_SLICE {
                for j in (late..self.seg.ranks()).filter(|&j| !arrived(j)) {
                    self.check_alive(j, what)?;
                }
                last_check = Instant::now();
            }
            if start.elapsed() >= limit {
                let why = format!(
                    "{} did nothing for {:.0} s while {what} (it is stuck)",
                    self.peers[late],
                    limit.as_secs_f64()
                );
                return Err(CommError::new(
                    self.peers[late].clone(),
                    CommOp::AllReduce,
                    why,
                ));
            }
            h.sleepers.fetch_add(1, Ordering::SeqCst);
            if h.wake.load(Ordering::SeqCst) == wake {
                futex_wait(&h.wake, wake, SLEEP_SLICE);
            }
            h.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn check_aborted(&self) -> Result<()> {
        match self.seg.header().aborted.load(Ordering::SeqCst) {
            0 => Ok(()),
            a if a as usize - 1 == self.me => Err(CommError::new(
                Peer::Local,
                CommOp::AllReduce,
                "the collective was closed after a failure",
            )),
            a => {
                let peer = self.peers[(a as usize - 1).min(self.peers.len() - 1)].clone();
                let why = format!("{peer} gave up the shared-memory collective after a failure");
                Err(CommError::new(peer, CommOp::AllReduce, why))
            }
        }
    }

    /// Fails when local rank `j`'s process is gone.
    fn check_alive(&self, j: usize, what: &str) -> Result<()> {
        let pid = self.seg.header().pids[j].load(Ordering::SeqCst);
        if pid == 0 || alive(pid) {
            return Ok(());
        }
        let why = format!(
            "{} (process {pid}) exited while {what} (did it crash or get killed?)",
            self.peers[j]
        );
        Err(CommError::new(
            self.peers[j].clone(),
            CommOp::AllReduce,
            why,
        ))
    }
}

/// `acc[i] += src[i]`, with AVX2 where the CPU has it.
fn add_assign(acc: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { add_assign_avx2(acc, src) };
        return;
    }
    add_assign_portable(acc, src);
}

/// [`add_assign`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn add_assign_avx2(acc: &mut [f32], src: &[f32]) {
    add_assign_portable(acc, src);
}

/// [`add_assign`] in chunks of 16 that the compiler vectorizes for the target it compiles for.
#[inline(always)]
fn add_assign_portable(acc: &mut [f32], src: &[f32]) {
    let mut a = acc.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (a, s) in (&mut a).zip(&mut s) {
        for (x, y) in a.iter_mut().zip(s) {
            *x += *y;
        }
    }
    for (x, y) in a.into_remainder().iter_mut().zip(s.remainder()) {
        *x += *y;
    }
}

/// Whether process `pid` is still running (neither gone nor a zombie).
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A killed child that its parent has not reaped yet still answers kill(0).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => r == 0,
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a futex wait on a live, aligned u32 in a shared mapping, with a timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: waking waiters of a live, aligned u32 in a shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}
