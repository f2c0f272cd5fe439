//! Batch normalization against a direct per-channel reference (values, statistics and
//! gradients, training and evaluation), finite differences, and its argument errors.

use ringflow_ml::{BatchNormMode, Device, Tensor};

use crate::helpers::*;

const EPS: f32 = 1e-5;

/// Per-channel mean and biased variance of `[n, C, rest...]` values, in f64.
fn reference_stats(x: &[f32], shape: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let (c, rest) = (shape[1], shape[2..].iter().product::<usize>());
    let count = (x.len() / c) as f64;
    let channel = |i: usize| i / rest % c;
    let mut mean = vec![0.0; c];
    for (i, &v) in x.iter().enumerate() {
        mean[channel(i)] += v as f64 / count;
    }
    let mut var = vec![0.0; c];
    for (i, &v) in x.iter().enumerate() {
        var[channel(i)] += (v as f64 - mean[channel(i)]).powi(2) / count;
    }
    (mean, var)
}

/// `(x − mean) / √(var + eps) · γ + β` per channel, in f64.
fn reference_normalize(
    x: &[f32],
    shape: &[usize],
    (mean, var): (&[f64], &[f64]),
    (gamma, beta): (&[f32], &[f32]),
) -> Vec<f32> {
    let (c, rest) = (shape[1], shape[2..].iter().product::<usize>());
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let k = i / rest % c;
            ((v as f64 - mean[k]) / (var[k] + EPS as f64).sqrt() * gamma[k] as f64 + beta[k] as f64)
                as f32
        })
        .collect()
}

/// Shapes: a `[n, C]` batch (BatchNorm1d), images, a batch of one image, and one large enough
/// to run in parallel.
const SHAPES: [&[usize]; 4] = [&[6, 4], &[3, 2, 4, 5], &[1, 3, 2, 2], &[8, 16, 16, 17]];

fn batch_norm_values(device: Device) -> TestResult {
    for (k, shape) in SHAPES.iter().enumerate() {
        let seed = 10 * k as u64;
        // Large offsets per element test the statistics' precision.
        let x = uniform(shape, 99.0, 101.0, seed, device);
        let gamma = uniform(&[shape[1]], 0.5, 1.5, seed + 1, device);
        let beta = uniform(&[shape[1]], -1.0, 1.0, seed + 2, device);
        let xv = x.to_vec();
        let (mean, var) = reference_stats(&xv, shape);
        let (y, stats) = x.batch_norm(&gamma, &beta, BatchNormMode::Train, EPS)?;
        let stats = stats.ok_or("training returns the batch's statistics")?;
        let to32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
        assert_close(&stats.mean.to_vec(), &to32(&mean), 2e-5, "batch mean")?;
        assert_close(&stats.var.to_vec(), &to32(&var), 2e-5, "batch variance")?;
        ensure(
            stats.count == xv.len() / shape[1],
            format!("count {} for {shape:?}", stats.count),
        )?;
        let (g, b) = (gamma.to_vec(), beta.to_vec());
        let want = reference_normalize(&xv, shape, (&mean, &var), (&g, &b));
        assert_close(&y.to_vec(), &want, 2e-3, &format!("train {shape:?}"))?;

        let run_mean = uniform(&[shape[1]], 99.5, 100.5, seed + 3, device);
        let run_var = uniform(&[shape[1]], 0.2, 0.5, seed + 4, device);
        let to64 = |t: &Tensor| t.to_vec().iter().map(|&v| v as f64).collect::<Vec<_>>();
        let mode = BatchNormMode::Eval {
            mean: &run_mean,
            var: &run_var,
        };
        let (y, none) = x.batch_norm(&gamma, &beta, mode, EPS)?;
        ensure(none.is_none(), "evaluation returns no statistics")?;
        let want = reference_normalize(&xv, shape, (&to64(&run_mean), &to64(&run_var)), (&g, &b));
        assert_close(&y.to_vec(), &want, 1e-3, &format!("eval {shape:?}"))?;
    }
    Ok(())
}

/// The gradients of `Σ y · r` in training mode by the closed form, in f64: `dβ = Σ r`,
/// `dγ = Σ r·x̂`, `dx = γ/σ · (r − mean(r) − x̂ · mean(r·x̂))`.
fn reference_train_grads(x: &[f32], shape: &[usize], gamma: &[f32], r: &[f32]) -> [Vec<f32>; 3] {
    let (c, rest) = (shape[1], shape[2..].iter().product::<usize>());
    let count = (x.len() / c) as f64;
    let (mean, var) = reference_stats(x, shape);
    let k = |i: usize| i / rest % c;
    let xhat = |i: usize| (x[i] as f64 - mean[k(i)]) / (var[k(i)] + EPS as f64).sqrt();
    let (mut dbeta, mut dgamma) = (vec![0.0f64; c], vec![0.0f64; c]);
    for (i, &ri) in r.iter().enumerate() {
        dbeta[k(i)] += ri as f64;
        dgamma[k(i)] += ri as f64 * xhat(i);
    }
    let dx = (0..x.len())
        .map(|i| {
            let inv_std = 1.0 / (var[k(i)] + EPS as f64).sqrt();
            let centered = r[i] as f64 - dbeta[k(i)] / count - xhat(i) * dgamma[k(i)] / count;
            (gamma[k(i)] as f64 * inv_std * centered) as f32
        })
        .collect();
    let to32 = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
    [dx, to32(dgamma), to32(dbeta)]
}

