//! Every default method of the backend traits against the fused kernel that overrides it, on
//! every device: the composite written with primitives (`*_from_primitives`, what a backend
//! without its own kernel runs) must give the values of the backend's override, so the defaults
//! a new backend relies on are exercised and right, and so are the overrides.

use std::error::Error;

use ndarray::{ArrayD, IxDyn};
use ringflow_ml::Device;
use ringflow_ml::backend::cpu::CpuArray;
use ringflow_ml::backend::elementwise::scale_from_primitives;
use ringflow_ml::backend::loss::{
    bce_with_logits_backward_from_primitives, bce_with_logits_from_primitives,
};
use ringflow_ml::backend::matmul::linear_from_primitives;
use ringflow_ml::backend::norm::{
    batch_norm_backward_from_primitives, batch_norm_from_primitives,
    batch_norm_stats_from_primitives, channel_sum_from_primitives,
};
use ringflow_ml::backend::optim::{
    adagrad_from_primitives, adam_from_primitives, sgd_from_primitives, sgd_product_from_primitives,
};
use ringflow_ml::backend::recurrent::{
    gru_cell_backward_from_primitives, gru_cell_from_primitives,
    lstm_cell_backward_from_primitives, lstm_cell_from_primitives,
};
use ringflow_ml::backend::reduce::{expand_axis_from_primitives, sum_to_shape_from_primitives};
use ringflow_ml::backend::softmax::softmax_backward_from_primitives;
use ringflow_ml::backend::{
    AdagradStep, AdamStep, BackendStorage, CudaStorage, ElementwiseOps, LossOps, MatmulOps,
    NormOps, OptimOps, RecurrentOps, ReduceOps, SgdStep, SoftmaxOps,
};

use crate::helpers::*;

type Checked<T> = Result<T, Box<dyn Error>>;

/// `on_backend!(device, check)` runs `check::<S>(location)` with the storage type `S` of
/// `device`'s backend.
macro_rules! on_backend {
    ($device:expr, $check:ident) => {
        match $device {
            Device::Cpu => $check::<CpuArray>(()),
            Device::Cuda(ordinal) => $check::<CudaStorage>(ordinal),
        }
    };
}

/// Uniform values in `[low, high)` of `shape` at `at`, fixed by `seed`.
fn random<S: BackendStorage>(
    shape: &[usize],
    low: f32,
    high: f32,
    seed: u64,
    at: S::Location,
) -> Checked<S> {
    let values = uniform(shape, low, high, seed, Device::Cpu).to_vec();
    Ok(S::from_host(
        ArrayD::from_shape_vec(IxDyn(shape), values)?,
        at,
    )?)
}

/// The elements, downloaded.
fn values<S: BackendStorage>(s: &S) -> Checked<Vec<f32>> {
    Ok(s.to_host()?.iter().copied().collect())
}

/// Fails unless the override's values `fused` and the default's values `composite` agree
/// within float32 rounding of the largest value, and are not all zero (which would prove
/// nothing).
fn agree<S: BackendStorage>(fused: &S, composite: &S, what: &str) -> TestResult {
    ensure(
        fused.shape() == composite.shape(),
        format!(
            "{what}: shapes {:?} and {:?}",
            fused.shape(),
            composite.shape()
        ),
    )?;
    let (f, c) = (values(fused)?, values(composite)?);
    let scale = c.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    ensure(
        c.iter().any(|&v| v != 0.0),
        format!("{what}: every value is zero"),
    )?;
    assert_close(&f, &c, 1e-5 * scale, what)
}

fn optimizer_updates_match_their_defaults(device: Device) -> TestResult {
    on_backend!(device, optimizer_updates_on)
}

