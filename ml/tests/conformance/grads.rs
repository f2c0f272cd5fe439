//! Gradients of every differentiable op against central finite differences.
//!
//! Each check computes `L = sum(op(x) · R)` with a fixed random `R`, so that every output
//! element contributes a different weight, and compares `backward` with `(L(x+h) - L(x-h)) / 2h`
//! element by element (see `helpers::check_grads`).

use ringflow_ml::nn::{
    Forward, LayerNorm, Model, ModelRegistry, ModelSpec, ParamBuilder, ParamStore,
};
use ringflow_ml::{Device, Tensor, loss, rng};

use crate::helpers::*;

/// Runs `check_grads` and names the case in the error.
fn check(name: &str, inputs: &[Tensor], f: &OpFn<'_>) -> TestResult {
    check_grads(inputs, f).map_err(|e| format!("{name}: {e}").into())
}

/// The checker itself must reject a derivative that is off by a factor of 2, has the wrong
/// sign, or is slightly shifted, while accepting the true one.
fn checker_catches_wrong_derivatives(device: Device) -> TestResult {
    let x = param(&[6], 0.3, 1.5, 1, device);
    let f = |t: &[Tensor]| t[0].square();
    let inputs = [x];
    let r = output_weights(&inputs, &f, 7)?;
    let analytic = analytic_grads(&inputs, &f, &r)?;
    let numeric = numeric_grads(&inputs, &f, &r, H)?;
    compare_grads(&analytic, &numeric, RTOL)?;
    let scaled = |k: f64, shift: f64| -> Vec<Vec<f64>> {
        analytic
            .iter()
            .map(|g| g.iter().map(|v| v * k + shift).collect())
            .collect()
    };
    ensure(
        compare_grads(&scaled(0.5, 0.0), &numeric, RTOL).is_err(),
        "a missing factor of 2 passed",
    )?;
    ensure(
        compare_grads(&scaled(2.0, 0.0), &numeric, RTOL).is_err(),
        "an extra factor of 2 passed",
    )?;
    ensure(
        compare_grads(&scaled(-1.0, 0.0), &numeric, RTOL).is_err(),
        "a flipped sign passed",
    )?;
    ensure(
        compare_grads(&scaled(1.0, 0.05), &numeric, RTOL).is_err(),
        "an offset of 0.05 passed",
    )?;
    // And the whole pipeline fails for a function whose gradient is not what backward computes:
    // a constant factor hidden from autodiff by detach.
    let fake = |t: &[Tensor]| t[0].detach()?.mul(&t[0]);
    let x = param(&[6], 0.3, 1.5, 2, device);
    ensure(
        check_grads(&[x], &fake).is_err(),
        "x.detach()?·x passed as if it were x²",
    )
}

const BINARY: [&str; 4] = ["add", "sub", "mul", "div"];

fn binary(name: &str, a: &Tensor, b: &Tensor) -> ringflow_ml::Result<Tensor> {
    match name {
        "add" => a.add(b),
        "sub" => a.sub(b),
        "mul" => a.mul(b),
        _ => a.div(b),
    }
}

fn check_binary(lhs: &[usize], rhs: &[usize], seed: u64, device: Device) -> TestResult {
    for (k, op) in BINARY.iter().enumerate() {
        let s = seed + 10 * k as u64;
        let a = param(lhs, -1.0, 1.0, s, device);
        // Divisors stay away from 0, where 1/b is steep.
        let b = param_away_from_zero(rhs, 0.5, 1.5, s + 1, device);
        let f = |t: &[Tensor]| binary(op, &t[0], &t[1]);
        check(&format!("{op} {lhs:?} {rhs:?}"), &[a, b], &f)?;
    }
    Ok(())
}

fn grad_binary_same_shape(device: Device) -> TestResult {
    check_binary(&[3, 4], &[3, 4], 10, device)
}

fn grad_binary_broadcast(device: Device) -> TestResult {
    let cases: [(&[usize], &[usize]); 9] = [
        (&[3, 4], &[4]),
        (&[3, 4], &[1, 4]),
        (&[1], &[2, 3]),
        (&[4], &[3, 4]),
        (&[3, 1], &[1, 4]),
        (&[3, 4], &[3, 1]),
        (&[], &[2, 3]),
        (&[2, 3], &[]),
        (&[2, 1, 4], &[3, 1]),
    ];
    for (i, (lhs, rhs)) in cases.iter().enumerate() {
        check_binary(lhs, rhs, 100 + 50 * i as u64, device)?;
    }
    Ok(())
}