/// Training-mode gradients against the closed form on every shape (the large one runs the
/// parallel kernels).
fn batch_norm_gradient_values(device: Device) -> TestResult {
    for (k, shape) in SHAPES.iter().enumerate() {
        let seed = 100 + 10 * k as u64;
        let x = param(shape, -2.0, 2.0, seed, device);
        let gamma = param(&[shape[1]], 0.5, 1.5, seed + 1, device);
        let beta = param(&[shape[1]], -1.0, 1.0, seed + 2, device);
        let r = uniform(shape, -1.0, 1.0, seed + 3, device);
        let (y, _) = x.batch_norm(&gamma, &beta, BatchNormMode::Train, EPS)?;
        let grads = y.mul(&r)?.sum_all()?.backward()?;
        let want = reference_train_grads(&x.to_vec(), shape, &gamma.to_vec(), &r.to_vec());
        for (name, t, want) in [
            ("dx", &x, &want[0]),
            ("dgamma", &gamma, &want[1]),
            ("dbeta", &beta, &want[2]),
        ] {
            let got = grads.get(t).ok_or("no gradient")?.to_vec();
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert_close(&got, want, 1e-4 * scale, &format!("{name} {shape:?}"))?;
        }
    }
    Ok(())
}

/// Finite differences, training mode (through the batch statistics) and evaluation mode.
fn grad_batch_norm(device: Device) -> TestResult {
    for (k, shape) in [&[5usize, 3][..], &[2, 2, 3, 2]].into_iter().enumerate() {
        let seed = 200 + 10 * k as u64;
        let x = param(shape, -2.0, 2.0, seed, device);
        let gamma = param_away_from_zero(&[shape[1]], 0.5, 1.5, seed + 1, device);
        let beta = param(&[shape[1]], -1.0, 1.0, seed + 2, device);
        let train = |t: &[Tensor]| Ok(t[0].batch_norm(&t[1], &t[2], BatchNormMode::Train, EPS)?.0);
        check_grads(&[x.clone(), gamma.clone(), beta.clone()], &train)
            .map_err(|e| format!("batch_norm train {shape:?}: {e}"))?;
        let mean = uniform(&[shape[1]], -0.5, 0.5, seed + 3, device);
        let var = uniform(&[shape[1]], 0.5, 2.0, seed + 4, device);
        let eval = |t: &[Tensor]| {
            let mode = BatchNormMode::Eval {
                mean: &mean,
                var: &var,
            };
            Ok(t[0].batch_norm(&t[1], &t[2], mode, EPS)?.0)
        };
        check_grads(&[x, gamma, beta], &eval)
            .map_err(|e| format!("batch_norm eval {shape:?}: {e}"))?;
    }
    Ok(())
}

/// Every invalid batch normalization is one error naming the op and the shapes.
fn batch_norm_errors(device: Device) -> TestResult {
    let x = Tensor::zeros(&[4, 3, 2, 2], device)?;
    let c3 = Tensor::ones(&[3], device)?;
    let c2 = Tensor::ones(&[2], device)?;
    let eval = |mean, var| BatchNormMode::Eval { mean, var };
    let cases: Vec<(ringflow_ml::Result<Tensor>, &str)> = vec![
        (
            x.batch_norm(&c2, &c3, BatchNormMode::Train, EPS)
                .map(|r| r.0),
            "batch_norm: gamma [2] does not have one value per channel of the input [4, 3, 2, 2]",
        ),
        (
            x.batch_norm(&c3, &c3, eval(&c3, &c2), EPS).map(|r| r.0),
            "batch_norm: the variance [2] does not have one value per channel",
        ),
        (
            Tensor::zeros(&[3], device)?
                .batch_norm(&c3, &c3, BatchNormMode::Train, EPS)
                .map(|r| r.0),
            "batch_norm: the input [3] has no channel axis",
        ),
        (
            Tensor::zeros(&[1, 3], device)?
                .batch_norm(&c3, &c3, BatchNormMode::Train, EPS)
                .map(|r| r.0),
            "batch_norm: training needs more than one value per channel, but the input [1, 3] has 1",
        ),
        (
            x.batch_norm(&c3, &c3, BatchNormMode::Train, -1.0)
                .map(|r| r.0),
            "batch_norm: eps -1 is not a finite non-negative number",
        ),
    ];
    for (k, (result, want)) in cases.into_iter().enumerate() {
        let message = match result {
            Ok(y) => return Err(format!("case {k} ({want}) gave a tensor {:?}", y.shape()).into()),
            Err(e) => e.to_string(),
        };
        ensure(
            message.starts_with(want),
            format!("case {k}: error \"{message}\" does not start with \"{want}\""),
        )?;
    }
    // One value per channel is fine for evaluation.
    let one = Tensor::zeros(&[1, 3], device)?;
    one.batch_norm(&c3, &c3, eval(&c3, &c3), EPS)?;
    Ok(())
}

device_test!(
    batch_norm_values,
    batch_norm_gradient_values,
    grad_batch_norm,
    batch_norm_errors,
);
