//! `ringflow local`: a driver in this process and N executor processes beside it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ringflow_driver::scheduler::SchedulerConfig;
use ringflow_driver::service::{self, DriverConfig, DriverLimits};
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use ringflow_proto::pb;
use ringflow_proto::security::{ClientSecurity, Secret};

use super::children::Children;
use super::progress::Observer;
use super::submit::{self, Watched};
use super::timeline::Timeline;
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
    }
}

pub fn run(args: LocalArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let mut spec = args.job.load()?;
    if let Some(n) = args.executors {
        anyhow::ensure!(n >= 1, "--executors must be at least 1");
        spec.cluster.executors = n;
    }
    // The executors run on this machine: a device it cannot use fails now, before any
    // planning or executor process.
    check_local_device(spec.cluster.device, "the job's")?;
    let n = spec.cluster.executors;
    let threads = spec.cluster.threads.unwrap_or_else(|| (cores() / n).max(1));
    let request = args.job.request(&spec);
    let observer = args.job.observer()?;
    let ui = parse_ui(&args.ui)?;
    let timeline = args.job.timeline()?;
    let secret = Secret::resolve(args.secret_file.as_deref())?;
    run_local(
        registry,
        secret,
        n,
        threads,
        request,
        args.job.summary_json.as_ref(),
        ui,
        observer,
        timeline,
    )
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

/// Runs one job on a local cluster: a driver in this process and `n` executor processes with
/// `threads` compute threads each. Planning errors, and a device this machine cannot use, are
/// reported before any executor starts.
#[allow(clippy::too_many_arguments)]
pub fn run_local(
    registry: ModelRegistry,
    secret: Option<Secret>,
    n: usize,
    threads: usize,
    request: pb::SubmitRequest,
    summary_json: Option<&PathBuf>,
    ui: Option<SocketAddr>,
    mut observer: Observer,
    timeline: Option<Timeline>,
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
            check_local_device(device, whose).map(|()| id)
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
        let recorder = timeline.map(|t| t.follow(&client, &job_id));
        let watched = submit::watch(&mut client, &job_id, &mut observer).await;
        if matches!(watched, Ok(Watched::Signal(_)) | Err(_)) {
            driver.cancel_all();
        }
        if let Some(r) = recorder {
            r.finish().await;
        }
        children.stop(Duration::from_secs(5));
        driver.shutdown().await;
        match watched? {
            Watched::Summary(json) => submit::finish(&json, summary_json),
            Watched::Signal(sig) => {
                eprintln!("interrupted: job {job_id} cancelled, executors stopped");
                Ok(ExitCode::from(sig.exit_code()))
            }
        }
    })
}
