//! Forming a job's ring and running collectives on its communication thread.
//!
//! Every executor binds a [`RingListener`] when it starts and registers its address with the
//! driver. For a job, the driver sends each rank the ring's addresses and a per-job secret
//! ([`RingConfig`]); [`RingCollective::connect`] then connects to the right neighbour and
//! accepts the left one, both through the authenticated handshake, before a deadline.
//!
//! With backup workers, every other rank also connects to rank 0 on the gradient lane
//! ([`BackupReduce`]).
//!
//! After that, one background thread owns the sockets (Horovod's design): the train loop only
//! enqueues operations and waits for their results. A writer thread beside it sends to the right
//! neighbour while the communication thread receives from the left. Every read and write has a
//! deadline, so a dead or stuck peer turns into an error that names it, never a hang.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringflow_core::listener::Connection;
use ringflow_core::spec::Compression;
use tracing::info;

use crate::collective::algorithms::{self, Link, LinkEnds, Outgoing};
use crate::collective::backup::BackupReduce;
use crate::collective::compressed;
use crate::collective::handshake::{self, JobSecret, Lane};
use crate::collective::listener::RingListener;
use crate::collective::wire::{configure, describe, write_f32s};
use crate::collective::{Collective, PendingReduce, ReduceOp, stopped};
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// Deadline for an outgoing connection to complete its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// What a rank needs to join its job's ring.
#[derive(Clone, Debug)]
pub struct RingConfig {
    /// The job (connections for other jobs are refused).
    pub job_id: String,
    /// This executor's rank.
    pub rank: usize,
    /// Every rank's ring address (`host:port`), indexed by rank.
    pub peers: Vec<String>,
    /// The job's secret.
    pub secret: JobSecret,
    /// Deadline for forming the ring and for every read and write afterwards.
    pub timeout: Duration,
    /// `cluster.backup_workers`: ranks whose gradients a step may do without (0: every step
    /// all-reduces on the ring). At most `world − 1` are used.
    pub backup_workers: usize,
    /// `cluster.compression`: the format gradients travel in ([`Collective::start_gradient_reduce`]);
    /// every other collective sends f32.
    pub compression: Compression,
}

enum Request {
    AllReduce(Vec<f32>, ReduceOp, Compression, Sender<Result<Vec<f32>>>),
    Broadcast(Vec<f32>, usize, Sender<Result<Vec<f32>>>),
    AllGather(Vec<f32>, Sender<Result<Vec<f32>>>),
}

/// A job's ring of executors, with its communication thread.
pub struct RingCollective {
    rank: usize,
    world: usize,
    timeout: Duration,
    compression: Compression,
    requests: Option<Sender<Request>>,
    comm: Option<JoinHandle<()>>,
    backup: Option<BackupReduce>,
    /// The accepted connections' places at the ring listener's gate.
    _accepted: Vec<Connection>,
}

fn peer(cfg: &RingConfig, rank: usize) -> Peer {
    Peer::rank_at(rank, &cfg.peers[rank])
}

