//! The executor process: registers with the driver, heartbeats, and runs the tasks of
//! successive jobs until it is stopped.
//!
//! An executor needs only the driver's URL. It binds its ring listener, registers (retrying
//! until the driver answers), and then loops: poll for a task, join the job's ring, train (or
//! benchmark), report the outcome. A heartbeat task runs beside it, carrying the full
//! registration so that a restarted driver learns the executor again; a heartbeat reply that
//! says the job ended stops the running task at its next step. An attachment stream held open
//! to the driver ([`attach`]) lets it notice at once when this process ends, and the
//! [`crate::last_words`] hooks tell it why, when the process panics or runs out of memory.

mod attach;
mod bench;
mod client;
mod context;
mod health;
pub mod ingest;
mod ring;
mod task;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringflow_core::listener::ListenerLimits;
use ringflow_core::pb;
use ringflow_core::security::ClientSecurity;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use tracing::{error, info, warn};

use crate::collective::RingListener;
use crate::error::{CommError, CommOp, Peer, Result};
use crate::memory::MemoryLimit;
use client::DriverClient;
use task::Worker;

/// How an executor process runs.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// The driver's URL, e.g. `http://10.0.0.1:7077`.
    pub driver: String,
    /// Compute threads.
    pub threads: usize,
    /// Where to accept ring connections (port 0 lets the OS choose).
    pub ring_bind: SocketAddr,
    /// The host other executors use to reach this one (default: the address this machine uses
    /// to reach the driver).
    pub advertise: Option<String>,
    /// Exit when the driver has been unreachable this long (for executors started by
    /// `ringflow local`, which must never outlive it). `None`: keep retrying.
    pub exit_with_driver: Option<Duration>,
    /// Print nothing but errors.
    pub quiet: bool,
    /// How to reach the driver: the cluster's shared secret and TLS.
    pub security: ClientSecurity,
    /// Where to serve `/healthz`, `/readyz` and `/metrics` (`None`: not at all).
    pub health: Option<SocketAddr>,
    /// The memory its tasks may use, in bytes (`ringflow executor --memory`); `None`: the
    /// smaller of the machine's memory and the process's cgroup limit ([`crate::memory`]).
    pub memory: Option<u64>,
    /// Which executors share this one's memory (`ringflow executor --host-identity`); `None`:
    /// this machine's and process's own ([`crate::collective::host_identity`]).
    pub host_identity: Option<String>,
    /// Bounds on the connections of the ring and health ports.
    pub limits: ExecutorLimits,
}

/// How many connections an executor's listeners admit, and how long they wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutorLimits {
    /// The ring port (its first-request deadline bounds each peer's handshake).
    pub ring: ListenerLimits,
    /// The health probes and metrics.
    pub health: ListenerLimits,
}

impl Default for ExecutorLimits {
    fn default() -> ExecutorLimits {
        ExecutorLimits {
            ring: ListenerLimits::RING,
            health: ListenerLimits::HEALTH,
        }
    }
}

/// The state the heartbeat task shares with the task loop.
#[derive(Default)]
struct Current {
    job_id: Mutex<String>,
    cancel: Arc<AtomicBool>,
}

/// What this executor tells the driver about itself when it registers.
fn executor_info(
    config: &ExecutorConfig,
    ring_address: String,
    memory: Option<MemoryLimit>,
) -> pb::ExecutorInfo {
    pb::ExecutorInfo {
        executor_id: executor_id(),
        host: hostname(),
        ring_address,
        cores: config.threads as u32,
        devices: advertised_devices(),
        protocol_version: ringflow_core::PROTOCOL_VERSION,
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        memory_bytes: memory.map_or(0, |m| m.bytes),
        memory_source: memory
            .map(|m| m.source.as_str().to_string())
            .unwrap_or_default(),
        host_identity: config
            .host_identity
            .clone()
            .unwrap_or_else(crate::collective::host_identity),
    }
}

