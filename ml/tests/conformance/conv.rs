//! 2-D convolution against a direct nested-loop reference (values and gradients, many
//! geometries), central finite differences, and its argument errors.

use ringflow_ml::{Conv2dOptions, Device, GradStore, Tensor};

use crate::helpers::*;

/// One convolution: input `[n, C, H, W]`, weight `[O, C / groups, kh, kw]`, options.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub opts: Conv2dOptions,
}

/// A case with the given stride, padding, dilation and groups.
pub fn case(
    x: [usize; 4],
    w: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Case {
    Case {
        x,
        w,
        opts: Conv2dOptions {
            stride,
            padding,
            dilation,
            groups,
        },
    }
}

/// The geometries every device must get right: stride, padding, dilation, groups, depthwise
/// (with a channel multiplier, dilated, and large enough to run in parallel), non-square kernels and inputs, batch 1, 1×1 (read directly or,
/// strided, unrolled), more images than weight-gradient runs, LeNet's layers, and 3×3 and 5×5
/// with 16 channels or more (Winograd on the CPU: odd sizes, padding, a channel count that is
/// not a multiple of 8).
pub fn cases() -> Vec<Case> {
    vec![
        case([2, 3, 7, 6], [4, 3, 3, 3], [1, 1], [0, 0], [1, 1], 1),
        case([2, 3, 9, 8], [5, 3, 3, 3], [2, 2], [1, 1], [1, 1], 1),
        case([1, 2, 9, 9], [3, 2, 3, 3], [1, 1], [2, 2], [2, 2], 1),
        case([2, 4, 6, 6], [6, 2, 3, 3], [1, 1], [1, 1], [1, 1], 2),
        case([2, 4, 7, 7], [4, 1, 3, 3], [1, 1], [1, 1], [1, 1], 4),
        case([3, 4, 8, 8], [8, 1, 3, 3], [2, 2], [1, 1], [1, 1], 4),
        case([2, 3, 9, 8], [6, 1, 3, 2], [1, 2], [2, 1], [2, 1], 3),
        case([4, 8, 32, 32], [8, 1, 3, 3], [1, 1], [1, 1], [1, 1], 8),
        case([2, 3, 5, 9], [4, 3, 2, 4], [1, 2], [1, 0], [1, 1], 1),
        case([2, 2, 6, 10], [3, 2, 3, 2], [2, 1], [0, 2], [1, 2], 1),
        case([1, 3, 6, 6], [2, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        case([3, 5, 4, 4], [6, 5, 1, 1], [1, 1], [0, 0], [1, 1], 1),
        case([2, 4, 5, 5], [6, 2, 1, 1], [1, 1], [0, 0], [1, 1], 2),
        case([2, 3, 7, 7], [4, 3, 1, 1], [2, 2], [0, 0], [1, 1], 1),
        case([2, 3, 3, 3], [2, 3, 1, 1], [1, 1], [1, 1], [1, 1], 1),
        case([2, 2, 3, 3], [2, 2, 5, 5], [1, 1], [2, 2], [1, 1], 1),
        case([20, 2, 6, 6], [3, 2, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        case([3, 1, 28, 28], [6, 1, 5, 5], [1, 1], [0, 0], [1, 1], 1),
        case([3, 6, 12, 12], [8, 6, 5, 5], [1, 1], [0, 0], [1, 1], 1),
        case([2, 16, 6, 7], [16, 16, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        case([2, 16, 7, 6], [17, 16, 5, 5], [1, 1], [2, 2], [1, 1], 1),
        case([3, 16, 8, 8], [16, 16, 5, 5], [1, 1], [0, 0], [1, 1], 1),
    ]
}

impl Case {
    /// `[n, O, oh, ow]`.
    pub fn out(&self) -> [usize; 4] {
        let o = &self.opts;
        let size = |d: usize| {
            (self.x[2 + d] + 2 * o.padding[d] - o.dilation[d] * (self.w[2 + d] - 1) - 1)
                / o.stride[d]
                + 1
        };
        [self.x[0], self.w[0], size(0), size(1)]
    }

    /// Calls `f(out_index, x_index, w_index)` for every product of the convolution.
    fn for_each_product(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [n, c, h, wd] = self.x;
        let [o, cg, kh, kw] = self.w;
        let [_, _, oh, ow] = self.out();
        let og = o / self.opts.groups;
        let (s, p, d) = (self.opts.stride, self.opts.padding, self.opts.dilation);
        for b in 0..n {
            for oc in 0..o {
                for y in 0..oh {
                    for xx in 0..ow {
                        let out_at = ((b * o + oc) * oh + y) * ow + xx;
                        for cc in 0..cg {
                            let ic = oc / og * cg + cc;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * s[0] + i * d[0]) as isize - p[0] as isize;
                                    let ix = (xx * s[1] + j * d[1]) as isize - p[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let x_at = ((b * c + ic) * h + iy as usize) * wd + ix as usize;
                                    let w_at = ((oc * cg + cc) * kh + i) * kw + j;
                                    f(out_at, x_at, w_at);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The convolution by its definition, in f64.
    pub fn reference(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let out = self.out();
        let plane = out[2] * out[3];
        let mut y: Vec<f64> = (0..out.iter().product::<usize>())
            .map(|i| bias.map_or(0.0, |b| b[i / plane % out[1]] as f64))
            .collect();
        self.for_each_product(|o, xi, wi| y[o] += x[xi] as f64 * w[wi] as f64);
        y.into_iter().map(|v| v as f32).collect()
    }

    /// The gradients of `Σ conv(x, w, b) · r` with respect to `x`, `w` and `b`, in f64.
    pub fn reference_grads(&self, x: &[f32], w: &[f32], r: &[f32]) -> [Vec<f32>; 3] {
        let out = self.out();
        let plane = out[2] * out[3];
        let mut dx = vec![0.0f64; x.len()];
        let mut dw = vec![0.0f64; w.len()];
        self.for_each_product(|o, xi, wi| {
            dx[xi] += r[o] as f64 * w[wi] as f64;
            dw[wi] += r[o] as f64 * x[xi] as f64;
        });
        let mut db = vec![0.0f64; out[1]];
        for (i, &v) in r.iter().enumerate() {
            db[i / plane % out[1]] += v as f64;
        }
        [dx, dw, db].map(|g| g.into_iter().map(|v| v as f32).collect())
    }
}

/// Inputs of a case: `x`, `w` and a bias, as parameters.
fn inputs(c: &Case, seed: u64, device: Device) -> [Tensor; 3] {
    [
        param(&c.x, -1.0, 1.0, seed, device),
        param(&c.w, -1.0, 1.0, seed + 1, device),
        param(&[c.w[0]], -1.0, 1.0, seed + 2, device),
    ]
}

fn conv2d_values(device: Device) -> TestResult {
    for (k, c) in cases().iter().enumerate() {
        let [x, w, b] = inputs(c, 10 * k as u64, device);
        let (xv, wv, bv) = (x.to_vec(), w.to_vec(), b.to_vec());
        let y = x.conv2d(&w, Some(&b), c.opts)?;
        ensure(
            y.shape() == c.out(),
            format!("{c:?}: shape {:?}, expected {:?}", y.shape(), c.out()),
        )?;
        let what = format!("conv2d {c:?}");
        assert_close(&y.to_vec(), &c.reference(&xv, &wv, Some(&bv)), 1e-4, &what)?;
        let y = x.conv2d(&w, None, c.opts)?;
        assert_close(&y.to_vec(), &c.reference(&xv, &wv, None), 1e-4, &what)?;
    }
    Ok(())
}

/// Input, weight and bias gradients against the reference, for every geometry; then the
/// weight's buffer is overwritten after `GradStore::zero` and added to without it.
fn conv2d_gradient_values(device: Device) -> TestResult {
    for (k, c) in cases().iter().enumerate() {
        let [x, w, b] = inputs(c, 100 + 10 * k as u64, device);
        let r = uniform(&c.out(), -1.0, 1.0, 7 + k as u64, device);
        let want = c.reference_grads(&x.to_vec(), &w.to_vec(), &r.to_vec());
        let loss = || -> ringflow_ml::Result<Tensor> {
            x.conv2d(&w, Some(&b), c.opts)?.mul(&r)?.sum_all()
        };
        let mut grads = GradStore::new();
        for pass in ["first", "after zero_grad"] {
            loss()?.backward_into(&mut grads)?;
            for (name, t, want) in [
                ("x", &x, &want[0]),
                ("w", &w, &want[1]),
                ("b", &b, &want[2]),
            ] {
                let got = grads.get(t).ok_or("no gradient")?.to_vec();
                assert_close(&got, want, 2e-4, &format!("d{name}, {pass} pass, {c:?}"))?;
            }
            grads.zero();
        }
        loss()?.backward_into(&mut grads)?;
        loss()?.backward_into(&mut grads)?;
        let twice: Vec<f32> = want[1].iter().map(|v| 2.0 * v).collect();
        let got = grads.get(&w).ok_or("no gradient")?.to_vec();
        assert_close(&got, &twice, 4e-4, &format!("dw accumulated twice, {c:?}"))?;
    }
    Ok(())
}

/// Central finite differences on small geometries (the reference's own check).
fn grad_conv2d(device: Device) -> TestResult {
    let small = [
        case([2, 2, 5, 4], [3, 2, 3, 2], [1, 1], [1, 0], [1, 1], 1),
        case([1, 4, 5, 5], [4, 2, 2, 2], [2, 1], [1, 1], [2, 1], 2),
        case([2, 2, 4, 4], [2, 1, 3, 3], [1, 1], [1, 1], [1, 1], 2),
        case([2, 3, 3, 3], [2, 3, 1, 1], [1, 1], [0, 0], [1, 1], 1),
    ];
    for (k, c) in small.iter().enumerate() {
        let ins = inputs(c, 300 + 10 * k as u64, device);
        let opts = c.opts;
        let f = move |t: &[Tensor]| t[0].conv2d(&t[1], Some(&t[2]), opts);
        check_grads(&ins, &f).map_err(|e| format!("conv2d {c:?}: {e}"))?;
    }
    Ok(())
}

/// Every invalid convolution is one error naming the op and the shapes.
fn conv2d_errors(device: Device) -> TestResult {
    let x = Tensor::zeros(&[8, 3, 32, 32], device)?;
    let w = |shape: &[usize]| Tensor::zeros(shape, device);
    let o = |stride: usize, padding: usize, dilation: usize, groups: usize| Conv2dOptions {
        stride: [stride; 2],
        padding: [padding; 2],
        dilation: [dilation; 2],
        groups,
    };
    let d = Conv2dOptions::default();
    let bias2 = Tensor::zeros(&[2], device)?;
    let cases: Vec<(ringflow_ml::Result<Tensor>, &str)> = vec![
        (
            x.conv2d(&w(&[16, 4, 3, 3])?, None, d),
            "conv2d: input [8, 3, 32, 32] has 3 channels but the weight [16, 4, 3, 3] expects 4 (groups 1)",
        ),
        (
            x.reshape(&[8, 3, 1024])?
                .conv2d(&w(&[4, 3, 3, 3])?, None, d),
            "the input [8, 3, 1024] is not a [batch, channels, height, width]",
        ),
        (
            x.conv2d(&w(&[4, 3, 9])?, None, d),
            "the weight [4, 3, 9] is not",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(1, 0, 1, 0)),
            "the number of groups must be at least 1",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(1, 0, usize::MAX, 1)),
            "is smaller than the kernel's extent",
        ),
        (
            x.conv2d(&w(&[4, 1, 3, 3])?, None, o(1, 0, 1, 3)),
            "3 groups must divide both the 3 input channels and the 4 output channels",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, Some(&bias2), d),
            "the bias [2] does not have one value per output channel of the weight [4, 3, 3, 3]",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(0, 0, 1, 1)),
            "the stride [0, 0] must be at least 1",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(1, 0, 0, 1)),
            "the dilation [0, 0] must be at least 1",
        ),
        (
            x.conv2d(&w(&[4, 3, 0, 3])?, None, d),
            "the kernel [0, 3] must be at least 1",
        ),
        (
            x.conv2d(&w(&[4, 3, 33, 3])?, None, d),
            "the input [32, 32] padded by [0, 0] is smaller than the kernel's extent [33, 3]",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(1, 0, 20, 1)),
            "is smaller than the kernel's extent [41, 41]",
        ),
        (
            x.conv2d(&w(&[4, 3, 3, 3])?, None, o(1, usize::MAX / 4, 1, 1)),
            "is larger than both the input [32, 32] and the kernel's extent [3, 3]",
        ),
        (
            Tensor::zeros(&[1, 3, 0, 4], device)?.conv2d(&w(&[4, 3, 1, 1])?, None, o(1, 1, 1, 1)),
            "the input [0, 4] has no cells",
        ),
    ];
    for (k, (result, want)) in cases.into_iter().enumerate() {
        let message = match result {
            Ok(y) => return Err(format!("case {k} ({want}) gave a tensor {:?}", y.shape()).into()),
            Err(e) => e.to_string(),
        };
        ensure(
            message.contains(want) && message.starts_with("conv2d: "),
            format!("case {k}: error \"{message}\" does not say \"{want}\""),
        )?;
    }
    Ok(())
}

device_test!(
    conv2d_values,
    conv2d_gradient_values,
    grad_conv2d,
    conv2d_errors
);