/// Three steps of every update from the same parameter and state, the override on one copy
/// and the default on the other, compared after each step (parameter and state).
fn optimizer_updates_on<S: BackendStorage>(at: S::Location) -> TestResult {
    let shape = [3, 7];
    let sgd = |momentum, dampening, nesterov, weight_decay, first| SgdStep {
        lr: 0.1,
        momentum,
        dampening,
        weight_decay,
        nesterov,
        first,
    };
    for (name, with_buffer, step) in [
        ("sgd", false, sgd(0.0, 0.0, false, 0.1, false)),
        ("sgd with momentum", true, sgd(0.9, 0.1, false, 0.01, false)),
        ("sgd, nesterov", true, sgd(0.9, 0.0, true, 0.0, false)),
    ] {
        let mut pair = [
            random::<S>(&shape, -1.0, 1.0, 1, at)?,
            random(&shape, -1.0, 1.0, 1, at)?,
        ];
        let mut bufs = [S::zeros(&shape, at)?, S::zeros(&shape, at)?];
        for t in 0..3 {
            let g = random::<S>(&shape, -2.0, 2.0, 10 + t, at)?;
            let step = SgdStep {
                first: t == 0,
                ..step
            };
            let [p0, p1] = &mut pair;
            let [b0, b1] = &mut bufs;
            OptimOps::sgd_update(p0, &g, with_buffer.then_some(b0), step)?;
            sgd_from_primitives(p1, &g, with_buffer.then_some(b1), step)?;
            agree(&pair[0], &pair[1], &format!("{name}, step {t}"))?;
            if with_buffer {
                agree(&bufs[0], &bufs[1], &format!("{name}, step {t}, momentum"))?;
            }
        }
    }
    adagrad_on::<S>(at, &shape)?;
    for decoupled in [false, true] {
        adam_on::<S>(at, &shape, decoupled)?;
    }
    Ok(())
}

fn adagrad_on<S: BackendStorage>(at: S::Location, shape: &[usize]) -> TestResult {
    let mut pair = [
        random::<S>(shape, -1.0, 1.0, 2, at)?,
        random(shape, -1.0, 1.0, 2, at)?,
    ];
    let mut acc = [
        random::<S>(shape, 0.0, 0.5, 3, at)?,
        random(shape, 0.0, 0.5, 3, at)?,
    ];
    let step = AdagradStep {
        lr: 0.05,
        eps: 1e-10,
        weight_decay: 0.01,
    };
    for t in 0..3 {
        let g = random::<S>(shape, -2.0, 2.0, 20 + t, at)?;
        let ([p0, p1], [a0, a1]) = (&mut pair, &mut acc);
        OptimOps::adagrad_update(p0, &g, a0, step)?;
        adagrad_from_primitives(p1, &g, a1, step)?;
        agree(&pair[0], &pair[1], &format!("adagrad, step {t}"))?;
        agree(&acc[0], &acc[1], &format!("adagrad, step {t}, sum"))?;
    }
    Ok(())
}

fn adam_on<S: BackendStorage>(at: S::Location, shape: &[usize], decoupled: bool) -> TestResult {
    let name = if decoupled { "adamw" } else { "adam" };
    let mut pair = [
        random::<S>(shape, -1.0, 1.0, 4, at)?,
        random(shape, -1.0, 1.0, 4, at)?,
    ];
    let mut m = [S::zeros(shape, at)?, S::zeros(shape, at)?];
    let mut v = [S::zeros(shape, at)?, S::zeros(shape, at)?];
    for t in 0..3 {
        let g = random::<S>(shape, -2.0, 2.0, 30 + t, at)?;
        let step = AdamStep {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            decoupled,
            step: t + 1,
        };
        let ([p0, p1], [m0, m1], [v0, v1]) = (&mut pair, &mut m, &mut v);
        OptimOps::adam_update(p0, &g, m0, v0, step)?;
        adam_from_primitives(p1, &g, m1, v1, step)?;
        agree(&pair[0], &pair[1], &format!("{name}, step {t}"))?;
        agree(&m[0], &m[1], &format!("{name}, step {t}, first moment"))?;
        agree(&v[0], &v[1], &format!("{name}, step {t}, second moment"))?;
    }
    Ok(())
}

fn softmax_backward_matches_its_default(device: Device) -> TestResult {
    on_backend!(device, softmax_backward_on)
}

