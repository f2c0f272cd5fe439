//! The admission side of a listener: which connections are open, which one makes room when
//! the listener is full, and the counts that `/metrics` shows.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

use super::ListenerLimits;

/// At most one summary line of refusals per listener in this time.
const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which of ringflow's listeners a gate guards: the `listener` label in `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    /// The driver's gRPC port (executors, clients, Arrow Flight).
    ControlPlane,
    /// The driver's web UI, JSON API, metrics and probes.
    Ui,
    /// An executor's ring port.
    Ring,
    /// An executor's health probes and metrics.
    Health,
}

impl ListenerKind {
    /// The `listener` label value.
    pub fn label(self) -> &'static str {
        match self {
            ListenerKind::ControlPlane => "grpc",
            ListenerKind::Ui => "ui",
            ListenerKind::Ring => "ring",
            ListenerKind::Health => "health",
        }
    }

    /// The listener's name in sentences.
    pub fn name(self) -> &'static str {
        match self {
            ListenerKind::ControlPlane => "control plane",
            ListenerKind::Ui => "web UI",
            ListenerKind::Ring => "ring listener",
            ListenerKind::Health => "health probe listener",
        }
    }
}

/// Why a listener refused or closed a connection on its own: the `reason` label of
/// `ringflow_connections_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The listener was at its bound and every open connection had completed its first
    /// request: the new connection was closed at accept.
    Limit,
    /// The listener was at its bound: this connection, the oldest that had not completed its
    /// first request, was closed to make room for a new one.
    Evicted,
    /// No completed handshake and first request within the deadline.
    FirstRequestTimeout,
    /// No bytes either way for the idle timeout.
    IdleTimeout,
    /// The handshake failed (TLS, or the ring's authentication).
    Handshake,
}

