//! The driver's web UI, like Spark's on port 4040: one page that shows jobs, executors and live
//! charts, the JSON API under `/api/v1` that the page polls, and Prometheus metrics at
//! `/metrics`.
//!
//! The page's HTML, script and style are compiled into the binary (`assets/`): no CDN, no npm
//! build. Every response is computed from the scheduler's state at the time of the request.
//!
//! | path | what |
//! | --- | --- |
//! | `/` | the page |
//! | `/api/v1/jobs` | jobs, newest first |
//! | `/api/v1/jobs/{id}` | one job |
//! | `/api/v1/jobs/{id}/metrics` | its loss, throughput and epoch series, and test metrics (a sequence job's tokens/s and padding, a tagger's entity F1) |
//! | `/api/v1/executors` | executors: rank, host, state, heartbeat, samples/s, phase split, memory |
//! | `/metrics` | Prometheus text exposition |
//! | `POST /api/v1/jobs/{id}/cancel` | cancels a job; with a shared secret, only for a request that carries it (`Authorization: Bearer SECRET`) |
//! | `/healthz` | 200 while the process serves (liveness) |
//! | `/readyz` | 200 while the control plane serves, else 503 (readiness) |
//!
//! Reads are open to whoever reaches the address, as in Spark, but only for a request whose
//! `Host` is an IP address, `localhost` or a name given with `--ui-host` ([`hosts`]), so that a
//! web page cannot read the UI through DNS rebinding; the probes answer any `Host`. The only
//! write action is guarded by the cluster's secret as well. With the driver's TLS settings the UI is served over
//! HTTPS with the same certificate. Its port admits a bounded number of connections, each with
//! a first-request deadline and an idle timeout ([`ringflow_core::listener`]).

mod api;
mod hosts;
mod metrics;

pub use hosts::{InvalidUiHost, UiHosts};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use ringflow_core::listener::{GatedListener, serve_http};
use tokio_rustls::rustls::ServerConfig;

use crate::scheduler::Refusal;
use crate::shared::Shared;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// The UI's routes over the driver's shared state, answering only the `Host`s of `hosts`
/// (the probes answer any).
pub(crate) fn router(shared: Arc<Shared>, hosts: UiHosts) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/jobs/{id}/metrics", get(job_metrics))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/executors", get(executors))
        .route("/metrics", get(prometheus))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(hosts),
            hosts::check_host,
        ))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

/// Serves the UI on `listener` (over TLS with `tls`, for the `Host`s of `hosts`) until
/// `shutdown` resolves.
pub(crate) async fn serve(
    listener: GatedListener,
    tls: Option<Arc<ServerConfig>>,
    shared: Arc<Shared>,
    hosts: UiHosts,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let addr: SocketAddr = listener.local_addr();
    let router = router(shared, hosts);
    let result = match tls {
        None => serve_http(listener, router, shutdown).await,
        Some(config) => match crate::tls::TlsListener::new(listener, config) {
            Ok(listener) => serve_http(listener, router, shutdown).await,
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        tracing::error!("the web UI on {addr} stopped: {e}");
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.serving.load(Ordering::Relaxed) {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response()
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// Cancels a job, when the request carries the cluster's secret (if the driver has one).
async fn cancel(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(secret) = &shared.secret {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let why = match presented {
            None => Some("the driver requires the cluster's shared secret to cancel a job"),
            Some(p) if !secret.matches(p.as_bytes()) => {
                Some("the shared secret sent does not match the driver's")
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            tracing::warn!("refused the web UI's cancel of job {id:?}: {why}");
            return error(StatusCode::UNAUTHORIZED, why.to_string());
        }
    }
    let result = shared.lock().cancel(&id, Instant::now());
    match result {
        Ok(cancelled) => Json(serde_json::json!({ "cancelled": cancelled })).into_response(),
        Err(Refusal::NotFound(m)) => error(StatusCode::NOT_FOUND, m),
        Err(Refusal::Version(m) | Refusal::Invalid(m)) => error(StatusCode::BAD_REQUEST, m),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no job {id:?}"))
}

async fn jobs(State(shared): State<Arc<Shared>>) -> Response {
    Json(api::jobs(&shared.lock(), Instant::now())).into_response()
}

async fn job(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let s = shared.lock();
    match s.job(&id) {
        Some(j) => Json(api::job(j, Instant::now())).into_response(),
        None => not_found(&id),
    }
}

async fn job_metrics(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let s = shared.lock();
    match s.job(&id) {
        Some(j) => Json(api::series(j)).into_response(),
        None => not_found(&id),
    }
}

async fn executors(State(shared): State<Arc<Shared>>) -> Response {
    Json(api::executors(&shared.lock(), Instant::now())).into_response()
}

async fn prometheus(State(shared): State<Arc<Shared>>) -> Response {
    let mut text = metrics::render(&shared.lock(), Instant::now());
    let listeners: Vec<_> = shared.listeners.iter().map(|g| g.stats()).collect();
    text.push_str(&ringflow_core::listener::render_prometheus(&listeners));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
