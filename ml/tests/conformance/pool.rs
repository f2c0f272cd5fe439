//! Max, average and global average pooling and flattening against direct nested-loop
//! references (values and gradients), finite differences, and their argument errors.

use ringflow_ml::{Device, GradStore, Pool2dOptions, Tensor};

use crate::helpers::*;

/// A pooling case: input `[n, C, H, W]` and options.
type Case = ([usize; 4], Pool2dOptions);

fn opts(kernel: [usize; 2], stride: Option<[usize; 2]>, padding: [usize; 2]) -> Pool2dOptions {
    Pool2dOptions {
        kernel,
        stride,
        padding,
    }
}

/// Non-overlapping windows (with a remainder), overlapping ones (stride < kernel), padding,
/// non-square windows and inputs, a window over the whole plane, batch 1, and planes enough to
/// run in parallel.
fn cases() -> Vec<Case> {
    vec![
        ([2, 3, 6, 6], Pool2dOptions::square(2)),
        ([2, 2, 7, 5], Pool2dOptions::square(2)),
        ([2, 2, 7, 7], opts([3, 3], Some([2, 2]), [0, 0])),
        ([1, 3, 7, 7], opts([3, 3], Some([2, 2]), [1, 1])),
        ([2, 2, 5, 6], opts([3, 3], Some([1, 1]), [1, 1])),
        ([2, 2, 5, 8], opts([2, 3], Some([1, 2]), [1, 1])),
        ([3, 2, 4, 5], opts([4, 5], None, [0, 0])),
        ([8, 16, 24, 24], Pool2dOptions::square(2)),
        ([4, 8, 30, 30], opts([3, 3], Some([2, 2]), [1, 1])),
    ]
}

/// `[n, C, oh, ow]` of a case.
fn out_shape((x, o): &Case) -> [usize; 4] {
    let stride = o.stride.unwrap_or(o.kernel);
    let size = |d: usize| (x[2 + d] + 2 * o.padding[d] - o.kernel[d]) / stride[d] + 1;
    [x[0], x[1], size(0), size(1)]
}

/// Calls `f(out_index, cells)` with the flat input indices of every output's window (padding
/// left out), in row-major order.
fn for_each_window(c: &Case, mut f: impl FnMut(usize, Vec<usize>)) {
    let ([_, _, h, w], o) = c;
    let out = out_shape(c);
    let stride = o.stride.unwrap_or(o.kernel);
    for plane in 0..out[0] * out[1] {
        for y in 0..out[2] {
            for x in 0..out[3] {
                let mut cells = Vec::new();
                for i in 0..o.kernel[0] {
                    for j in 0..o.kernel[1] {
                        let iy = (y * stride[0] + i) as isize - o.padding[0] as isize;
                        let ix = (x * stride[1] + j) as isize - o.padding[1] as isize;
                        if (0..*h as isize).contains(&iy) && (0..*w as isize).contains(&ix) {
                            cells.push(plane * h * w + iy as usize * w + ix as usize);
                        }
                    }
                }
                f((plane * out[2] + y) * out[3] + x, cells);
            }
        }
    }
}

/// Max and average pooling by definition, and their gradients of `Σ y · r`.
fn reference(c: &Case, x: &[f32], r: &[f32]) -> [Vec<f32>; 4] {
    let n = out_shape(c).iter().product();
    let (mut max, mut avg) = (vec![0.0; n], vec![0.0; n]);
    let (mut dmax, mut davg) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for_each_window(c, |o, cells| {
        let best = cells
            .iter()
            .copied()
            .reduce(|b, i| if x[i] > x[b] { i } else { b })
            .expect("every window has a cell");
        max[o] = x[best];
        dmax[best] += r[o];
        let count = cells.len() as f32;
        avg[o] = cells.iter().map(|&i| x[i] as f64).sum::<f64>() as f32 / count;
        for &i in &cells {
            davg[i] += r[o] / count;
        }
    });
    [max, avg, dmax, davg]
}

