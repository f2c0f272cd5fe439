//! Semantics of the graph: what records, where gradients go, how they accumulate and reset.

use ringflow_ml::{Device, GradStore, NoGradGuard, Tensor, no_grad};

use crate::helpers::*;

fn no_grad_records_nothing(device: Device) -> TestResult {
    let x = param(&[2, 2], -1.0, 1.0, 1, device);
    ensure(
        x.requires_grad() && x.is_leaf(),
        "a parameter is a leaf that requires grad",
    )?;
    let y = no_grad(|| x.mul(&x).and_then(|t| t.sum_all()))?;
    ensure(
        !y.requires_grad(),
        "a tensor computed under no_grad requires grad",
    )?;
    ensure(y.is_leaf(), "a tensor computed under no_grad is not a leaf")?;
    ensure(
        y.backward().is_err(),
        "backward from a no_grad result must be an error",
    )?;
    {
        let _outer = NoGradGuard::new();
        no_grad(|| ());
        // Leaving the inner scope must not turn recording back on inside the outer one.
        ensure(
            !x.exp()?.requires_grad(),
            "recording resumed inside an outer NoGradGuard",
        )?;
    }
    let z = x.exp()?;
    ensure(
        z.requires_grad() && !z.is_leaf(),
        "recording did not resume after no_grad",
    )?;
    // Ops on tensors that need no gradient record nothing either.
    let c = Tensor::ones(&[2, 2], device)?;
    let d = c.add(&c)?;
    ensure(
        !d.requires_grad() && d.is_leaf(),
        "constants produced a recorded tensor",
    )?;
    ensure(
        d.backward().is_err(),
        "backward through constants must be an error",
    )
}

fn backward_needs_one_element(device: Device) -> TestResult {
    let x = param(&[2, 3], -1.0, 1.0, 2, device);
    let y = x.mul(&x)?;
    let mut grads = GradStore::new();
    match y.backward_into(&mut grads) {
        Ok(()) => Err("backward from a [2, 3] tensor succeeded".into()),
        Err(e) => ensure(
            e.to_string().contains("[2, 3]"),
            format!("the error does not name the shape: {e}"),
        ),
    }?;
    ensure(grads.get(&x).is_none(), "a failed backward left a gradient")?;
    // A [1, 1] result is a valid start, as is a scalar parameter itself.
    x.sum(1, true)?.sum(0, true)?.backward_into(&mut grads)?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[1.0; 6],
        0.0,
        "d sum / dx",
    )?;
    let s = Tensor::scalar(3.0, device)?.into_parameter()?;
    let grads = s.backward()?;
    assert_close(&grads.get(&s).expect("grad").to_vec(), &[1.0], 0.0, "ds/ds")
}

fn gradients_accumulate_until_zero_grad(device: Device) -> TestResult {
    let x = tensor(&[1., -2., 3.], &[3], device).into_parameter()?;
    let c = tensor(&[0.5, 2., -1.], &[3], device);
    let mut grads = GradStore::new();
    ensure(grads.get(&x).is_none(), "a fresh parameter has a gradient")?;
    let loss = || x.mul(&c)?.sum_all();
    loss()?.backward_into(&mut grads)?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[0.5, 2., -1.],
        0.0,
        "first backward",
    )?;
    loss()?.backward_into(&mut grads)?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[1., 4., -2.],
        0.0,
        "second backward adds",
    )?;
    grads.zero();
    assert_close(
        &grads.get(&x).expect("grad buffer kept").to_vec(),
        &[0.; 3],
        0.0,
        "after zero_grad",
    )?;
    // x² through a different graph after the reset: 2x.
    x.square()?.sum_all()?.backward_into(&mut grads)?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[2., -4., 6.],
        0.0,
        "after reset",
    )?;
    // The grad-buffer helpers agree with get().
    let mut buf = [0.0; 3];
    grads.copy_to_slice(&x, &mut buf)?;
    assert_close(&buf, &[2., -4., 6.], 0.0, "copy_grad_to_slice")?;
    let params = [x.clone()];
    let norm = grads.norm(&params)?;
    ensure((norm * norm - 56.0).abs() < 1e-9, "grad_sum_squares")?;
    grads.scale(&params, 0.5)?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[1., -2., 3.],
        0.0,
        "scale_grad",
    )?;
    grads.copy_from_slice(&x, &[7., 8., 9.])?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[7., 8., 9.],
        0.0,
        "copy_grad_from_slice",
    )?;
    // get() is a snapshot, not a live view.
    let snapshot = grads.get(&x).expect("grad");
    grads.zero();
    assert_close(
        &snapshot.to_vec(),
        &[7., 8., 9.],
        0.0,
        "snapshot after zero_grad",
    )
}

