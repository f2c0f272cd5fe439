//! The `ringflow` command line: a thin clap layer over the driver and executor libraries.

mod bench;
mod bench_ingest;
mod daemons;
mod export;
mod history;
mod infer;
mod local;
mod security;
mod signals;
mod sql;
mod status;
mod submit;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ringflow_core::spec::{JobSpec, Override, SpecAsWritten};
use ringflow_driver::observe::tensorboard::TensorBoard;
use ringflow_driver::observe::timeline::Timeline;
use ringflow_driver::observe::{Observers, console};
use ringflow_ml::nn::ModelRegistry;

/// Data-parallel training with a ring all-reduce.
#[derive(Parser)]
#[command(name = "ringflow", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log filter (e.g. `info`, `ringflow_executor=debug`); also read from RINGFLOW_LOG.
    #[arg(long, global = true, env = "RINGFLOW_LOG", default_value = "warn")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job on this machine: a driver in this process and executor processes beside it.
    Local(local::LocalArgs),
    /// Submit a job to a running driver and follow it to the end.
    Submit(submit::SubmitArgs),
    /// Serve the control plane that executors register with and jobs are submitted to.
    Driver(daemons::DriverArgs),
    /// Register with a driver and run the tasks of successive jobs until stopped.
    Executor(daemons::ExecutorArgs),
    /// List a driver's jobs and executors.
    Status(status::StatusArgs),
    /// Cancel a job.
    Cancel(status::CancelArgs),
    /// Run a DataFusion SQL query over Parquet, CSV or JSON tables; print or write the result.
    Sql(sql::SqlArgs),
    /// Evaluate a saved model on a data set (loss, accuracy or mse), on executors in parallel.
    Eval(infer::EvalArgs),
    /// Write a saved model's predictions for a data set as Parquet, on executors in parallel.
    Predict(infer::PredictArgs),
    /// Export a saved model for other runtimes: `--format onnx`.
    Export(export::ExportArgs),
    /// Summarize the jobs of a checkpoint directory from their event log (`events.jsonl`).
    History(history::HistoryArgs),
    /// Measure ringflow: `bench allreduce`, `bench train`, `bench ingest`.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// What every way of running a job accepts.
#[derive(Args, Clone)]
pub(crate) struct JobArgs {
    /// The job spec (TOML).
    job: PathBuf,

    /// Override a spec field, e.g. `--set train.epochs=2` or `--set train.optimizer.lr=0.1`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,

    /// Write the job's summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<PathBuf>,

    /// Continue the job from the last checkpoint in this checkpoint directory (the job's
    /// `cluster.checkpoint_dir`, which it then keeps using).
    #[arg(long, value_name = "DIR")]
    resume: Option<String>,

    /// Write the training loss, throughput and test figures as TensorBoard event files into
    /// this local directory (created if missing), for `tensorboard --logdir DIR`.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,

    /// Write every rank's per-step phases (data, forward, backward, all-reduce, optimizer) to
    /// this file as a Chrome trace, for Perfetto or chrome://tracing.
    #[arg(long, value_name = "PATH")]
    timeline: Option<PathBuf>,
}

impl JobArgs {
    /// Reads the spec with its `--set` overrides and then `flags`, the command's flags that set
    /// spec fields (with `--resume DIR`, which sets `cluster.checkpoint_dir`), all applied
    /// before the spec is checked once; then checks the files this command writes itself.
    fn load(&self, flags: &[Override]) -> anyhow::Result<(JobSpec, SpecAsWritten)> {
        let mut overrides: Vec<Override> = self
            .set
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        overrides.extend(flags.iter().cloned());
        if let Some(dir) = &self.resume {
            overrides.push(Override::flag(
                &format!("--resume {dir}"),
                "cluster.checkpoint_dir",
                dir.as_str(),
            ));
        }
        let written = SpecAsWritten::read(&self.job, &overrides)?;
        let spec = written.spec(&overrides)?;
        check_summary_json(self.summary_json.as_deref())?;
        if let Some(dir) = &self.tensorboard {
            let dir = dir.display().to_string();
            ringflow_driver::outputs::check_dir("--tensorboard", &dir)?;
        }
        Ok((spec, written))
    }

    /// What follows the job: its progress display and the `--tensorboard` writer, whose
    /// directory and event file are created now.
    fn observers(&self) -> anyhow::Result<Observers> {
        let tensorboard = self
            .tensorboard
            .as_deref()
            .map(TensorBoard::create)
            .transpose()?;
        Ok(console::for_stderr().with(tensorboard))
    }

    /// The `--timeline` file, created now so that a bad path fails before the job starts.
    fn timeline(&self) -> anyhow::Result<Option<Timeline>> {
        Ok(self.timeline.as_deref().map(Timeline::create).transpose()?)
    }

    /// The request that submits the job `spec`, made from `written`.
    fn request(&self, spec: &JobSpec, written: &SpecAsWritten) -> ringflow_core::pb::SubmitRequest {
        ringflow_core::pb::SubmitRequest {
            resume: self.resume.is_some(),
            written: Some(written.into()),
            ..submit::train_request(spec, &self.job)
        }
    }
}

/// Fails, naming the flag, when `--summary-json PATH` could not be written at the end of the
/// job (checked before the job starts; its directory is created at the end).
pub(crate) fn check_summary_json(path: Option<&std::path::Path>) -> anyhow::Result<()> {
    if let Some(path) = path {
        ringflow_driver::outputs::check_local_file("--summary-json", path)?;
    }
    Ok(())
}

/// The log filter of this process (`--log` or RINGFLOW_LOG), which executors started by this
/// process (`local`, `eval`, `predict`) are given too.
static LOG_FILTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// This process's log filter, `warn` before the command line was parsed.
pub(crate) fn log_filter() -> &'static str {
    LOG_FILTER.get().map_or("warn", String::as_str)
}

/// Parses the command line and runs it with `registry`'s model kinds; returns the exit code.
pub fn main(registry: ModelRegistry) -> ExitCode {
    let cli = Cli::parse();
    let _ = LOG_FILTER.set(cli.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // A CPU setting the kernels cannot follow is refused before any work, not worked around.
    if let Err(e) = ringflow_ml::backend::cpu::isa::cpu_settings() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Local(args) => local::run(args, registry),
        Command::Submit(args) => submit::run(args),
        Command::Driver(args) => daemons::driver(args, registry),
        Command::Executor(args) => daemons::executor(args, registry),
        Command::Status(args) => status::status(args),
        Command::Cancel(args) => status::cancel(args),
        Command::Sql(args) => sql::run(args),
        Command::Eval(args) => infer::eval(args, registry),
        Command::Predict(args) => infer::predict(args, registry),
        Command::Export(args) => export::run(args, registry),
        Command::History(args) => history::run(args),
        Command::Bench(cmd) => bench::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A multi-threaded tokio runtime for the command's RPCs.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Cores of this machine.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
