//! The ring algorithms, pipelined chunk by chunk.
//!
//! A [`Link`] is one rank's view of the ring: it receives from its left neighbour on the
//! calling (communication) thread and sends to its right neighbour through a writer thread, so
//! that sending, receiving and reducing overlap and no rank can block another by filling a
//! socket buffer. Each chunk received is reduced (or stored) and, where the algorithm forwards
//! it, queued for sending at once: the next step starts before the current one ends. A received
//! chunk's buffer is reduced in place and forwarded as it is, and the writer hands sent buffers
//! back through a pool, so the steady state neither copies nor allocates beyond what the
//! algorithm needs.
//!
//! All-reduce is reduce-scatter followed by all-gather (Patarasuk & Yuan; Horovod, NCCL): the
//! buffer is cut into N segments, and each rank sends and receives 2(N−1)/N of it. With
//! gradient compression the same algorithm sends 16-bit floats ([`super::compressed`]).

use std::net::TcpStream;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringflow_core::spec::Compression;

use crate::collective::ReduceOp;
pub use crate::collective::wire::CHUNK;
use crate::collective::wire::{describe, read_values};
use crate::error::{CommError, CommOp, Peer};

type Result<T> = std::result::Result<T, CommError>;

/// What the writer thread sends to the right neighbour.
pub enum Outgoing {
    /// An operation header.
    Header([u64; 3]),
    /// Payload.
    Floats(Vec<f32>),
    /// Compressed payload: the bits of 16-bit floats.
    Halves(Vec<u16>),
}

/// A value type that travels on the ring, with the link's pool of buffers for it.
pub trait Element: bytemuck::Pod + Default {
    /// The pool of buffers the writer has finished with.
    fn pool(link: &Link) -> &Receiver<Vec<Self>>;
}

impl Element for f32 {
    fn pool(link: &Link) -> &Receiver<Vec<f32>> {
        &link.pool
    }
}

impl Element for u16 {
    fn pool(link: &Link) -> &Receiver<Vec<u16>> {
        &link.pool16
    }
}

/// One rank's connections in the ring.
pub struct Link {
    pub rank: usize,
    pub world: usize,
    pub left: TcpStream,
    pub left_peer: Peer,
    pub right_peer: Peer,
    pub outgoing: Sender<Outgoing>,
    pub writer_error: Arc<Mutex<Option<CommError>>>,
    pub deadline: Duration,
    pub sequence: u64,
    /// The operation under way (from its header).
    op: CommOp,
    /// Buffers the writer has finished with, for reuse.
    pool: Receiver<Vec<f32>>,
    /// Compressed buffers the writer has finished with, for reuse.
    pool16: Receiver<Vec<u16>>,
}

/// What a rank's [`Link`] is made of once its ring is connected.
pub struct LinkEnds {
    /// This rank.
    pub rank: usize,
    /// The ring's size.
    pub world: usize,
    /// The connection from the left neighbour (read by this rank).
    pub left: TcpStream,
    /// Who the left neighbour is, for errors.
    pub left_peer: Peer,
    /// Who the right neighbour is, for errors.
    pub right_peer: Peer,
    /// The writer thread that sends to the right neighbour.
    pub outgoing: Sender<Outgoing>,
    /// Where the writer thread leaves its failure.
    pub writer_error: Arc<Mutex<Option<CommError>>>,
    /// Buffers the writer has finished with, for reuse.
    pub pool: Receiver<Vec<f32>>,
    /// Compressed buffers the writer has finished with, for reuse.
    pub pool16: Receiver<Vec<u16>>,
}

/// Operation codes in headers.
#[derive(Clone, Copy)]
pub enum OpCode {
    AllReduce = 1,
    Broadcast = 2,
    AllGather = 3,
}

/// The operation a header's code names, if any.
pub fn op_of(code: u64) -> Option<CommOp> {
    match code & 0xff {
        1 => Some(CommOp::AllReduce),
        2 => Some(CommOp::Broadcast),
        3 => Some(CommOp::AllGather),
        _ => None,
    }
}

fn op_name(code: u64) -> String {
    op_of(code).map_or_else(|| "an unknown operation".into(), |op| op.to_string())
}

/// Where a header's first word keeps the codec of an all-reduce's payload (the top byte; the
/// operation code is the low byte and a broadcast's root the bits between).
const CODEC_SHIFT: u32 = 56;

/// The header code of `codec` (f32 is 0, as in headers from before compression).
fn codec_code(codec: Compression) -> u64 {
    match codec {
        Compression::None => 0,
        Compression::Fp16 => 1,
        Compression::Bf16 => 2,
    }
}

