//! The driver's gRPC server: the [`executors`] service for executors, the [`jobs`] service for
//! the command line, the Arrow Flight service ([`flight`]) that serves partitions to executors
//! that cannot read the data, all on one port, and a ticker that drives the [`Scheduler`]'s
//! timed rules. The executor and job services decode and encode messages of at most
//! [`MAX_MESSAGE_BYTES`], the bound their clients set too.
//!
//! With a shared secret every call must carry a valid token ([`auth`]); with TLS the port
//! speaks only TLS. Both ports admit a bounded number of connections and close those that do
//! not complete a first (authenticated) call in time or stay idle too long
//! ([`ringflow_core::listener`]).

mod auth;
pub mod error;
mod executors;
mod exits;
mod flight;
mod jobs;

pub use crate::ui::{InvalidUiHost, UiHosts};
pub use exits::ExitReporter;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_server::FlightServiceServer;
use ringflow_core::listener::{ConnectionGate, GatedListener, ListenerKind, ListenerLimits};
use ringflow_core::pb::executors_server::ExecutorsServer;
use ringflow_core::pb::jobs_server::JobsServer;
use ringflow_core::security::{Secret, ServerTls};
use ringflow_core::wire::MAX_MESSAGE_BYTES;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::error::Result;
use crate::scheduler::{Refusal, SchedulerConfig};
pub(crate) use crate::shared::Shared;
use error::StartError;

/// How often the scheduler's timed rules run.
const TICK: Duration = Duration::from_millis(100);

pub(crate) fn status(r: Refusal) -> tonic::Status {
    match r {
        Refusal::Version(m) => tonic::Status::failed_precondition(m),
        Refusal::Invalid(m) => tonic::Status::invalid_argument(m),
        Refusal::NotFound(m) => tonic::Status::not_found(m),
    }
}

/// How a driver listens and times its rules.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The control-plane address (port 0 lets the OS choose).
    pub bind: SocketAddr,
    /// Heartbeat and loss timing.
    pub scheduler: SchedulerConfig,
    /// Where to serve the web UI, its JSON API and Prometheus metrics (`None`: not at all).
    pub ui: Option<SocketAddr>,
    /// When the UI's port is taken, try the next ones (and finally any free port) instead of
    /// failing: for embedded drivers, several of which may run at once.
    pub ui_next_free_port: bool,
    /// The names the web UI answers for besides IP addresses and `localhost` (`--ui-host`).
    pub ui_hosts: UiHosts,
    /// The shared secret every caller must prove (`None`: anyone who reaches the port may
    /// register executors and submit jobs).
    pub secret: Option<Secret>,
    /// TLS for the control plane and the web UI (`None`: plain TCP and HTTP).
    pub tls: Option<ServerTls>,
    /// Bounds on the connections of the control plane and the web UI.
    pub limits: DriverLimits,
}

/// How many connections the driver's listeners admit, and how long they wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverLimits {
    /// The control plane (gRPC and Flight): executors, clients, data requests.
    pub control_plane: ListenerLimits,
    /// The web UI, its JSON API, `/metrics` and the probes.
    pub ui: ListenerLimits,
}

impl Default for DriverLimits {
    fn default() -> DriverLimits {
        DriverLimits {
            control_plane: ListenerLimits::CONTROL_PLANE,
            ui: ListenerLimits::UI,
        }
    }
}

/// A running driver.
pub struct DriverHandle {
    /// The address it serves on.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    ticker: JoinHandle<()>,
    /// The web UI's address, when it is served.
    pub ui_addr: Option<SocketAddr>,
    /// Whether both are served over TLS.
    tls: bool,
    ui_shutdown: Option<oneshot::Sender<()>>,
    ui_server: Option<JoinHandle<()>>,
}