impl RingCollective {
    /// The format gradients travel in on this ring (`cluster.compression`).
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Joins the ring described by `cfg`, accepting the left neighbour on `listener`.
    pub fn connect(listener: &RingListener, cfg: RingConfig) -> Result<RingCollective> {
        let world = cfg.peers.len();
        if cfg.rank >= world {
            let why = format!("rank {} is outside a ring of {world}", cfg.rank);
            return Err(CommError::new(Peer::Local, CommOp::FormRing, why).into());
        }
        if world == 1 {
            return Ok(RingCollective {
                rank: 0,
                world: 1,
                timeout: cfg.timeout,
                compression: cfg.compression,
                requests: None,
                comm: None,
                backup: None,
                _accepted: Vec::new(),
            });
        }
        let deadline = Instant::now() + cfg.timeout;
        let right_rank = (cfg.rank + 1) % world;
        let left_rank = (cfg.rank + world - 1) % world;
        let backups = cfg.backup_workers.min(world - 1);
        let connect = |lane: Lane, peer: usize| {
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name("ringflow-ring-connect".into())
                .spawn(move || connect_to(&cfg, lane, peer, deadline))
                .map_err(|e| CommError::thread(CommOp::FormRing, e))
        };
        let join = |h: JoinHandle<Result<TcpStream>>| {
            h.join().unwrap_or_else(|_| {
                let why = "the ring connector failed";
                Err(CommError::new(Peer::Local, CommOp::FormRing, why).into())
            })
        };
        let connector = connect(Lane::Ring, right_rank)?;
        let uplink = match (backups, cfg.rank) {
            (0, _) | (_, 0) => None,
            _ => Some(connect(Lane::Gradients, 0)?),
        };
        let mut expected = vec![(Lane::Ring, left_rank)];
        if backups > 0 && cfg.rank == 0 {
            expected.extend((1..world).map(|r| (Lane::Gradients, r)));
        }
        let accepted = accept_peers(listener, &cfg, &expected, deadline);
        let right = join(connector);
        let uplink = uplink.map(join).transpose();
        let (accepted, right, uplink) = (accepted?, right?, uplink?);
        let (mut accepted, places): (Vec<TcpStream>, Vec<Connection>) =
            accepted.into_iter().unzip();
        let left = accepted.remove(0);
        for s in accepted
            .iter()
            .chain([&left, &right])
            .chain(uplink.as_ref())
        {
            configure(s, cfg.timeout).map_err(|e| {
                CommError::because(
                    Peer::Local,
                    CommOp::FormRing,
                    "cannot configure a ring socket",
                    e,
                )
            })?;
        }
        let quorum = world - backups;
        let backup = match uplink {
            Some(up) => Some(BackupReduce::connect(
                cfg.rank,
                world,
                quorum,
                up,
                cfg.timeout,
            )?),
            None if backups > 0 => Some(BackupReduce::aggregate(
                world,
                quorum,
                accepted,
                cfg.timeout,
            )?),
            None => None,
        };
        let compression = cfg.compression;
        info!(rank = cfg.rank, world, backups, %compression, "ring formed");
        let (req_tx, comm) = start_threads(&cfg, left, right)?;
        Ok(RingCollective {
            rank: cfg.rank,
            world,
            timeout: cfg.timeout,
            compression: cfg.compression,
            requests: Some(req_tx),
            comm: Some(comm),
            backup,
            _accepted: places,
        })
    }

    /// How long a caller waits for an operation: every read inside it has `timeout`, and an
    /// operation waits behind at most a few queued ones.
    fn wait_limit(&self) -> Duration {
        self.timeout * (4 * self.world as u32 + 4)
    }

    fn submit(
        &mut self,
        op: CommOp,
        make: impl FnOnce(Sender<Result<Vec<f32>>>) -> Request,
    ) -> Result<PendingReduce> {
        let (tx, rx) = channel();
        let requests = self
            .requests
            .as_ref()
            .ok_or_else(|| CommError::new(Peer::Local, op, "the ring is closed"))?;
        requests.send(make(tx)).map_err(|_| stopped(op))?;
        Ok(PendingReduce::waiting(rx, self.wait_limit()))
    }
}

impl Collective for RingCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn start_all_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce> {
        if self.world == 1 {
            return Ok(PendingReduce::ready(Ok(buf)));
        }
        self.submit(CommOp::AllReduce, |tx| {
            Request::AllReduce(buf, op, Compression::None, tx)
        })
    }

    fn start_gradient_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce> {
        if self.world == 1 {
            return Ok(PendingReduce::ready(Ok(buf)));
        }
        let codec = self.compression;
        self.submit(CommOp::AllReduce, |tx| {
            Request::AllReduce(buf, op, codec, tx)
        })
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let data = buf.to_vec();
        let out = self
            .submit(CommOp::Broadcast, |tx| Request::Broadcast(data, root, tx))?
            .wait()?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn all_gather(&mut self, mine: &[f32]) -> Result<Vec<f32>> {
        if self.world == 1 {
            return Ok(mine.to_vec());
        }
        let data = mine.to_vec();
        self.submit(CommOp::AllGather, |tx| Request::AllGather(data, tx))?
            .wait()
    }

    fn backup(&mut self) -> Option<&mut BackupReduce> {
        self.backup.as_mut()
    }

    fn close(&mut self) {
        self.backup.take();
        // The communication thread ends after its current operation (which has a deadline).
        self.requests.take();
    }

    fn barrier(&mut self) -> Result<()> {
        let mut token = [1.0f32];
        self.all_reduce(&mut token, ReduceOp::Sum)?;
        if token[0] as usize != self.world {
            let why = format!(
                "barrier counted {} ranks, expected {}",
                token[0], self.world
            );
            return Err(CommError::new(Peer::Ring, CommOp::Barrier, why).into());
        }
        Ok(())
    }
}

