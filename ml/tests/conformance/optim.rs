//! Optimizer steps, schedules and clipping against values worked out by hand from the PyTorch
//! formulas (`torch.optim`), written next to each expectation.
//!
//! Every case starts from one parameter `w = [1, -2]` and sets its gradient by hand before each
//! step: `g₁ = [0.5, -1]`, then `g₂` as noted.

use ringflow_ml::nn::ParamStore;
use ringflow_ml::optim::{Optimizer, OptimizerSpec, Schedule};
use ringflow_ml::{Device, GradStore, Tensor};

use crate::helpers::*;

const G1: [f32; 2] = [0.5, -1.0];
const G2: [f32; 2] = [0.25, 2.0];

/// A store holding `w = [1, -2]`.
fn store(device: Device) -> Result<(ParamStore, Tensor), Box<dyn std::error::Error>> {
    let mut s = ParamStore::new();
    let w = s.insert("w".into(), tensor(&[1., -2.], &[2], device))?;
    Ok((s, w))
}

/// Runs `spec` with learning rate `lr` over the gradients `grads` and returns `w` after each step.
fn run(
    spec: OptimizerSpec,
    lr: f32,
    grads: &[[f32; 2]],
    device: Device,
) -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error>> {
    let (params, w) = store(device)?;
    let mut opt = Optimizer::new(spec, &params)?;
    let mut grad_store = GradStore::new();
    let mut out = Vec::new();
    for g in grads {
        grad_store.copy_from_slice(&w, g)?;
        opt.step(lr, &mut grad_store)?;
        ensure(
            grad_store.get(&w).expect("grad").to_vec() == g,
            "step changed the gradient",
        )?;
        out.push(w.to_vec());
    }
    ensure(opt.steps() == grads.len() as u64, "step count")?;
    Ok(out)
}

fn sgd(momentum: f32, dampening: f32, nesterov: bool, weight_decay: f32) -> OptimizerSpec {
    OptimizerSpec::Sgd {
        lr: 0.1,
        momentum,
        dampening,
        nesterov,
        weight_decay,
        groups: Vec::new(),
    }
}

fn sgd_plain_and_weight_decay(device: Device) -> TestResult {
    // w - lr·g = [1 - 0.05, -2 + 0.1]
    let w = run(sgd(0.0, 0.0, false, 0.0), 0.1, &[G1], device)?;
    assert_close(&w[0], &[0.95, -1.9], 1e-6, "sgd")?;
    // d = g + 0.1·w = [0.6, -1.2]; w - 0.1·d
    let w = run(sgd(0.0, 0.0, false, 0.1), 0.1, &[G1], device)?;
    assert_close(&w[0], &[0.94, -1.88], 1e-6, "sgd, weight decay 0.1")?;
    // The lr passed to step wins over the spec's (schedules pass their own).
    let w = run(sgd(0.0, 0.0, false, 0.0), 0.2, &[G1], device)?;
    assert_close(&w[0], &[0.9, -1.8], 1e-6, "sgd, lr 0.2 at step")
}

fn sgd_momentum(device: Device) -> TestResult {
    // b₁ = g₁ = [0.5, -1];             w₁ = w - 0.1·b₁ = [0.95, -1.9]
    // b₂ = 0.9·b₁ + g₂ = [0.7, 1.1];   w₂ = w₁ - 0.1·b₂ = [0.88, -2.01]
    let w = run(sgd(0.9, 0.0, false, 0.0), 0.1, &[G1, G2], device)?;
    assert_close(&w[0], &[0.95, -1.9], 1e-6, "momentum, step 1")?;
    assert_close(&w[1], &[0.88, -2.01], 1e-6, "momentum, step 2")?;
    // dampening 0.5: b₂ = 0.9·b₁ + 0.5·g₂ = [0.575, 0.1]; w₂ = [0.95 - 0.0575, -1.9 - 0.01]
    let w = run(sgd(0.9, 0.5, false, 0.0), 0.1, &[G1, G2], device)?;
    assert_close(
        &w[0],
        &[0.95, -1.9],
        1e-6,
        "dampened momentum, step 1 (b₁ = g₁ undamped)",
    )?;
    assert_close(&w[1], &[0.8925, -1.91], 1e-6, "dampened momentum, step 2")
}

fn sgd_nesterov(device: Device) -> TestResult {
    // b₁ = g₁;  step = g₁ + 0.9·b₁ = [0.95, -1.9];  w₁ = [1 - 0.095, -2 + 0.19] = [0.905, -1.81]
    // b₂ = 0.9·b₁ + g₂ = [0.7, 1.1];  step = g₂ + 0.9·b₂ = [0.88, 2.99];  w₂ = [0.817, -2.109]
    let w = run(sgd(0.9, 0.0, true, 0.0), 0.1, &[G1, G2], device)?;
    assert_close(&w[0], &[0.905, -1.81], 1e-6, "nesterov, step 1")?;
    assert_close(&w[1], &[0.817, -2.109], 1e-6, "nesterov, step 2")
}

