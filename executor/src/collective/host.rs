//! The collective of a job whose ranks share hosts: all-reduce through shared memory within a
//! host, and hierarchically across hosts.
//!
//! [`connect`] always forms the job's TCP ring first (it carries broadcast, all-gather,
//! barrier and backup workers, which are rare or small, and proves that every rank is there).
//! Then, when `cluster.shared_memory` is on and some host has more than one rank:
//!
//! - all ranks on one host: all-reduce goes through the host's segment ([`ShmGroup`]);
//! - several hosts (Horovod's hierarchical all-reduce): each host sums through its segment
//!   into its first rank (its "leader"), the leaders all-reduce the sums over a ring of their
//!   own, and each leader broadcasts the result to its host through the segment. The buffer
//!   goes through in chunks, pipelined: the leaders' ring reduces one chunk (on its own thread)
//!   while the host sums the next one and broadcasts the previous one.
//!
//! All-reduces run on a communication thread of their own, in the order they were started, so
//! gradient buckets overlap with the backward pass as on the ring. A failure anywhere aborts the
//! segment, which wakes every local rank at once; a leader's failure closes its ring of
//! leaders, which the other leaders see at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::collective::shm::{self, HostLayout, MAX_LOCAL_RANKS, Segment, ShmGroup};
use crate::collective::{
    BackupReduce, Collective, Compression, PendingReduce, ReduceOp, RingCollective, RingConfig,
    RingListener, stopped,
};
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// Where each rank runs, as the driver says, and whether to use shared memory.
#[derive(Clone, Debug, Default)]
pub struct HostConfig {
    /// Every rank's host identity, indexed by rank (empty: unknown).
    pub hosts: Vec<String>,
    /// The ring's generation (a re-formed ring gets a fresh segment).
    pub generation: u32,
    /// `cluster.shared_memory`.
    pub shared_memory: bool,
}

type Reply = Sender<Result<Vec<f32>>>;

/// An all-reduce for the communication thread: the buffer, the reduction, whether it holds
/// gradients (which the leaders' ring sends compressed under `cluster.compression`), and
/// where the result goes.
type Request = (Vec<f32>, ReduceOp, bool, Reply);

/// Floats per chunk of a hierarchical all-reduce (8 MiB): the leaders' ring reduces one chunk
/// across hosts while the host sums the next.
const CHUNK_FLOATS: usize = 2 << 20;

/// A job's collective when ranks share hosts: see the module's documentation.
pub struct HostCollective {
    ring: RingCollective,
    requests: Option<Sender<Request>>,
    /// Ranks on several hosts: all-reduces go through the leaders' ring.
    hierarchical: bool,
    comm: Option<JoinHandle<()>>,
    /// This host's segment and this rank's index in it, to abort it from `close`.
    segment: Option<(Arc<Segment>, usize)>,
    wait_limit: Duration,
}

/// Joins the job's ring and, where ranks share hosts, their shared memory: returns the ring
/// alone when shared memory has nothing to do.
pub fn connect(
    listener: &RingListener,
    cfg: RingConfig,
    host: HostConfig,
) -> Result<Box<dyn Collective>> {
    let world = cfg.peers.len();
    // Checks the rank against the ring's size, among the rest.
    let ring = RingCollective::connect(listener, cfg.clone())?;
    let layout = HostLayout::of(&host.hosts, cfg.rank, world);
    if !host.shared_memory || layout.is_flat() {
        return Ok(Box::new(ring));
    }
    if layout.most_local > MAX_LOCAL_RANKS {
        warn!(
            "a host runs {} ranks of this job, more than shared memory serves ({MAX_LOCAL_RANKS}): \
             they all-reduce over TCP",
            layout.most_local
        );
        return Ok(Box::new(ring));
    }
    let deadline = Instant::now() + cfg.timeout;
    let group = join_segment(&cfg, &host, &layout, deadline)?;
    let leaders = if layout.leaders.len() > 1 && layout.local[0] == cfg.rank {
        Some(RingCollective::connect(
            listener,
            leaders_ring(&cfg, &layout),
        )?)
    } else {
        None
    };
    info!(
        "rank {} all-reduces through shared memory with the {} ranks of its host ({} hosts)",
        cfg.rank,
        layout.local.len(),
        layout.leaders.len()
    );
    let wait_limit = cfg.timeout * (4 * world as u32 + 4);
    let segment = group.as_ref().map(|g| (g.segment().clone(), g.me()));
    let hierarchical = layout.leaders.len() > 1;
    let worker = HostComm {
        group,
        leaders,
        hierarchical,
        world,
        wait_limit,
        spare: Vec::new(),
    };
    let (tx, rx) = channel();
    let comm = std::thread::Builder::new()
        .name("ringflow-shm-comm".into())
        .spawn(move || worker.run(rx))
        .map_err(|e| CommError::thread(CommOp::FormRing, e))?;
    Ok(Box::new(HostCollective {
        ring,
        requests: Some(tx),
        hierarchical,
        comm: Some(comm),
        segment,
        wait_limit,
    }))
}

