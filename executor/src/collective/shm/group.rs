//! The collectives of one host's ranks over their [`Segment`].
//!
//! A buffer goes through in slot-sized pieces. All-reduce of a piece: every rank copies it
//! into its slot; barrier; each rank sums its 1/n share of the piece across all n slots (in
//! rank order, so the result does not depend on who sums) into its buffer and its own slot;
//! barrier; every rank copies the other shares out of their owners' slots. Alternate pieces use
//! alternate slot sets, so two barriers per piece suffice. Broadcast from the host's first rank
//! takes one barrier per piece.
//!
//! A barrier is a per-rank counter in the segment: a rank arrives by storing the barrier's
//! number, and waits until every rank's counter has reached it — spinning briefly (only when
//! the host has a core per rank), yielding its core a few times, then sleeping on a futex in
//! short slices. Every slice it
//! checks that the ranks it waits for are alive (`kill(pid, 0)`, and not a zombie) and that
//! none gave up; a dead rank fails the wait at once, naming it, and a silent one after the
//! deadline.

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
}

/// Where the `n` shares of a piece of `len` floats start and end (sizes differ by at most 1).
fn share(i: usize, n: usize, len: usize) -> std::ops::Range<usize> {
    let at = |i: usize| i * len / n;
    at(i)..at(i + 1)
}

/// Whether counter `v` has reached barrier `target` (counters wrap around).
fn reached(v: u32, target: u32) -> bool {
    v.wrapping_sub(target) as i32 >= 0
}

impl ShmGroup {
    /// The group of rank `me` of the ranks `peers` on `seg`, whose waits last at most
    /// `timeout`.
    pub fn new(seg: Arc<Segment>, me: usize, peers: Vec<Peer>, timeout: Duration) -> ShmGroup {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spins = if seg.ranks() <= cores { SPINS } else { 0 };
        ShmGroup {
            seg,
            me,
            peers,
            barrier: 0,
            pieces: 0,
            timeout,
            spins,
        }
    }

    /// The segment, to abort it from another thread.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// All-reduce of `buf` among the host's ranks; with `Average`, divides by `divisor`.
    pub fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp, divisor: usize) -> Result<()> {
        let (n, me) = (self.seg.ranks(), self.me);
        let scale = match op {
            ReduceOp::Sum => None,
            ReduceOp::Average => Some(1.0 / divisor as f32),
        };
        let total = buf.len();
        for (k, piece) in buf.chunks_mut(SLOT_FLOATS).enumerate() {
            let set = self.next_set();
            let m = piece.len();
            // SAFETY: between barriers only this rank touches its own slot.
            unsafe { self.seg.slot_mut(set, me, 0..m) }.copy_from_slice(piece);
            self.arrive(Some(total as u64));
            self.wait("copying its values into shared memory", self.timeout)?;
            if k == 0 {
                self.check_lengths(total)?;
            }
            let mine = share(me, n, m);
            sum_share(
                &self.seg,
                set,
                mine.clone(),
                &mut piece[mine.clone()],
                scale,
            );
            // SAFETY: this rank's own share of its own slot is read by nobody in this phase.
            unsafe { self.seg.slot_mut(set, me, mine.clone()) }.copy_from_slice(&piece[mine]);
            self.arrive(None);
            self.wait("reducing its share", self.timeout)?;
            for j in (0..n).filter(|&j| j != me) {
                let theirs = share(j, n, m);
                // SAFETY: rank j wrote its share before the barrier; nobody writes it until
                // this rank's next barrier.
                let reduced = unsafe { self.seg.slot(set, j, theirs.clone()) };
                piece[theirs].copy_from_slice(reduced);
            }
        }
        Ok(())
    }

    /// Replaces `buf` on every local rank by the host's first rank's, waiting for it at most
    /// `limit` (it may be reducing across hosts meanwhile).
    pub fn broadcast_from_first(&mut self, buf: &mut [f32], limit: Duration) -> Result<()> {
        for piece in buf.chunks_mut(SLOT_FLOATS) {
            let set = self.next_set();
            let m = piece.len();
            if self.me == 0 {
                // SAFETY: the slot set was last read before everyone's previous barrier.
                unsafe { self.seg.slot_mut(set, 0, 0..m) }.copy_from_slice(piece);
            }
            self.arrive(None);
            self.wait("receiving reduced values from its host's first rank", limit)?;
            if self.me != 0 {
                // SAFETY: written before the barrier; rewritten only after the next one.
                piece.copy_from_slice(unsafe { self.seg.slot(set, 0, 0..m) });
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
        h.wake.fetch_add(1, Ordering::SeqCst);
        if h.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&h.wake);
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
            if yields < YIELDS {
                yields += 1;
                std::thread::yield_now();
                continue;
            }
            // Every arrival wakes every sleeper: look at the processes once per slice only.
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

/// `out = Σ_j slot_j[range]` over the host's ranks in rank order, then scaled.
fn sum_share(
    seg: &Segment,
    set: usize,
    range: std::ops::Range<usize>,
    out: &mut [f32],
    scale: Option<f32>,
) {
    // Blocks that stay in L1 while every slot is added into them.
    const BLOCK: usize = 4096;
    let mut at = range.start;
    while at < range.end {
        let end = (at + BLOCK).min(range.end);
        let dst = &mut out[at - range.start..end - range.start];
        // SAFETY: every rank wrote its slot before the barrier; this share is read only here.
        dst.copy_from_slice(unsafe { seg.slot(set, 0, at..end) });
        for j in 1..seg.ranks() {
            let src = unsafe { seg.slot(set, j, at..end) };
            for (d, s) in dst.iter_mut().zip(src) {
                *d += *s;
            }
        }
        if let Some(scale) = scale {
            dst.iter_mut().for_each(|d| *d *= scale);
        }
        at = end;
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