impl Drop for RingCollective {
    fn drop(&mut self) {
        // Closing the request channel ends the communication thread, which closes the sockets.
        self.requests.take();
        if let Some(h) = self.comm.take() {
            let _ = h.join();
        }
    }
}

/// Starts the writer thread, which sends to the right neighbour, and the communication thread,
/// which runs the collectives it is asked for; returns where to ask, and the latter's handle.
fn start_threads(
    cfg: &RingConfig,
    left: TcpStream,
    right: TcpStream,
) -> Result<(Sender<Request>, JoinHandle<()>)> {
    let world = cfg.peers.len();
    let (right_rank, left_rank) = ((cfg.rank + 1) % world, (cfg.rank + world - 1) % world);
    let (out_tx, out_rx) = channel::<Outgoing>();
    let (pool_tx, pool_rx) = channel::<Vec<f32>>();
    let (pool16_tx, pool16_rx) = channel::<Vec<u16>>();
    let writer_error = Arc::new(Mutex::new(None));
    let writer = Writer {
        stream: right,
        peer: peer(cfg, right_rank),
        timeout: cfg.timeout,
        error: writer_error.clone(),
    };
    std::thread::Builder::new()
        .name("ringflow-ring-writer".into())
        .spawn(move || writer.run(out_rx, pool_tx, pool16_tx))
        .map_err(|e| CommError::thread(CommOp::FormRing, e))?;
    let ends = LinkEnds {
        rank: cfg.rank,
        world,
        left,
        left_peer: peer(cfg, left_rank),
        right_peer: peer(cfg, right_rank),
        outgoing: out_tx,
        writer_error,
        pool: pool_rx,
        pool16: pool16_rx,
    };
    let link = Link::new(ends, cfg.timeout);
    let (req_tx, req_rx) = channel();
    let comm = std::thread::Builder::new()
        .name("ringflow-comm".into())
        .spawn(move || comm_loop(link, req_rx))
        .map_err(|e| CommError::thread(CommOp::FormRing, e))?;
    Ok((req_tx, comm))
}

fn comm_loop(mut link: Link, requests: Receiver<Request>) {
    let mut broken: Option<CommError> = None;
    let mut aborted = false;
    for request in requests {
        match request {
            Request::AllReduce(mut buf, op, codec, reply) => {
                let r = match (broken.clone(), codec) {
                    (Some(e), _) => Err(e),
                    (None, Compression::None) => {
                        algorithms::all_reduce(&mut link, &mut buf, op).map(|_| buf)
                    }
                    (None, codec) => {
                        compressed::all_reduce(&mut link, &mut buf, op, codec).map(|_| buf)
                    }
                };
                note_failure(&r, &mut broken);
                // Values beyond the codec's range fail the step on every rank alike, with the
                // ring intact.
                let r = r.map_err(ExecutorError::from).and_then(|buf| {
                    match codec {
                        Compression::None => Ok(()),
                        codec => compressed::check_finite(codec, &buf),
                    }
                    .map(|_| buf)
                });
                let _ = reply.send(r);
            }
            Request::Broadcast(mut buf, root, reply) => {
                let r = match broken.clone() {
                    Some(e) => Err(e),
                    None => algorithms::broadcast(&mut link, &mut buf, root).map(|_| buf),
                };
                note_failure(&r, &mut broken);
                let _ = reply.send(r.map_err(ExecutorError::from));
            }
            Request::AllGather(mine, reply) => {
                let r = match broken.clone() {
                    Some(e) => Err(e),
                    None => algorithms::all_gather(&mut link, &mine),
                };
                note_failure(&r, &mut broken);
                let _ = reply.send(r.map_err(ExecutorError::from));
            }
        }
        if broken.is_some() && !aborted {
            link.abort();
            aborted = true;
        }
    }
}

