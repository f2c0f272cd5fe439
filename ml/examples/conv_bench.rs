//! Convolution throughput on the CPU: forward + backward GFLOP/s of a ResNet-sized layer, of
//! `examples/resnet_small.toml`'s 3×3 layers, of LeNet's two convolutions and of a depthwise
//! layer (GFLOP/s count im2col's multiply-adds, also where Winograd runs fewer), next to the GFLOP/s of the crate's GEMM on
//! a square 1024 product, on the same machine; and the time of each pass alone (forward, input
//! gradient, weight gradient; the forward + backward figure also includes the bias-free graph's
//! bookkeeping).
//!
//! ```text
//! cargo run --release -p ringflow-ml --example conv_bench [-- --seconds S] [--device D]
//! ```
//!
//! Runs on all cores of the machine (set `RAYON_NUM_THREADS` to use fewer). Each figure is the
//! best of several timed repetitions after a warm-up, so that the scratch buffers have grown
//! and the caches are warm; a busy machine lowers them. `--device cuda` (a build with
//! `--features cuda`) times the same layers and GEMM on a GPU instead, waiting for the device
//! at the end of every timed call (`benches/gpu_verify.sh` runs it so).

use std::time::{Duration, Instant};

use ringflow_ml::backend::{Conv2dGeometry, Storage};
use ringflow_ml::{Conv2dOptions, Device, GradStore, Tensor, rng};

/// One layer to time.
struct Layer {
    name: &'static str,
    input: [usize; 4],
    weight: [usize; 4],
    opts: Conv2dOptions,
}

impl Layer {
    /// Multiply-adds of one forward pass, times 2 (FLOPs); backward is twice that (input and
    /// weight gradients).
    fn forward_flops(&self, out: &[usize]) -> f64 {
        let [_, cg, kh, kw] = self.weight;
        2.0 * out.iter().product::<usize>() as f64 * (cg * kh * kw) as f64
    }
}

fn layers() -> Vec<Layer> {
    let opts = |padding: usize, groups: usize| Conv2dOptions {
        padding: [padding; 2],
        groups,
        ..Conv2dOptions::default()
    };
    vec![
        Layer {
            name: "ResNet 64→64 3×3 pad 1, 56×56, batch 8",
            input: [8, 64, 56, 56],
            weight: [64, 64, 3, 3],
            opts: opts(1, 1),
        },
        Layer {
            name: "small ResNet 16→16 3×3 pad 1, 28×28, batch 64",
            input: [64, 16, 28, 28],
            weight: [16, 16, 3, 3],
            opts: opts(1, 1),
        },
        Layer {
            name: "small ResNet 32→32 3×3 pad 1, 14×14, batch 64",
            input: [64, 32, 14, 14],
            weight: [32, 32, 3, 3],
            opts: opts(1, 1),
        },
        Layer {
            name: "small ResNet 64→64 3×3 pad 1, 7×7, batch 64",
            input: [64, 64, 7, 7],
            weight: [64, 64, 3, 3],
            opts: opts(1, 1),
        },
        Layer {
            name: "LeNet conv1 1→32 5×5, 28×28, batch 64",
            input: [64, 1, 28, 28],
            weight: [32, 1, 5, 5],
            opts: opts(0, 1),
        },
        Layer {
            name: "LeNet conv2 32→64 5×5, 12×12, batch 64",
            input: [64, 32, 12, 12],
            weight: [64, 32, 5, 5],
            opts: opts(0, 1),
        },
        Layer {
            name: "depthwise 64 3×3 pad 1, 56×56, batch 8",
            input: [8, 64, 56, 56],
            weight: [64, 1, 3, 3],
            opts: opts(1, 64),
        },
        Layer {
            name: "pointwise 64→128 1×1, 28×28, batch 8",
            input: [8, 64, 28, 28],
            weight: [128, 64, 1, 1],
            opts: opts(0, 1),
        },
    ]
}

/// The shortest of the timed repetitions of `f` within about `budget` (at least 3), after one
/// warm-up call.
fn best_time(
    budget: Duration,
    device: Device,
    mut f: impl FnMut() -> ringflow_ml::Result<()>,
) -> ringflow_ml::Result<f64> {
    let mut f = || f().and_then(|()| device.synchronize());
    f()?;
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    Ok(best)
}

