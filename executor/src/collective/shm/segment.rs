//! The shared-memory segment of one host's ranks: a POSIX shared-memory object (`/dev/shm`)
//! that the host's first rank creates with mode 0600 under a name derived from the job's
//! secret, and that the others attach to after checking its owner, mode, size and the key in
//! its header. The creator unlinks it once every local rank has attached, so it lives on only
//! as long as the ranks that map it.
//!
//! Layout: a header (magic, key, sizes, flags and one cache line per rank for its barrier
//! counter), then three sets of per-rank slots of [`SLOT_FLOATS`] floats each, used by
//! successive pieces of a buffer in turn, so that one barrier per piece suffices: while a rank
//! copies piece k in, it sums its share of piece k−1 and copies piece k−2 out. A set's slots lie
//! one after the other, so a broadcast can use a whole set as one area.

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{CommError, CommOp, Peer};

type Result<T> = std::result::Result<T, CommError>;

/// Floats per rank's slot (1 MiB): the piece a buffer travels in.
pub const SLOT_FLOATS: usize = 256 * 1024;
/// Most ranks of one host that share a segment; a host with more uses the TCP ring.
pub const MAX_LOCAL_RANKS: usize = 64;
/// Slot sets, used by successive pieces in turn.
pub const SETS: usize = 3;

const MAGIC: [u8; 8] = *b"RFSHMv02";
const READY: u32 = 0x5244_5931;
/// How often an attaching rank looks for the segment or its readiness.
const ATTACH_POLL: Duration = Duration::from_millis(2);

/// One rank's barrier counter and the length it announced, on a cache line of its own.
#[repr(C, align(64))]
pub struct RankLine {
    /// The last barrier this rank arrived at.
    pub arrived: AtomicU32,
    /// The length of the all-reduce it is in (checked against the others').
    pub len: AtomicU64,
}

/// The segment's header, at its start.
#[repr(C)]
pub struct Header {
    magic: [u8; 8],
    key: [u8; 32],
    ranks: u32,
    slot_floats: u32,
    ready: AtomicU32,
    /// Ranks that have attached (the creator counts itself).
    pub attached: AtomicU32,
    /// 0, or the local index + 1 of the rank that gave up after a failure.
    pub aborted: AtomicU32,
    /// Bumped at every arrival; sleepers wait on it with a futex.
    pub wake: AtomicU32,
    /// Ranks asleep on `wake`.
    pub sleepers: AtomicU32,
    /// Each local rank's process id, for liveness checks.
    pub pids: [AtomicU32; MAX_LOCAL_RANKS],
    /// Each local rank's barrier line.
    pub lines: [RankLine; MAX_LOCAL_RANKS],
}

/// Bytes before the first slot.
const HEADER_BYTES: usize = std::mem::size_of::<Header>().next_multiple_of(4096);

/// What a rank needs to create or attach to its host's segment.
#[derive(Clone, Debug)]
pub struct SegmentSpec {
    /// The object's name (`/rf-…`), derived from the job's secret.
    pub name: String,
    /// The key every attaching rank checks, derived from the job's secret.
    pub key: [u8; 32],
    /// Ranks on this host.
    pub ranks: usize,
    /// This rank's index among them (0 creates the segment).
    pub me: usize,
    /// The creator's global rank and ring address, for errors.
    pub creator: Peer,
}

impl SegmentSpec {
    /// The segment's size in bytes.
    fn bytes(&self) -> usize {
        HEADER_BYTES + SETS * self.ranks * SLOT_FLOATS * 4
    }
}

/// A mapped segment.
pub struct Segment {
    base: *mut u8,
    len: usize,
    ranks: usize,
    /// The name, while this (creating) rank has not unlinked it yet.
    linked: Option<CString>,
}

// SAFETY: the mapping is shared memory; all shared state in the header is atomic, and the
// slots are accessed only in ranges that the barrier protocol gives to one writer at a time.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

fn os_error(what: String) -> CommError {
    let e = std::io::Error::last_os_error();
    CommError::because(Peer::Local, CommOp::FormRing, what, e)
}

