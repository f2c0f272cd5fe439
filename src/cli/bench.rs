//! `ringflow bench`: measurements of ringflow itself.
//!
//! - `bench allreduce`: all-reduce bandwidth on local executor processes (through shared
//!   memory, over the TCP ring with `--shared-memory false`, hierarchically with `--hosts N`).
//! - `bench train`: training steps per second of an MLP on one device (CPU or GPU) with synthetic
//!   in-memory data, for side-by-side comparisons with PyTorch (`benches/gpu_mlp.py`).
//! - `bench ingest`: Parquet to `f32` batches per second ([`super::bench_ingest`]).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use ringflow_core::pb;
use ringflow_core::wire::payload;
use ringflow_driver::BenchSummary;
use ringflow_driver::observe::console;
use ringflow_driver::scheduler::SchedulerConfig;
use ringflow_driver::summary::SUMMARY_FIELD;
use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, GradStore, Tensor, loss, rng};

use super::submit::{self, Watched};
use crate::local::{LocalCluster, LocalConfig};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time all-reduces among N local executor processes.
    Allreduce(AllreduceArgs),
    /// Time training steps of an MLP on one device with synthetic data (no data loading).
    Train(TrainArgs),
    /// Time reading Parquet files into f32 batches, as training reads them (rows/s, MB/s).
    Ingest(super::bench_ingest::IngestArgs),
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

    /// Ranks of one host all-reduce through shared memory (`false`: over TCP, as across
    /// hosts), like the job spec's `cluster.shared_memory`.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    shared_memory: bool,

    /// Spread the ranks over this many simulated hosts (each its own host identity): with
    /// shared memory, the hierarchical all-reduce (within each host, then among the hosts).
    #[arg(long, value_name = "N", default_value_t = 1)]
    hosts: usize,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Allreduce(args) => allreduce(args),
        BenchCommand::Train(args) => train(args),
        BenchCommand::Ingest(args) => super::bench_ingest::run(args),
    }
}