/// Creates (this host's first rank) or attaches to this host's segment; `None` for a rank
/// alone on its host.
fn join_segment(
    cfg: &RingConfig,
    host: &HostConfig,
    layout: &HostLayout,
    deadline: Instant,
) -> Result<Option<ShmGroup>> {
    if layout.local.len() < 2 {
        return Ok(None);
    }
    let peer = |local: usize| {
        let r = layout.local[local];
        Peer::rank_at(r, &cfg.peers[r])
    };
    let me = layout.local_index(cfg.rank);
    let identity = host.hosts.get(cfg.rank).map_or("", String::as_str);
    let spec = shm::segment_spec(
        &cfg.secret,
        &cfg.job_id,
        host.generation,
        identity,
        layout.local.len(),
        me,
        peer(0),
    );
    let segment = if me == 0 {
        let mut seg = Segment::create(&spec)?;
        seg.unlink_when_attached(deadline, peer)?;
        seg
    } else {
        Segment::attach(&spec, deadline)?
    };
    let peers = (0..layout.local.len()).map(peer).collect();
    Ok(Some(ShmGroup::new(
        Arc::new(segment),
        me,
        peers,
        cfg.timeout,
    )))
}

/// The ring of the hosts' first ranks, as a job of its own (so that its connections cannot
/// be mistaken for the full ring's).
fn leaders_ring(cfg: &RingConfig, layout: &HostLayout) -> RingConfig {
    let rank = layout
        .leaders
        .iter()
        .position(|&r| r == cfg.rank)
        .unwrap_or(0);
    RingConfig {
        job_id: format!("{}/hosts", cfg.job_id),
        rank,
        peers: layout
            .leaders
            .iter()
            .map(|&r| cfg.peers[r].clone())
            .collect(),
        backup_workers: 0,
        ..cfg.clone()
    }
}

/// What the communication thread owns.
struct HostComm {
    group: Option<ShmGroup>,
    leaders: Option<RingCollective>,
    hierarchical: bool,
    world: usize,
    wait_limit: Duration,
    /// Buffers back from the leaders' ring, for the next chunks.
    spare: Vec<Vec<f32>>,
}

impl HostComm {
    fn run(mut self, requests: Receiver<Request>) {
        let mut broken: Option<ExecutorError> = None;
        for (buf, op, gradient, reply) in requests {
            let r = match &broken {
                Some(e) => Err(clone_error(e)),
                None => self.all_reduce(buf, op, gradient),
            };
            if let (Err(e), None) = (&r, &broken) {
                broken = Some(clone_error(e));
                self.abort();
            }
            let _ = reply.send(r);
        }
    }

    /// All-reduces `buf`; the leaders' ring sends the host sums compressed when `gradient`
    /// (and the job compresses gradients).
    fn all_reduce(&mut self, mut buf: Vec<f32>, op: ReduceOp, gradient: bool) -> Result<Vec<f32>> {
        if !self.hierarchical {
            if let Some(g) = &mut self.group {
                g.all_reduce(&mut buf, op, self.world)?;
            }
            return Ok(buf);
        }
        let scale = (op == ReduceOp::Average).then(|| 1.0 / self.world as f32);
        // The scaling left for after the leaders' ring (gradients are scaled before it).
        let after = if gradient { None } else { scale };
        let total = buf.len();
        let chunks = total.div_ceil(CHUNK_FLOATS).max(1);
        let at = |c: usize| c * CHUNK_FLOATS..((c + 1) * CHUNK_FLOATS).min(total);
        // Chunk c's host sum goes to the leaders' ring (its own thread) while the host sums
        // chunk c + 1; then chunk c's result is broadcast within the host.
        let mut in_flight = VecDeque::new();
        for c in 0..chunks {
            if let Some(g) = &mut self.group {
                g.reduce_to_first(&mut buf[at(c)])?;
            }
            let pending = match &mut self.leaders {
                Some(leaders) => {
                    let mut sums = self.spare.pop().unwrap_or_default();
                    sums.clear();
                    sums.extend_from_slice(&buf[at(c)]);
                    Some(if gradient {
                        // Averaged before they are compressed, as the flat ring does: no
                        // partial sum then exceeds the largest value a rank contributes.
                        if let Some(scale) = scale {
                            sums.iter_mut().for_each(|v| *v *= scale);
                        }
                        leaders.start_gradient_reduce(sums, ReduceOp::Sum)?
                    } else {
                        leaders.start_all_reduce(sums, ReduceOp::Sum)?
                    })
                }
                None => None,
            };
            in_flight.push_back((at(c), pending));
            if in_flight.len() > 1 {
                let (range, pending) = in_flight.pop_front().expect("two in flight");
                self.finish(&mut buf[range], pending, after)?;
            }
        }
        while let Some((range, pending)) = in_flight.pop_front() {
            self.finish(&mut buf[range], pending, after)?;
        }
        Ok(buf)
    }