impl DriverHandle {
    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The driver's URL, `http://ADDR` (`https://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr)
    }

    /// The web UI's URL, `http://ADDR/` (`https://` with TLS), when it is served.
    pub fn ui_url(&self) -> Option<String> {
        self.ui_addr.map(|a| format!("{}://{a}/", self.scheme()))
    }

    /// The device job `job_id` runs on (`cluster.device`; the CPU for benchmarks), if the job
    /// exists. Embedded drivers use it to check the device on the machine their executors
    /// share.
    pub fn job_device(&self, job_id: &str) -> Option<Device> {
        self.shared.lock().job(job_id).map(|j| j.device())
    }

    /// Fails job `job_id` unless what one executor needs for it fits `limit_bytes`, described
    /// by `limit` ("the 3.9 GiB each of 4 executors gets of this machine's …"); returns the
    /// refusal. Embedded drivers call it before they start their executors.
    pub fn refuse_unless_fits(
        &self,
        job_id: &str,
        limit_bytes: u64,
        limit: &str,
    ) -> std::result::Result<(), crate::error::JobError> {
        self.shared
            .lock()
            .refuse_unless_fits(job_id, limit_bytes, limit, Instant::now())
    }

    /// A handle that reports executor processes that ended ([`ExitReporter`]), for the process
    /// that started them.
    pub fn exit_reporter(&self) -> ExitReporter {
        ExitReporter(self.shared.clone())
    }

    /// Cancels every unfinished job (used on Ctrl-C).
    pub fn cancel_all(&self) {
        let now = Instant::now();
        let mut s = self.shared.lock();
        let ids: Vec<String> = s
            .jobs()
            .filter(|j| !j.is_finished())
            .map(|j| j.id.clone())
            .collect();
        for id in ids {
            let _ = s.cancel(&id, now);
        }
    }

    /// Stops serving, waits for the server to end, and releases the locks of the jobs'
    /// output directories.
    pub async fn shutdown(mut self) {
        self.shared.serving.store(false, Ordering::Relaxed);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(tx) = self.ui_shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(ui) = self.ui_server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), ui).await;
        }
        self.ticker.abort();
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
        // The jobs end with their driver: their output directories are free again.
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.lock().release_locks()).await;
    }
}

/// Ports tried after a taken UI port, before any free port.
const UI_PORT_TRIES: u16 = 16;

/// Binds the UI's address, or with `next_free` the next free port after it.
async fn bind_ui(ui: SocketAddr, next_free: bool) -> Result<tokio::net::TcpListener> {
    let fail = |cause| StartError::Ui { ui, cause };
    match tokio::net::TcpListener::bind(ui).await {
        Ok(l) => Ok(l),
        Err(e) if next_free && e.kind() == std::io::ErrorKind::AddrInUse => {
            for offset in 1..=UI_PORT_TRIES {
                let mut next = ui;
                next.set_port(ui.port().saturating_add(offset));
                if let Ok(l) = tokio::net::TcpListener::bind(next).await {
                    return Ok(l);
                }
            }
            let mut any = ui;
            any.set_port(0);
            Ok(tokio::net::TcpListener::bind(any).await.map_err(fail)?)
        }
        Err(e) => Err(fail(e).into()),
    }
}

/// Where the control plane's connections come from.
enum Incoming {
    /// Plain TCP.
    Plain(GatedListener),
    /// TLS, the handshakes done by the driver.
    Tls(crate::tls::TlsListener),
}

/// A gate for the listener `kind`, its limits checked.
fn gate(kind: ListenerKind, limits: ListenerLimits) -> Result<Arc<ConnectionGate>> {
    limits.check(kind)?;
    Ok(ConnectionGate::new(kind, limits))
}