impl Segment {
    /// Creates the segment (mode 0600), initializes its header and marks it ready.
    pub fn create(spec: &SegmentSpec) -> Result<Segment> {
        let name = c_name(&spec.name)?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
        // SAFETY: `name` is a valid C string.
        let mut fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
        if fd < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::AlreadyExists {
            // Left by a creator of this very ring that died before unlinking it.
            // SAFETY: as above.
            unsafe {
                libc::shm_unlink(name.as_ptr());
                fd = libc::shm_open(name.as_ptr(), flags, 0o600);
            }
        }
        if fd < 0 {
            return Err(os_error(format!(
                "cannot create the shared-memory segment {}",
                spec.name
            )));
        }
        let len = spec.bytes();
        let fail = |what: &str, cause: std::io::Error| {
            let why = format!(
                "cannot {what} the shared-memory segment {} ({} MiB; is /dev/shm full? \
                 cluster.shared_memory = false avoids it)",
                spec.name,
                len >> 20
            );
            let e = CommError::because(Peer::Local, CommOp::FormRing, why, cause);
            // SAFETY: `name` is valid and `fd` is ours.
            unsafe {
                libc::shm_unlink(name.as_ptr());
                libc::close(fd);
            }
            e
        };
        // SAFETY: `fd` is an open descriptor of ours. Reserving the pages now turns a full
        // /dev/shm into this error instead of a SIGBUS on first touch.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(fail("size", std::io::Error::last_os_error()));
        }
        // SAFETY: as above.
        let reserved = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        if reserved != 0 {
            let cause = std::io::Error::from_raw_os_error(reserved);
            return Err(fail("reserve memory for", cause));
        }
        let base = map(fd, len).map_err(|e| fail("map", e))?;
        // SAFETY: `fd` is ours; the mapping keeps the object alive.
        unsafe { libc::close(fd) };
        let seg = Segment {
            base,
            len,
            ranks: spec.ranks,
            linked: Some(name),
        };
        // SAFETY: the mapping is fresh, zeroed and at least HEADER_BYTES long; nobody reads
        // these fields before `ready` is published below.
        unsafe {
            let h = base as *mut Header;
            (*h).magic = MAGIC;
            (*h).key = spec.key;
            (*h).ranks = spec.ranks as u32;
            (*h).slot_floats = SLOT_FLOATS as u32;
        }
        let h = seg.header();
        h.pids[0].store(std::process::id(), Ordering::SeqCst);
        h.attached.store(1, Ordering::SeqCst);
        h.ready.store(READY, Ordering::SeqCst);
        Ok(seg)
    }

    /// Attaches to the segment that rank 0 of this host creates, waiting for it until
    /// `deadline`; refuses one that is not this user's, not private, of the wrong size or
    /// without the job's key.
    pub fn attach(spec: &SegmentSpec, deadline: Instant) -> Result<Segment> {
        let name = c_name(&spec.name)?;
        let fd = loop {
            // SAFETY: `name` is a valid C string.
            let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR, 0) };
            // The creator makes the object before it sizes it: an empty one is not ready yet.
            if fd >= 0 && (object_size(fd) != Some(0) || Instant::now() >= deadline) {
                break fd;
            }
            if fd >= 0 {
                // SAFETY: `fd` is ours and not used again.
                unsafe { libc::close(fd) };
                std::thread::sleep(ATTACH_POLL);
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(os_error(format!(
                    "cannot open the shared-memory segment {}",
                    spec.name
                )));
            }
            if Instant::now() >= deadline {
                let why = format!(
                    "{} did not create this host's shared-memory segment in time",
                    spec.creator
                );
                return Err(CommError::new(spec.creator.clone(), CommOp::FormRing, why));
            }
            std::thread::sleep(ATTACH_POLL);
        };
        let checked = check_object(fd, spec);
        let mapped = checked.and_then(|len| {
            map(fd, len).map_err(|e| {
                let why = format!("cannot map the shared-memory segment {}", spec.name);
                CommError::because(Peer::Local, CommOp::FormRing, why, e)
            })
        });
        // SAFETY: `fd` is ours; a mapping keeps the object alive.
        unsafe { libc::close(fd) };
        let seg = Segment {
            base: mapped?,
            len: spec.bytes(),
            ranks: spec.ranks,
            linked: None,
        };
        seg.verify(spec, deadline)?;
        let h = seg.header();
        h.pids[spec.me].store(std::process::id(), Ordering::SeqCst);
        h.attached.fetch_add(1, Ordering::SeqCst);
        Ok(seg)
    }

    /// Waits for the creator to publish the header, then checks it against `spec`.
    fn verify(&self, spec: &SegmentSpec, deadline: Instant) -> Result<()> {
        let h = self.header();
        while h.ready.load(Ordering::SeqCst) != READY {
            if Instant::now() >= deadline {
                let why = format!("the shared-memory segment {} never became ready", spec.name);
                return Err(CommError::new(spec.creator.clone(), CommOp::FormRing, why));
            }
            std::thread::sleep(ATTACH_POLL);
        }
        let same_key = ringflow_core::security::constant_time_eq(&h.key, &spec.key);
        if h.magic != MAGIC
            || !same_key
            || h.ranks as usize != spec.ranks
            || h.slot_floats as usize != SLOT_FLOATS
        {
            let why = format!(
                "refused the shared-memory segment {}: it does not carry this job's key \
                 (another job's, or a foreign process's)",
                spec.name
            );
            return Err(CommError::new(Peer::Local, CommOp::FormRing, why));
        }
        Ok(())
    }

    /// Waits until every local rank has attached, then unlinks the name (creator only).
    pub fn unlink_when_attached(
        &mut self,
        deadline: Instant,
        who: impl Fn(usize) -> Peer,
    ) -> Result<()> {
        while self.header().attached.load(Ordering::SeqCst) < self.ranks as u32 {
            if Instant::now() >= deadline {
                self.unlink();
                let h = self.header();
                let missing = (1..self.ranks)
                    .find(|&j| h.pids[j].load(Ordering::SeqCst) == 0)
                    .unwrap_or(1);
                let why = format!(
                    "{} did not attach to this host's shared-memory segment in time",
                    who(missing)
                );
                return Err(CommError::new(who(missing), CommOp::FormRing, why));
            }
            std::thread::sleep(ATTACH_POLL);
        }
        self.unlink();
        Ok(())
    }

    fn unlink(&mut self) {
        if let Some(name) = self.linked.take() {
            // SAFETY: `name` is a valid C string.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_BYTES long and page-aligned.
        unsafe { &*(self.base as *const Header) }
    }

    /// Ranks sharing the segment.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// `range` of set `set`'s area, which holds rank 0's slot, then rank 1's, and so on.
    fn area_ptr(&self, set: usize, range: &std::ops::Range<usize>) -> *mut f32 {
        assert!(set < SETS && range.start <= range.end);
        assert!(range.end <= self.ranks * SLOT_FLOATS);
        let offset = HEADER_BYTES + (set * self.ranks * SLOT_FLOATS + range.start) * 4;
        debug_assert!(offset + range.len() * 4 <= self.len);
        // SAFETY: in bounds of the mapping, as checked above.
        unsafe { self.base.add(offset) as *mut f32 }
    }

    fn slot_ptr(&self, set: usize, rank: usize, range: &std::ops::Range<usize>) -> *mut f32 {
        assert!(rank < self.ranks && range.start <= range.end && range.end <= SLOT_FLOATS);
        let start = rank * SLOT_FLOATS;
        self.area_ptr(set, &(start + range.start..start + range.end))
    }

    /// Floats in one set's area: one slot per rank.
    pub fn area_floats(&self) -> usize {
        self.ranks * SLOT_FLOATS
    }

    /// `range` of set `set`'s whole area (every rank's slot, in rank order), to read.
    ///
    /// # Safety
    /// No rank may write that range until the caller's next barrier.
    pub unsafe fn area(&self, set: usize, range: std::ops::Range<usize>) -> &[f32] {
        let p = self.area_ptr(set, &range);
        // SAFETY: in bounds; the caller guarantees nobody writes it meanwhile.
        unsafe { std::slice::from_raw_parts(p, range.len()) }
    }

    /// `range` of set `set`'s whole area, to write.
    ///
    /// # Safety
    /// No other rank may read or write that range until the caller's next barrier, and the
    /// caller holds no other reference to it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn area_mut(&self, set: usize, range: std::ops::Range<usize>) -> &mut [f32] {
        let p = self.area_ptr(set, &range);
        // SAFETY: in bounds; the caller guarantees exclusive access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(p, range.len()) }
    }

    /// `range` of `rank`'s slot in `set`, to read.
    ///
    /// # Safety
    /// No rank may write that range until the caller's next barrier.
    pub unsafe fn slot(&self, set: usize, rank: usize, range: std::ops::Range<usize>) -> &[f32] {
        let p = self.slot_ptr(set, rank, &range);
        // SAFETY: in bounds; the caller guarantees nobody writes it meanwhile.
        unsafe { std::slice::from_raw_parts(p, range.len()) }
    }

    /// `range` of `rank`'s slot in `set`, to write.
    ///
    /// # Safety
    /// No other rank may read or write that range until the caller's next barrier, and the
    /// caller holds no other reference to it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(
        &self,
        set: usize,
        rank: usize,
        range: std::ops::Range<usize>,
    ) -> &mut [f32] {
        let p = self.slot_ptr(set, rank, &range);
        // SAFETY: in bounds; the caller guarantees exclusive access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(p, range.len()) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: `base`/`len` are the mapping made at creation or attachment.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| {
        CommError::new(
            Peer::Local,
            CommOp::FormRing,
            "a shared-memory name contains a NUL byte",
        )
    })
}

