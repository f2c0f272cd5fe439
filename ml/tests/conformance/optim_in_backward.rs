//! Plain SGD applied inside the backward pass (`Optimizer::backward`): the weights end bit for
//! bit where the backward pass and the step leave them, for dense layers of every product shape
//! (packed, few columns) and every batch (within one depth block of the GEMM and deeper), while
//! weights used twice, gradients already holding values and other optimizers are left to the
//! step, and weights the optimizer does not own to the caller.

use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec, ParamStore};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, GradStore, Tensor, loss, rng};

use crate::helpers::*;

type Checked<T> = Result<T, Box<dyn std::error::Error>>;

/// Plain SGD, or with momentum.
fn sgd(momentum: f32) -> OptimizerSpec {
    OptimizerSpec::Sgd {
        lr: 0.1,
        momentum,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
        groups: Vec::new(),
    }
}

/// The values of every parameter, by name.
fn values(params: &ParamStore) -> Vec<(String, Vec<f32>)> {
    params
        .iter()
        .map(|p| (p.name.clone(), p.tensor.to_vec()))
        .collect()
}

/// A 24-40-36-3 ReLU MLP trained `steps` steps on a batch of `batch` rows, through
/// `Optimizer::backward` (`in_backward`) or `Tensor::backward_into`, then the step; its
/// parameters and the gradients of its weights after the last pass.
fn train(
    spec: OptimizerSpec,
    (batch, steps): (usize, usize),
    in_backward: bool,
    device: Device,
) -> Checked<(ParamStore, Vec<Vec<f32>>)> {
    let layers = ModelSpec::mlp(&[24, 40, 36, 3], "relu");
    let model = Model::build(&layers, &ModelRegistry::default(), 3, device)?;
    let mut opt = Optimizer::new(spec, model.params())?;
    let x = uniform(&[batch, 24], -1.0, 1.0, 5, device);
    let labels: Vec<f32> = (0..batch).map(|i| (i % 3) as f32).collect();
    let y = tensor(&labels, &[batch], device);
    let mut dropout = rng::seeded(1, rng::streams::DROPOUT);
    let mut store = GradStore::new();
    for _ in 0..steps {
        store.zero();
        let l = loss::cross_entropy(&model.forward(&x, true, &mut dropout)?, &y)?;
        if in_backward {
            opt.backward(&l, 0.1, &mut store)?;
        } else {
            l.backward_into(&mut store)?;
        }
        opt.step(0.1, &mut store)?;
    }
    let weights = model.params().iter().filter(|p| p.name.ends_with("weight"));
    let grads = weights.map(|p| store.get(&p.tensor).map(|g| g.to_vec()).unwrap_or_default());
    let grads = grads.collect();
    Ok((model.params().clone(), grads))
}

fn sgd_in_backward_matches_backward_then_step(device: Device) -> TestResult {
    ensure(
        Optimizer::new(sgd(0.0), &ParamStore::new())?.updates_in_backward(),
        "plain SGD",
    )?;
    // Batches within one depth block of the GEMM (the weight gradients' depth), at and past
    // the AVX-512 kernel's 192 and 256, and several blocks deep.
    for batch in [50, 192, 193, 256, 257, 600] {
        let (fused, grads) = train(sgd(0.0), (batch, 3), true, device)?;
        let (plain, plain_grads) = train(sgd(0.0), (batch, 3), false, device)?;
        ensure(
            values(&fused) == values(&plain),
            format!("batch {batch}: the weights differ from backward then step"),
        )?;
        // Updated in the pass, the weights' gradients were never stored; the reference's were.
        ensure(
            grads.iter().all(|g| g.iter().all(|&v| v == 0.0)),
            format!("batch {batch}: a weight's gradient was stored"),
        )?;
        ensure(
            plain_grads.iter().all(|g| g.iter().any(|&v| v != 0.0)),
            "the reference stored every weight's gradient",
        )?;
    }
    Ok(())
}

fn other_optimizers_take_the_plain_pass(device: Device) -> TestResult {
    ensure(
        !Optimizer::new(sgd(0.9), &ParamStore::new())?.updates_in_backward(),
        "SGD with momentum needs the gradient for its buffer",
    )?;
    let (fused, grads) = train(sgd(0.9), (50, 3), true, device)?;
    let (plain, _) = train(sgd(0.9), (50, 3), false, device)?;
    ensure(values(&fused) == values(&plain), "momentum SGD's weights")?;
    ensure(
        grads.iter().all(|g| g.iter().any(|&v| v != 0.0)),
        "momentum SGD's gradients are stored",
    )
}

/// `w` used twice (`x · w · w`), `v` whose gradient already holds a pass's values and `u`,
/// which the optimizer does not own, are left to the step (which applies the whole gradients of
/// its own) and to the caller.
fn shared_accumulated_and_foreign_weights_are_left_alone(device: Device) -> TestResult {
    let run = |in_backward: bool| -> Checked<Vec<Vec<f32>>> {
        let mut params = ParamStore::new();
        let w = params.insert("w".into(), param(&[6, 6], -0.5, 0.5, 7, device))?;
        let v = params.insert("v".into(), param(&[6, 20], -0.5, 0.5, 8, device))?;
        let u = param(&[20, 4], -0.5, 0.5, 10, device);
        let x = uniform(&[30, 6], -1.0, 1.0, 9, device);
        let mut opt = Optimizer::new(sgd(0.0), &params)?;
        let loss_of = |t: Tensor| -> ringflow_ml::Result<Tensor> { t.mul(&t)?.mean_all() };
        let mut grads = GradStore::new();
        grads.zero();
        loss_of(x.matmul(&v)?)?.backward_into(&mut grads)?;
        let l = loss_of(x.matmul(&w)?.matmul(&w)?.matmul(&v)?.matmul(&u)?)?;
        if in_backward {
            opt.backward(&l, 0.1, &mut grads)?;
        } else {
            l.backward_into(&mut grads)?;
        }
        opt.step(0.1, &mut grads)?;
        let u_grad = grads.get(&u).ok_or("u has no gradient")?.to_vec();
        ensure(u_grad.iter().any(|&g| g != 0.0), "u's gradient was stored")?;
        Ok(vec![w.to_vec(), v.to_vec(), u.to_vec()])
    };
    let (got, want) = (run(true)?, run(false)?);
    let u0 = param(&[20, 4], -0.5, 0.5, 10, device).to_vec();
    ensure(got[0] == want[0], "the weight used twice")?;
    ensure(
        got[1] == want[1],
        "the weight whose gradient held a pass already",
    )?;
    ensure(
        got[2] == u0,
        "a weight the optimizer does not own was updated",
    )
}

device_test!(
    sgd_in_backward_matches_backward_then_step,
    other_optimizers_take_the_plain_pass,
    shared_accumulated_and_foreign_weights_are_left_alone,
);