fn allreduce(args: AllreduceArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.ranks >= 1, "--ranks must be at least 1");
    anyhow::ensure!(args.iters >= 1, "--iters must be at least 1");
    anyhow::ensure!(args.size_mb > 0.0, "--size-mb must be positive");
    anyhow::ensure!(
        (1..=args.ranks).contains(&args.hosts),
        "--hosts must be between 1 and --ranks"
    );
    let floats = args
        .floats
        .unwrap_or_else(|| ((args.size_mb * 1048576.0) / 4.0).round() as u64);
    // The driver refuses a size the executors cannot hold; this only keeps the arithmetic sane.
    let bytes = floats.checked_mul(4).ok_or_else(|| {
        anyhow::anyhow!("--floats {floats} (or --size-mb) is beyond any machine's memory")
    })?;
    let rt = super::runtime()?;
    rt.block_on(async {
        let config = LocalConfig {
            threads: 1,
            scheduler: SchedulerConfig::default(),
            hosts: args.hosts,
            log_filter: super::log_filter().to_string(),
            ..LocalConfig::new(args.ranks)
        };
        let mut cluster = LocalCluster::start(config, ModelRegistry::default()).await?;
        cluster.start_executors(None)?;
        let mut client = submit::connect(&cluster.url(), &cluster.security()).await?;
        let job_id = client
            .submit(pb::SubmitRequest {
                protocol_version: ringflow_core::PROTOCOL_VERSION,
                kind: pb::TaskKind::BenchAllreduce as i32,
                bench_executors: args.ranks as u32,
                bench: Some(pb::BenchSpec {
                    floats,
                    warmup: args.warmup,
                    iters: args.iters,
                    check: args.check,
                    shared_memory: args.shared_memory,
                }),
                ..Default::default()
            })
            .await
            .map_err(super::submit::rpc_error)?
            .into_inner()
            .job_id;
        let watched = submit::watch(&mut client, &job_id, &mut console::for_stderr()).await;
        cluster
            .shutdown(!matches!(watched, Ok(Watched::Summary(_))))
            .await;
        let text = match watched? {
            Watched::Summary(text) => text,
            Watched::Stopped(sig) => return Ok(ExitCode::from(sig.exit_code())),
        };
        let s: BenchSummary = payload::decode(SUMMARY_FIELD, &text)?;
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

/// The optimizers `bench train` can use, with the hyper-parameters its peer script uses too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchOptimizer {
    /// SGD with momentum 0.9 (default lr 0.01), as `torch.optim.SGD(lr, momentum=0.9)`.
    Sgd,
    /// Adam with betas (0.9, 0.999) and eps 1e-8 (default lr 1e-3), as `torch.optim.Adam(lr)`.
    Adam,
}

#[derive(Args, Clone, Debug)]
pub struct TrainArgs {
    /// The device to train on: `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: Device,

    /// Layer widths of the MLP, inputs first and classes last.
    #[arg(long, value_delimiter = ',', default_value = "784,1024,1024,10")]
    layers: Vec<usize>,

    /// Activation between the layers.
    #[arg(long, default_value = "relu")]
    activation: String,

    /// Rows per step.
    #[arg(long, default_value_t = 1024)]
    batch: usize,

    /// Timed steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,

    /// Untimed steps first (warms caches, compiles kernels, fills the allocator).
    #[arg(long, default_value_t = 20)]
    warmup: usize,

    /// The optimizer.
    #[arg(long, value_enum, default_value_t = BenchOptimizer::Sgd)]
    optimizer: BenchOptimizer,

    /// Learning rate (default: 0.01 for sgd, 0.001 for adam).
    #[arg(long)]
    lr: Option<f32>,

    /// Distinct random batches uploaded to the device before timing and cycled through.
    #[arg(long, default_value_t = 4)]
    batches: usize,

    /// Seed of the initial weights and the synthetic data.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Print the result as one JSON object on one line instead of a `key=value` line.
    #[arg(long)]
    json: bool,
}

/// What `bench train` measured.
#[derive(Debug, serde::Serialize)]
struct TrainReport {
    framework: &'static str,
    device: String,
    layers: Vec<usize>,
    activation: String,
    params: usize,
    batch: usize,
    optimizer: &'static str,
    lr: f32,
    warmup: usize,
    steps: usize,
    /// Rows per second over the timed steps: `batch · steps / total time`.
    samples_per_s: f64,
    ms_per_step_median: f64,
    ms_per_step_mean: f64,
    /// Loss of the first warm-up step (about ln(classes) for a fresh model).
    first_loss: f32,
    /// Loss of the last timed step.
    final_loss: f32,
    /// The share of GPU allocations the caching allocator served from its pool (GPUs only).
    allocator_hit_rate: Option<f64>,
}

impl TrainReport {
    fn line(&self) -> String {
        let layers: Vec<String> = self.layers.iter().map(|w| w.to_string()).collect();
        format!(
            "train device={} layers={} batch={} optimizer={} lr={} steps={} samples_per_s={:.0} \
             ms_per_step_median={:.3} ms_per_step_mean={:.3} first_loss={:.4} final_loss={:.4}",
            self.device,
            layers.join("-"),
            self.batch,
            self.optimizer,
            self.lr,
            self.steps,
            self.samples_per_s,
            self.ms_per_step_median,
            self.ms_per_step_mean,
            self.first_loss,
            self.final_loss,
        ) + &self
            .allocator_hit_rate
            .map(|r| format!(" allocator_hit_rate={r:.4}"))
            .unwrap_or_default()
    }
}

fn train(args: TrainArgs) -> anyhow::Result<ExitCode> {
    // As an executor trains: freed buffers kept for the next step, and the steps on one of the
    // compute pool's threads (from outside the pool every parallel op hands its work over and
    // sleeps until it is done, a hand-over and a wake-up that the step would count).
    ringflow_executor::allocator::keep_freed_buffers();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = ringflow_executor::train::with_compute_threads(cores, || train_bench(&args))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("cannot write the report as JSON")?
        );
    } else {
        println!("{}", report.line());
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the model, uploads the synthetic batches and times `args.steps` training steps.
fn train_bench(args: &TrainArgs) -> anyhow::Result<TrainReport> {
    // One sentence when the device cannot be used (a build without `cuda`, no driver, no GPU).
    args.device.check_available()?;
    anyhow::ensure!(
        args.layers.len() >= 2 && args.layers.iter().all(|&w| w > 0),
        "--layers needs at least two positive widths (inputs and classes), not {:?}",
        args.layers
    );
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    anyhow::ensure!(args.batches >= 1, "--batches must be at least 1");
    let device = args.device;
    let (inputs, classes) = (args.layers[0], args.layers[args.layers.len() - 1]);

    let spec = ModelSpec::mlp(&args.layers, &args.activation);
    let model = Model::build(&spec, &ModelRegistry::default(), args.seed, device)
        .with_context(|| format!("cannot build the MLP {:?} on {device}", args.layers))?;
    let (opt_spec, lr) = bench_optimizer(args);
    let optimizer_name = opt_spec.kind();
    let mut optimizer = Optimizer::new(opt_spec, model.params())
        .with_context(|| format!("cannot create the {optimizer_name} optimizer on {device}"))?;

    // The data: a few fixed batches, uploaded once; the timed loop moves nothing to the device.
    let batches = synthetic_batches(args, inputs, classes)?;

    let mut dropout = rng::seeded(args.seed, rng::streams::DROPOUT);
    let mut grads = GradStore::new();
    let mut step = |i: usize| -> anyhow::Result<f32> {
        let (x, y) = &batches[i % batches.len()];
        let logits = model.forward(x, true, &mut dropout)?;
        let loss = loss::cross_entropy(&logits, y)?;
        loss.backward_into(&mut grads)?;
        optimizer.step(lr, &mut grads)?;
        grads.zero();
        // The per-step metric download; on a GPU it waits for the step's work to finish.
        let value = loss.item()?;
        anyhow::ensure!(
            value.is_finite(),
            "the loss is {value} at step {} (training diverged; try a smaller --lr)",
            i + 1
        );
        Ok(value)
    };

    let mut first_loss = None;
    for i in 0..args.warmup {
        let l = step(i).with_context(|| format!("warm-up step {} failed", i + 1))?;
        first_loss.get_or_insert(l);
    }
    let mut times = Vec::with_capacity(args.steps);
    let mut final_loss = f32::NAN;
    let start = Instant::now();
    for i in args.warmup..args.warmup + args.steps {
        let t = Instant::now();
        final_loss = step(i).with_context(|| format!("step {} failed", i + 1))?;
        times.push(t.elapsed().as_secs_f64());
        first_loss.get_or_insert(final_loss);
    }
    let total = start.elapsed().as_secs_f64();

    let mean = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(TrainReport {
        framework: "ringflow",
        device: device.to_string(),
        layers: args.layers.clone(),
        activation: args.activation.clone(),
        params: model.params().numel(),
        batch: args.batch,
        optimizer: optimizer_name,
        lr,
        warmup: args.warmup,
        steps: args.steps,
        samples_per_s: (args.batch * args.steps) as f64 / total,
        ms_per_step_median: median * 1e3,
        ms_per_step_mean: mean * 1e3,
        first_loss: first_loss.unwrap_or(final_loss),
        final_loss,
        allocator_hit_rate: device.allocator_stats().map(|s| s.hit_rate()),
    })
}

/// The optimizer `--optimizer` names, at `--lr` or its default rate; and that rate.
fn bench_optimizer(args: &TrainArgs) -> (OptimizerSpec, f32) {
    match args.optimizer {
        BenchOptimizer::Sgd => {
            let lr = args.lr.unwrap_or(0.01);
            let spec = OptimizerSpec::Sgd {
                lr,
                momentum: 0.9,
                dampening: 0.0,
                nesterov: false,
                weight_decay: 0.0,
                groups: Vec::new(),
            };
            (spec, lr)
        }
        BenchOptimizer::Adam => {
            let lr = args.lr.unwrap_or(1e-3);
            let spec = OptimizerSpec::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
                groups: Vec::new(),
            };
            (spec, lr)
        }
    }
}

