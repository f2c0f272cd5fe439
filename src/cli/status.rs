//! `ringflow status` and `ringflow cancel`.

use std::process::ExitCode;

use clap::Args;
use ringflow_core::pb;

use super::security::SecurityArgs;

#[derive(Args)]
pub struct StatusArgs {
    /// The driver's URL.
    #[arg(long, env = "RINGFLOW_DRIVER")]
    driver: String,

    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Args)]
pub struct CancelArgs {
    /// The job's id (as `ringflow status` lists it).
    job: String,

    /// The driver's URL.
    #[arg(long, env = "RINGFLOW_DRIVER")]
    driver: String,

    #[command(flatten)]
    security: SecurityArgs,
}

fn state_name(s: i32) -> &'static str {
    match pb::JobState::try_from(s) {
        Ok(pb::JobState::Queued) => "queued",
        Ok(pb::JobState::Waiting) => "waiting",
        Ok(pb::JobState::Running) => "running",
        Ok(pb::JobState::Succeeded) => "succeeded",
        Ok(pb::JobState::Failed) => "failed",
        Ok(pb::JobState::Cancelled) => "cancelled",
        Err(_) => "unknown",
    }
}

pub fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(async {
        let mut c = super::submit::connect(&args.driver, &args.security.client()?).await?;
        let jobs = c
            .list_jobs(pb::ListJobsRequest {})
            .await
            .map_err(super::submit::rpc_error)?
            .into_inner()
            .jobs;
        let execs = c
            .list_executors(pb::ListExecutorsRequest {})
            .await
            .map_err(super::submit::rpc_error)?
            .into_inner()
            .executors;
        println!("JOBS ({})", jobs.len());
        println!(
            "{:<28} {:<10} {:>9} {:>8} {:>9}  ERROR",
            "ID", "STATE", "EXECUTORS", "EPOCH", "AGE"
        );
        for j in &jobs {
            println!(
                "{:<28} {:<10} {:>9} {:>8} {:>8.0}s  {}",
                j.job_id,
                state_name(j.state),
                j.executors,
                format!("{}/{}", j.epoch, j.epochs),
                j.age_s,
                j.error
            );
        }
        println!();
        println!("EXECUTORS ({})", execs.len());
        println!(
            "{:<34} {:<20} {:<22} {:>5} {:>10} {:<16} {:<6} {:<20} {:>9}",
            "ID", "HOST", "RING", "CORES", "MEMORY", "DEVICES", "STATE", "JOB", "HEARTBEAT"
        );
        for e in &execs {
            let info = e.info.clone().unwrap_or_default();
            println!(
                "{:<34} {:<20} {:<22} {:>5} {:>10} {:<16} {:<6} {:<20} {:>8.1}s",
                info.executor_id,
                info.host,
                info.ring_address,
                info.cores,
                match info.memory_bytes {
                    0 => "-".to_string(),
                    bytes => ringflow_core::size::format_bytes(bytes),
                },
                info.devices.join(","),
                e.state,
                if e.job_id.is_empty() {
                    "-".to_string()
                } else {
                    format!("{} r{}", e.job_id, e.rank)
                },
                e.last_heartbeat_s
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(async {
        let mut c = super::submit::connect(&args.driver, &args.security.client()?).await?;
        let reply = c
            .cancel(pb::CancelRequest {
                job_id: args.job.clone(),
            })
            .await
            .map_err(|s| match s.code() {
                tonic::Code::NotFound => anyhow::anyhow!(
                    "the driver at {} has {} (`ringflow status --driver {}` lists its jobs)",
                    args.driver,
                    s.message(),
                    args.driver
                ),
                _ => super::submit::rpc_error(s),
            })?;
        if reply.into_inner().cancelled {
            println!("cancelled job {}", args.job);
        } else {
            println!("job {} had already ended", args.job);
        }
        Ok(ExitCode::SUCCESS)
    })
}