/// Distinct values at least 0.1 apart, so that finite differences never change a maximum.
fn distinct(shape: &[usize], seed: u64, device: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let order = uniform(&[n], 0.0, 1.0, seed, Device::Cpu).to_vec();
    let mut rank: Vec<usize> = (0..n).collect();
    rank.sort_by(|&a, &b| order[a].total_cmp(&order[b]));
    let mut data = vec![0.0; n];
    for (k, &i) in rank.iter().enumerate() {
        data[i] = k as f32 * 0.1 - n as f32 * 0.05;
    }
    Tensor::from_vec(data, shape, device)
        .and_then(Tensor::into_parameter)
        .expect("shape")
}

fn pool_values_and_gradients(device: Device) -> TestResult {
    for (k, c) in cases().iter().enumerate() {
        let (shape, o) = c;
        let what = |op: &str| format!("{op} {shape:?} {o:?}");
        let x = param(shape, -1.0, 1.0, 20 + k as u64, device);
        let r = uniform(&out_shape(c), -1.0, 1.0, 40 + k as u64, device);
        let [max, avg, dmax, davg] = reference(c, &x.to_vec(), &r.to_vec());
        let y = x.max_pool2d(*o)?;
        ensure(y.shape() == out_shape(c), what("max_pool2d shape"))?;
        assert_close(&y.to_vec(), &max, 0.0, &what("max_pool2d"))?;
        let mut grads = GradStore::new();
        y.mul(&r)?.sum_all()?.backward_into(&mut grads)?;
        assert_close(
            &grads.get(&x).ok_or("no grad")?.to_vec(),
            &dmax,
            1e-5,
            &what("dmax"),
        )?;
        grads.zero();
        let y = x.avg_pool2d(*o)?;
        assert_close(&y.to_vec(), &avg, 1e-5, &what("avg_pool2d"))?;
        y.mul(&r)?.sum_all()?.backward_into(&mut grads)?;
        assert_close(
            &grads.get(&x).ok_or("no grad")?.to_vec(),
            &davg,
            1e-5,
            &what("davg"),
        )?;
    }
    Ok(())
}

/// A window's first maximum wins ties; a NaN wins and stays; and a window that holds only
/// padding and negative values still returns a value of the input (padding never wins).
fn max_pool_ties_nan_and_padding(device: Device) -> TestResult {
    let x = tensor(&[1., 1., 0., 1.], &[1, 1, 2, 2], device).into_parameter()?;
    let y = x.max_pool2d(Pool2dOptions::square(2))?;
    let grads = y.sum_all()?.backward()?;
    assert_close(
        &grads.get(&x).ok_or("no grad")?.to_vec(),
        &[1., 0., 0., 0.],
        0.0,
        "tie",
    )?;
    let nan = tensor(&[1., f32::NAN, 3., 2.], &[1, 1, 2, 2], device);
    ensure(
        nan.max_pool2d(Pool2dOptions::square(2))?.to_vec()[0].is_nan(),
        "a NaN in a window must give NaN",
    )?;
    let negative = tensor(&[-5., -6., -7., -8.], &[1, 1, 2, 2], device);
    let padded = opts([3, 3], Some([2, 2]), [1, 1]);
    assert_close(
        &negative.max_pool2d(padded)?.to_vec(),
        &[-5.],
        0.0,
        "max over padding",
    )?;
    assert_close(
        &negative.avg_pool2d(padded)?.to_vec(),
        &[-6.5],
        1e-6,
        "average without the padding",
    )
}