/// The size of an open object, if it can be read.
fn object_size(fd: libc::c_int) -> Option<i64> {
    // SAFETY: `st` is plain data filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` is writable.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_size)
}

/// Checks an opened object before mapping it: this user's, private, of the expected size.
fn check_object(fd: libc::c_int, spec: &SegmentSpec) -> Result<usize> {
    // SAFETY: `st` is plain data filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_error(format!(
            "cannot inspect the shared-memory segment {}",
            spec.name
        )));
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let refuse = |why: String| {
        let why = format!("refused the shared-memory segment {}: {why}", spec.name);
        Err(CommError::new(Peer::Local, CommOp::FormRing, why))
    };
    if st.st_uid != uid {
        return refuse(format!(
            "it belongs to user {}, not to this executor's {uid}",
            st.st_uid
        ));
    }
    if st.st_mode & 0o077 != 0 {
        return refuse(format!(
            "its mode {:o} lets other users in",
            st.st_mode & 0o777
        ));
    }
    let len = spec.bytes();
    if st.st_size as u64 != len as u64 {
        return refuse(format!(
            "it has {} bytes where this ring needs {len}",
            st.st_size
        ));
    }
    Ok(len)
}

fn map(fd: libc::c_int, len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of an object of at least `len` bytes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as *mut u8)
    }
}
