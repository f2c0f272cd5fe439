//! Forward values of the ops on small hand-computed examples, and the errors that invalid
//! arguments must produce (as `Err`, never as a panic).

use ringflow_ml::loss::{self, LossKind};
use ringflow_ml::{Device, GradStore, Tensor, rng};

use crate::helpers::*;

const TOL: f32 = 1e-6;

fn matmul_values(device: Device) -> TestResult {
    let a = tensor(&[1., 2., 3., 4., 5., 6.], &[2, 3], device);
    let b = tensor(&[7., 8., 9., 10., 11., 12.], &[3, 2], device);
    let c = a.matmul(&b)?;
    ensure(c.shape() == [2, 2], format!("shape {:?}", c.shape()))?;
    // [1·7+2·9+3·11, 1·8+2·10+3·12; 4·7+5·9+6·11, 4·8+5·10+6·12]
    assert_close(&c.to_vec(), &[58., 64., 139., 154.], TOL, "matmul")?;
    // Bigger than a kernel tile, against the definition.
    let (m, k, n) = (17, 33, 9);
    let x = uniform(&[m, k], -1.0, 1.0, 1, device);
    let y = uniform(&[k, n], -1.0, 1.0, 2, device);
    let (xv, yv) = (x.to_vec(), y.to_vec());
    let want: Vec<f32> = (0..m * n)
        .map(|ij| {
            (0..k)
                .map(|p| xv[ij / n * k + p] * yv[p * n + ij % n])
                .sum()
        })
        .collect();
    assert_close(&x.matmul(&y)?.to_vec(), &want, 1e-4, "matmul 17x33·33x9")
}

fn softmax_values(device: Device) -> TestResult {
    let x = tensor(&[1., 2., 3.], &[3], device);
    // e^i / (e + e² + e³)
    assert_close(
        &x.softmax(-1)?.to_vec(),
        &[0.090_030_57, 0.244_728_47, 0.665_240_96],
        TOL,
        "softmax",
    )?;
    // i - ln(e + e² + e³)
    assert_close(
        &x.log_softmax(0)?.to_vec(),
        &[-2.407_606, -1.407_606, -0.407_606],
        1e-5,
        "log_softmax",
    )?;
    // Along the first axis: column 0 is softmax(1, 3), column 1 softmax(2, 2).
    let m = tensor(&[1., 2., 3., 2.], &[2, 2], device);
    assert_close(
        &m.softmax(0)?.to_vec(),
        &[0.119_202_92, 0.5, 0.880_797_1, 0.5],
        TOL,
        "softmax(0)",
    )?;
    // Huge logits stay finite.
    let big = tensor(&[1000., 1001., 1002.], &[1, 3], device);
    assert_close(
        &big.softmax(1)?.to_vec(),
        &[0.090_030_57, 0.244_728_47, 0.665_240_96],
        TOL,
        "softmax(big)",
    )?;
    assert_close(
        &big.log_softmax(1)?.to_vec(),
        &[-2.407_606, -1.407_606, -0.407_606],
        1e-4,
        "log_softmax(big)",
    )
}

