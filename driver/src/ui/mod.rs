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
//! | `/api/v1/jobs/{id}/metrics` | its loss, throughput and epoch series, and test metrics |
//! | `/api/v1/executors` | executors: rank, host, state, heartbeat, samples/s, phase split |
//! | `/metrics` | Prometheus text exposition |

mod api;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;

use crate::service::Shared;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// The UI's routes over the driver's shared state.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
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
        .route("/api/v1/executors", get(executors))
        .route("/metrics", get(prometheus))
        .with_state(shared)
}

/// Serves the UI on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    if let Err(e) = axum::serve(listener, router(shared))
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("the web UI on {addr:?} stopped: {e}");
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn not_found(id: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": format!("no job {id:?}") })),
    )
        .into_response()
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
    let text = metrics::render(&shared.lock(), Instant::now());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