/// Starts a driver on the current tokio runtime.
pub async fn start(config: DriverConfig, registry: ModelRegistry) -> Result<DriverHandle> {
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|cause| StartError::Listen {
            bind: config.bind,
            cause,
        })?;
    let addr = listener.local_addr().map_err(StartError::BoundAddress)?;
    // The UI's port is taken before anything runs, so that a taken port fails the start cleanly.
    let ui_listener = match config.ui {
        None => None,
        Some(ui) => Some(bind_ui(ui, config.ui_next_free_port).await?),
    };
    let grpc_gate = gate(ListenerKind::ControlPlane, config.limits.control_plane)?;
    let ui_gate = gate(ListenerKind::Ui, config.limits.ui)?;
    let mut shared = Shared::new(config.scheduler.clone(), registry, config.secret.clone());
    shared.listeners = vec![grpc_gate.clone(), ui_gate.clone()];
    let shared = Arc::new(shared);
    let listener = GatedListener::new(listener, grpc_gate).map_err(StartError::BoundAddress)?;
    let mut builder = tonic::transport::Server::builder();
    let verifier = auth::AuthCheck::verifier(config.secret.as_ref());
    let check = |service| auth::AuthCheck::new(verifier.clone(), service);
    let router = builder
        .add_service(InterceptedService::new(
            ExecutorsServer::new(executors::ExecutorsService(shared.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            check("an executor"),
        ))
        .add_service(InterceptedService::new(
            JobsServer::new(jobs::JobsService(shared.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            check("a client"),
        ))
        .add_service(InterceptedService::new(
            FlightServiceServer::new(flight::PartitionServer(shared.clone()))
                .max_encoding_message_size(usize::MAX),
            check("a data (Flight)"),
        ));
    // With TLS the driver runs the handshakes itself, so that it can log the ones it refuses.
    let incoming = match &config.tls {
        None => Incoming::Plain(listener),
        Some(tls) => Incoming::Tls(
            crate::tls::TlsListener::new(listener, tls.grpc()).map_err(StartError::Tls)?,
        ),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let shutdown = async {
        let _ = rx.await;
    };
    let serving: Serving = match incoming {
        Incoming::Tls(tls) => {
            Box::pin(router.serve_with_incoming_shutdown(tls.into_incoming(), shutdown))
        }
        Incoming::Plain(tcp) => {
            Box::pin(router.serve_with_incoming_shutdown(tcp.into_incoming(), shutdown))
        }
    };
    let server = spawn_server(serving, shared.clone());
    if config.secret.is_none() {
        tracing::warn!(
            "the driver at {addr} has no shared secret: anyone who can reach it may register \
             executors and submit jobs (see --secret-file)"
        );
    }
    let (ui_addr, ui_shutdown, ui_server) = match ui_listener {
        None => (None, None, None),
        Some(listener) => {
            let (addr, tx, server) = serve_ui(listener, ui_gate, &config, shared.clone())?;
            (Some(addr), Some(tx), Some(server))
        }
    };
    let ticker = start_ticker(shared.clone());
    tracing::info!(%addr, "driver listening");
    Ok(DriverHandle {
        addr,
        shared,
        shutdown: Some(tx),
        server: Some(server),
        ticker,
        ui_addr,
        tls: config.tls.is_some(),
        ui_shutdown,
        ui_server,
    })
}

/// The gRPC server's future: it ends when the server stops.
type Serving = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<(), tonic::transport::Error>> + Send>,
>;

/// Runs the gRPC server; when it stops, the driver no longer reports itself ready.
fn spawn_server(serving: Serving, shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let result = serving.await;
        shared.serving.store(false, Ordering::Relaxed);
        if let Err(e) = result {
            tracing::error!("the driver's server stopped: {e}");
        }
    })
}

/// Serves the web UI on `listener`; returns its address, the sender that stops it and its task.
fn serve_ui(
    listener: tokio::net::TcpListener,
    gate: Arc<ConnectionGate>,
    config: &DriverConfig,
    shared: Arc<Shared>,
) -> Result<(SocketAddr, oneshot::Sender<()>, JoinHandle<()>)> {
    let bound = StartError::UiBoundAddress;
    let ui_addr = listener.local_addr().map_err(bound)?;
    let (tx, rx) = oneshot::channel::<()>();
    let listener = GatedListener::new(listener, gate).map_err(bound)?;
    let server = tokio::spawn(crate::ui::serve(
        listener,
        config.tls.as_ref().map(|t| t.http()),
        shared,
        config.ui_hosts.clone(),
        async {
            let _ = rx.await;
        },
    ));
    tracing::info!(%ui_addr, "web UI listening");
    Ok((ui_addr, tx, server))
}

/// Runs the scheduler's timed rules every [`TICK`].
fn start_ticker(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(TICK);
        loop {
            interval.tick().await;
            shared.tick();
        }
    })
}