fn grad_same_tensor_on_both_sides(device: Device) -> TestResult {
    // x·x, x/x, x+x and x-x: both gradient contributions land in one buffer.
    let x = param_away_from_zero(&[2, 3], 0.5, 1.5, 20, device);
    for op in ["mul", "add"] {
        check(
            &format!("x {op} x"),
            std::slice::from_ref(&x),
            &|t: &[Tensor]| binary(op, &t[0], &t[0]),
        )?;
    }
    // A diamond through intermediate tensors: y = tanh(x); y·y + exp(y) - y.
    let f = |t: &[Tensor]| {
        let y = t[0].tanh()?;
        y.mul(&y)?.add(&y.exp()?)?.sub(&y)
    };
    check("diamond", &[x], &f)
}

fn grad_affine(device: Device) -> TestResult {
    let x = param(&[3, 4], -1.0, 1.0, 30, device);
    let inputs = [x];
    check("affine", &inputs, &|t: &[Tensor]| t[0].affine(1.5, -0.3))?;
    check("scale", &inputs, &|t: &[Tensor]| t[0].scale(-2.0))?;
    check("add_scalar", &inputs, &|t: &[Tensor]| t[0].add_scalar(0.7))
}

fn grad_unary(device: Device) -> TestResult {
    let general = param(&[3, 4], -1.5, 1.5, 40, device);
    let positive = param(&[3, 4], 0.5, 2.0, 41, device);
    let off_zero = param_away_from_zero(&[3, 4], 0.1, 1.5, 42, device);
    type Unary = fn(&Tensor) -> ringflow_ml::Result<Tensor>;
    let cases: [(&str, &Tensor, Unary); 10] = [
        ("neg", &general, Tensor::neg),
        ("exp", &general, Tensor::exp),
        ("log", &positive, Tensor::log),
        ("relu", &off_zero, Tensor::relu),
        ("tanh", &general, Tensor::tanh),
        ("sigmoid", &general, Tensor::sigmoid),
        ("gelu", &general, Tensor::gelu),
        ("gelu_exact", &general, Tensor::gelu_exact),
        ("sqrt", &positive, Tensor::sqrt),
        ("square", &general, Tensor::square),
    ];
    for (name, x, op) in cases {
        check(name, std::slice::from_ref(x), &|t: &[Tensor]| op(&t[0]))?;
    }
    Ok(())
}

fn grad_matmul(device: Device) -> TestResult {
    let a = param(&[3, 4], -1.0, 1.0, 50, device);
    let b = param(&[4, 5], -1.0, 1.0, 51, device);
    check(
        "matmul (both)",
        &[a.clone(), b.clone()],
        &|t: &[Tensor]| t[0].matmul(&t[1]),
    )?;
    let b_const = uniform(&[4, 5], -1.0, 1.0, 52, device);
    check(
        "matmul (left only)",
        std::slice::from_ref(&a),
        &|t: &[Tensor]| t[0].matmul(&b_const),
    )?;
    let a_const = uniform(&[3, 4], -1.0, 1.0, 53, device);
    check("matmul (right only)", &[b], &|t: &[Tensor]| {
        a_const.matmul(&t[0])
    })?;
    // x·xᵀ: the same tensor as both operands.
    check("x·xᵀ", &[a], &|t: &[Tensor]| {
        t[0].matmul(&t[0].transpose(0, 1)?)
    })
}

fn grad_linear(device: Device) -> TestResult {
    let x = param(&[3, 4], -1.0, 1.0, 54, device);
    let w = param(&[4, 5], -1.0, 1.0, 55, device);
    let b = param(&[5], -1.0, 1.0, 56, device);
    check(
        "linear (input, weight and bias)",
        &[x.clone(), w.clone(), b.clone()],
        &|t: &[Tensor]| t[0].linear(&t[1], &t[2]),
    )?;
    let x_const = uniform(&[3, 4], -1.0, 1.0, 57, device);
    check("linear (weight and bias)", &[w, b], &|t: &[Tensor]| {
        x_const.linear(&t[0], &t[1])
    })?;
    // The fused op equals its two-op definition.
    let w = uniform(&[4, 5], -1.0, 1.0, 58, device);
    let b = uniform(&[5], -1.0, 1.0, 59, device);
    let fused = x.linear(&w, &b)?.to_vec();
    let plain = x.matmul(&w)?.add(&b)?.to_vec();
    for (f, p) in fused.iter().zip(&plain) {
        ensure(
            (f - p).abs() < 1e-5,
            format!("linear {f} vs matmul+add {p}"),
        )?;
    }
    Ok(())
}

