//! `ringflow local`: a driver in this process and N executor processes beside it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ringflow_core::pb;
use ringflow_core::security::Secret;
use ringflow_core::spec::{JobSpec, Override};
use ringflow_driver::observe::Observers;
use ringflow_driver::service::UiHosts;
use ringflow_ml::nn::ModelRegistry;

use super::JobArgs;
use super::submit::{self, Watched};
use crate::local::{self, LocalCluster, LocalConfig};

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

    /// A name the web UI answers for (repeatable), besides IP addresses and localhost; a
    /// request for any other `Host` is refused (403).
    #[arg(long, value_name = "NAME")]
    ui_host: Vec<String>,

    /// The embedded driver's shared secret (or set RINGFLOW_SECRET), for executors started
    /// elsewhere to join it with (default: a fresh random secret only this run's executors
    /// know).
    #[arg(long, env = "RINGFLOW_SECRET_FILE", value_name = "PATH")]
    secret_file: Option<PathBuf>,

    /// Spread the executors over this many simulated hosts (each its own host identity), to
    /// try the hierarchical all-reduce across hosts on one machine.
    #[arg(long, value_name = "N", default_value_t = 1, hide = true)]
    simulate_hosts: usize,
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

/// The names of `--ui-host`, checked.
pub fn parse_ui_hosts(names: &[String]) -> anyhow::Result<UiHosts> {
    UiHosts::new(names).map_err(|e| anyhow::anyhow!("--ui-host {e}"))
}

impl TryFrom<(&LocalArgs, &JobSpec)> for LocalConfig {
    type Error = anyhow::Error;

    /// The cluster `local` starts for `spec`: its executors (after `--executors`), sharing
    /// this machine's cores unless `cluster.threads` says otherwise, the web UI of `--ui`, and
    /// the secret of `--secret-file`.
    fn try_from((args, spec): (&LocalArgs, &JobSpec)) -> anyhow::Result<LocalConfig> {
        let shared = LocalConfig::new(spec.cluster.executors);
        Ok(LocalConfig {
            threads: spec.cluster.threads.unwrap_or(shared.threads),
            ui: parse_ui(&args.ui)?,
            ui_hosts: parse_ui_hosts(&args.ui_host)?,
            secret: Secret::resolve(args.secret_file.as_deref())?,
            log_filter: super::log_filter().to_string(),
            hosts: args.simulate_hosts,
            ..shared
        })
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
    let (spec, written) = args.job.load(&flags)?;
    let key = match args.executors {
        Some(_) => "--executors",
        None => "cluster.executors",
    };
    local::check_executors(spec.cluster.executors, key)?;
    // The executors run on this machine: a device it cannot use fails now, before any
    // planning or executor process.
    local::check_device(spec.cluster.device, "the job's")?;
    let config = LocalConfig::try_from((&args, &spec))?;
    let request = args.job.request(&spec, &written);
    let observers = args.job.observers()?.with(args.job.timeline()?);
    run_local(
        config,
        registry,
        request,
        args.job.summary_json.as_ref(),
        observers,
    )
}

/// Runs one job on a local cluster. Planning errors, a device this machine cannot use, and a
/// job that cannot fit this machine's memory are reported before any executor starts.
pub fn run_local(
    config: LocalConfig,
    registry: ModelRegistry,
    request: pb::SubmitRequest,
    summary_json: Option<&PathBuf>,
    mut observers: Observers,
) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(async {
        let mut cluster = LocalCluster::start(config, registry).await?;
        if let Some(ui) = cluster.driver().ui_url() {
            eprintln!("web UI at {ui}");
        }
        let url = cluster.url();
        let mut client = submit::connect(&url, &cluster.security()).await?;
        let whose = match pb::TaskKind::try_from(request.kind) {
            Ok(pb::TaskKind::Eval | pb::TaskKind::Predict) => "the saved model's",
            _ => "the job's",
        };
        // The device is known once the job is planned (for eval and predict it is the saved
        // model's).
        let submitted = submit::submit(&mut client, request).await;
        let started = submitted.and_then(|id| {
            cluster.check_job(&id, whose)?;
            let pids = cluster.start_executors(Some(&id))?;
            Ok((id, pids))
        });
        let (job_id, pids) = match started {
            Ok(started) => started,
            Err(e) => {
                cluster.shutdown(false).await;
                return Err(e);
            }
        };
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        eprintln!(
            "started {} executor processes (pids {}) for driver {url}",
            pids.len(),
            pids.join(" ")
        );
        let watched = submit::watch(&mut client, &job_id, &mut observers).await;
        cluster
            .shutdown(matches!(watched, Ok(Watched::Stopped(_)) | Err(_)))
            .await;
        match watched? {
            Watched::Summary(json) => submit::finish(&json, summary_json),
            Watched::Stopped(sig) => {
                eprintln!("interrupted: job {job_id} cancelled, executors stopped");
                Ok(ExitCode::from(sig.exit_code()))
            }
        }
    })
}