/// How a header's first word says its payload travels, in words.
fn codec_name(word: u64) -> &'static str {
    match word >> CODEC_SHIFT {
        0 => "f32",
        1 => "fp16",
        2 => "bf16",
        _ => "an unknown format",
    }
}

/// A header's root (a broadcast's; 0 for the other collectives).
fn root_of(word: u64) -> u64 {
    (word & ((1 << CODEC_SHIFT) - 1)) >> 8
}

impl Link {
    /// Closes both directions of the ring at this rank after a failure: the left neighbour's
    /// writes fail and the right neighbour reads end-of-stream (the writer finishes), so the
    /// failure travels around the ring at once instead of each rank waiting out its deadline.
    pub fn abort(&mut self) {
        let _ = self.left.shutdown(std::net::Shutdown::Both);
        let (closed, _) = std::sync::mpsc::channel();
        self.outgoing = closed;
    }

    /// The link of a rank connected to `ends`, whose reads and writes wait at most `deadline`.
    pub fn new(ends: LinkEnds, deadline: Duration) -> Link {
        let LinkEnds {
            rank,
            world,
            left,
            left_peer,
            right_peer,
            outgoing,
            writer_error,
            pool,
            pool16,
        } = ends;
        Link {
            rank,
            world,
            left,
            left_peer,
            right_peer,
            outgoing,
            writer_error,
            deadline,
            sequence: 0,
            op: CommOp::AllReduce,
            pool,
            pool16,
        }
    }

    /// A buffer of `n` values (contents unspecified), reused from the pool when possible.
    pub(super) fn buffer<T: Element>(&self, n: usize) -> Vec<T> {
        let mut v = T::pool(self)
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        v.resize(n, T::default());
        v
    }

    pub(super) fn send(&self, item: Outgoing) -> Result<()> {
        if let Some(e) = self
            .writer_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(e);
        }
        self.outgoing.send(item).map_err(|_| {
            let why = format!("the connection to {} is closed", self.right_peer);
            CommError::new(self.right_peer.clone(), self.op, why)
        })
    }

    fn send_range(&self, buf: &[f32]) -> Result<()> {
        for chunk in buf.chunks(CHUNK) {
            let mut out = self.buffer::<f32>(chunk.len());
            out.copy_from_slice(chunk);
            self.send(Outgoing::Floats(out))?;
        }
        Ok(())
    }

    fn recv_error(&self, e: std::io::Error, what: &str) -> CommError {
        // A failure to receive is often caused by the writer failing first; prefer its story.
        if let Some(w) = self
            .writer_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return w;
        }
        let why = describe(&e, &self.left_peer.to_string(), what, self.deadline);
        CommError::new(self.left_peer.clone(), self.op, why).with_cause(e)
    }

    /// Sends this operation's header right and checks that the left neighbour's matches, so
    /// that ranks calling different collectives, or sending gradients in different formats,
    /// fail loudly instead of exchanging garbage.
    pub(super) fn agree(
        &mut self,
        code: OpCode,
        codec: Compression,
        len: usize,
        root: usize,
    ) -> Result<()> {
        self.sequence += 1;
        self.op = op_of(code as u64).unwrap_or(self.op);
        let header = [
            code as u64 | ((root as u64) << 8) | (codec_code(codec) << CODEC_SHIFT),
            self.sequence,
            len as u64,
        ];
        self.send(Outgoing::Header(header))?;
        let mut theirs = [0u64; 3];
        std::io::Read::read_exact(&mut self.left, bytemuck::cast_slice_mut(&mut theirs))
            .map_err(|e| self.recv_error(e, "starting a collective"))?;
        if theirs == header {
            return Ok(());
        }
        let codecs = |w: u64| w >> CODEC_SHIFT;
        let why = if codecs(theirs[0]) != codecs(header[0]) && theirs[1..] == header[1..] {
            format!(
                "{} sends gradients as {}, rank {} as {}: every rank of a job must use the \
                 same cluster.compression",
                self.left_peer,
                codec_name(theirs[0]),
                self.rank,
                codec_name(header[0]),
            )
        } else {
            format!(
                "collective mismatch: {} started {} #{} of {} values (root {}, {}), rank {} \
                 started {} #{} of {len} values (root {root}, {})",
                self.left_peer,
                op_name(theirs[0]),
                theirs[1],
                theirs[2],
                root_of(theirs[0]),
                codec_name(theirs[0]),
                self.rank,
                op_name(header[0]),
                header[1],
                codec_name(header[0]),
            )
        };
        Err(CommError::new(self.left_peer.clone(), self.op, why))
    }

    /// Receives `len` values from the left, chunk by chunk, handing each chunk's range and
    /// buffer to `each`, which may forward the buffer or drop it.
    pub(super) fn receive<T: Element>(
        &mut self,
        len: usize,
        what: &str,
        mut each: impl FnMut(std::ops::Range<usize>, Vec<T>, &Link) -> Result<()>,
    ) -> Result<()> {
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at);
            let mut incoming = self.buffer::<T>(n);
            if let Err(e) = read_values(&mut self.left, &mut incoming) {
                return Err(self.recv_error(e, what));
            }
            each(at..at + n, incoming, self)?;
            at += n;
        }
        Ok(())
    }
}