fn gradients_reach_only_parameters(device: Device) -> TestResult {
    let w = param(&[3, 2], -1.0, 1.0, 3, device);
    let unused = param(&[2], -1.0, 1.0, 4, device);
    let x = uniform(&[4, 3], -1.0, 1.0, 5, device);
    let h = x.matmul(&w)?;
    ensure(h.requires_grad() && !h.is_leaf(), "x·w is recorded")?;
    let grads = h.tanh()?.sum_all()?.backward()?;
    ensure(grads.get(&w).is_some(), "w got no gradient")?;
    ensure(
        grads.get(&unused).is_none(),
        "an unused parameter got a gradient",
    )?;
    ensure(grads.get(&x).is_none(), "a constant input got a gradient")?;
    ensure(
        grads.get(&h).is_none(),
        "an intermediate tensor kept a gradient",
    )?;
    // detach cuts the graph: only the attached factor contributes.
    let p = tensor(&[3.0], &[1], device).into_parameter()?;
    let mut grads = p.detach()?.mul(&p)?.sum_all()?.backward()?;
    assert_close(
        &grads.get(&p).expect("grad").to_vec(),
        &[3.0],
        0.0,
        "d(stop(p)·p)/dp",
    )?;
    ensure(!p.detach()?.requires_grad(), "detach requires grad")?;
    // into_parameter on a computed tensor makes a new leaf; gradients stop there.
    let q = p.square()?.into_parameter()?;
    ensure(
        q.is_leaf() && q.requires_grad(),
        "into_parameter of a result is a leaf parameter",
    )?;
    grads.zero();
    q.mul(&q)?.sum_all()?.backward_into(&mut grads)?;
    assert_close(
        &grads.get(&q).expect("grad").to_vec(),
        &[18.0],
        1e-5,
        "d(q²)/dq",
    )?;
    assert_close(
        &grads.get(&p).expect("grad").to_vec(),
        &[0.0],
        0.0,
        "p behind a new leaf",
    )
}

fn deep_chains_do_not_overflow(device: Device) -> TestResult {
    // 20 000 recorded ops: the backward pass must be iterative, not recursive.
    let x = Tensor::scalar(1.0, device)?.into_parameter()?;
    let mut y = x.clone();
    for _ in 0..20_000 {
        y = y.add_scalar(0.0)?;
    }
    let grads = y.scale(2.0)?.backward()?;
    assert_close(
        &grads.get(&x).expect("grad").to_vec(),
        &[2.0],
        0.0,
        "gradient through a long chain",
    )
}