impl RefusalReason {
    /// Every reason, in the order of the counters.
    pub const ALL: [RefusalReason; 5] = [
        RefusalReason::Limit,
        RefusalReason::Evicted,
        RefusalReason::FirstRequestTimeout,
        RefusalReason::IdleTimeout,
        RefusalReason::Handshake,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            RefusalReason::Limit => "limit",
            RefusalReason::Evicted => "evicted",
            RefusalReason::FirstRequestTimeout => "first_request_timeout",
            RefusalReason::IdleTimeout => "idle_timeout",
            RefusalReason::Handshake => "handshake",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// `n` refusals of this kind, in words, for the summary line.
    fn describe(self, n: u64, limits: &ListenerLimits) -> String {
        match self {
            RefusalReason::Limit => format!(
                "{n} refused at its bound of {} connections",
                limits.max_connections
            ),
            RefusalReason::Evicted => {
                format!("{n} closed to make room before their first request")
            }
            RefusalReason::FirstRequestTimeout => format!(
                "{n} closed without a first request within {} s",
                limits.first_request.as_secs_f64()
            ),
            RefusalReason::IdleTimeout => format!("{n} closed after being idle"),
            RefusalReason::Handshake => format!("{n} failed the handshake"),
        }
    }
}

/// One open connection, as the gate and the connection's stream see it.
pub(crate) struct ConnState {
    id: u64,
    peer: SocketAddr,
    opened: Instant,
    /// Whether the client completed its first request (an authenticated call, an HTTP
    /// request, the ring's handshake).
    established: AtomicBool,
    /// Milliseconds after `opened` of the last byte read or written.
    last_activity_ms: AtomicU64,
    /// Whether the gate closed it (each connection is counted under one reason at most).
    closed: AtomicBool,
    /// Whether it was closed to make room; the stream fails its next read or write.
    evicted: AtomicBool,
    /// Woken when the connection is evicted, so that its task notices at once.
    pub(crate) waker: AtomicWaker,
    /// For a blocking socket: a handle shut down to evict it.
    blocking: Mutex<Option<std::net::TcpStream>>,
}

impl ConnState {
    fn established(&self) -> bool {
        self.established.load(Ordering::Acquire)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.waker.wake();
        if let Some(socket) = lock(&self.blocking).take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A handle on an open connection that marks its first request done (cheap to clone; it
/// does not keep the connection's place at the gate).
#[derive(Clone)]
pub struct ConnectionHandle(Arc<ConnState>);

impl ConnectionHandle {
    /// The client completed its first request: from now on only the idle timeout applies,
    /// and the connection no longer makes room for new ones.
    pub fn establish(&self) {
        self.0.established.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for ConnectionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionHandle")
            .field("peer", &self.0.peer)
            .field("established", &self.0.established())
            .finish()
    }
}

/// An admitted connection's place at its gate, released when dropped.
pub struct Connection {
    gate: Arc<ConnectionGate>,
    state: Arc<ConnState>,
}

impl Connection {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.state.peer
    }

    /// A handle that marks the first request done.
    pub fn handle(&self) -> ConnectionHandle {
        ConnectionHandle(self.state.clone())
    }

    /// Marks the first request done (see [`ConnectionHandle::establish`]).
    pub fn establish(&self) {
        self.handle().establish();
    }

    /// Whether the client completed its first request.
    pub fn is_established(&self) -> bool {
        self.state.established()
    }

    /// Whether the gate closed the connection to make room for a new one.
    pub fn is_evicted(&self) -> bool {
        self.state.evicted.load(Ordering::Acquire)
    }

    /// When the client must have completed its handshake and first request.
    pub fn first_request_deadline(&self) -> Instant {
        later(self.state.opened, self.gate.limits.first_request)
    }

    /// Notes a byte read or written (it postpones the idle timeout).
    pub(crate) fn touch(&self) {
        let ms = self.state.opened.elapsed().as_millis() as u64;
        self.state.last_activity_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The deadline that applies now and the reason it closes the connection.
    pub(crate) fn deadline(&self) -> (Instant, RefusalReason) {
        if self.state.established() {
            let last = Duration::from_millis(self.state.last_activity_ms.load(Ordering::Relaxed));
            let last = later(self.state.opened, last);
            (
                later(last, self.gate.limits.idle),
                RefusalReason::IdleTimeout,
            )
        } else {
            (
                self.first_request_deadline(),
                RefusalReason::FirstRequestTimeout,
            )
        }
    }

    /// Closes the connection for `reason` like [`Connection::close_for`], with `detail` (who
    /// and why, e.g. a failed handshake's cause) for the next summary line.
    pub fn close_with(&self, reason: RefusalReason, detail: String) {
        lock(&self.gate.log).detail = Some(detail);
        self.close_for(reason);
    }

    /// The gate closes the connection for `reason` (counted once per connection).
    pub fn close_for(&self, reason: RefusalReason) {
        if !self.state.closed.swap(true, Ordering::AcqRel) {
            self.gate.count(reason);
        }
    }

    pub(crate) fn state(&self) -> &ConnState {
        &self.state
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        lock(&self.gate.open).conns.remove(&self.state.id);
    }
}

/// `at + d`, or a century later where that overflows (an unbounded timeout).
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// Open connections by id, which is their order of arrival.
    conns: BTreeMap<u64, Arc<ConnState>>,
}

#[derive(Default)]
struct SummaryLog {
    last: Option<Instant>,
    /// The counters at the last summary line.
    logged: [u64; RefusalReason::ALL.len()],
    /// What the latest refusal with details was, for the next line.
    detail: Option<String>,
}

/// The gate of one listener: its bound, its open connections and its counters.
pub struct ConnectionGate {
    kind: ListenerKind,
    limits: ListenerLimits,
    open: Mutex<Registry>,
    accepted: AtomicU64,
    refused: [AtomicU64; RefusalReason::ALL.len()],
    log: Mutex<SummaryLog>,
}

/// A listener's figures for `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerStats {
    /// Which listener.
    pub kind: ListenerKind,
    /// Its bound on concurrent connections.
    pub max_connections: usize,
    /// Connections open now.
    pub open: usize,
    /// Connections admitted since it started.
    pub accepted: u64,
    /// Connections refused or closed by the gate, by reason (in [`RefusalReason::ALL`]'s
    /// order).
    pub refused: [(RefusalReason, u64); RefusalReason::ALL.len()],
}

impl ConnectionGate {
    /// A gate for the listener `kind` with `limits`.
    pub fn new(kind: ListenerKind, limits: ListenerLimits) -> Arc<ConnectionGate> {
        Arc::new(ConnectionGate {
            kind,
            limits,
            open: Mutex::default(),
            accepted: AtomicU64::new(0),
            refused: Default::default(),
            log: Mutex::default(),
        })
    }

    /// The listener it guards.
    pub fn kind(&self) -> ListenerKind {
        self.kind
    }

    /// Its limits.
    pub fn limits(&self) -> &ListenerLimits {
        &self.limits
    }

    /// Admits a connection from `peer`, making room if needed (see the module docs); `None`
    /// when it must be refused (the caller closes it).
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Connection> {
        self.admit_with(peer, None)
    }

    /// [`ConnectionGate::admit`] for a blocking socket, which the gate shuts down when it
    /// makes room.
    pub fn admit_blocking(
        self: &Arc<Self>,
        socket: &std::net::TcpStream,
        peer: SocketAddr,
    ) -> Option<Connection> {
        self.admit_with(peer, socket.try_clone().ok())
    }