fn broadcasting_values(device: Device) -> TestResult {
    let col = tensor(&[1., 2., 3.], &[3, 1], device);
    let row = tensor(&[10., 20.], &[2], device);
    let s = col.add(&row)?;
    ensure(
        s.shape() == [3, 2],
        format!("[3,1]+[2] has shape {:?}", s.shape()),
    )?;
    assert_close(
        &s.to_vec(),
        &[11., 21., 12., 22., 13., 23.],
        TOL,
        "[3,1]+[2]",
    )?;
    let m = tensor(&[1., 2., 3., 4., 5., 6.], &[2, 3], device);
    let two = Tensor::scalar(2.0, device)?;
    let d = two.div(&m)?;
    ensure(
        d.shape() == [2, 3],
        format!("[]/[2,3] has shape {:?}", d.shape()),
    )?;
    assert_close(
        &d.to_vec(),
        &[2., 1., 2. / 3., 0.5, 0.4, 1. / 3.],
        TOL,
        "[]/[2,3]",
    )?;
    let v = tensor(&[1., 10., 100.], &[3], device);
    assert_close(
        &m.sub(&v)?.to_vec(),
        &[0., -8., -97., 3., -5., -94.],
        TOL,
        "[2,3]-[3]",
    )?;
    assert_close(
        &v.sub(&m)?.to_vec(),
        &[0., 8., 97., -3., 5., 94.],
        TOL,
        "[3]-[2,3]",
    )?;
    let c2 = tensor(&[2., 4.], &[2, 1], device);
    assert_close(
        &m.div(&c2)?.to_vec(),
        &[0.5, 1., 1.5, 1., 1.25, 1.5],
        TOL,
        "[2,3]/[2,1]",
    )?;
    let r3 = tensor(&[1., 0., -1.], &[1, 1, 3], device);
    let p = c2.mul(&r3)?;
    ensure(
        p.shape() == [1, 2, 3],
        format!("[2,1]*[1,1,3] has shape {:?}", p.shape()),
    )?;
    assert_close(
        &p.to_vec(),
        &[2., 0., -2., 4., 0., -4.],
        TOL,
        "[2,1]*[1,1,3]",
    )
}

fn reduction_values(device: Device) -> TestResult {
    let m = tensor(&[1., 2., 3., 4., 5., 6.], &[2, 3], device);
    assert_close(&m.sum_all()?.to_vec(), &[21.], TOL, "sum_all")?;
    ensure(m.sum_all()?.shape().is_empty(), "sum_all is 0-dimensional")?;
    assert_close(&[m.mean_all()?.item()?], &[3.5], TOL, "mean_all")?;
    let s0 = m.sum(0, false)?;
    ensure(s0.shape() == [3], format!("sum(0) shape {:?}", s0.shape()))?;
    assert_close(&s0.to_vec(), &[5., 7., 9.], TOL, "sum(0)")?;
    let s1 = m.sum(1, true)?;
    ensure(
        s1.shape() == [2, 1],
        format!("sum(1, keepdim) shape {:?}", s1.shape()),
    )?;
    assert_close(&s1.to_vec(), &[6., 15.], TOL, "sum(1, keepdim)")?;
    assert_close(&m.mean(-1, false)?.to_vec(), &[2., 5.], TOL, "mean(-1)")?;
    let mk = m.mean(0, true)?;
    ensure(
        mk.shape() == [1, 3],
        format!("mean(0, keepdim) shape {:?}", mk.shape()),
    )?;
    assert_close(&mk.to_vec(), &[2.5, 3.5, 4.5], TOL, "mean(0, keepdim)")
}