fn grad_pools(device: Device) -> TestResult {
    let small = [
        ([2, 2, 5, 4], opts([3, 2], Some([1, 1]), [1, 1])),
        ([1, 2, 5, 5], opts([3, 3], Some([2, 2]), [1, 1])),
        ([2, 1, 4, 6], Pool2dOptions::square(2)),
    ];
    for (k, (shape, o)) in small.into_iter().enumerate() {
        let x = distinct(&shape, 60 + k as u64, device);
        check_grads(std::slice::from_ref(&x), &|t: &[Tensor]| t[0].max_pool2d(o))
            .map_err(|e| format!("max_pool2d {shape:?} {o:?}: {e}"))?;
        check_grads(&[x], &|t: &[Tensor]| t[0].avg_pool2d(o))
            .map_err(|e| format!("avg_pool2d {shape:?} {o:?}: {e}"))?;
    }
    let x = param(&[2, 3, 3, 4], -1.0, 1.0, 70, device);
    check_grads(std::slice::from_ref(&x), &|t: &[Tensor]| {
        t[0].global_avg_pool2d()
    })
    .map_err(|e| format!("global_avg_pool2d: {e}"))?;
    let f = |t: &[Tensor]| t[0].flatten()?.matmul(&t[1]);
    let w = param(&[36, 2], -1.0, 1.0, 71, device);
    check_grads(&[x, w], &f).map_err(|e| format!("flatten: {e}").into())
}

fn global_avg_pool_and_flatten_values(device: Device) -> TestResult {
    let x = uniform(&[2, 3, 4, 5], -1.0, 1.0, 80, device);
    let xv = x.to_vec();
    let want: Vec<f32> = xv
        .chunks(20)
        .map(|plane| plane.iter().sum::<f32>() / 20.0)
        .collect();
    let g = x.global_avg_pool2d()?;
    ensure(g.shape() == [2, 3], format!("global shape {:?}", g.shape()))?;
    assert_close(&g.to_vec(), &want, 1e-6, "global_avg_pool2d")?;
    let f = x.flatten()?;
    ensure(
        f.shape() == [2, 60],
        format!("flatten shape {:?}", f.shape()),
    )?;
    assert_close(&f.to_vec(), &xv, 0.0, "flatten keeps the order")?;
    let v = uniform(&[3], -1.0, 1.0, 81, device).flatten()?;
    ensure(
        v.shape() == [3, 1],
        format!("flatten of [3]: {:?}", v.shape()),
    )
}

/// Every invalid pooling is one error naming the op and the shapes.
fn pool_errors(device: Device) -> TestResult {
    let x = Tensor::zeros(&[2, 3, 8, 8], device)?;
    let cases: Vec<(ringflow_ml::Result<Tensor>, &str)> = vec![
        (
            x.max_pool2d(opts([3, 3], None, [2, 1])),
            "max_pool2d: padding [2, 1] must be at most half the kernel [3, 3]",
        ),
        (
            x.avg_pool2d(opts([0, 2], None, [0, 0])),
            "avg_pool2d: the kernel [0, 2] must be at least 1",
        ),
        (
            x.max_pool2d(opts([2, 2], Some([1, 0]), [0, 0])),
            "max_pool2d: the stride [1, 0] must be at least 1",
        ),
        (
            x.avg_pool2d(Pool2dOptions::square(9)),
            "avg_pool2d: the input [8, 8] padded by [0, 0] is smaller than the kernel [9, 9]",
        ),
        (
            x.reshape(&[6, 8, 8])?.max_pool2d(Pool2dOptions::square(2)),
            "max_pool2d: the input [6, 8, 8] is not a [batch, channels, height, width]",
        ),
        (
            Tensor::zeros(&[1, 1, 0, 3], device)?.avg_pool2d(opts([2, 2], None, [1, 1])),
            "avg_pool2d: the input [0, 3] has no cells",
        ),
        (
            x.reshape(&[6, 64])?.global_avg_pool2d(),
            "global_avg_pool2d: the input [6, 64] is not",
        ),
        (
            Tensor::scalar(1.0, device)?.flatten(),
            "flatten: a 0-dimensional tensor",
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
    Ok(())
}

device_test!(
    pool_values_and_gradients,
    max_pool_ties_nan_and_padding,
    grad_pools,
    global_avg_pool_and_flatten_values,
    pool_errors,
);