fn grad_softmax(device: Device) -> TestResult {
    let x = param(&[3, 4], -2.0, 2.0, 60, device);
    let inputs = [x];
    for axis in [-1, 0] {
        check(&format!("softmax({axis})"), &inputs, &|t: &[Tensor]| {
            t[0].softmax(axis)
        })?;
        check(
            &format!("log_softmax({axis})"),
            &inputs,
            &|t: &[Tensor]| t[0].log_softmax(axis),
        )?;
    }
    let x3 = param(&[2, 3, 4], -2.0, 2.0, 61, device);
    check("softmax(1) of 3-D", &[x3], &|t: &[Tensor]| t[0].softmax(1))
}

fn grad_reductions(device: Device) -> TestResult {
    let x = param(&[2, 3, 4], -1.0, 1.0, 70, device);
    let inputs = [x];
    check("sum_all", &inputs, &|t: &[Tensor]| t[0].sum_all())?;
    check("mean_all", &inputs, &|t: &[Tensor]| t[0].mean_all())?;
    for axis in [0, 1, -1] {
        for keepdim in [false, true] {
            check(
                &format!("sum({axis}, {keepdim})"),
                &inputs,
                &|t: &[Tensor]| t[0].sum(axis, keepdim),
            )?;
            check(
                &format!("mean({axis}, {keepdim})"),
                &inputs,
                &|t: &[Tensor]| t[0].mean(axis, keepdim),
            )?;
        }
    }
    Ok(())
}

fn grad_layout(device: Device) -> TestResult {
    let x = param(&[2, 3, 4], -1.0, 1.0, 80, device);
    let inputs = [x];
    check("reshape", &inputs, &|t: &[Tensor]| t[0].reshape(&[6, 4]))?;
    check("transpose(0, 2)", &inputs, &|t: &[Tensor]| {
        t[0].transpose(0, 2)
    })?;
    check("transpose(-1, 1)", &inputs, &|t: &[Tensor]| {
        t[0].transpose(-1, 1)
    })?;
    check("permute", &inputs, &|t: &[Tensor]| t[0].permute(&[2, 0, 1]))?;
    check("permute", &inputs, &|t: &[Tensor]| t[0].permute(&[1, 2, 0]))?;
    check("narrow(1)", &inputs, &|t: &[Tensor]| t[0].narrow(1, 1, 2))?;
    check("narrow(-1)", &inputs, &|t: &[Tensor]| t[0].narrow(-1, 0, 3))?;
    check("narrow(0)", &inputs, &|t: &[Tensor]| t[0].narrow(0, 1, 1))?;
    let m = param(&[3, 4], -1.0, 1.0, 81, device);
    check("transpose 2-D", &[m], &|t: &[Tensor]| t[0].transpose(0, 1))
}

fn grad_concat(device: Device) -> TestResult {
    let rows = [
        param(&[2, 3], -1.0, 1.0, 90, device),
        param(&[1, 3], -1.0, 1.0, 91, device),
        param(&[3, 3], -1.0, 1.0, 92, device),
    ];
    check("concat(0)", &rows, &|t: &[Tensor]| {
        Tensor::concat(&[&t[0], &t[1], &t[2]], 0)
    })?;
    let cols = [
        param(&[2, 1], -1.0, 1.0, 93, device),
        param(&[2, 3], -1.0, 1.0, 94, device),
        param(&[2, 2], -1.0, 1.0, 95, device),
    ];
    check("concat(1)", &cols, &|t: &[Tensor]| {
        Tensor::concat(&[&t[0], &t[1], &t[2]], 1)
    })?;
    let cubes = [
        param(&[2, 1, 3], -1.0, 1.0, 97, device),
        param(&[2, 2, 3], -1.0, 1.0, 98, device),
    ];
    check("concat(1) of 3-D", &cubes, &|t: &[Tensor]| {
        Tensor::concat(&[&t[0], &t[1]], 1)
    })?;
    // The same tensor twice, and a constant among parameters.
    let c = uniform(&[2, 3], -1.0, 1.0, 96, device);
    check("concat(x, c, x)", &cols[1..2], &|t: &[Tensor]| {
        Tensor::concat(&[&t[0], &c, &t[0]], -1)
    })
}