/// `args.batches` batches of `args.batch` uniform random rows of `inputs` features, with
/// random class labels below `classes`, on the benchmark's device.
fn synthetic_batches(
    args: &TrainArgs,
    inputs: usize,
    classes: usize,
) -> anyhow::Result<Vec<(Tensor, Tensor)>> {
    let device = args.device;
    let mut data_rng = rng::seeded(args.seed, DATA_STREAM);
    let mut batches = Vec::with_capacity(args.batches);
    for _ in 0..args.batches {
        let x = Tensor::uniform(&[args.batch, inputs], 0.0, 1.0, &mut data_rng, device)
            .with_context(|| format!("cannot upload a synthetic batch to {device}"))?;
        // Integer class indices in 0..classes, stored as f32 like every label.
        let labels = Tensor::uniform(&[args.batch], 0.0, 1.0, &mut data_rng, Device::Cpu)?
            .to_vec()
            .into_iter()
            .map(|u| ((u * classes as f32) as usize).min(classes - 1) as f32)
            .collect();
        // Checked on the host as they are uploaded, as the trainer's labels are, so the loss
        // reads nothing back from the device.
        let y = Tensor::from_indices(labels, &[args.batch], classes, device)
            .with_context(|| format!("cannot upload synthetic labels to {device}"))?;
        batches.push((x, y));
    }
    Ok(batches)
}