fn adagrad_defaults_and_steps(device: Device) -> TestResult {
    let spec: OptimizerSpec = serde_json::from_str(r#"{"kind":"adagrad","lr":0.01}"#)?;
    let want = OptimizerSpec::Adagrad {
        lr: 0.01,
        initial_accumulator: 0.1,
        eps: 1e-10,
        weight_decay: 0.0,
        groups: Vec::new(),
    };
    ensure(
        spec == want,
        format!("{{kind: adagrad, lr: 0.01}} parsed as {spec:?}"),
    )?;
    let (params, _) = store(device)?;
    let state = Optimizer::new(spec.clone(), &params)?.state_tensors()?;
    ensure(
        state.len() == 1 && state[0].0 == "w.sum",
        format!("state names {state:?}"),
    )?;
    assert_close(&state[0].2, &[0.1, 0.1], 0.0, "initial accumulator")?;
    // acc₁ = 0.1 + g₁² = [0.35, 1.1];  w₁ = w - 0.01·g₁/√acc₁ = [0.991548457, -1.990465374]
    // acc₂ = acc₁ + g₁² = [0.6, 2.1];   w₂ = w₁ - 0.01·g₁/√acc₂ = [0.985093485, -1.983564719]
    let w = run(spec, 0.01, &[G1, G1], device)?;
    assert_close(&w[0], &[0.991_548_5, -1.990_465_4], 1e-6, "adagrad, step 1")?;
    assert_close(&w[1], &[0.985_093_5, -1.983_564_7], 1e-6, "adagrad, step 2")
}

fn adam(weight_decay: f32, decoupled: bool) -> OptimizerSpec {
    let (lr, beta1, beta2, eps) = (0.1, 0.9, 0.999, 1e-8);
    if decoupled {
        OptimizerSpec::Adamw {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            groups: Vec::new(),
        }
    } else {
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            groups: Vec::new(),
        }
    }
}

fn adam_bias_correction(device: Device) -> TestResult {
    // lr 0.1, β = (0.9, 0.999), ε = 1e-8; g₂ = [-0.25, 2]. Element 0 (g = 0.5, then -0.25):
    // m₁ = 0.1·0.5 = 0.05, v₁ = 0.001·0.25 = 0.00025; m̂ = 0.5, v̂ = 0.25; w₁ = 1 - 0.1·0.5/0.5 = 0.9
    // m₂ = 0.045 - 0.025 = 0.02, v₂ = 0.00024975 + 0.0000625 = 0.00031225
    // m̂ = 0.02/0.19 = 0.1052632, v̂ = 0.00031225/0.001999 = 0.1562031, √v̂ = 0.3952254
    // w₂ = 0.9 - 0.1·0.1052632/0.3952254 = 0.8733663
    // Element 1 (g = -1, then 2): w₁ = -1.9; m₂ = -0.09 + 0.2 = 0.11, v₂ = 0.000999 + 0.004 =
    // 0.004999; m̂ = 0.5789474, v̂ = 2.5007504, √v̂ = 1.5813761; w₂ = -1.9 - 0.0366104 = -1.9366104
    let g2 = [-0.25, 2.0];
    let w = run(adam(0.0, false), 0.1, &[G1, g2], device)?;
    assert_close(&w[0], &[0.9, -1.9], 1e-6, "adam, step 1")?;
    assert_close(&w[1], &[0.873_366_3, -1.936_610_4], 2e-6, "adam, step 2")?;
    // L2 weight decay enters the gradient: d₁ = g₁ + 0.1·w = [0.6, -1.2], so step 1 is again
    // ±lr, but step 2 (d₂ = g₂ + 0.1·w₁ = [-0.16, 1.81]) differs: w₂[0] = 0.8544414.
    let w = run(adam(0.1, false), 0.1, &[G1, g2], device)?;
    assert_close(
        &w[1][..1],
        &[0.854_441_4],
        2e-6,
        "adam with L2 decay, step 2",
    )
}

