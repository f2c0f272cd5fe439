//! `ringflow driver` and `ringflow executor`: the long-running processes of a cluster.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ringflow_core::listener::ListenerLimits;
use ringflow_driver::scheduler::{DEFAULT_RETAINED_JOBS, SchedulerConfig};
use ringflow_driver::service::{self, DriverConfig, DriverLimits};
use ringflow_executor::worker::{self, ExecutorConfig, ExecutorLimits};
use ringflow_ml::nn::ModelRegistry;

use super::security::SecurityArgs;
use super::signals::{shutdown_signal, stop_flag_on_signal};

#[derive(Args)]
pub struct DriverArgs {
    /// Address of the control plane.
    #[arg(long, default_value = "0.0.0.0:7077")]
    bind: SocketAddr,

    /// Seconds of silence after which an executor is considered lost.
    #[arg(long, default_value_t = 15)]
    executor_timeout: u64,

    /// Address of the web UI, its JSON API (/api/v1), Prometheus metrics (/metrics) and the
    /// health probes (/healthz, /readyz); `off` serves none.
    #[arg(long, default_value = "127.0.0.1:4040")]
    ui: String,

    /// A name the web UI answers for (repeatable), besides IP addresses and localhost: the
    /// driver's DNS name when browsers or a proxy reach the UI by it. A request for any other
    /// `Host` is refused (403), so that web pages cannot read the UI through DNS rebinding.
    #[arg(long, value_name = "NAME")]
    ui_host: Vec<String>,

    /// Most connections the control plane (gRPC and Flight) holds at once. At the bound, the
    /// oldest connection that has not yet made an authenticated call makes room; when there
    /// is none, new connections are refused.
    #[arg(long, value_name = "N", default_value_t = ListenerLimits::CONTROL_PLANE.max_connections)]
    max_connections: usize,

    /// Most connections the web UI holds at once (same rule, with any request as the first).
    #[arg(long, value_name = "N", default_value_t = ListenerLimits::UI.max_connections)]
    ui_max_connections: usize,

    /// How many finished jobs the driver keeps, with their events and summaries, for
    /// `ringflow status`, the web UI and `/metrics`; older ones are forgotten (their event
    /// logs stay in their checkpoint directories).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RETAINED_JOBS)]
    retained_jobs: usize,

    #[command(flatten)]
    timeouts: TimeoutArgs,

    #[command(flatten)]
    security: SecurityArgs,
}

/// The deadlines of a daemon's listeners.
#[derive(Args)]
struct TimeoutArgs {
    /// Seconds a client has to complete its handshake (TLS, the ring's) and first request on
    /// any port of this process before it is disconnected.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    first_request_timeout: u64,

    /// Seconds without a byte either way after which a connection to the control plane, the
    /// web UI or the health port is closed (ringflow's clients ping every 5 to 20 s, so keep it
    /// above 30).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    idle_timeout: u64,
}

impl TimeoutArgs {
    /// `defaults` with these deadlines and `max` connections (the flag `max_flag` sets it).
    fn limits(
        &self,
        defaults: ListenerLimits,
        max: usize,
        max_flag: &str,
    ) -> anyhow::Result<ListenerLimits> {
        anyhow::ensure!(max >= 1, "{max_flag} must be at least 1");
        anyhow::ensure!(
            self.first_request_timeout >= 1,
            "--first-request-timeout must be at least 1 second"
        );
        anyhow::ensure!(
            self.idle_timeout >= 1,
            "--idle-timeout must be at least 1 second"
        );
        let idle = match defaults.idle {
            // A listener without an idle timeout (the ring's) keeps none.
            Duration::MAX => Duration::MAX,
            _ => Duration::from_secs(self.idle_timeout),
        };
        Ok(ListenerLimits {
            max_connections: max,
            first_request: Duration::from_secs(self.first_request_timeout),
            idle,
        })
    }
}

/// Raises this process's open-file limit to its hard limit (as Go programs do), so that the
/// listeners' bounds, not the limit, decide which connections are refused, and warns when the
/// bounds (set by `flags`) still do not fit under it.
fn open_files_for(connections: usize, flags: &str) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid pointer.
    let soft = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
        limit.rlim_cur
    };
    // Files, data readers and outgoing connections need descriptors too.
    let needed = connections as u64 + 256;
    if soft < needed {
        tracing::warn!(
            "the open-file limit ({soft}) is below the listeners' bounds on connections \
             ({connections}) plus room for files: raise it (ulimit -n) or lower {flags}"
        );
    }
}

impl TryFrom<&DriverArgs> for DriverConfig {
    type Error = anyhow::Error;

    fn try_from(a: &DriverArgs) -> anyhow::Result<DriverConfig> {
        anyhow::ensure!(
            a.executor_timeout >= 2,
            "--executor-timeout must be at least 2 seconds"
        );
        anyhow::ensure!(a.retained_jobs >= 1, "--retained-jobs must be at least 1");
        let (secret, tls) = a.security.server()?;
        Ok(DriverConfig {
            bind: a.bind,
            scheduler: SchedulerConfig {
                heartbeat_interval: Duration::from_millis(1000),
                executor_timeout: Duration::from_secs(a.executor_timeout),
                retained_jobs: a.retained_jobs,
                ..SchedulerConfig::default()
            },
            ui: super::local::parse_ui(&a.ui)?,
            ui_next_free_port: false,
            ui_hosts: super::local::parse_ui_hosts(&a.ui_host)?,
            secret,
            tls,
            limits: DriverLimits {
                control_plane: a.timeouts.limits(
                    ListenerLimits::CONTROL_PLANE,
                    a.max_connections,
                    "--max-connections",
                )?,
                ui: a.timeouts.limits(
                    ListenerLimits::UI,
                    a.ui_max_connections,
                    "--ui-max-connections",
                )?,
            },
        })
    }
}