    /// The leader takes a chunk's sum over every host from the leaders' ring; then the host's
    /// ranks receive it from their leader.
    fn finish(
        &mut self,
        chunk: &mut [f32],
        pending: Option<PendingReduce>,
        scale: Option<f32>,
    ) -> Result<()> {
        if let Some(pending) = pending {
            let sums = pending.wait()?;
            chunk.copy_from_slice(&sums);
            if let Some(scale) = scale {
                chunk.iter_mut().for_each(|v| *v *= scale);
            }
            self.spare.push(sums);
        }
        if let Some(g) = &mut self.group {
            g.broadcast_from_first(chunk, self.wait_limit)?;
        }
        Ok(())
    }

    /// Tells the host's ranks and the other leaders that this rank gave up.
    fn abort(&mut self) {
        if let Some(g) = &self.group {
            ShmGroup::abort(g.segment(), g.me());
        }
        if let Some(leaders) = &mut self.leaders {
            leaders.close();
        }
        self.leaders = None;
    }
}

/// A failure, again, for the operations that follow it.
fn clone_error(e: &ExecutorError) -> ExecutorError {
    match e {
        ExecutorError::Comm(c) => {
            ExecutorError::Comm(c.clone().reworded(|m| format!("the ring is broken: {m}")))
        }
        other => ExecutorError::Comm(CommError::new(
            Peer::Local,
            CommOp::AllReduce,
            format!("the ring is broken: {other}"),
        )),
    }
}

impl HostCollective {
    /// Hands an all-reduce to the communication thread (`gradient`: see
    /// [`Collective::start_gradient_reduce`]).
    fn request(&mut self, buf: Vec<f32>, op: ReduceOp, gradient: bool) -> Result<PendingReduce> {
        let (tx, rx) = channel();
        let requests = self
            .requests
            .as_ref()
            .ok_or_else(|| CommError::new(Peer::Local, CommOp::AllReduce, "the ring is closed"))?;
        requests
            .send((buf, op, gradient, tx))
            .map_err(|_| stopped(CommOp::AllReduce))?;
        Ok(PendingReduce::waiting(rx, self.wait_limit))
    }
}

impl Collective for HostCollective {
    fn rank(&self) -> usize {
        self.ring.rank()
    }

    fn world(&self) -> usize {
        self.ring.world()
    }

    fn start_all_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce> {
        self.request(buf, op, false)
    }

    /// With `cluster.compression`, gradients of ranks on several hosts are summed exactly
    /// within each host (shared memory) and sent compressed only between hosts, by the
    /// leaders' ring: the links between hosts, where bandwidth is scarce, carry a quarter of
    /// what a flat uncompressed ring would (half the data, half the bytes per value). All
    /// ranks of one host: over the TCP ring, compressed, as on a job without shared memory
    /// (so that a local job sees fp16's range as a cluster does). Uncompressed, gradients go
    /// through shared memory like any all-reduce.
    fn start_gradient_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce> {
        match self.ring.compression() {
            Compression::None => self.start_all_reduce(buf, op),
            _ if self.hierarchical => self.request(buf, op, true),
            _ => self.ring.start_gradient_reduce(buf, op),
        }
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        self.ring.broadcast(buf, root)
    }

    fn all_gather(&mut self, mine: &[f32]) -> Result<Vec<f32>> {
        self.ring.all_gather(mine)
    }

    fn barrier(&mut self) -> Result<()> {
        self.ring.barrier()
    }

    fn backup(&mut self) -> Option<&mut BackupReduce> {
        self.ring.backup()
    }

    fn close(&mut self) {
        if let Some((seg, me)) = &self.segment {
            ShmGroup::abort(seg, *me);
        }
        self.ring.close();
        self.requests.take();
    }
}

impl Drop for HostCollective {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(h) = self.comm.take() {
            let _ = h.join();
        }
    }
}