fn elementwise_values(device: Device) -> TestResult {
    let x = tensor(&[-1., 0., 0.5, 2.], &[4], device);
    assert_close(&x.neg()?.to_vec(), &[1., -0., -0.5, -2.], TOL, "neg")?;
    assert_close(&x.relu()?.to_vec(), &[0., 0., 0.5, 2.], TOL, "relu")?;
    assert_close(&x.square()?.to_vec(), &[1., 0., 0.25, 4.], TOL, "square")?;
    assert_close(
        &x.exp()?.to_vec(),
        &[(-1f32).exp(), 1., 0.5f32.exp(), 2f32.exp()],
        1e-6,
        "exp",
    )?;
    assert_close(
        &x.tanh()?.to_vec(),
        &[-0.761_594_2, 0., 0.462_117_16, 0.964_027_6],
        TOL,
        "tanh",
    )?;
    assert_close(
        &x.sigmoid()?.to_vec(),
        &[0.268_941_43, 0.5, 0.622_459_3, 0.880_797_1],
        TOL,
        "sigmoid",
    )?;
    // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
    assert_close(
        &x.gelu()?.to_vec(),
        &[-0.158_808, 0., 0.345_714, 1.954_597_7],
        1e-5,
        "gelu",
    )?;
    // 0.5·x·(1 + erf(x/√2)), from Python's math.erf in float64.
    assert_close(
        &x.gelu_exact()?.to_vec(),
        &[-0.158_655_25, 0., 0.345_731_23, 1.954_499_7],
        1e-6,
        "gelu_exact",
    )?;
    assert_close(
        &x.affine(3.0, 1.0)?.to_vec(),
        &[-2., 1., 2.5, 7.],
        TOL,
        "affine",
    )?;
    assert_close(&x.scale(-2.0)?.to_vec(), &[2., 0., -1., -4.], TOL, "scale")?;
    assert_close(
        &x.add_scalar(0.5)?.to_vec(),
        &[-0.5, 0.5, 1., 2.5],
        TOL,
        "add_scalar",
    )?;
    let p = tensor(&[1., 4., std::f32::consts::E, 0.25], &[4], device);
    assert_close(
        &p.sqrt()?.to_vec(),
        &[1., 2., std::f32::consts::E.sqrt(), 0.5],
        TOL,
        "sqrt",
    )?;
    assert_close(
        &p.log()?.to_vec(),
        &[0., 4f32.ln(), 1., 0.25f32.ln()],
        TOL,
        "log",
    )?;
    let extreme = tensor(&[-1000., 1000.], &[2], device);
    assert_close(
        &extreme.sigmoid()?.to_vec(),
        &[0., 1.],
        0.0,
        "sigmoid at ±1000",
    )
}

fn layout_values(device: Device) -> TestResult {
    let m = tensor(&[1., 2., 3., 4., 5., 6.], &[2, 3], device);
    let t = m.transpose(0, 1)?;
    ensure(
        t.shape() == [3, 2],
        format!("transpose shape {:?}", t.shape()),
    )?;
    assert_close(&t.to_vec(), &[1., 4., 2., 5., 3., 6.], 0.0, "transpose")?;
    assert_close(
        &m.reshape(&[3, 2])?.to_vec(),
        &m.to_vec(),
        0.0,
        "reshape keeps the order",
    )?;
    // permute([2, 0, 1]): out[k][i][j] = x[i][j][k] for x of shape [2, 3, 4].
    let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let x = tensor(&data, &[2, 3, 4], device);
    let p = x.permute(&[2, 0, 1])?;
    ensure(
        p.shape() == [4, 2, 3],
        format!("permute shape {:?}", p.shape()),
    )?;
    let want: Vec<f32> = (0..24)
        .map(|o| {
            let (k, i, j) = (o / 6, (o / 3) % 2, o % 3);
            data[i * 12 + j * 4 + k]
        })
        .collect();
    assert_close(&p.to_vec(), &want, 0.0, "permute")?;
    let a = tensor(&[1., 2.], &[2, 1], device);
    let c = Tensor::concat(&[&a, &m, &a], 1)?;
    ensure(
        c.shape() == [2, 5],
        format!("concat(1) shape {:?}", c.shape()),
    )?;
    assert_close(
        &c.to_vec(),
        &[1., 1., 2., 3., 1., 2., 4., 5., 6., 2.],
        0.0,
        "concat(1)",
    )?;
    let r = tensor(&[7., 8., 9.], &[1, 3], device);
    assert_close(
        &Tensor::concat(&[&r, &m], 0)?.to_vec(),
        &[7., 8., 9., 1., 2., 3., 4., 5., 6.],
        0.0,
        "concat(0)",
    )?;
    assert_close(
        &m.narrow(1, 1, 2)?.to_vec(),
        &[2., 3., 5., 6.],
        0.0,
        "narrow(1)",
    )?;
    assert_close(
        &m.narrow(0, 1, 1)?.to_vec(),
        &[4., 5., 6.],
        0.0,
        "narrow(0)",
    )?;
    let table = tensor(&[0., 1., 10., 11., 20., 21.], &[3, 2], device);
    let ids = tensor(&[2., 0., 2., 1.], &[2, 2], device);
    let g = table.index_select(&ids)?;
    ensure(
        g.shape() == [2, 2, 2],
        format!("index_select shape {:?}", g.shape()),
    )?;
    assert_close(
        &g.to_vec(),
        &[20., 21., 0., 1., 20., 21., 10., 11.],
        0.0,
        "index_select",
    )?;
    // An ndarray in another memory order is read in its logical (row-major) order.
    let transposed =
        ndarray::Array2::from_shape_vec((3, 2), vec![1., 2., 3., 4., 5., 6.])?.reversed_axes();
    let t = Tensor::from_array(transposed.into_dyn(), device)?;
    ensure(
        t.shape() == [2, 3],
        format!("from_array shape {:?}", t.shape()),
    )?;
    assert_close(
        &t.to_vec(),
        &[1., 3., 5., 2., 4., 6.],
        0.0,
        "from_array of a transposed array",
    )
}