/// Start of segment `i` of `n` over a buffer of `len` (segments differ in size by at most 1).
fn seg_start(i: usize, n: usize, len: usize) -> usize {
    (i as u128 * len as u128 / n as u128) as usize
}

/// Segment `i` of `n` over a buffer of `len`.
pub(super) fn segment(i: usize, n: usize, len: usize) -> std::ops::Range<usize> {
    seg_start(i, n, len)..seg_start(i + 1, n, len)
}

/// Ring all-reduce of `buf` in place.
pub fn all_reduce(link: &mut Link, buf: &mut [f32], op: ReduceOp) -> Result<()> {
    let (r, n, len) = (link.rank, link.world, buf.len());
    if n == 1 {
        return Ok(());
    }
    link.agree(OpCode::AllReduce, Compression::None, len, 0)?;
    let scale = 1.0 / n as f32;
    // Reduce-scatter: step s sends segment r−s and receives segment r−s−1, adds this rank's
    // values into the received partial sum and forwards it; the last step's sums are final.
    link.send_range(&buf[segment(r, n, len)])?;
    for s in 0..n - 1 {
        let seg = segment((r + 2 * n - s - 1) % n, n, len);
        let last = s == n - 2;
        let base = seg.start;
        link.receive::<f32>(
            seg.len(),
            "reducing gradients",
            |range, mut partial, link| {
                let mine = &mut buf[base + range.start..base + range.end];
                for (p, &m) in partial.iter_mut().zip(mine.iter()) {
                    *p += m;
                }
                if last {
                    if op == ReduceOp::Average {
                        partial.iter_mut().for_each(|p| *p *= scale);
                    }
                    mine.copy_from_slice(&partial);
                }
                // Forward at once: to the next reduce-scatter step, or (when final) to all-gather.
                link.send(Outgoing::Floats(partial))
            },
        )?;
    }
    // All-gather: step s receives the final segment r−s and forwards it, except in the last step.
    for s in 0..n - 1 {
        let seg = segment((r + n - s) % n, n, len);
        let forward = s < n - 2;
        let base = seg.start;
        link.receive::<f32>(
            seg.len(),
            "gathering reduced gradients",
            |range, incoming, link| {
                buf[base + range.start..base + range.end].copy_from_slice(&incoming);
                if forward {
                    link.send(Outgoing::Floats(incoming))?;
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Ring broadcast of `root`'s `buf`, pipelined along the ring.
pub fn broadcast(link: &mut Link, buf: &mut [f32], root: usize) -> Result<()> {
    let (r, n) = (link.rank, link.world);
    if n == 1 {
        return Ok(());
    }
    link.agree(OpCode::Broadcast, Compression::None, buf.len(), root)?;
    if r == root {
        return link.send_range(buf);
    }
    let forward = (r + 1) % n != root;
    link.receive::<f32>(
        buf.len(),
        "receiving a broadcast",
        |range, incoming, link| {
            buf[range].copy_from_slice(&incoming);
            if forward {
                link.send(Outgoing::Floats(incoming))?;
            }
            Ok(())
        },
    )
}

/// Ring all-gather: every rank's `mine` in rank order.
pub fn all_gather(link: &mut Link, mine: &[f32]) -> Result<Vec<f32>> {
    let (r, n, m) = (link.rank, link.world, mine.len());
    let mut out = vec![0.0; n * m];
    out[r * m..(r + 1) * m].copy_from_slice(mine);
    if n == 1 {
        return Ok(out);
    }
    link.agree(OpCode::AllGather, Compression::None, m, 0)?;
    link.send_range(mine)?;
    for s in 0..n - 1 {
        let piece = (r + 2 * n - s - 1) % n;
        let forward = s < n - 2;
        let base = piece * m;
        link.receive::<f32>(m, "gathering values", |range, incoming, link| {
            out[base + range.start..base + range.end].copy_from_slice(&incoming);
            if forward {
                link.send(Outgoing::Floats(incoming))?;
            }
            Ok(())
        })?;
    }
    Ok(out)
}