fn softmax_backward_on<S: BackendStorage>(at: S::Location) -> TestResult {
    let shape = [3, 5, 4];
    let x = random::<S>(&shape, -3.0, 3.0, 5, at)?;
    let g = random::<S>(&shape, -1.0, 1.0, 6, at)?;
    for axis in 0..shape.len() {
        for log in [false, true] {
            let y = x.softmax(axis, log)?;
            let fused = SoftmaxOps::softmax_backward(&y, &g, axis, log)?;
            let composite = softmax_backward_from_primitives(&y, &g, axis, log)?;
            agree(&fused, &composite, &format!("axis {axis}, log {log}"))?;
        }
    }
    Ok(())
}

fn bce_matches_its_default(device: Device) -> TestResult {
    on_backend!(device, bce_on)
}

fn bce_on<S: BackendStorage>(at: S::Location) -> TestResult {
    let shape = [6, 5];
    let x = random::<S>(&shape, -30.0, 30.0, 7, at)?;
    let z = random::<S>(&shape, 0.0, 1.0, 8, at)?;
    let loss = <S as LossOps>::bce_with_logits(&x, &z)?;
    agree(&loss, &bce_with_logits_from_primitives(&x, &z)?, "loss")?;
    let grad = random::<S>(&[], 0.5, 1.5, 9, at)?;
    let fused = <S as LossOps>::bce_with_logits_backward(&x, &z, &grad)?;
    let composite = bce_with_logits_backward_from_primitives(&x, &z, &grad)?;
    agree(&fused, &composite, "gradient")
}

fn reductions_and_scale_match_their_defaults(device: Device) -> TestResult {
    on_backend!(device, reductions_on)
}

fn reductions_on<S: BackendStorage>(at: S::Location) -> TestResult {
    let x = random::<S>(&[2, 3, 4], -1.0, 1.0, 11, at)?;
    for target in [
        &[4][..],
        &[3, 1],
        &[1, 4],
        &[2, 1, 4],
        &[2, 3, 1],
        &[1, 1, 1],
        &[3, 4],
    ] {
        for accumulate in [false, true] {
            let mut fused = random::<S>(target, -1.0, 1.0, 12, at)?;
            let mut composite = random::<S>(target, -1.0, 1.0, 12, at)?;
            ReduceOps::sum_to_shape_into(&x, &mut fused, accumulate)?;
            sum_to_shape_from_primitives(&x, &mut composite, accumulate)?;
            let what = format!("sum to {target:?}, accumulate {accumulate}");
            agree(&fused, &composite, &what)?;
        }
    }
    for (axis, keepdim) in [(0, false), (1, false), (2, true), (1, true)] {
        let reduced = x.sum(Some(axis), keepdim)?;
        let fused = ReduceOps::expand_axis(&reduced, axis, 5, keepdim)?;
        let composite = expand_axis_from_primitives(&reduced, axis, 5, keepdim)?;
        agree(
            &fused,
            &composite,
            &format!("expand axis {axis}, keepdim {keepdim}"),
        )?;
    }
    let (mut fused, mut composite) = (x.duplicate()?, x.duplicate()?);
    ElementwiseOps::scale(&mut fused, -2.5)?;
    scale_from_primitives(&mut composite, -2.5)?;
    agree(&fused, &composite, "scale")
}

fn linear_matches_its_default(device: Device) -> TestResult {
    on_backend!(device, linear_on)
}

/// A dense layer's product with its bias, on shapes the CPU runs packed on every thread, on its
/// thin kernels and through the `gemm` crate.
fn linear_on<S: BackendStorage>(at: S::Location) -> TestResult {
    for (k, (m, depth, n)) in [(256, 96, 200), (3, 40, 300), (150, 30, 5), (33, 1, 17)]
        .into_iter()
        .enumerate()
    {
        let seed = 90 + 10 * k as u64;
        let x = random::<S>(&[m, depth], -1.0, 1.0, seed, at)?;
        let w = random::<S>(&[depth, n], -1.0, 1.0, seed + 1, at)?;
        let bias = random::<S>(&[n], -2.0, 2.0, seed + 2, at)?;
        let fused = MatmulOps::linear(&x, &w, &bias)?;
        let composite = linear_from_primitives(&x, &w, &bias)?;
        agree(&fused, &composite, &format!("linear {m}×{depth}×{n}"))?;
    }
    Ok(())
}

