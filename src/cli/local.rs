//! `ringflow local`: a driver in this process and N executor processes beside it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ringflow_driver::observe::Observers;
use ringflow_driver::scheduler::{ProcessEnd, SchedulerConfig};
use ringflow_driver::service::{self, DriverConfig, DriverHandle, DriverLimits};
use ringflow_executor::memory::MemoryLimit;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use ringflow_proto::pb;
use ringflow_proto::security::{ClientSecurity, Secret};
use ringflow_proto::size::format_bytes;
use ringflow_proto::spec::Override;

use super::children::Children;
use super::submit::{self, Watched};
use super::{JobArgs, cores};

#[derive(Args)]
pub struct LocalArgs {
    #[command(flatten)]
    job: JobArgs,

    /// Executors to train with (overrides `cluster.executors`).
    #[arg(long)]
    executors: Option<usize>,

    /// Address of the web UI, its JSON API and Prometheus metrics (`off`: none). When the
    /// default port is taken the next free one is used, as Spark does.
    #[arg(long, default_value = "127.0.0.1:4040")]
    ui: String,

    /// The embedded driver's shared secret (or set RINGFLOW_SECRET), for executors started
    /// elsewhere to join it with (default: a fresh random secret only this run's executors
    /// know).
    #[arg(long, env = "RINGFLOW_SECRET_FILE", value_name = "PATH")]
    secret_file: Option<PathBuf>,
}

/// `--ui ADDR` or `--ui off`.
pub fn parse_ui(value: &str) -> anyhow::Result<Option<SocketAddr>> {
    if value == "off" {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        anyhow::anyhow!("--ui {value:?} is not an address like 127.0.0.1:4040 or `off`")
    })
}

/// The scheduler timing of an embedded driver: everything is on this machine, so loss is
/// noticed quickly.
fn local_timing() -> SchedulerConfig {
    SchedulerConfig {
        heartbeat_interval: Duration::from_millis(500),
        executor_timeout: Duration::from_secs(10),
        ..SchedulerConfig::default()
    }
}

pub fn run(args: LocalArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let flags: Vec<Override> = args
        .executors
        .map(|n| {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            Override::flag(&format!("--executors {n}"), "cluster.executors", n)
        })
        .into_iter()
        .collect();
    let spec = args.job.load(&flags)?;
    let key = match args.executors {
        Some(_) => "--executors",
        None => "cluster.executors",
    };
    check_local_executors(spec.cluster.executors, key)?;
    // The executors run on this machine: a device it cannot use fails now, before any
    // planning or executor process.
    check_local_device(spec.cluster.device, "the job's")?;
    let n = spec.cluster.executors;
    let threads = spec.cluster.threads.unwrap_or_else(|| (cores() / n).max(1));
    let request = args.job.request(&spec);
    let observers = args.job.observers()?;
    let ui = parse_ui(&args.ui)?;
    let observers = observers.with(args.job.timeline()?);
    let secret = Secret::resolve(args.secret_file.as_deref())?;
    run_local(
        registry,
        secret,
        n,
        threads,
        request,
        args.job.summary_json.as_ref(),
        ui,
        observers,
    )
}

/// The most executor processes a local cluster starts.
pub const MAX_LOCAL_EXECUTORS: usize = 256;