/// The random stream of the synthetic data (apart from initialization and dropout).
const DATA_STREAM: u64 = 100;

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: BenchCommand,
    }

    fn parse(args: &[&str]) -> TrainArgs {
        let argv = ["bench", "train"].iter().chain(args);
        match Cli::try_parse_from(argv).expect("valid arguments").cmd {
            BenchCommand::Train(a) => a,
            _ => unreachable!("parsed bench train"),
        }
    }

    #[test]
    fn defaults_are_the_wide_mlp_at_batch_1024() {
        let a = parse(&[]);
        assert_eq!(a.layers, [784, 1024, 1024, 10]);
        assert_eq!((a.batch, a.steps, a.warmup), (1024, 200, 20));
        assert_eq!((a.device, a.optimizer), (Device::Cpu, BenchOptimizer::Sgd));
        assert_eq!(parse(&["--device", "cuda:1"]).device, Device::Cuda(1));
    }

    #[test]
    fn a_small_mlp_trains_on_the_cpu() {
        for opt in ["sgd", "adam"] {
            let args = parse(&[
                "--layers",
                "6,32,3",
                "--batch",
                "16",
                "--steps",
                "40",
                "--warmup",
                "2",
                "--batches",
                "1",
                "--optimizer",
                opt,
                "--lr",
                "0.05",
            ]);
            let r = train_bench(&args).expect("trains");
            assert_eq!(r.params, 6 * 32 + 32 + 32 * 3 + 3);
            assert!(r.samples_per_s > 0.0 && r.ms_per_step_median > 0.0);
            // Random labels, but one batch of 16 rows, seen again and again: the model memorizes it.
            assert!(r.final_loss < r.first_loss, "{opt}: {r:?}");
        }
    }

    #[test]
    fn an_unusable_device_is_one_sentence() {
        let args = parse(&["--device", "cuda:7"]);
        if args.device.check_available().is_ok() {
            return; // a machine with eight GPUs
        }
        let e = train_bench(&args).expect_err("no such device");
        assert!(e.to_string().contains("cuda:7"), "{e:#}");
    }
}