/// After a failure the ring's byte streams are out of step; every later operation fails too.
fn note_failure<T>(r: &std::result::Result<T, CommError>, broken: &mut Option<CommError>) {
    if let (Err(e), None) = (r, &broken) {
        *broken = Some(e.clone().reworded(|m| format!("the ring is broken: {m}")));
    }
}

/// The writer thread's end of the connection to the right neighbour.
struct Writer {
    stream: TcpStream,
    peer: Peer,
    timeout: Duration,
    /// Where a failure to send is left for the communication thread.
    error: Arc<Mutex<Option<CommError>>>,
}

impl Writer {
    fn run(mut self, items: Receiver<Outgoing>, pool: Sender<Vec<f32>>, pool16: Sender<Vec<u16>>) {
        // The operation being sent, from the last header (one comes before any payload).
        let mut op = CommOp::AllReduce;
        for item in items {
            let r = match item {
                Outgoing::Header(h) => {
                    op = algorithms::op_of(h[0]).unwrap_or(op);
                    std::io::Write::write_all(&mut self.stream, bytemuck::cast_slice(&h))
                }
                Outgoing::Floats(f) => {
                    let r = write_f32s(&mut self.stream, &f);
                    let _ = pool.send(f);
                    r
                }
                Outgoing::Halves(h) => {
                    let r = std::io::Write::write_all(&mut self.stream, bytemuck::cast_slice(&h));
                    let _ = pool16.send(h);
                    r
                }
            };
            if let Err(e) = r {
                let why = describe(&e, &self.peer.to_string(), "sending", self.timeout);
                let failure = CommError::new(self.peer, op, why).with_cause(e);
                *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }
}

/// Connects to `peer_rank` on `lane` through the handshake, retrying until `deadline`.
fn connect_to(
    cfg: &RingConfig,
    lane: Lane,
    peer_rank: usize,
    deadline: Instant,
) -> Result<TcpStream> {
    let addr = &cfg.peers[peer_rank];
    let name = peer(cfg, peer_rank);
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let targets: Vec<SocketAddr> = match addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last = format!("cannot resolve {addr}: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        for target in targets {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&target, left.max(Duration::from_millis(1))) {
                Ok(mut stream) => {
                    let _ = configure(&stream, HANDSHAKE_DEADLINE);
                    match handshake::connect(
                        &mut stream,
                        lane,
                        &cfg.job_id,
                        cfg.rank as u32,
                        peer_rank as u32,
                        &cfg.secret,
                    ) {
                        Ok(()) => return Ok(stream),
                        Err(e) => last = format!("handshake failed: {e}"),
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let whom = match lane {
        Lane::Ring => format!("its right neighbour {name}"),
        Lane::Gradients => format!("the gradient aggregator on {name}"),
    };
    let why = format!(
        "rank {} could not connect to {whom} within {:.0} s: {last}",
        cfg.rank,
        cfg.timeout.as_secs_f64()
    );
    Err(CommError::new(name, CommOp::FormRing, why).into())
}

/// Accepts one authenticated connection for each `(lane, rank)` in `expected`, before
/// `deadline`; returns them in that order, with their places at the listener's gate.
fn accept_peers(
    listener: &RingListener,
    cfg: &RingConfig,
    expected: &[(Lane, usize)],
    deadline: Instant,
) -> Result<Vec<(TcpStream, Connection)>> {
    let formation = listener.form(&cfg.job_id, cfg.rank, &cfg.secret, expected);
    let mut accepted: Vec<Option<(TcpStream, Connection)>> =
        expected.iter().map(|_| None).collect();
    while accepted.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match formation.arrivals.recv_timeout(left) {
            Ok(a) => accepted[a.index] = Some((a.stream, a.connection)),
            Err(_) => break,
        }
    }
    drop(formation);
    if let Some(i) = accepted.iter().position(Option::is_none) {
        let (lane, rank) = expected[i];
        let whom = match lane {
            Lane::Ring => format!("its left neighbour {}", peer(cfg, rank)),
            Lane::Gradients => format!("{} to send gradients", peer(cfg, rank)),
        };
        let why = format!(
            "rank {} waited {:.0} s for {whom} to connect",
            cfg.rank,
            cfg.timeout.as_secs_f64(),
        );
        return Err(CommError::new(peer(cfg, rank), CommOp::FormRing, why).into());
    }
    Ok(accepted.into_iter().flatten().collect())
}