fn gemm_gflops(budget: Duration, device: Device) -> ringflow_ml::Result<f64> {
    let mut r = rng::seeded(1, 0);
    let a = Tensor::uniform(&[1024, 1024], -1.0, 1.0, &mut r, device)?;
    let b = Tensor::uniform(&[1024, 1024], -1.0, 1.0, &mut r, device)?;
    let secs = best_time(budget, device, || a.matmul(&b).map(drop))?;
    Ok(2.0 * 1024f64.powi(3) / secs / 1e9)
}

/// What one layer measured: forward and forward + backward GFLOP/s, and the milliseconds of
/// each pass alone.
struct Measured {
    forward_gflops: f64,
    total_gflops: f64,
    forward_ms: f64,
    input_grad_ms: f64,
    weight_grad_ms: f64,
}

fn measure(layer: &Layer, budget: Duration, device: Device) -> ringflow_ml::Result<Measured> {
    let mut r = rng::seeded(2, 0);
    let x = Tensor::uniform(&layer.input, -1.0, 1.0, &mut r, device)?.into_parameter()?;
    let w = Tensor::uniform(&layer.weight, -0.1, 0.1, &mut r, device)?.into_parameter()?;
    let out = ringflow_ml::no_grad(|| x.conv2d(&w, None, layer.opts))?;
    let flops = layer.forward_flops(out.shape());
    let geometry = Conv2dGeometry {
        batch: layer.input[0],
        in_channels: layer.input[1],
        in_size: [layer.input[2], layer.input[3]],
        out_channels: layer.weight[0],
        kernel: [layer.weight[2], layer.weight[3]],
        stride: layer.opts.stride,
        padding: layer.opts.padding,
        dilation: layer.opts.dilation,
        groups: layer.opts.groups,
    };
    let storage = |t: &Tensor| Storage::from_host(t.to_array()?, device);
    let (xs, ws, dy) = (storage(&x)?, storage(&w)?, storage(&out)?);
    let mut dw = Storage::zeros(&layer.weight, device)?;
    let forward = best_time(budget, device, || {
        Storage::conv2d(&xs, &ws, None, &geometry).map(drop)
    })?;
    let input_grad = best_time(budget, device, || {
        Storage::conv2d_backward_input(&dy, &ws, &geometry).map(drop)
    })?;
    let weight_grad = best_time(budget, device, || {
        Storage::conv2d_backward_weight(&mut dw, &xs, &dy, &geometry, false)
    })?;
    let mut grads = GradStore::new();
    let both = best_time(budget, device, || {
        grads.zero();
        x.conv2d(&w, None, layer.opts)?
            .sum_all()?
            .backward_into(&mut grads)
    })?;
    Ok(Measured {
        forward_gflops: flops / forward / 1e9,
        total_gflops: 3.0 * flops / both / 1e9,
        forward_ms: forward * 1e3,
        input_grad_ms: input_grad * 1e3,
        weight_grad_ms: weight_grad * 1e3,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let seconds = match args.iter().position(|a| a == "--seconds") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--seconds needs a value")?
            .parse::<f64>()?,
        None => 1.0,
    };
    let device: Device = match args.iter().position(|a| a == "--device") {
        Some(i) => args.get(i + 1).ok_or("--device needs a value")?.parse()?,
        None => Device::Cpu,
    };
    device.check_available()?;
    let budget = Duration::from_secs_f64(seconds);
    println!(
        "device: {device}, threads: {}",
        rayon::current_num_threads()
    );
    println!(
        "GEMM 1024×1024×1024: {:.1} GFLOP/s",
        gemm_gflops(budget, device)?
    );
    println!(
        "{:<42} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "layer", "fwd", "fwd+bwd", "fwd", "dx", "dw"
    );
    println!(
        "{:<42} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "", "GFLOP/s", "GFLOP/s", "ms", "ms", "ms"
    );
    for layer in layers() {
        let m = measure(&layer, budget, device)?;
        println!(
            "{:<42} {:>8.1} {:>10.1} {:>8.2} {:>8.2} {:>8.2}",
            layer.name,
            m.forward_gflops,
            m.total_gflops,
            m.forward_ms,
            m.input_grad_ms,
            m.weight_grad_ms
        );
    }
    Ok(())
}