fn sgd_product_update_matches_its_default(device: Device) -> TestResult {
    on_backend!(device, sgd_product_update_on)
}

/// A plain SGD step whose gradient is a product (a dense layer's weight gradient `xᵀ · dy`),
/// written onto the weight by the CPU's GEMM: packed on every thread, with a depth deeper than
/// one block, with few columns, and with both operands transposed.
fn sgd_product_update_on<S: BackendStorage>(at: S::Location) -> TestResult {
    let cases = [
        ((96, 256, 200), (true, false)),
        ((64, 600, 48), (true, false)),
        ((150, 40, 5), (true, false)),
        ((40, 33, 70), (true, true)),
    ];
    for (k, ((m, depth, n), (ta, tb))) in cases.into_iter().enumerate() {
        let seed = 300 + 10 * k as u64;
        let stored = |rows, cols, t| if t { [cols, rows] } else { [rows, cols] };
        let a = random::<S>(&stored(m, depth, ta), -1.0, 1.0, seed, at)?;
        let b = random::<S>(&stored(depth, n, tb), -1.0, 1.0, seed + 1, at)?;
        let mut pair = [
            random::<S>(&[m, n], -1.0, 1.0, seed + 2, at)?,
            random(&[m, n], -1.0, 1.0, seed + 2, at)?,
        ];
        let before = values(&pair[0])?;
        let [fused, composite] = &mut pair;
        OptimOps::sgd_product_update(fused, (&a, ta), (&b, tb), 0.05)?;
        sgd_product_from_primitives(composite, (&a, ta), (&b, tb), 0.05)?;
        let moved = values(&pair[0])? != before;
        ensure(
            moved,
            format!("the {m}×{depth}×{n} step left the weight as it was"),
        )?;
        agree(&pair[0], &pair[1], &format!("sgd product {m}×{depth}×{n}"))?;
    }
    Ok(())
}

fn batch_norm_matches_its_defaults(device: Device) -> TestResult {
    on_backend!(device, batch_norm_on)
}

/// The per-channel sum, statistics, normalization and both backward passes, on a `[n, C]` batch
/// and on images large enough for the parallel kernels.
fn batch_norm_on<S: BackendStorage>(at: S::Location) -> TestResult {
    for (k, shape) in [&[7usize, 5][..], &[8, 16, 16, 17]].into_iter().enumerate() {
        let seed = 40 + 10 * k as u64;
        let x = random::<S>(shape, -3.0, 5.0, seed, at)?;
        let c = [shape[1]];
        let (gamma, beta) = (
            random::<S>(&c, 0.5, 1.5, seed + 1, at)?,
            random(&c, -1.0, 1.0, seed + 2, at)?,
        );
        let sum = NormOps::channel_sum(&x)?;
        agree(
            &sum,
            &channel_sum_from_primitives(&x)?,
            &format!("sum {shape:?}"),
        )?;
        let (mean, var) = NormOps::batch_norm_stats(&x)?;
        let (mean_c, var_c) = batch_norm_stats_from_primitives(&x)?;
        agree(&mean, &mean_c, &format!("mean {shape:?}"))?;
        agree(&var, &var_c, &format!("variance {shape:?}"))?;
        let fused = NormOps::batch_norm(&x, &mean, &var, &gamma, &beta, 1e-5)?;
        let composite = batch_norm_from_primitives(&x, &mean, &var, &gamma, &beta, 1e-5)?;
        agree(&fused, &composite, &format!("normalize {shape:?}"))?;
        let g = random::<S>(shape, -1.0, 1.0, seed + 3, at)?;
        for batch_stats in [true, false] {
            let (dx, dgamma, dbeta) =
                NormOps::batch_norm_backward(&x, &g, &mean, &var, &gamma, 1e-5, batch_stats)?;
            let (dx_c, dgamma_c, dbeta_c) = batch_norm_backward_from_primitives(
                &x,
                &g,
                &mean,
                &var,
                &gamma,
                1e-5,
                batch_stats,
            )?;
            let what = |name: &str| format!("{name} {shape:?}, batch statistics {batch_stats}");
            agree(&dx, &dx_c, &what("dx"))?;
            agree(&dgamma, &dgamma_c, &what("dgamma"))?;
            agree(&dbeta, &dbeta_c, &what("dbeta"))?;
        }
    }
    Ok(())
}