/// Fails with one sentence when `n` executors (asked for by `what`, a key or flag) are more
/// than a local cluster starts.
pub fn check_local_executors(n: usize, what: &str) -> anyhow::Result<()> {
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
fn check_local_device(device: Device, whose: &str) -> anyhow::Result<()> {
    device.check_available().map_err(|e| {
        anyhow::anyhow!(
            "{whose} cluster.device = \"{device}\" cannot be used by executors on this machine: {e}"
        )
    })
}

/// Fails job `job_id` with one sentence when what one executor needs for it exceeds its share
/// of this machine's memory (the smaller of the machine's and this process's cgroup limit),
/// shared by the `n` executors about to start.
fn check_local_memory(driver: &DriverHandle, job_id: &str, n: usize) -> anyhow::Result<()> {
    let Some(limit) = MemoryLimit::resolve(None) else {
        return Ok(());
    };
    let each = limit.bytes / n.max(1) as u64;
    let text = if n == 1 {
        format!("this machine's {limit}")
    } else {
        format!(
            "the {} each of {n} executors gets of this machine's {limit}",
            format_bytes(each)
        )
    };
    driver
        .refuse_unless_fits(job_id, each, &text)
        .map_err(anyhow::Error::msg)
}

/// Tells the embedded driver at once when an executor process ends: the job names the
/// executor and its exit status (and fails, or re-forms its ring), instead of waiting for a
/// heartbeat timeout. One that ends before it registered fails `job_id` if it still waits.
fn report_exits(children: &mut Children, driver: &service::DriverHandle, job_id: &str) {
    let reporter = driver.exit_reporter();
    let host = ringflow_executor::worker::hostname();
    let job_id = job_id.to_string();
    children.watch(move |pid, status| {
        let how = ProcessEnd::from(status);
        if !reporter.executor_exited(&host, pid, how) {
            reporter.fail_waiting_job(
                &job_id,
                format!("executor process {pid} {how} before it registered with the driver"),
            );
        }
    });
}

/// Runs one job on a local cluster: a driver in this process and `n` executor processes with
/// `threads` compute threads each. Planning errors, a device this machine cannot use, and a job
/// that cannot fit this machine's memory are reported before any executor starts.
#[allow(clippy::too_many_arguments)]
pub fn run_local(
    registry: ModelRegistry,
    secret: Option<Secret>,
    n: usize,
    threads: usize,
    request: pb::SubmitRequest,
    summary_json: Option<&PathBuf>,
    ui: Option<SocketAddr>,
    mut observers: Observers,
) -> anyhow::Result<ExitCode> {
    let log = super::log_filter().to_string();
    let secret = secret.unwrap_or_else(Secret::generate);
    let security = ClientSecurity::with_secret(secret.clone());
    let rt = super::runtime()?;
    rt.block_on(async {
        let driver = service::start(
            DriverConfig {
                bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                scheduler: local_timing(),
                ui,
                ui_next_free_port: true,
                // Only the executors started below may register: they get a fresh secret.
                secret: Some(secret.clone()),
                tls: None,
                limits: DriverLimits::default(),
            },
            registry,
        )
        .await?;
        if let Some(ui) = driver.ui_url() {
            eprintln!("web UI at {ui}");
        }
        let url = driver.url();
        let mut client = submit::connect(&url, &security).await?;
        let whose = match pb::TaskKind::try_from(request.kind) {
            Ok(pb::TaskKind::Eval | pb::TaskKind::Predict) => "the saved model's",
            _ => "the job's",
        };
        let submitted = submit::submit(&mut client, request).await;
        // The device is known once the job is planned (for eval and predict it is the saved
        // model's).
        let checked = submitted.and_then(|id| {
            let device = driver.job_device(&id).unwrap_or(Device::Cpu);
            check_local_device(device, whose)?;
            check_local_memory(&driver, &id, n)?;
            Ok(id)
        });
        let job_id = match checked {
            Ok(id) => id,
            Err(e) => {
                driver.shutdown().await;
                return Err(e);
            }
        };
        let mut children = Children::spawn(n, &url, &secret, threads, &log)?;
        eprintln!(
            "started {n} executor processes (pids {}) for driver {url}",
            children
                .pids()
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        report_exits(&mut children, &driver, &job_id);
        let watched = submit::watch(&mut client, &job_id, &mut observers).await;
        if matches!(watched, Ok(Watched::Stopped(_)) | Err(_)) {
            driver.cancel_all();
        }
        children.stop(Duration::from_secs(5));
        driver.shutdown().await;
        match watched? {
            Watched::Summary(json) => submit::finish(&json, summary_json),
            Watched::Stopped(sig) => {
                eprintln!("interrupted: job {job_id} cancelled, executors stopped");
                Ok(ExitCode::from(sig.exit_code()))
            }
        }
    })
}