    fn admit_with(
        self: &Arc<Self>,
        peer: SocketAddr,
        blocking: Option<std::net::TcpStream>,
    ) -> Option<Connection> {
        let (state, evicted) = {
            let mut open = lock(&self.open);
            let mut evicted = None;
            if open.conns.len() >= self.limits.max_connections {
                let oldest = open.conns.values().find(|c| !c.established()).cloned();
                match oldest {
                    Some(c) => {
                        open.conns.remove(&c.id);
                        evicted = Some(c);
                    }
                    None => {
                        drop(open);
                        self.count(RefusalReason::Limit);
                        return None;
                    }
                }
            }
            let id = open.next_id;
            open.next_id += 1;
            let state = Arc::new(ConnState {
                id,
                peer,
                opened: Instant::now(),
                established: AtomicBool::new(false),
                last_activity_ms: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                evicted: AtomicBool::new(false),
                waker: AtomicWaker::new(),
                blocking: Mutex::new(blocking),
            });
            open.conns.insert(id, state.clone());
            (state, evicted)
        };
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = evicted
            && !c.closed.swap(true, Ordering::AcqRel)
        {
            c.evict();
            self.count(RefusalReason::Evicted);
        }
        Some(Connection {
            gate: self.clone(),
            state,
        })
    }

    /// Counts a connection refused or closed for `reason` that has no [`Connection`] (any
    /// more), e.g. a failed TLS handshake.
    pub fn count(&self, reason: RefusalReason) {
        self.refused[reason.index()].fetch_add(1, Ordering::Relaxed);
        if reason != RefusalReason::IdleTimeout {
            self.summarize(Instant::now());
        }
    }

    /// Logs a summary of the refusals since the last one, at most once per
    /// [`SUMMARY_INTERVAL`].
    fn summarize(&self, now: Instant) {
        let mut log = lock(&self.log);
        if log
            .last
            .is_some_and(|t| now.duration_since(t) < SUMMARY_INTERVAL)
        {
            return;
        }
        let counts = self.counts();
        let mut delta = counts;
        for (d, before) in delta.iter_mut().zip(log.logged) {
            *d -= before;
        }
        let since = log.last.map(|t| now.duration_since(t));
        log.last = Some(now);
        log.logged = counts;
        let detail = log.detail.take();
        drop(log);
        if let Some(line) = summary_line(self.kind, &self.limits, delta, since, detail) {
            tracing::warn!("{line}");
        }
    }

    fn counts(&self) -> [u64; RefusalReason::ALL.len()] {
        std::array::from_fn(|i| self.refused[i].load(Ordering::Relaxed))
    }

