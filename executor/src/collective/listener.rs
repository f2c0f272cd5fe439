//! The executor's ring port: one accepting thread for the executor's lifetime, behind a
//! [`ConnectionGate`].
//!
//! Every connection passes the gate at accept (at its bound, the oldest connection still in its
//! handshake makes room; when none is, the new one is closed before a byte is read) and then
//! runs the acceptor's side of the handshake on a thread of its own, under the gate's
//! first-request deadline, so a silent or slow peer never holds up the others. A peer that
//! connects before this executor starts forming its ring waits (within that deadline) for the
//! ring to form; one for another job, a rank or lane the ring does not expect, or without the
//! job's secret is closed and counted. Authenticated connections go to the ring being formed
//! ([`RingListener::form`]).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringflow_core::listener::{
    Connection, ConnectionGate, ListenerKind, ListenerLimits, RefusalReason,
};
use tracing::debug;

use crate::collective::handshake::{self, Failure, Hello, JobSecret, Lane, Refusal};

/// Stack of a handshake thread: the handshake needs little, and there may be many at once.
const HANDSHAKE_STACK: usize = 256 * 1024;
/// How often a handshake waiting for its ring checks whether it was closed to make room.
const WAIT_SLICE: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The socket on which an executor accepts ring connections, bound once for its lifetime.
pub struct RingListener {
    local: SocketAddr,
    gate: Arc<ConnectionGate>,
    forming: Arc<Forming>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RingListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingListener")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl RingListener {
    /// Binds `addr` (port 0 lets the OS choose) with the default limits.
    pub fn bind(addr: SocketAddr) -> std::io::Result<RingListener> {
        RingListener::bind_with(addr, ListenerLimits::RING)
    }

    /// Binds `addr` with `limits` and starts accepting.
    pub fn bind_with(addr: SocketAddr, limits: ListenerLimits) -> std::io::Result<RingListener> {
        limits
            .check(ListenerKind::Ring)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let gate = ConnectionGate::new(ListenerKind::Ring, limits);
        let forming = Arc::new(Forming::default());
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (gate, forming, stop) = (gate.clone(), forming.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ringflow-ring-accept".into())
                .spawn(move || accept_loop(&listener, &gate, &forming, &stop))?
        };
        Ok(RingListener {
            local,
            gate,
            forming,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The gate, whose figures the executor's `/metrics` shows.
    pub fn gate(&self) -> &Arc<ConnectionGate> {
        &self.gate
    }

    /// Starts forming a ring as rank `rank` of `job_id`: until the returned [`Formation`] is
    /// dropped, connections from the `expected` (lane, rank) pairs that prove `secret` arrive
    /// on it.
    pub(crate) fn form(
        &self,
        job_id: &str,
        rank: usize,
        secret: &JobSecret,
        expected: &[(Lane, usize)],
    ) -> Formation<'_> {
        let (tx, arrivals) = channel();
        let round = Arc::new(Round {
            job_id: job_id.to_string(),
            rank: rank as u32,
            secret: secret.clone(),
            expected: expected.to_vec(),
            taken: Mutex::new(vec![false; expected.len()]),
            arrivals: tx,
        });
        *lock(&self.forming.current) = Some(round.clone());
        self.forming.changed.notify_all();
        Formation {
            forming: &self.forming,
            round,
            arrivals,
        }
    }
}

impl Drop for RingListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread with a connection of our own; should that fail, the thread
        // ends at the next connection instead.
        let mut wake = self.local;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok()
            && let Some(acceptor) = self.acceptor.take()
        {
            let _ = acceptor.join();
        }
    }
}

/// An authenticated connection for the ring being formed.
pub(crate) struct Arrival {
    /// Its place in the formation's expected (lane, rank) pairs.
    pub index: usize,
    pub stream: TcpStream,
    /// Its place at the gate, held for as long as the connection is open.
    pub connection: Connection,
}

/// A ring being formed on this executor; authenticated connections arrive on `arrivals`.
pub(crate) struct Formation<'a> {
    forming: &'a Forming,
    round: Arc<Round>,
    pub arrivals: Receiver<Arrival>,
}

impl Drop for Formation<'_> {
    fn drop(&mut self) {
        let mut current = lock(&self.forming.current);
        if current
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, &self.round))
        {
            *current = None;
        }
    }
}