fn grad_index_select(device: Device) -> TestResult {
    let table = param(&[5, 3], -1.0, 1.0, 100, device);
    // Row 2 is picked three times, row 0 twice, row 1 never.
    let ids = tensor(&[0., 2., 2., 4., 0., 2.], &[2, 3], device);
    check("index_select", &[table], &|t: &[Tensor]| {
        t[0].index_select(&ids)
    })
}

fn grad_dropout(device: Device) -> TestResult {
    let x = param(&[4, 5], -1.0, 1.0, 110, device);
    // A fresh generator with the same seed on every evaluation fixes the mask.
    let f = |t: &[Tensor]| t[0].dropout(0.3, &mut rng::seeded(5, rng::streams::DROPOUT));
    check("dropout", &[x], &f)
}

fn grad_losses(device: Device) -> TestResult {
    let logits = param(&[4, 3], -2.0, 2.0, 120, device);
    let labels = tensor(&[0., 2., 1., 2.], &[4], device);
    check("cross_entropy", &[logits], &|t: &[Tensor]| {
        loss::cross_entropy(&t[0], &labels)
    })?;

    let out = param(&[4, 3], -1.0, 1.0, 121, device);
    let target = uniform(&[4, 3], -1.0, 1.0, 122, device);
    check("mse", &[out], &|t: &[Tensor]| loss::mse(&t[0], &target))?;
    let column = param(&[4, 1], -1.0, 1.0, 123, device);
    let flat_target = uniform(&[4], -1.0, 1.0, 124, device);
    check("mse [n,1] vs [n]", &[column], &|t: &[Tensor]| {
        loss::mse(&t[0], &flat_target)
    })?;

    let z = param(&[6], -3.0, 3.0, 125, device);
    let hard = tensor(&[1., 0., 0., 1., 1., 0.], &[6], device);
    let soft = tensor(&[0.2, 0.9, 0.5, 1., 0., 0.7], &[6], device);
    let bce = loss::binary_cross_entropy_with_logits;
    check(
        "bce (0/1 targets)",
        std::slice::from_ref(&z),
        &|t: &[Tensor]| bce(&t[0], &hard),
    )?;
    check("bce (soft targets)", &[z], &|t: &[Tensor]| {
        bce(&t[0], &soft)
    })
}

fn grad_layer_norm(device: Device) -> TestResult {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(1, rng::streams::INIT);
    let ln = LayerNorm::new(
        &mut ParamBuilder::new(&mut store, &mut init, device),
        5,
        1e-5,
    )?;
    // Non-trivial scale and shift, so that their gradients differ per element.
    ln.gamma
        .copy_from_slice(&uniform(&[5], 0.5, 1.5, 130, device).to_vec())?;
    ln.beta
        .copy_from_slice(&uniform(&[5], -0.5, 0.5, 131, device).to_vec())?;
    let x = param(&[3, 5], -2.0, 2.0, 132, device);
    let f = |t: &[Tensor]| {
        use ringflow_ml::nn::Module;
        let mut dropout = rng::seeded(0, rng::streams::DROPOUT);
        ln.forward(&t[0], &mut Forward::new(true, &mut dropout))
    };
    check("layer_norm", &[x, ln.gamma.clone(), ln.beta.clone()], &f)
}

fn grad_mlp_parameters(device: Device) -> TestResult {
    for activation in ["tanh", "gelu", "gelu_exact", "sigmoid"] {
        let model = Model::build(
            &ModelSpec::mlp(&[3, 5, 4, 2], activation),
            &ModelRegistry::default(),
            3,
            device,
        )?;
        let x = uniform(&[6, 3], -2.0, 2.0, 140, device);
        let labels = tensor(&[0., 1., 1., 0., 1., 0.], &[6], device);
        let params: Vec<Tensor> = model.params().iter().map(|p| p.tensor.clone()).collect();
        let f = |_: &[Tensor]| {
            let mut dropout = rng::seeded(0, rng::streams::DROPOUT);
            loss::cross_entropy(&model.forward(&x, true, &mut dropout)?, &labels)
        };
        check(&format!("mlp ({activation})"), &params, &f)?;
    }
    Ok(())
}

device_test!(
    checker_catches_wrong_derivatives,
    grad_binary_same_shape,
    grad_binary_broadcast,
    grad_same_tensor_on_both_sides,
    grad_affine,
    grad_unary,
    grad_matmul,
    grad_linear,
    grad_softmax,
    grad_reductions,
    grad_layout,
    grad_concat,
    grad_index_select,
    grad_dropout,
    grad_losses,
    grad_layer_norm,
    grad_mlp_parameters,
);