fn dropout_values(device: Device) -> TestResult {
    let x = Tensor::ones(&[100, 100], device)?;
    let mut r = rng::seeded(9, rng::streams::DROPOUT);
    assert_close(
        &x.dropout(0.0, &mut r)?.to_vec(),
        &x.to_vec(),
        0.0,
        "dropout(0)",
    )?;
    let y = x.dropout(0.25, &mut r)?.to_vec();
    let zeros = y.iter().filter(|&&v| v == 0.0).count();
    ensure(
        y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6),
        "kept values are scaled by 1/(1-p)",
    )?;
    ensure(
        (2200..2800).contains(&zeros),
        format!("{zeros} of 10000 zeroed with p = 0.25"),
    )?;
    let a = x.dropout(0.5, &mut rng::seeded(3, 2))?.to_vec();
    let b = x.dropout(0.5, &mut rng::seeded(3, 2))?.to_vec();
    ensure(a == b, "the same seed gives the same mask")?;
    let c = x.dropout(0.5, &mut rng::seeded(4, 2))?.to_vec();
    ensure(a != c, "another seed gives another mask")?;
    for p in [1.0, -0.1, f32::NAN] {
        ensure(
            x.dropout(p, &mut r).is_err(),
            format!("dropout({p}) must be an error"),
        )?;
    }
    Ok(())
}

fn loss_values(device: Device) -> TestResult {
    // Row 1: ln(e + e² + e³) - 3; row 2: same minus 1 instead of 3.
    let logits = tensor(&[1., 2., 3., 1., 2., 3.], &[2, 3], device);
    let labels = tensor(&[2., 0.], &[2], device);
    let ce = loss::cross_entropy(&logits, &labels)?;
    ensure(ce.shape().is_empty(), "cross_entropy is 0-dimensional")?;
    assert_close(
        &ce.to_vec(),
        &[(0.407_606 + 2.407_606) / 2.0],
        1e-5,
        "cross_entropy",
    )?;
    // Huge logits: finite loss and gradient.
    let big = tensor(&[1e4, -1e4], &[1, 2], device).into_parameter()?;
    let l = loss::cross_entropy(&big, &tensor(&[0.], &[1], device))?;
    ensure(
        l.item()?.abs() < 1e-3,
        format!("confident correct logits: loss {}", l.item()?),
    )?;
    let grads = l.backward()?;
    ensure(
        grads
            .get(&big)
            .expect("grad")
            .to_vec()
            .iter()
            .all(|v| v.is_finite()),
        "finite gradient",
    )?;
    // ((1-0)² + (2-4)²) / 2
    let mse = loss::mse(
        &tensor(&[1., 2.], &[2], device),
        &tensor(&[0., 4.], &[2], device),
    )?;
    assert_close(&mse.to_vec(), &[2.5], TOL, "mse")?;
    let column = loss::mse(
        &tensor(&[1., 2.], &[2, 1], device),
        &tensor(&[0., 4.], &[2], device),
    )?;
    assert_close(&column.to_vec(), &[2.5], TOL, "mse [n,1] vs [n]")?;
    // x=0, z=1: ln 2; x=2, z=0: 2 + ln(1 + e⁻²).
    let z = tensor(&[0., 2.], &[2], device);
    let t = tensor(&[1., 0.], &[2], device);
    let bce = loss::binary_cross_entropy_with_logits(&z, &t)?;
    assert_close(&bce.to_vec(), &[1.410_037_6], 1e-6, "bce")?;
    let huge = loss::binary_cross_entropy_with_logits(
        &tensor(&[-1e4], &[1], device),
        &tensor(&[1.], &[1], device),
    )?;
    assert_close(&huge.to_vec(), &[1e4], 1.0, "bce of a huge wrong logit")?;
    // LossKind dispatches, reshaping a [n, 1] output for binary cross-entropy.
    let via_kind = LossKind::BinaryCrossEntropy.compute(&z.reshape(&[2, 1])?, &t)?;
    assert_close(
        &via_kind.to_vec(),
        &[1.410_037_6],
        1e-6,
        "LossKind::BinaryCrossEntropy",
    )?;
    assert_close(
        &LossKind::CrossEntropy.compute(&logits, &labels)?.to_vec(),
        &ce.to_vec(),
        0.0,
        "LossKind::CrossEntropy",
    )
}

