//! [`LocalCluster`]: a driver in this process and executor processes of this very binary beside
//! it, on this machine — what `ringflow local`, `eval`, `predict` and `bench allreduce` run on
//! when no `--driver` is given (Spark's `local[N]` master, but with real processes and a real
//! ring).
//!
//! A [`LocalConfig`] says how many executors, with how many threads, and where the web UI
//! listens; the command line converts its arguments into one once. [`LocalCluster::start`]
//! starts the driver alone, so that a job is planned (and refused) before any executor exists;
//! [`LocalCluster::check_job`] refuses a job whose device or memory this machine cannot give,
//! and [`LocalCluster::start_executors`] starts the executors ([`children`]), whose ends the
//! driver hears about at once.

pub mod children;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ringflow_core::security::{ClientSecurity, Secret};
use ringflow_core::size::format_bytes;
use ringflow_driver::scheduler::{ProcessEnd, SchedulerConfig};
use ringflow_driver::service::{self, DriverConfig, DriverHandle, DriverLimits, UiHosts};
use ringflow_executor::memory::MemoryLimit;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;

use children::Children;

/// The most executor processes a local cluster starts.
pub const MAX_LOCAL_EXECUTORS: usize = 256;

/// How long executors get to stop on their own before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How a local cluster runs.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Executor processes to start (at most [`MAX_LOCAL_EXECUTORS`]).
    pub executors: usize,
    /// Compute threads of each executor.
    pub threads: usize,
    /// Where the web UI listens (`None`: no UI); a taken port moves on to the next free one.
    pub ui: Option<SocketAddr>,
    /// The names the web UI answers for besides IP addresses and `localhost`.
    pub ui_hosts: UiHosts,
    /// The embedded driver's shared secret (`None`: a fresh one that only this cluster's
    /// executors know).
    pub secret: Option<Secret>,
    /// The executors' log filter.
    pub log_filter: String,
    /// The scheduler's timing.
    pub scheduler: SchedulerConfig,
    /// Hosts the executors pretend to be on (1: this machine, as it is): with more, executor
    /// `i` gets host identity `simulated-host-{i mod hosts}`, so that shared memory and the
    /// hierarchical all-reduce across hosts can be tried and measured on one machine.
    pub hosts: usize,
}

impl LocalConfig {
    /// `executors` processes sharing this machine's cores, no UI, a fresh secret, warnings
    /// logged, and the timing of a machine where a lost executor is noticed quickly.
    pub fn new(executors: usize) -> LocalConfig {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        LocalConfig {
            executors,
            threads: (cores / executors.max(1)).max(1),
            ui: None,
            ui_hosts: UiHosts::default(),
            secret: None,
            log_filter: "warn".into(),
            hosts: 1,
            scheduler: SchedulerConfig {
                heartbeat_interval: Duration::from_millis(500),
                executor_timeout: Duration::from_secs(10),
                ..SchedulerConfig::default()
            },
        }
    }
}

/// Fails with one sentence when `n` executors (asked for by `what`, a key or flag) are more
/// than a local cluster starts.
pub fn check_executors(n: usize, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        n <= MAX_LOCAL_EXECUTORS,
        "{what} asks for {n} executors, but a local cluster starts one process per executor, at \
         most {MAX_LOCAL_EXECUTORS}; for more, start a driver and executors (`ringflow driver`, \
         `ringflow executor`) and use --driver"
    );
    Ok(())
}

/// Fails with one sentence when `device` cannot be used on this machine, where a local
/// cluster's executors run; `whose` names where the device comes from ("the job's").
pub fn check_device(device: Device, whose: &str) -> anyhow::Result<()> {
    device.check_available().map_err(|e| {
        anyhow::anyhow!(
            "{whose} cluster.device = \"{device}\" cannot be used by executors on this machine: {e}"
        )
    })
}

