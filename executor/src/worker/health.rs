//! The executor's health probes (`--health ADDR`), for compose healthchecks and Kubernetes
//! probes: `/healthz` answers 200 while the process serves, `/readyz` 200 while it is
//! registered with a driver that answered its last heartbeats, else 503 with the reason.
//! `/metrics` gives the connection figures of the executor's ring and health listeners in the
//! Prometheus format. Plain HTTP: the probes reveal nothing but those facts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ringflow_core::listener::{
    ConnectionGate, GatedListener, ListenerKind, ListenerLimits, render_prometheus, serve_http,
};

use crate::error::{CommError, CommOp, Peer, Result};

/// The start of the message when the probes' bound address cannot be read.
const ADDRESS_UNKNOWN: &str = "cannot read the health probes' address";

/// How long without a successful heartbeat before the executor reports not ready, as a
/// multiple of the heartbeat interval (and at least [`MIN_SILENCE`]).
const SILENT_INTERVALS: u32 = 5;
const MIN_SILENCE: Duration = Duration::from_secs(10);

/// What `/readyz` answers from: when the driver last answered, and the heartbeat interval.
#[derive(Debug, Default)]
pub(crate) struct Health {
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Health {
    /// The driver answered (registration or heartbeat) now; it expects heartbeats every
    /// `interval`.
    pub(crate) fn driver_answered(&self, interval: Duration) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), interval));
    }

    /// `Ok` when ready, else the reason.
    fn ready(&self) -> std::result::Result<(), NotReady> {
        match *self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Err(NotReady::Unregistered),
            Some((at, interval)) => {
                let limit = (interval * SILENT_INTERVALS).max(MIN_SILENCE);
                let silent = at.elapsed();
                if silent > limit {
                    Err(NotReady::DriverSilent {
                        silent_s: silent.as_secs_f64(),
                    })
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// Why the executor is not ready, as `/readyz` says.
#[derive(Debug, PartialEq, thiserror::Error)]
enum NotReady {
    /// It has not registered with a driver yet.
    #[error("not registered with the driver yet")]
    Unregistered,
    /// The driver has not answered its heartbeats for this long.
    #[error("the driver has not answered for {silent_s:.0} s")]
    DriverSilent { silent_s: f64 },
}

async fn readyz(State(probes): State<Probes>) -> Response {
    match probes.health.ready() {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// What the health port serves from: the probes' state and the listeners' gates.
#[derive(Clone)]
struct Probes {
    health: Arc<Health>,
    gates: Vec<Arc<ConnectionGate>>,
}

async fn metrics(State(probes): State<Probes>) -> Response {
    let stats: Vec<_> = probes.gates.iter().map(|g| g.stats()).collect();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render_prometheus(&stats),
    )
        .into_response()
}

/// Binds `addr` with `limits` and serves the probes, and the figures of `ring`'s gate and its
/// own at `/metrics`, on `rt` for as long as the runtime lives.
pub(crate) fn serve(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    limits: ListenerLimits,
    health: Arc<Health>,
    ring: Arc<ConnectionGate>,
) -> Result<SocketAddr> {
    let start = |why| CommError::new(Peer::Local, CommOp::Start, why);
    let unbound = |e| CommError::because(Peer::Local, CommOp::Start, ADDRESS_UNKNOWN, e);
    limits
        .check(ListenerKind::Health)
        .map_err(|e| start(e.to_string()).with_cause(e))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| {
            let context = format!("cannot serve health probes on {addr} (--health)");
            CommError::because(Peer::Local, CommOp::Start, context, e)
        })?;
    let bound = listener.local_addr().map_err(unbound)?;
    let gate = ConnectionGate::new(ListenerKind::Health, limits);
    let probes = Probes {
        health,
        gates: vec![ring, gate.clone()],
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probes);
    let listener = GatedListener::new(listener, gate).map_err(unbound)?;
    rt.spawn(async move {
        if let Err(e) = serve_http(listener, app, std::future::pending()).await {
            tracing::error!("the health probes on {bound} stopped: {e}");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_the_driver_answers() {
        let h = Health::default();
        assert_eq!(
            h.ready().unwrap_err().to_string(),
            "not registered with the driver yet"
        );
        h.driver_answered(Duration::from_secs(1));
        assert_eq!(h.ready(), Ok(()));
        *h.state.lock().unwrap() = Some((
            Instant::now() - Duration::from_secs(30),
            Duration::from_secs(1),
        ));
        let why = h.ready().unwrap_err().to_string();
        assert!(
            why.starts_with("the driver has not answered for 30 s"),
            "{why}"
        );
    }
}