/// The ring being formed, if any, and a condition variable for handshakes waiting for one.
#[derive(Default)]
struct Forming {
    current: Mutex<Option<Arc<Round>>>,
    changed: Condvar,
}

impl Forming {
    /// The ring being formed, waiting for one until `deadline` (or until `connection` is
    /// closed to make room).
    fn wait(&self, deadline: Instant, connection: &Connection) -> Option<Arc<Round>> {
        let mut current = lock(&self.current);
        loop {
            if let Some(round) = current.as_ref() {
                return Some(round.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || connection.is_evicted() {
                return None;
            }
            current = self
                .changed
                .wait_timeout(current, left.min(WAIT_SLICE))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// What a ring being formed accepts.
struct Round {
    job_id: String,
    rank: u32,
    secret: JobSecret,
    expected: Vec<(Lane, usize)>,
    /// Which expected peers are connected.
    taken: Mutex<Vec<bool>>,
    arrivals: Sender<Arrival>,
}

impl Round {
    /// The place of a peer claiming `rank` on `lane`, or why it may not connect.
    fn place(&self, hello: &Hello) -> Result<usize, Refusal> {
        let (lane, rank) = (hello.lane, hello.rank);
        if hello.job != self.job_id {
            return Err(Refusal::OtherJob {
                job: hello.job.clone(),
                ours: self.job_id.clone(),
            });
        }
        let i = self
            .expected
            .iter()
            .position(|&(l, r)| l == lane && r == rank as usize)
            .ok_or(Refusal::NotExpected {
                rank,
                lane,
                ours: self.rank,
            })?;
        if lock(&self.taken)[i] {
            return Err(Refusal::AlreadyConnected { rank, lane });
        }
        Ok(i)
    }
}

fn accept_loop(
    listener: &TcpListener,
    gate: &Arc<ConnectionGate>,
    forming: &Arc<Forming>,
    stop: &AtomicBool,
) {
    for incoming in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match incoming {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, say: retrying at once would only spin.
                debug!("the ring listener could not accept a connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Ok(from) = stream.peer_addr() else {
            continue;
        };
        // A refused connection is dropped, and so closed, right here.
        let Some(connection) = gate.admit_blocking(&stream, from) else {
            continue;
        };
        let forming = forming.clone();
        // Should no thread start, the connection is dropped with the closure.
        let _ = std::thread::Builder::new()
            .name("ringflow-ring-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || handshake(stream, from, connection, &forming));
    }
}

/// Runs the acceptor's side of one connection's handshake and hands it to the ring.
fn handshake(stream: TcpStream, from: SocketAddr, connection: Connection, forming: &Forming) {
    let result = authenticate(&stream, &connection, forming);
    if connection.is_evicted() {
        return;
    }
    match result {
        Ok((round, index)) => {
            if std::mem::replace(&mut lock(&round.taken)[index], true) {
                // Another connection from the same peer was faster.
                let why = format!("{from}: the same rank connected twice on one lane");
                connection.close_with(RefusalReason::Handshake, why);
                return;
            }
            connection.establish();
            let _ = round.arrivals.send(Arrival {
                index,
                stream,
                connection,
            });
        }
        Err(Failure::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            connection.close_for(RefusalReason::FirstRequestTimeout);
        }
        Err(e) => {
            debug!(%from, "dropped a ring connection that failed the handshake: {e}");
            connection.close_with(RefusalReason::Handshake, format!("{from}: {e}"));
        }
    }
}

/// The acceptor's side: reads the hello, waits for the ring it is for, checks the peer's place
/// and proof. Returns the ring and the peer's place in it.
fn authenticate(
    stream: &TcpStream,
    connection: &Connection,
    forming: &Forming,
) -> Result<(Arc<Round>, usize), Failure> {
    let deadline = connection.first_request_deadline();
    let _ = stream.set_nodelay(true);
    let mut io = Deadlined { stream, deadline };
    let hello = handshake::read_hello(&mut io)?;
    let round = forming
        .wait(deadline, connection)
        .ok_or_else(|| Refusal::NoRing {
            rank: hello.rank,
            job: hello.job.clone(),
        })?;
    let index = round.place(&hello)?;
    handshake::answer(&mut io, &hello, round.rank, &round.secret)?;
    Ok((round, index))
}

/// A socket whose every read and write ends by `deadline` (not merely some time after the
/// last byte, so a peer that trickles bytes cannot stretch the handshake).
struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no handshake within the deadline",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        s.read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        s.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