fn adamw_decoupled_decay(device: Device) -> TestResult {
    // w ← w·(1 - lr·λ) first, then the Adam step on the raw gradient:
    // step 1: [1·0.99 - 0.1, -2·0.99 + 0.1] = [0.89, -1.88]
    // step 2: [0.89·0.99 - 0.0266337, -1.88·0.99 - 0.0366104] = [0.8544663, -1.8978104]
    let g2 = [-0.25, 2.0];
    let w = run(adam(0.1, true), 0.1, &[G1, g2], device)?;
    assert_close(&w[0], &[0.89, -1.88], 1e-6, "adamw, step 1")?;
    assert_close(&w[1], &[0.854_466_3, -1.897_810_4], 2e-6, "adamw, step 2")?;
    // AdamW's default decay is 0.01.
    let spec: OptimizerSpec = serde_json::from_str(r#"{"kind":"adamw"}"#)?;
    ensure(
        spec == OptimizerSpec::Adamw {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            groups: Vec::new(),
        },
        format!("adamw defaults: {spec:?}"),
    )
}

fn optimizer_specs_are_validated(device: Device) -> TestResult {
    let (params, _) = store(device)?;
    for bad in [
        r#"{"kind":"sgd","lr":0}"#,
        r#"{"kind":"sgd","lr":-1}"#,
        r#"{"kind":"sgd","momentum":1.0}"#,
        r#"{"kind":"sgd","nesterov":true}"#,
        r#"{"kind":"sgd","momentum":0.9,"dampening":0.1,"nesterov":true}"#,
        r#"{"kind":"adam","beta1":1.0}"#,
        r#"{"kind":"adamw","beta2":-0.5}"#,
        r#"{"kind":"adagrad","initial_accumulator":-1}"#,
    ] {
        let spec: OptimizerSpec = serde_json::from_str(bad)?;
        ensure(
            Optimizer::new(spec, &params).is_err(),
            format!("{bad} was accepted"),
        )?;
    }
    for unparsable in [r#"{"kind":"sgd","momentun":0.9}"#, r#"{"kind":"rmsprop"}"#] {
        ensure(
            serde_json::from_str::<OptimizerSpec>(unparsable).is_err(),
            format!("{unparsable} parsed"),
        )?;
    }
    Ok(())
}

fn schedules(_device: Device) -> TestResult {
    // lr · 0.5^⌊step/3⌋
    let step: Schedule = serde_json::from_str(r#"{"kind":"step","step_size":3,"gamma":0.5}"#)?;
    let got: Vec<f32> = (0..7).map(|s| step.lr_at(0.1, s, 100)).collect();
    assert_close(
        &got,
        &[0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025],
        1e-7,
        "step schedule",
    )?;
    let default_gamma: Schedule = serde_json::from_str(r#"{"kind":"step","step_size":2}"#)?;
    assert_close(
        &[default_gamma.lr_at(1.0, 2, 10)],
        &[0.1],
        1e-7,
        "step schedule, default gamma",
    )?;
    // Warm-up: lr·(step+1)/2 for steps 0, 1; then min + ½(lr - min)(1 + cos(π·(step-2)/8)).
    let cos: Schedule =
        serde_json::from_str(r#"{"kind":"cosine","warmup_steps":2,"min_lr":0.01}"#)?;
    let got: Vec<f32> = [0, 1, 2, 4, 6, 10]
        .iter()
        .map(|&s| cos.lr_at(1.0, s, 10))
        .collect();
    // step 4: 0.01 + 0.495·(1 + cos(π/4)) = 0.8550179; step 6: 0.01 + 0.495 = 0.505
    assert_close(
        &got,
        &[0.5, 1.0, 1.0, 0.855_017_9, 0.505, 0.01],
        1e-6,
        "cosine schedule",
    )?;
    ensure(
        cos.lr_at(1.0, 50, 10) >= 0.01 - 1e-7,
        "cosine stays at min_lr past the end",
    )?;
    assert_close(
        &[Schedule::Constant.lr_at(0.3, 99, 10)],
        &[0.3],
        0.0,
        "constant schedule",
    )?;
    ensure(
        Schedule::Step {
            step_size: 0,
            gamma: 0.5,
        }
        .validate()
        .is_err(),
        "step_size 0 accepted",
    )?;
    ensure(
        Schedule::Cosine {
            warmup_steps: 0,
            min_lr: -1.0,
        }
        .validate()
        .is_err(),
        "negative min_lr accepted",
    )
}

fn clip_grad_norm_scales_to_max(device: Device) -> TestResult {
    let mut params = ParamStore::new();
    let a = params.insert("a".into(), tensor(&[0., 0.], &[2], device))?;
    let b = params.insert("b".into(), tensor(&[0.], &[1], device))?;
    let tensors = params.tensors();
    let mut grads = GradStore::new();
    grads.copy_from_slice(&a, &[3., 0.])?;
    grads.copy_from_slice(&b, &[-4.])?;
    ensure(
        (grads.norm(&tensors)? - 5.0).abs() < 1e-9,
        "grad_norm of [3, 0, -4]",
    )?;
    // Under the limit: untouched.
    ensure(
        (grads.clip_norm(&tensors, 10.0)? - 5.0).abs() < 1e-9,
        "clip returns the norm",
    )?;
    assert_close(
        &grads.get(&a).expect("grad").to_vec(),
        &[3., 0.],
        0.0,
        "unclipped a",
    )?;
    // Over it: scaled by 1/5, so that the joint norm is 1.
    ensure(
        (grads.clip_norm(&tensors, 1.0)? - 5.0).abs() < 1e-9,
        "clip returns the norm before clipping",
    )?;
    assert_close(
        &grads.get(&a).expect("grad").to_vec(),
        &[0.6, 0.],
        1e-6,
        "clipped a",
    )?;
    assert_close(
        &grads.get(&b).expect("grad").to_vec(),
        &[-0.8],
        1e-6,
        "clipped b",
    )?;
    ensure(
        (grads.norm(&tensors)? - 1.0).abs() < 1e-5,
        format!("norm after clipping {}", grads.norm(&tensors)?),
    )
}

device_test!(
    sgd_plain_and_weight_decay,
    sgd_momentum,
    sgd_nesterov,
    adagrad_defaults_and_steps,
    adam_bias_correction,
    adamw_decoupled_decay,
    optimizer_specs_are_validated,
    schedules,
    clip_grad_norm_scales_to_max,
);