/// Tensors large enough for the multithreaded kernels give exactly what a serial loop gives.
fn large_tensors_match_serial_loops(device: Device) -> TestResult {
    let (rows, cols) = (300, 257);
    let n = rows * cols;
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let bs: Vec<f32> = (0..cols).map(|j| j as f32 * 0.01 - 1.0).collect();
    let x = Tensor::from_vec(xs.clone(), &[rows, cols], device)?;
    let b = Tensor::from_vec(bs.clone(), &[cols], device)?;
    let relu = x.relu()?.to_vec();
    let biased = x.add(&b)?.to_vec();
    let affine = x.affine(2.0, 0.5)?.to_vec();
    for i in 0..n {
        ensure(relu[i] == xs[i].max(0.0), format!("relu at {i}"))?;
        ensure(
            biased[i] == xs[i] + bs[i % cols],
            format!("bias add at {i}"),
        )?;
        ensure(affine[i] == xs[i] * 2.0 + 0.5, format!("affine at {i}"))?;
    }
    // Reductions to a bias and the relu backward, through a parameter's gradient.
    let p = Tensor::from_vec(xs.clone(), &[rows, cols], device)?.into_parameter()?;
    let bias = Tensor::zeros(&[cols], device)?.into_parameter()?;
    let mut grads = GradStore::new();
    p.add(&bias)?.relu()?.sum_all()?.backward_into(&mut grads)?;
    let gp = grads.get(&p).expect("a gradient").to_vec();
    let gb = grads.get(&bias).expect("a gradient").to_vec();
    for i in 0..n {
        ensure(
            gp[i] == if xs[i] > 0.0 { 1.0 } else { 0.0 },
            format!("relu grad at {i}"),
        )?;
    }
    for j in 0..cols {
        let want = (0..rows).filter(|r| xs[r * cols + j] > 0.0).count() as f32;
        ensure(
            gb[j] == want,
            format!("bias grad at {j}: {} vs {want}", gb[j]),
        )?;
    }
    // A stale (zeroed) gradient is overwritten, not added to, by the next pass.
    grads.zero();
    p.add(&bias)?.relu()?.sum_all()?.backward_into(&mut grads)?;
    ensure(
        grads.get(&p).expect("a gradient").to_vec() == gp,
        "after zero_grad",
    )?;
    Ok(())
}

device_test!(
    large_tensors_match_serial_loops,
    matmul_values,
    softmax_values,
    broadcasting_values,
    reduction_values,
    elementwise_values,
    layout_values,
    dropout_values,
    loss_values,
);