fn recurrent_gates_match_their_defaults(device: Device) -> TestResult {
    on_backend!(device, recurrent_on)
}

/// Both cells forward (outputs and what they save) and backward (from the same saved values),
/// on a small batch and on one large enough for the CPU's parallel rows; gates up to ±6, where
/// the activations saturate.
fn recurrent_on<S: BackendStorage>(at: S::Location) -> TestResult {
    for (k, (n, h)) in [(3usize, 5usize), (64, 160)].into_iter().enumerate() {
        let seed = 60 + 10 * k as u64;
        let what = |name: &str| format!("{name}, [{n}, {h}]");
        let gates = random::<S>(&[n, 4 * h], -6.0, 6.0, seed, at)?;
        let c_prev = random::<S>(&[n, h], -2.0, 2.0, seed + 1, at)?;
        let (hs, c, saved) = RecurrentOps::lstm_cell(&gates, &c_prev)?;
        let (hs_c, c_c, saved_c) = lstm_cell_from_primitives(&gates, &c_prev)?;
        agree(&hs, &hs_c, &what("lstm h"))?;
        agree(&c, &c_c, &what("lstm c"))?;
        agree(&saved, &saved_c, &what("lstm saved"))?;
        let dh = random::<S>(&[n, h], -1.0, 1.0, seed + 2, at)?;
        let dc = random::<S>(&[n, h], -1.0, 1.0, seed + 3, at)?;
        let (dgates, dc_prev) = RecurrentOps::lstm_cell_backward(&saved, &dh, &dc)?;
        let (dgates_c, dc_prev_c) = lstm_cell_backward_from_primitives(&saved, &dh, &dc)?;
        agree(&dgates, &dgates_c, &what("lstm dgates"))?;
        agree(&dc_prev, &dc_prev_c, &what("lstm dc_prev"))?;

        let x_gates = random::<S>(&[n, 3 * h], -6.0, 6.0, seed + 4, at)?;
        let h_gates = random::<S>(&[n, 3 * h], -6.0, 6.0, seed + 5, at)?;
        let h_prev = random::<S>(&[n, h], -1.0, 1.0, seed + 6, at)?;
        let (out, saved) = RecurrentOps::gru_cell(&x_gates, &h_gates, &h_prev)?;
        let (out_c, saved_c) = gru_cell_from_primitives(&x_gates, &h_gates, &h_prev)?;
        agree(&out, &out_c, &what("gru h"))?;
        agree(&saved, &saved_c, &what("gru saved"))?;
        let (dx, dhg, dhp) = RecurrentOps::gru_cell_backward(&saved, &dh)?;
        let (dx_c, dhg_c, dhp_c) = gru_cell_backward_from_primitives(&saved, &dh)?;
        agree(&dx, &dx_c, &what("gru dx_gates"))?;
        agree(&dhg, &dhg_c, &what("gru dh_gates"))?;
        agree(&dhp, &dhp_c, &what("gru dh_prev"))?;
    }
    Ok(())
}

device_test!(
    linear_matches_its_default,
    sgd_product_update_matches_its_default,
    recurrent_gates_match_their_defaults,
    batch_norm_matches_its_defaults,
    optimizer_updates_match_their_defaults,
    softmax_backward_matches_its_default,
    bce_matches_its_default,
    reductions_and_scale_match_their_defaults,
);
