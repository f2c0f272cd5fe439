//! Bounds on the connections a server accepts, shared by every listener of ringflow: the
//! driver's control plane (gRPC and Flight) and web UI, and an executor's ring and health
//! ports.
//!
//! Each listener has a [`ConnectionGate`] with its [`ListenerLimits`]:
//!
//! - **A bound on concurrent connections.** At the bound, a new connection makes room by
//!   closing the oldest connection that has not completed its first request (or handshake);
//!   when every open connection has, the new one is closed at accept, before a byte is read.
//!   A flood of silent connections therefore cannot lock out a client that speaks at once.
//! - **A first-request deadline.** A client must complete its handshake and first request
//!   (TLS, the HTTP/2 preface and an authenticated call, an HTTP request, the ring's
//!   authentication) within [`ListenerLimits::first_request`].
//! - **An idle timeout.** A connection with no bytes either way for [`ListenerLimits::idle`]
//!   is closed. ringflow's own clients send HTTP/2 keepalive pings more often than that.
//!
//! Refusals and closes are counted, not logged one line each: [`render_prometheus`] writes
//! them for `/metrics`, and the log gets at most one summary line a minute per listener.
//!
//! [`GatedListener`] applies a gate to a tokio listener (for tonic and axum), and
//! [`GuardedStream`] enforces the deadlines on each connection; blocking listeners (the
//! ring's) use [`ConnectionGate::admit_blocking`] and [`Connection::first_request_deadline`].

mod accept;
mod gate;
mod http;
mod limits_error;
mod metrics;
mod stream;

use std::time::Duration;

pub use accept::GatedListener;
pub use gate::{
    Connection, ConnectionGate, ConnectionHandle, ListenerKind, ListenerStats, RefusalReason,
};
pub use http::Guarded;
pub use http::serve_http;
pub use limits_error::LimitsError;
pub use metrics::render_prometheus;
pub use stream::{GuardedStream, PeerInfo, peer_of};

/// How many connections a listener admits at once and how long it waits for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// The most connections open at once.
    pub max_connections: usize,
    /// How long a client may take to complete its handshake and first request.
    pub first_request: Duration,
    /// How long a connection may stay without a byte either way before it is closed.
    pub idle: Duration,
}

/// The first-request deadline of every listener unless configured.
pub const DEFAULT_FIRST_REQUEST: Duration = Duration::from_secs(10);
/// The idle timeout of the HTTP listeners unless configured: well above
/// [`CLIENT_KEEPALIVE`] and the few seconds between the web UI's polls.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(120);
/// ringflow's own gRPC clients (executors, their data requests, the command line) send an
/// HTTP/2 keepalive ping at least this often, even while idle, so that the driver's idle
/// timeout never closes their connections.
pub const CLIENT_KEEPALIVE: Duration = Duration::from_secs(20);

impl ListenerLimits {
    /// The driver's control plane: executors (a few connections each), clients and Flight.
    pub const CONTROL_PLANE: ListenerLimits = ListenerLimits {
        max_connections: 2048,
        first_request: DEFAULT_FIRST_REQUEST,
        idle: DEFAULT_IDLE,
    };
    /// The driver's web UI, JSON API and metrics: browsers open a few connections each.
    pub const UI: ListenerLimits = ListenerLimits {
        max_connections: 256,
        first_request: DEFAULT_FIRST_REQUEST,
        idle: DEFAULT_IDLE,
    };
    /// An executor's ring port: its job's peers (every rank, on rank 0 with backup workers)
    /// plus room for retries. Ring connections have no idle timeout here: every read and
    /// write on them has the job's ring deadline.
    pub const RING: ListenerLimits = ListenerLimits {
        max_connections: 256,
        first_request: DEFAULT_FIRST_REQUEST,
        idle: Duration::MAX,
    };
    /// An executor's health probes and metrics: probes and scrapers.
    pub const HEALTH: ListenerLimits = ListenerLimits {
        max_connections: 64,
        first_request: DEFAULT_FIRST_REQUEST,
        idle: DEFAULT_IDLE,
    };

    /// Checks that the limits admit connections at all; the error names `listener`.
    pub fn check(&self, listener: ListenerKind) -> Result<(), LimitsError> {
        let listener = listener.name();
        if self.max_connections == 0 {
            return Err(LimitsError::NoConnections { listener });
        }
        if self.first_request.is_zero() || self.idle.is_zero() {
            return Err(LimitsError::NoTime { listener });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_clients_ping_well_within_the_idle_timeout() {
        for limits in [ListenerLimits::CONTROL_PLANE, ListenerLimits::UI] {
            assert!(limits.idle >= CLIENT_KEEPALIVE * 3, "{limits:?}");
        }
    }

    #[test]
    fn limits_that_admit_nothing_are_refused() {
        let none = ListenerLimits {
            max_connections: 0,
            ..ListenerLimits::UI
        };
        let err = none.check(ListenerKind::Ui).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the web UI must admit at least 1 connection at once, not 0"
        );
        assert!(ListenerLimits::RING.check(ListenerKind::Ring).is_ok());
    }
}
