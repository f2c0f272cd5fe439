//! `ringflow submit`, and the watching and printing that `local` shares with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ringflow_core::pb::{self, jobs_client::JobsClient};
use ringflow_core::security::{AuthenticatedChannel, ClientSecurity, error_chain, status_line};
use ringflow_core::spec::JobSpec;
use ringflow_core::wire::MAX_MESSAGE_BYTES;
use ringflow_driver::JobSummary;
use ringflow_driver::observe::{self, Followed, Observers};

use super::JobArgs;
use super::security::SecurityArgs;
use super::signals::{Signal, shutdown_signal};

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    job: JobArgs,

    /// The driver's URL, e.g. http://10.0.0.1:7077 (https:// with TLS).
    #[arg(long, env = "RINGFLOW_DRIVER")]
    driver: String,

    #[command(flatten)]
    security: SecurityArgs,
}

/// A client of a driver's job service.
pub type Client = JobsClient<AuthenticatedChannel>;

/// Connects to a driver's job service (keepalives detect a driver that vanished).
pub async fn connect(url: &str, security: &ClientSecurity) -> anyhow::Result<Client> {
    let endpoint = security
        .endpoint(url)?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the driver at {url}: {}", error_chain(&e)))?;
    // The same bound on messages as the driver's job service.
    Ok(JobsClient::new(security.authenticated(channel))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Makes a relative local path that exists here absolute, so that a driver and executors
/// running elsewhere on the same file system read the file this command meant. A relative
/// path that does not exist here is left for the driver and executors to resolve in their own
/// working directories (data that only the driver's machine holds).
pub fn absolute_if_here(p: &str) -> String {
    if p.contains("://") || Path::new(p).is_absolute() || !Path::new(p).exists() {
        return p.to_string();
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(p).display().to_string(),
        Err(_) => p.to_string(),
    }
}

/// Makes the spec's relative local paths that exist here absolute ([`absolute_if_here`]); the
/// checkpoint directory always.
pub fn absolutize(spec: &mut JobSpec) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    spec.data.train = absolute_if_here(&spec.data.train);
    spec.data.test = spec.data.test.as_deref().map(absolute_if_here);
    for path in spec.data.tables.values_mut() {
        *path = absolute_if_here(path);
    }
    spec.model.init_from = spec.model.init_from.as_deref().map(absolute_if_here);
    let dir = spec.checkpoint_dir();
    if !dir.contains("://") && !Path::new(&dir).is_absolute() {
        spec.cluster.checkpoint_dir = Some(cwd.join(dir).display().to_string());
    }
    Ok(())
}

/// The request that submits `spec` (read from `file`) for training.
pub fn train_request(spec: &JobSpec, file: &Path) -> pb::SubmitRequest {
    pb::SubmitRequest {
        protocol_version: ringflow_core::PROTOCOL_VERSION,
        kind: pb::TaskKind::Train as i32,
        spec: ringflow_core::wire::payload::encode(spec),
        spec_file: file.display().to_string(),
        ..Default::default()
    }
}

/// A failed call to the driver as one sentence: its message, saying that the driver refused
/// the caller when the shared secret was missing or wrong.
pub fn rpc_error(s: tonic::Status) -> anyhow::Error {
    match s.code() {
        tonic::Code::Unauthenticated => {
            anyhow::anyhow!("the driver refused this request: {}", s.message())
        }
        _ => anyhow::anyhow!(status_line(&s)),
    }
}

/// Submits a job; returns its id. Planning errors come back as one sentence.
pub async fn submit(client: &mut Client, request: pb::SubmitRequest) -> anyhow::Result<String> {
    let reply = client.submit(request).await.map_err(rpc_error)?;
    Ok(reply.into_inner().job_id)
}

/// How a watch ended: the job's summary (as JSON), or the signal that arrived first.
pub type Watched = Followed<Signal>;

/// Follows a job's events, handing them to `observers` (which show and record them), until its
/// summary (or a signal).
pub async fn watch(
    client: &mut Client,
    job_id: &str,
    observers: &mut Observers,
) -> anyhow::Result<Watched> {
    let events = client
        .watch(pb::WatchRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    Ok(observe::follow(events, job_id, observers, shutdown_signal()).await?)
}

/// Prints a training job's summary (the payload the driver sent), writes it where asked, and
/// returns the exit code.
pub fn finish(text: &str, summary_path: Option<&PathBuf>) -> anyhow::Result<ExitCode> {
    let summary = JobSummary::from_payload(text)?;
    if let Some(path) = summary_path {
        summary.write_json(path)?;
    }
    if let Some(e) = &summary.error {
        eprintln!("error: {e}");
    }
    print!("{summary}");
    Ok(if summary.status == ringflow_driver::JobStatus::Succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn run(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let (mut spec, written) = args.job.load(&[])?;
    absolutize(&mut spec)?;
    let observers = args.job.observers()?;
    let observers = observers.with(args.job.timeline()?);
    follow(
        &args.driver,
        &args.security.client()?,
        args.job.request(&spec, &written),
        args.job.summary_json.as_ref(),
        observers,
    )
}

/// Submits `request` to the driver at `url` and follows the job to its end, handing its events
/// to `observers`.
pub fn follow(
    url: &str,
    security: &ClientSecurity,
    request: pb::SubmitRequest,
    summary_json: Option<&PathBuf>,
    mut observers: Observers,
) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(async {
        let mut client = connect(url, security).await?;
        let job_id = submit(&mut client, request).await?;
        eprintln!("submitted job {job_id} to {url}");
        match watch(&mut client, &job_id, &mut observers).await? {
            Watched::Summary(json) => finish(&json, summary_json),
            Watched::Stopped(sig) => {
                eprintln!("cancelling job {job_id}");
                let _ = client
                    .cancel(pb::CancelRequest {
                        job_id: job_id.clone(),
                    })
                    .await;
                Ok(ExitCode::from(sig.exit_code()))
            }
        }
    })
}
