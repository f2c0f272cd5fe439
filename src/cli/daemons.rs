//! `ringflow driver` and `ringflow executor`: the long-running processes of a cluster.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ringflow_driver::scheduler::SchedulerConfig;
use ringflow_driver::service::{self, DriverConfig};
use ringflow_executor::worker::{self, ExecutorConfig};
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

    #[command(flatten)]
    security: SecurityArgs,
}

impl TryFrom<&DriverArgs> for DriverConfig {
    type Error = anyhow::Error;

    fn try_from(a: &DriverArgs) -> anyhow::Result<DriverConfig> {
        anyhow::ensure!(
            a.executor_timeout >= 2,
            "--executor-timeout must be at least 2 seconds"
        );
        let (secret, tls) = a.security.server()?;
        Ok(DriverConfig {
            bind: a.bind,
            scheduler: SchedulerConfig {
                heartbeat_interval: Duration::from_millis(1000),
                executor_timeout: Duration::from_secs(a.executor_timeout),
                ..SchedulerConfig::default()
            },
            ui: super::local::parse_ui(&a.ui)?,
            ui_next_free_port: false,
            secret,
            tls,
        })
    }
}

pub fn driver(args: DriverArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let config = DriverConfig::try_from(&args)?;
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

    /// Serve the health probes /healthz and /readyz (200 once registered) on this address.
    #[arg(long, value_name = "ADDR")]
    health: Option<SocketAddr>,

    /// The memory this executor's tasks may use, e.g. 8GiB or 512MiB (default: the smaller of
    /// the machine's memory and the process's cgroup limit). The driver refuses a job whose
    /// memory estimate exceeds it.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    memory: Option<u64>,

    #[command(flatten)]
    security: SecurityArgs,
}

/// `--memory SIZE`.
fn parse_memory(text: &str) -> Result<u64, String> {
    ringflow_proto::size::parse_size(text).map_err(|e| e.to_string())
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
        })
    }
}

pub fn executor(args: ExecutorArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let config = ExecutorConfig::try_from(&args)?;
    let stop = Arc::new(AtomicBool::new(false));
    stop_flag_on_signal(stop.clone(), args.quiet);
    match worker::run(config, registry, stop) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ringflow_executor::ExecutorError::Cancelled) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("the executor stopped"),
    }
}