/// Products big enough for the multithreaded GEMM kernels: `dA = R·Bᵀ` and `dB = Aᵀ·R` against
/// the definition, on the first backward pass (fresh buffers) and the second (accumulating).
fn matmul_gradients_at_scale(device: Device) -> TestResult {
    let (m, k, n) = (96, 257, 80);
    let a = param(&[m, k], -1.0, 1.0, 10, device);
    let b = param(&[k, n], -1.0, 1.0, 11, device);
    let r = uniform(&[m, n], -1.0, 1.0, 12, device);
    let (av, bv, rv) = (a.to_vec(), b.to_vec(), r.to_vec());
    let da: Vec<f32> = (0..m * k)
        .map(|ip| {
            (0..n)
                .map(|j| rv[ip / k * n + j] as f64 * bv[ip % k * n + j] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    let db: Vec<f32> = (0..k * n)
        .map(|pj| {
            (0..m)
                .map(|i| av[i * k + pj / n] as f64 * rv[i * n + pj % n] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    let mut grads = GradStore::new();
    for pass in 1..=2 {
        a.matmul(&b)?
            .mul(&r)?
            .sum_all()?
            .backward_into(&mut grads)?;
        let scale = |v: &[f32]| v.iter().map(|x| x * pass as f32).collect::<Vec<_>>();
        assert_close(
            &grads.get(&a).expect("grad").to_vec(),
            &scale(&da),
            1e-3,
            &format!("dA, pass {pass}"),
        )?;
        assert_close(
            &grads.get(&b).expect("grad").to_vec(),
            &scale(&db),
            1e-3,
            &format!("dB, pass {pass}"),
        )?;
    }
    Ok(())
}

fn values_round_trip(device: Device) -> TestResult {
    let x = tensor(&[1., 2., 3., 4.], &[2, 2], device);
    ensure(
        x.shape() == [2, 2] && x.rank() == 2 && x.numel() == 4,
        "shape, rank, numel",
    )?;
    ensure(x.device() == device, "device")?;
    let y = x.clone();
    x.copy_from_slice(&[5., 6., 7., 8.])?;
    assert_close(&y.to_vec(), &[5., 6., 7., 8.], 0.0, "clones share data")?;
    let d = x.detach()?;
    x.copy_from_slice(&[0.; 4])?;
    assert_close(&d.to_vec(), &[5., 6., 7., 8.], 0.0, "detach copies")?;
    ensure(x.to_array()?.shape() == [2, 2], "to_array shape")?;
    assert_close(
        &Tensor::full(&[3], 2.5, device)?.to_vec(),
        &[2.5; 3],
        0.0,
        "full",
    )?;
    assert_close(
        &Tensor::scalar(4.0, device)?.to_vec(),
        &[4.0],
        0.0,
        "scalar",
    )?;
    let a = Tensor::randn(&[1001], 2.0, &mut test_rng(1), device)?.to_vec();
    let mean = a.iter().sum::<f32>() / a.len() as f32;
    let std = (a.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / a.len() as f32).sqrt();
    ensure(
        mean.abs() < 0.2 && (std - 2.0).abs() < 0.2,
        format!("randn(std 2): mean {mean}, std {std}"),
    )?;
    let u = Tensor::uniform(&[1000], -3.0, -1.0, &mut test_rng(2), device)?.to_vec();
    ensure(u.iter().all(|v| (-3.0..-1.0).contains(v)), "uniform range")
}

/// Gradients leave and return through one flat buffer (the executors' gradient buckets), page-
/// locked where the device is a GPU. Copies to and from page-locked memory are asynchronous, so
/// the host touches the buffers right after each call returns, before anything else could wait
/// for the device: a gather or scatter that returned before its copies finished fails here.
fn gradients_gather_and_scatter(device: Device) -> TestResult {
    let a = param(&[3, 4], -1.0, 1.0, 1, device);
    let b = param(&[5], -1.0, 1.0, 2, device);
    let unused = param(&[2], -1.0, 1.0, 3, device);
    let mut want = vec![1.0f32; 12];
    want.extend([0.0, 0.0]);
    want.extend(b.to_vec().iter().map(|v| 2.0 * v));
    let mut grads = a.sum_all()?.add(&b.square()?.sum_all()?)?.backward()?;
    let params = [a.clone(), unused.clone(), b.clone()];
    let mut flat = vec![7.0f32; 12 + 2 + 5];
    let _pinned = device.pin_host(&mut flat)?;
    grads.gather(&params, &mut flat)?;
    assert_close(&flat, &want, 1e-6, "gathered gradients")?;
    let mut halves: Vec<f32> = flat.iter().map(|v| v / 2.0).collect();
    let pinned_halves = device.pin_host(&mut halves)?;
    grads.scatter(&params, &halves)?;
    // The scatter has returned: its buffer may be reused at once.
    halves.fill(f32::NAN);
    drop(pinned_halves);
    assert_close(
        &grads.get(&a).expect("a").to_vec(),
        &[0.5; 12],
        1e-6,
        "scattered a",
    )?;
    assert_close(
        &grads.get(&unused).expect("unused").to_vec(),
        &[0.0; 2],
        0.0,
        "scattered unused",
    )?;
    ensure(
        grads.gather(&params, &mut flat[1..]).is_err(),
        "a buffer of the wrong size is refused",
    )?;
    Ok(())
}

device_test!(
    gradients_gather_and_scatter,
    no_grad_records_nothing,
    backward_needs_one_element,
    gradients_accumulate_until_zero_grad,
    gradients_reach_only_parameters,
    deep_chains_do_not_overflow,
    matmul_gradients_at_scale,
    values_round_trip,
);