/// A driver in this process and, once started, its executor processes.
pub struct LocalCluster {
    driver: DriverHandle,
    secret: Secret,
    config: LocalConfig,
    children: Option<Children>,
}

impl LocalCluster {
    /// Starts the embedded driver on a loopback port (and its web UI, if configured); no
    /// executor yet.
    pub async fn start(config: LocalConfig, registry: ModelRegistry) -> anyhow::Result<Self> {
        check_executors(config.executors, "the local cluster")?;
        let secret = config.secret.clone().unwrap_or_else(Secret::generate);
        let driver = service::start(
            DriverConfig {
                bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                scheduler: config.scheduler.clone(),
                ui: config.ui,
                ui_next_free_port: true,
                ui_hosts: config.ui_hosts.clone(),
                // Only this cluster's executors (and whoever was given the secret) register.
                secret: Some(secret.clone()),
                tls: None,
                limits: DriverLimits::default(),
            },
            registry,
        )
        .await?;
        Ok(LocalCluster {
            driver,
            secret,
            config,
            children: None,
        })
    }

    /// The driver's URL.
    pub fn url(&self) -> String {
        self.driver.url()
    }

    /// What a client of the driver proves itself with.
    pub fn security(&self) -> ClientSecurity {
        ClientSecurity::with_secret(self.secret.clone())
    }

    /// The embedded driver.
    pub fn driver(&self) -> &DriverHandle {
        &self.driver
    }

    /// Refuses job `job_id`, with one sentence, when this machine cannot run it: a device it
    /// cannot use (`whose` says where the device comes from, "the job's"), or more memory per
    /// executor than its share of this machine's (the smaller of the machine's and this
    /// process's cgroup limit).
    pub fn check_job(&self, job_id: &str, whose: &str) -> anyhow::Result<()> {
        let device = self.driver.job_device(job_id).unwrap_or(Device::Cpu);
        check_device(device, whose)?;
        let Some(limit) = MemoryLimit::resolve(None) else {
            return Ok(());
        };
        let n = self.config.executors;
        let each = limit.bytes / n.max(1) as u64;
        let text = if n == 1 {
            format!("this machine's {limit}")
        } else {
            format!(
                "the {} each of {n} executors gets of this machine's {limit}",
                format_bytes(each)
            )
        };
        self.driver
            .refuse_unless_fits(job_id, each, &text)
            .map_err(anyhow::Error::msg)
    }

    /// Starts the executors; returns their process ids. The driver hears at once when one
    /// ends: the job names the executor and its exit status (and fails, or re-forms its ring)
    /// instead of waiting for a heartbeat timeout, and one that ends before it registered
    /// fails `waiting_job` if that job still waits for executors.
    pub fn start_executors(&mut self, waiting_job: Option<&str>) -> anyhow::Result<Vec<u32>> {
        let c = &self.config;
        let url = self.driver.url();
        let mut children = Children::spawn(
            c.executors,
            &url,
            &self.secret,
            c.threads,
            &c.log_filter,
            c.hosts,
        )?;
        let reporter = self.driver.exit_reporter();
        let host = ringflow_executor::worker::hostname();
        let job_id = waiting_job.map(str::to_string);
        children.watch(move |pid, status| {
            let how = ProcessEnd::from(status);
            if !reporter.executor_exited(&host, pid, how)
                && let Some(job_id) = &job_id
            {
                reporter.fail_waiting_job(
                    job_id,
                    format!("executor process {pid} {how} before it registered with the driver"),
                );
            }
        });
        let pids = children.pids();
        self.children = Some(children);
        Ok(pids)
    }

    /// Stops the executors and the driver; with `cancel`, the unfinished jobs are cancelled
    /// first.
    pub async fn shutdown(mut self, cancel: bool) {
        if cancel {
            self.driver.cancel_all();
        }
        if let Some(mut children) = self.children.take() {
            children.stop(STOP_GRACE);
        }
        self.driver.shutdown().await;
    }
}