    /// The figures for `/metrics`.
    pub fn stats(&self) -> ListenerStats {
        let counts = self.counts();
        ListenerStats {
            kind: self.kind,
            max_connections: self.limits.max_connections,
            open: lock(&self.open).conns.len(),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused: std::array::from_fn(|i| (RefusalReason::ALL[i], counts[i])),
        }
    }
}

/// The summary line for `delta` refusals by reason (idle timeouts are routine and left out),
/// `since` the previous line; `None` when there is nothing to say.
fn summary_line(
    kind: ListenerKind,
    limits: &ListenerLimits,
    delta: [u64; RefusalReason::ALL.len()],
    since: Option<Duration>,
    detail: Option<String>,
) -> Option<String> {
    let parts: Vec<String> = RefusalReason::ALL
        .iter()
        .zip(delta)
        .filter(|(r, n)| **r != RefusalReason::IdleTimeout && *n > 0)
        .map(|(r, n)| r.describe(n, limits))
        .collect();
    if parts.is_empty() {
        return None;
    }
    let when = match since {
        Some(d) => format!("in the last {:.0} s", d.as_secs_f64()),
        None => "since it started".to_string(),
    };
    let latest = detail.map_or_else(String::new, |d| format!("; the latest: {d}"));
    Some(format!(
        "the {} refused connections {when}: {}{latest} (counted in \
         ringflow_connections_refused_total at /metrics; this line repeats at most once a \
         minute)",
        kind.name(),
        parts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn gate(max: usize) -> Arc<ConnectionGate> {
        ConnectionGate::new(
            ListenerKind::Ui,
            ListenerLimits {
                max_connections: max,
                ..ListenerLimits::UI
            },
        )
    }

    fn refused(g: &ConnectionGate, reason: RefusalReason) -> u64 {
        g.stats().refused[reason.index()].1
    }

    #[test]
    fn at_the_bound_the_oldest_silent_connection_makes_room() {
        let g = gate(2);
        let a = g.admit(peer(1)).unwrap();
        let b = g.admit(peer(2)).unwrap();
        let c = g.admit(peer(3)).expect("room is made");
        assert!(a.is_evicted(), "the oldest silent connection is closed");
        assert!(!b.is_evicted() && !c.is_evicted());
        assert_eq!(g.stats().open, 2);
        assert_eq!(refused(&g, RefusalReason::Evicted), 1);
        // Established connections keep their place: the silent one goes.
        b.establish();
        let d = g.admit(peer(4)).expect("room is made");
        assert!(c.is_evicted() && !b.is_evicted() && !d.is_evicted());
        assert_eq!(refused(&g, RefusalReason::Evicted), 2);
        // Once every open connection is established, new ones are refused.
        d.establish();
        assert!(g.admit(peer(5)).is_none());
        assert_eq!(refused(&g, RefusalReason::Limit), 1);
        assert_eq!(g.stats().accepted, 4);
        // A closed connection frees its place.
        drop(b);
        assert!(g.admit(peer(6)).is_some());
        // Dropping an evicted connection later changes nothing.
        drop(a);
        assert_eq!(g.stats().open, 1);
    }

    #[test]
    fn a_connection_is_counted_under_one_reason_only() {
        let g = gate(4);
        let a = g.admit(peer(1)).unwrap();
        a.close_for(RefusalReason::FirstRequestTimeout);
        a.close_for(RefusalReason::IdleTimeout);
        assert_eq!(refused(&g, RefusalReason::FirstRequestTimeout), 1);
        assert_eq!(refused(&g, RefusalReason::IdleTimeout), 0);
    }

    #[test]
    fn the_deadline_is_the_first_request_then_the_idle_timeout() {
        let limits = ListenerLimits {
            max_connections: 4,
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        };
        let g = ConnectionGate::new(ListenerKind::ControlPlane, limits);
        let a = g.admit(peer(1)).unwrap();
        let (due, why) = a.deadline();
        assert_eq!(why, RefusalReason::FirstRequestTimeout);
        assert_eq!(due, a.first_request_deadline());
        a.establish();
        let (due, why) = a.deadline();
        assert_eq!(why, RefusalReason::IdleTimeout);
        assert_eq!(due, later(a.state.opened, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(20));
        a.touch();
        assert!(a.deadline().0 > due, "activity postpones the idle timeout");
        // An unbounded idle timeout does not overflow.
        let ring = ConnectionGate::new(ListenerKind::Ring, ListenerLimits::RING);
        let r = ring.admit(peer(2)).unwrap();
        r.establish();
        assert!(r.deadline().0 > Instant::now() + Duration::from_secs(3600));
    }

    #[test]
    fn a_blocking_socket_is_shut_down_when_it_makes_room() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, from) = listener.accept().unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let g = gate(1);
        let _first = g.admit_blocking(&server, from).unwrap();
        let _second = g.admit(peer(9)).unwrap();
        // The read returns at once (end of stream), not after the 10 s timeout.
        let mut buf = [0u8; 1];
        assert_eq!(server.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn refusals_are_summarized_without_idle_timeouts() {
        let limits = ListenerLimits::UI;
        let mut delta = [0; 5];
        assert_eq!(
            summary_line(ListenerKind::Ui, &limits, delta, None, None),
            None
        );
        delta[RefusalReason::IdleTimeout.index()] = 7;
        assert_eq!(
            summary_line(ListenerKind::Ui, &limits, delta, None, None),
            None
        );
        delta[RefusalReason::Limit.index()] = 3;
        delta[RefusalReason::FirstRequestTimeout.index()] = 2;
        let line = summary_line(
            ListenerKind::Ui,
            &limits,
            delta,
            Some(Duration::from_secs(61)),
            None,
        )
        .unwrap();
        assert!(
            line.starts_with(
                "the web UI refused connections in the last 61 s: 3 refused at its bound of \
                 256 connections, 2 closed without a first request within 10 s"
            ),
            "{line}"
        );
        assert!(!line.contains("idle"), "{line}");
        delta = [0; 5];
        delta[RefusalReason::Handshake.index()] = 1;
        let line = summary_line(
            ListenerKind::Ring,
            &ListenerLimits::RING,
            delta,
            None,
            Some("10.0.0.7:5000: bad MAC".into()),
        )
        .unwrap();
        assert!(
            line.starts_with(
                "the ring listener refused connections since it started: 1 failed the \
                 handshake; the latest: 10.0.0.7:5000: bad MAC ("
            ),
            "{line}"
        );
    }

    #[test]
    fn the_summary_is_logged_at_most_once_a_minute() {
        let g = gate(1);
        let start = Instant::now();
        g.count(RefusalReason::Limit);
        let first = lock(&g.log).last;
        assert!(first.is_some());
        g.count(RefusalReason::Limit);
        assert_eq!(lock(&g.log).last, first, "no second line within a minute");
        assert_eq!(lock(&g.log).logged[0], 1);
        g.summarize(start + SUMMARY_INTERVAL + Duration::from_secs(1));
        assert_eq!(lock(&g.log).logged[0], 2, "the next line covers the rest");
    }
}
