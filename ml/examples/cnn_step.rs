//! One training step of `examples/mnist_cnn.toml`'s LeNet-style network (conv 5×5 32 – ReLU –
//! pool – conv 5×5 64 – ReLU – pool – linear 128 – ReLU – linear 10, cross-entropy, Adam) on a
//! random batch, without the data pipeline or the all-reduce: the milliseconds of the forward
//! pass (loss included), the backward pass and the optimizer, and the samples per second of the
//! whole step. The figure to hold against `benches/cnn_vs_peers.sh`'s (which adds the data and
//! the executor's bookkeeping), and the program to profile.
//!
//! ```text
//! cargo run --release -p ringflow-ml --example cnn_step [-- --seconds S] [--batch N] \
//!     [--precision f32|bf16] [--winograd on|off] [--model lenet|wide-mlp] [--thrash MB]
//! ```
//!
//! `--model wide-mlp` times `benches/mlp_vs_jax.sh`'s wide MLP instead (784-1024-1024-10, ReLU,
//! plain SGD; give it `--batch 256` as the script does). The backward pass is
//! `Optimizer::backward`'s, as a lone executor runs it: with plain SGD it updates the dense
//! layers' weights itself, and the optimizer's time is the biases'.
//!
//! `--thrash MB` writes a buffer of that many MiB on every thread before each step, outside
//! the timing, so that the step starts with caches full of other data, as when a busy
//! neighbour on the host shares the L3 (64 covers this machine's 32 MiB L3 and both L2s).
//!
//! `--precision bf16` multiplies in bfloat16 with f32 sums (`train.matmul_precision`);
//! `--winograd off` runs the second convolution as im2col and GEMM (`train.winograd = false`).
//! Runs on all cores (set `RAYON_NUM_THREADS` to use fewer); each phase's figure is its median
//! over the steps run in about `S` seconds (1 by default) after a few warm-up steps. An executor
//! sets glibc's malloc to keep freed buffers (`executor/src/allocator.rs`); to time the step as
//! an executor runs it, give this program the same settings through the environment,
//! `MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=536870912` (without them every
//! step maps its buffers afresh, and the figure includes that).

use std::time::{Duration, Instant};

use rayon::prelude::*;

use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, GradStore, Tensor, loss, rng};

/// The value after `flag` in the arguments, parsed, or `default`.
fn arg<T: std::str::FromStr>(flag: &str, default: T) -> Result<T, Box<dyn std::error::Error>>
where
    T::Err: std::error::Error + 'static,
{
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == flag) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

/// The network of `examples/mnist_cnn.toml`.
fn lenet() -> ringflow_ml::Result<ModelSpec> {
    ModelSpec::new(
        "sequential",
        serde_json::json!({ "input": [1, 28, 28], "classes": 10, "layers": [
            { "type": "conv2d", "out_channels": 32, "kernel": 5 }, { "type": "relu" },
            { "type": "max_pool2d", "kernel": 2 },
            { "type": "conv2d", "out_channels": 64, "kernel": 5 }, { "type": "relu" },
            { "type": "max_pool2d", "kernel": 2 },
            { "type": "flatten" }, { "type": "linear", "out": 128 }, { "type": "relu" },
            { "type": "linear" } ] }),
    )
}

/// The wide MLP of `benches/mlp_vs_jax.sh`.
fn wide_mlp() -> ringflow_ml::Result<ModelSpec> {
    ModelSpec::new(
        "mlp",
        serde_json::json!({ "layers": [784, 1024, 1024, 10], "activation": "relu" }),
    )
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `examples/mnist_cnn.toml`'s optimizer.
fn adam() -> OptimizerSpec {
    OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        groups: Vec::new(),
    }
}

/// `benches/mlp_vs_jax.sh`'s optimizer.
fn sgd() -> OptimizerSpec {
    OptimizerSpec::Sgd {
        lr: 0.05,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
        groups: Vec::new(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Inside the pool, as an executor trains: the step's thread is one of the pool's, not a
    // thread that hands every parallel op to the pool and sleeps until it is done.
    rayon::ThreadPoolBuilder::new()
        .build()?
        .install(|| run().map_err(|e| e.to_string()))?;
    Ok(())
}

/// The timed steps.
fn run() -> Result<(), Box<dyn std::error::Error>> {
    let budget = Duration::from_secs_f64(arg("--seconds", 1.0)?);
    let batch: usize = arg("--batch", 64)?;
    let precision: String = arg("--precision", String::from("f32"))?;
    let winograd: String = arg("--winograd", String::from("on"))?;
    let winograd = match winograd.as_str() {
        "on" | "off" => winograd == "on",
        other => return Err(format!("--winograd is `on` or `off`, not `{other}`").into()),
    };
    let numerics = ringflow_ml::Numerics {
        matmul_precision: precision.parse()?,
        winograd,
    };
    let _numerics = numerics.enter();
    let (spec, optimizer, input) = match arg("--model", String::from("lenet"))?.as_str() {
        "lenet" => (lenet()?, adam(), vec![batch, 1, 28, 28]),
        "wide-mlp" => (wide_mlp()?, sgd(), vec![batch, 784]),
        other => return Err(format!("--model is `lenet` or `wide-mlp`, not `{other}`").into()),
    };
    let lr = optimizer.lr();
    let model = Model::build(&spec, &ModelRegistry::default(), 42, Device::Cpu)?;
    let mut opt = Optimizer::new(optimizer, model.params())?;
    let mut r = rng::seeded(7, 0);
    let x = Tensor::randn(&input, 1.0, &mut r, Device::Cpu)?;
    let labels = (0..batch).map(|i| (i % 10) as f32).collect();
    let y = Tensor::from_vec(labels, &[batch], Device::Cpu)?;
    let mut thrash = vec![0u8; arg("--thrash", 0usize)? << 20];
    let (mut forward, mut backward, mut update, mut total) = (vec![], vec![], vec![], vec![]);
    let mut grads = GradStore::new();
    let start = Instant::now();
    for step in 0.. {
        thrash
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(step as u8));
        let t0 = Instant::now();
        grads.zero();
        let l = loss::cross_entropy(&model.forward(&x, true, &mut r)?, &y)?;
        let t1 = Instant::now();
        opt.backward(&l, lr, &mut grads)?;
        let t2 = Instant::now();
        opt.step(lr, &mut grads)?;
        let t3 = Instant::now();
        if step >= 5 {
            forward.push((t1 - t0).as_secs_f64() * 1e3);
            backward.push((t2 - t1).as_secs_f64() * 1e3);
            update.push((t3 - t2).as_secs_f64() * 1e3);
            total.push((t3 - t0).as_secs_f64());
        }
        if total.len() >= 5 && start.elapsed() > budget {
            break;
        }
    }
    let step = median(&mut total);
    println!(
        "batch {batch}, {} threads, {} steps: forward {:.2} ms, backward {:.2} ms, optimizer \
         {:.2} ms; {:.0} samples/s",
        rayon::current_num_threads(),
        total.len(),
        median(&mut forward),
        median(&mut backward),
        median(&mut update),
        batch as f64 / step
    );
    Ok(())
}