pub fn driver(args: DriverArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let config = DriverConfig::try_from(&args)?;
    open_files_for(
        config.limits.control_plane.max_connections + config.limits.ui.max_connections,
        "--max-connections or --ui-max-connections",
    );
    let rt = super::runtime()?;
    rt.block_on(async {
        let handle = service::start(config, registry).await?;
        eprintln!("driver listening on {}", handle.url());
        if let Some(ui) = handle.ui_url() {
            eprintln!("web UI at {ui}");
        }
        shutdown_signal().await;
        eprintln!("driver stopping");
        handle.cancel_all();
        handle.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(Args)]
pub struct ExecutorArgs {
    /// The driver's URL, e.g. http://10.0.0.1:7077.
    #[arg(long, env = "RINGFLOW_DRIVER")]
    driver: String,

    /// Compute threads (default: all cores).
    #[arg(long)]
    cores: Option<usize>,

    /// Address for ring connections from other executors (port 0: any free port).
    #[arg(long, default_value = "0.0.0.0:0")]
    ring_bind: SocketAddr,

    /// Host name or IP that other executors use to reach this one (default: this machine's
    /// address on the route to the driver).
    #[arg(long)]
    advertise: Option<String>,

    /// Exit when the driver has been unreachable for this many seconds (default: wait for it).
    #[arg(long, value_name = "SECONDS")]
    exit_with_driver: Option<u64>,

    /// Print nothing but errors (used for the executors that `ringflow local` starts).
    #[arg(long)]
    quiet: bool,

    /// Serve the health probes /healthz and /readyz (200 once registered), and the
    /// connection metrics at /metrics, on this address.
    #[arg(long, value_name = "ADDR")]
    health: Option<SocketAddr>,

    /// The memory this executor's tasks may use, e.g. 8GiB or 512MiB (default: the smaller of
    /// the machine's memory and the process's cgroup limit). The driver refuses a job whose
    /// memory estimate exceeds it.
    #[arg(long, value_name = "SIZE", value_parser = ringflow_core::size::parse_size)]
    memory: Option<u64>,

    /// Which executors share this one's memory: those with the same identity all-reduce
    /// through shared memory (default: this machine's boot id and this process's network, IPC
    /// and PID namespaces). Give executors of one machine different identities to make them
    /// count as different hosts.
    #[arg(long, value_name = "ID")]
    host_identity: Option<String>,

    /// Most connections the ring port holds at once (peers of the job, plus those still in
    /// their handshake; at the bound the oldest of those makes room).
    #[arg(long, value_name = "N", default_value_t = ListenerLimits::RING.max_connections)]
    ring_max_connections: usize,

    /// Most connections the health port holds at once.
    #[arg(long, value_name = "N", default_value_t = ListenerLimits::HEALTH.max_connections)]
    health_max_connections: usize,

    #[command(flatten)]
    timeouts: TimeoutArgs,

    #[command(flatten)]
    security: SecurityArgs,
}

impl TryFrom<&ExecutorArgs> for ExecutorConfig {
    type Error = anyhow::Error;

    fn try_from(a: &ExecutorArgs) -> anyhow::Result<ExecutorConfig> {
        let threads = a.cores.unwrap_or_else(super::cores);
        anyhow::ensure!(threads >= 1, "--cores must be at least 1");
        anyhow::ensure!(
            a.driver.starts_with("http://") || a.driver.starts_with("https://"),
            "--driver must be a URL such as http://10.0.0.1:7077, not {:?}",
            a.driver
        );
        Ok(ExecutorConfig {
            driver: a.driver.clone(),
            threads,
            ring_bind: a.ring_bind,
            advertise: a.advertise.clone(),
            exit_with_driver: a.exit_with_driver.map(Duration::from_secs),
            quiet: a.quiet,
            security: a.security.client()?,
            health: a.health,
            memory: a.memory,
            host_identity: a.host_identity.clone(),
            limits: ExecutorLimits {
                ring: a.timeouts.limits(
                    ListenerLimits::RING,
                    a.ring_max_connections,
                    "--ring-max-connections",
                )?,
                health: a.timeouts.limits(
                    ListenerLimits::HEALTH,
                    a.health_max_connections,
                    "--health-max-connections",
                )?,
            },
        })
    }
}

pub fn executor(args: ExecutorArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let config = ExecutorConfig::try_from(&args)?;
    open_files_for(
        config.limits.ring.max_connections + config.limits.health.max_connections,
        "--ring-max-connections or --health-max-connections",
    );
    let stop = Arc::new(AtomicBool::new(false));
    stop_flag_on_signal(stop.clone(), args.quiet);
    match worker::run(config, registry, stop) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ringflow_executor::ExecutorError::Cancelled) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("the executor stopped"),
    }
}