/// Runs an executor until `stop` is set (by a signal) or, with `exit_with_driver`, until the
/// driver is gone.
pub fn run(config: ExecutorConfig, registry: ModelRegistry, stop: Arc<AtomicBool>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ringflow-rpc")
        .enable_all()
        .build()
        .map_err(|e| starting("cannot start the RPC runtime", e))?;
    let listener = RingListener::bind_with(config.ring_bind, config.limits.ring).map_err(|e| {
        let context = format!("cannot listen for ring connections on {}", config.ring_bind);
        starting(context, e)
    })?;
    let host = advertise_host(&config)?;
    let ring_address = format!("{host}:{}", listener.local_addr().port());
    let memory = MemoryLimit::resolve(config.memory);
    let info = executor_info(&config, ring_address, memory);
    let health = Arc::new(health::Health::default());
    if let Some(addr) = config.health {
        let bound = health::serve(
            &rt,
            addr,
            config.limits.health,
            health.clone(),
            listener.gate().clone(),
        )?;
        info!("health probes at http://{bound}/healthz and /readyz, metrics at /metrics");
    }
    let mut client = rt.block_on(DriverClient::connect(
        &config.driver,
        &config.security,
        config.exit_with_driver,
    ))?;
    let interval = rt.block_on(client.register(&info, &stop))?;
    health.driver_answered(interval);
    info!(
        executor = %info.executor_id,
        ring = %info.ring_address,
        devices = %info.devices.join(","),
        memory = %memory.map_or("unknown".into(), |m| m.to_string()),
        "registered with {}",
        config.driver
    );
    if !config.quiet {
        eprintln!(
            "executor {} registered with {} (ring {})",
            info.executor_id, config.driver, info.ring_address
        );
    }

    report_last_words(&rt, &client, &info.executor_id);
    if crate::allocator::keep_freed_buffers() {
        use crate::allocator::{MMAP_THRESHOLD, TRIM_THRESHOLD};
        let (mmap, trim) = (MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20);
        info!("malloc keeps freed buffers (mmap threshold {mmap} MiB, trim {trim} MiB)");
    }
    let attachment = rt.spawn(attach::hold(client.clone(), info.clone()));
    let current = Arc::new(Current::default());
    let heartbeat = rt.spawn(heartbeat_loop(
        client.clone(),
        info.clone(),
        interval,
        current.clone(),
        stop.clone(),
        config.exit_with_driver,
        health,
    ));

    while !stop.load(Ordering::Relaxed) {
        let task = match rt.block_on(client.poll_task(&info.executor_id, Duration::from_secs(2))) {
            Ok(Some(task)) => task,
            Ok(None) => continue,
            Err(s) => {
                poll_failed(&rt, &mut client, &info.executor_id, &s);
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        let header = task.header.clone().unwrap_or_default();
        *current.job_id.lock().unwrap_or_else(|p| p.into_inner()) = header.job_id.clone();
        current.cancel.store(false, Ordering::Relaxed);
        info!(job = %header.job_id, rank = header.rank, "task received");
        let worker = Worker {
            rt: &rt,
            client: &client,
            listener: &listener,
            config: &config,
            registry: &registry,
            current: &current,
            info: &info,
        };
        let result = worker.run_one(&task);
        *current.job_id.lock().unwrap_or_else(|p| p.into_inner()) = String::new();
        if let Err(e) = result {
            error!(job = %header.job_id, "could not report the task's end: {e}");
        }
    }
    heartbeat.abort();
    attachment.abort();
    Ok(())
}

/// A poll for tasks failed with `status`. When the driver answered (the reply did not arrive
/// whole, or could not be decoded), the reply may have held this executor's task: the driver
/// is told, and fails that task's job at once naming this executor and the cause. An
/// unreachable driver sent nothing (and would not hear it).
fn poll_failed(
    rt: &tokio::runtime::Runtime,
    client: &mut DriverClient,
    executor_id: &str,
    status: &tonic::Status,
) {
    let why = ringflow_core::security::status_line(status);
    if status.code() == tonic::Code::Unavailable {
        warn!(
            "polling the driver at {} for tasks failed: {why}",
            client.url()
        );
        return;
    }
    let cause = format!("the reply to its poll for tasks could not be read: {why}");
    error!("this executor could not receive its task from the driver: {cause}; telling the driver");
    if let Err(e) = rt.block_on(client.task_not_received(executor_id, &cause)) {
        warn!("{e}");
    }
}

/// Installs the hooks that report a panic or a failed allocation of this process to the
/// driver before it ends ([`crate::last_words`]).
fn report_last_words(rt: &tokio::runtime::Runtime, client: &DriverClient, executor_id: &str) {
    let (handle, client, id) = (rt.handle().clone(), client.clone(), executor_id.to_string());
    let installed = crate::last_words::install(executor_id, move |words| {
        if let Err(e) = handle.block_on(client.last_words(&id, words)) {
            eprintln!("error: {e}");
        }
    });
    if let Err(e) = installed {
        warn!("cannot install the hooks that report a panic or out of memory to the driver: {e}");
    }
}

/// The devices this executor advertises at registration: `cpu`, then `cuda:I` for each CUDA
/// device it can see (none in a build without the `cuda` feature or on a machine without a
/// GPU).
fn advertised_devices() -> Vec<String> {
    std::iter::once("cpu".to_string())
        .chain(Device::cuda_devices().into_iter().filter_map(|d| match d {
            Device::Cuda(i) => Some(format!("cuda:{i}")),
            Device::Cpu => None,
        }))
        .collect()
}

/// This process's peak resident memory (`VmHWM` in `/proc/self/status`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

async fn heartbeat_loop(
    mut client: DriverClient,
    info: pb::ExecutorInfo,
    mut interval: Duration,
    current: Arc<Current>,
    stop: Arc<AtomicBool>,
    exit_with_driver: Option<Duration>,
    health: Arc<health::Health>,
) {
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        let job_id = current
            .job_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match client.heartbeat(&info, &job_id).await {
            Ok(reply) => {
                last_ok = Instant::now();
                if reply.cancel {
                    current.cancel.store(true, Ordering::Relaxed);
                }
                if reply.heartbeat_interval_ms > 0 {
                    interval = Duration::from_millis(reply.heartbeat_interval_ms);
                }
                health.driver_answered(interval);
            }
            Err(e) => {
                let silent = last_ok.elapsed();
                warn!(
                    "heartbeat to the driver failed ({:.0} s without one): {e}",
                    silent.as_secs_f64()
                );
                if let Some(limit) = exit_with_driver
                    && silent > limit
                {
                    error!(
                        "the driver has been unreachable for {:.0} s; exiting",
                        silent.as_secs_f64()
                    );
                    current.cancel.store(true, Ordering::Relaxed);
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// A process-unique executor id: `exec-<host>-<pid>-<random>`.
fn executor_id() -> String {
    let mut r = [0u8; 3];
    rand::fill(&mut r);
    let host = hostname();
    let short = host.split('.').next().unwrap_or("host");
    format!(
        "exec-{short}-{}-{:02x}{:02x}{:02x}",
        std::process::id(),
        r[0],
        r[1],
        r[2]
    )
}

/// This executor could not start (`context`) because of `cause`.
fn starting(context: impl std::fmt::Display, cause: std::io::Error) -> CommError {
    CommError::because(Peer::Local, CommOp::Start, context, cause)
}

/// The machine's host name.
pub fn hostname() -> String {
    ringflow_core::host::hostname()
}

/// The host other executors should dial: `--advertise`, or the local address of the route to
/// the driver (loopback when the driver is local).
fn advertise_host(config: &ExecutorConfig) -> Result<String> {
    if let Some(h) = &config.advertise {
        return Ok(h.clone());
    }
    if !config.ring_bind.ip().is_unspecified() {
        return Ok(config.ring_bind.ip().to_string());
    }
    let authority = config
        .driver
        .split("://")
        .nth(1)
        .unwrap_or(&config.driver)
        .trim_end_matches('/');
    let target = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut a| a.next());
    let Some(target) = target else {
        return Ok(Ipv4Addr::LOCALHOST.to_string());
    };
    if target.ip().is_loopback() {
        return Ok(target.ip().to_string());
    }
    let bind: SocketAddr = match target.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let ip = UdpSocket::bind(bind)
        .and_then(|s| s.connect(target).and_then(|_| s.local_addr()))
        .map(|a| a.ip())
        .map_err(|e| {
            let context = format!("cannot find a route to the driver at {target}");
            CommError::because(Peer::driver(&config.driver), CommOp::Start, context, e)
        })?;
    Ok(ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executors_advertise_the_cpu_and_every_visible_gpu() {
        let devices = advertised_devices();
        assert_eq!(devices[0], "cpu");
        assert_eq!(devices.len(), 1 + Device::cuda_devices().len());
        assert!(devices[1..].iter().all(|d| d.starts_with("cuda:")));
    }
}
