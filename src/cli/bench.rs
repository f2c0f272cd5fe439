//! `ringflow bench allreduce`: ring all-reduce bandwidth on local executor processes.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use ringflow_driver::scheduler::SchedulerConfig;
use ringflow_driver::service::{self, DriverConfig};
use ringflow_ml::nn::ModelRegistry;
use ringflow_proto::pb;

use super::children::Children;
use super::submit::{self, Watched};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time ring all-reduces among N local executor processes.
    Allreduce(AllreduceArgs),
}

#[derive(Args)]
pub struct AllreduceArgs {
    /// Executor processes in the ring.
    #[arg(long, default_value_t = 2)]
    ranks: usize,

    /// Buffer size in MiB (2^20 bytes) of f32.
    #[arg(long, default_value_t = 64.0)]
    size_mb: f64,

    /// Timed all-reduces (the median is reported).
    #[arg(long, default_value_t = 20)]
    iters: u32,

    /// Untimed all-reduces first.
    #[arg(long, default_value_t = 3)]
    warmup: u32,

    /// Exact number of floats (overrides --size-mb).
    #[arg(long)]
    floats: Option<u64>,

    /// Check all-reduce, broadcast and all-gather against serial computations instead of timing.
    #[arg(long)]
    check: bool,
}

#[derive(serde::Deserialize)]
struct BenchSummary {
    status: String,
    error: Option<String>,
    seconds: Vec<f64>,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    let BenchCommand::Allreduce(args) = cmd;
    anyhow::ensure!(args.ranks >= 1, "--ranks must be at least 1");
    anyhow::ensure!(args.iters >= 1, "--iters must be at least 1");
    anyhow::ensure!(args.size_mb > 0.0, "--size-mb must be positive");
    let floats = args
        .floats
        .unwrap_or_else(|| ((args.size_mb * 1048576.0) / 4.0).round() as u64);
    let bytes = floats * 4;
    let rt = super::runtime()?;
    rt.block_on(async {
        let driver = service::start(
            DriverConfig {
                bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                scheduler: SchedulerConfig::default(),
            },
            ModelRegistry::default(),
        )
        .await?;
        let mut children = Children::spawn(args.ranks, &driver.url(), 1, "warn")?;
        let mut client = submit::connect(&driver.url()).await?;
        let job_id = client
            .submit(pb::SubmitRequest {
                protocol_version: ringflow_proto::PROTOCOL_VERSION,
                kind: pb::TaskKind::BenchAllreduce as i32,
                bench_executors: args.ranks as u32,
                bench: Some(pb::BenchSpec {
                    floats,
                    warmup: args.warmup,
                    iters: args.iters,
                    check: args.check,
                }),
                ..Default::default()
            })
            .await
            .map_err(|s| anyhow::anyhow!("{}", s.message()))?
            .into_inner()
            .job_id;
        let watched = submit::watch(&mut client, &job_id).await;
        if !matches!(watched, Ok(Watched::Summary(_))) {
            driver.cancel_all();
        }
        children.stop(Duration::from_secs(5));
        driver.shutdown().await;
        let json = match watched? {
            Watched::Summary(json) => json,
            Watched::Signal(sig) => return Ok(ExitCode::from(sig.exit_code())),
        };
        let s: BenchSummary = serde_json::from_str(&json).context("unreadable benchmark summary")?;
        if s.status != "succeeded" {
            anyhow::bail!(s.error.unwrap_or_else(|| "the benchmark did not finish".into()));
        }
        if args.check {
            println!("allreduce check ranks={} floats={floats} ok", args.ranks);
            return Ok(ExitCode::SUCCESS);
        }
        anyhow::ensure!(!s.seconds.is_empty(), "the benchmark reported no times");
        let mut t = s.seconds.clone();
        t.sort_by(f64::total_cmp);
        let median = t[t.len() / 2];
        let n = args.ranks as f64;
        let algbw = bytes as f64 / median / 1e9;
        let busbw = algbw * 2.0 * (n - 1.0) / n;
        println!(
            "allreduce ranks={} bytes={bytes} time_ms={:.3} algbw_GBps={algbw:.3} busbw_GBps={busbw:.3}",
            args.ranks,
            median * 1e3
        );
        Ok(ExitCode::SUCCESS)
    })
}
