//! The executor's health probes (`--health ADDR`), for compose healthchecks and Kubernetes
//! probes: `/healthz` answers 200 while the process serves, `/readyz` 200 while it is
//! registered with a driver that answered its last heartbeats, else 503 with the reason.
//! Plain HTTP: the probes reveal nothing but those two facts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::{ExecutorError, Result};

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
    fn ready(&self) -> std::result::Result<(), String> {
        match *self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Err("not registered with the driver yet".into()),
            Some((at, interval)) => {
                let limit = (interval * SILENT_INTERVALS).max(MIN_SILENCE);
                let silent = at.elapsed();
                if silent > limit {
                    Err(format!(
                        "the driver has not answered for {:.0} s",
                        silent.as_secs_f64()
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    match health.ready() {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// Binds `addr` and serves the probes on `rt` for as long as the runtime lives.
pub(crate) fn serve(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    health: Arc<Health>,
) -> Result<SocketAddr> {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| {
            ExecutorError::Comm(format!(
                "cannot serve health probes on {addr} (--health): {e}"
            ))
        })?;
    let bound = listener
        .local_addr()
        .map_err(|e| ExecutorError::Comm(format!("cannot read the health probes' address: {e}")))?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
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
        assert_eq!(h.ready().unwrap_err(), "not registered with the driver yet");
        h.driver_answered(Duration::from_secs(1));
        assert_eq!(h.ready(), Ok(()));
        *h.state.lock().unwrap() = Some((
            Instant::now() - Duration::from_secs(30),
            Duration::from_secs(1),
        ));
        let why = h.ready().unwrap_err();
        assert!(
            why.starts_with("the driver has not answered for 30 s"),
            "{why}"
        );
    }
}
