//! CUDA against the CPU on random inputs: every op's output and the gradients of every input
//! must agree within float32 tolerances, and so must optimizer steps and a short MLP training
//! run. Each case skips itself (with a note on stderr) where no GPU can be used.

use ringflow_ml::backend::UnaryOp;
use ringflow_ml::loss;
use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec, ParamStore};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{BatchNormMode, Conv2dOptions, Device, GradStore, Pool2dOptions, Tensor, rng};

use crate::helpers::*;

/// `|gpu - cpu| <= ATOL · scale + RTOL · |cpu|` elementwise, where `scale` is the largest
/// magnitude in the output (at least 1). The absolute part follows the output's scale because an
/// element that is a small difference of large terms (a log-softmax gradient `g - p·Σg` where
/// `p·Σg ≈ g`) carries the rounding of the terms, not of the result: two correct float32
/// implementations that sum in different orders differ there by about `eps · Σ|g|`.
const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

/// `cross_device!(name)` runs `fn name(device) -> Result<Vec<Vec<f32>>>` on the CPU and on
/// `cuda:0` and compares every returned vector.
macro_rules! cross_device {
    ($($name:ident),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                super::compare(stringify!($name), super::$name);
            }
        )+
    };
}

type Outputs = Result<Vec<Vec<f32>>, Box<dyn std::error::Error>>;

/// Runs `case` on both devices and compares (or skips without a GPU). The CPU run happens
/// everywhere, so that the cases themselves are exercised in every build.
pub fn compare(name: &str, case: fn(Device) -> Outputs) {
    let want = case(Device::Cpu).unwrap_or_else(|e| panic!("{name} on the CPU: {e}"));
    assert!(
        want.iter().any(|v| v.iter().any(|&x| x != 0.0)),
        "{name}: every output is zero; the comparison would prove nothing"
    );
    let gpu = Device::Cuda(0);
    if !crate::helpers::available(gpu) {
        return;
    }
    let got = case(gpu).unwrap_or_else(|e| panic!("{name} on {gpu}: {e}"));
    assert_eq!(want.len(), got.len(), "{name}: number of outputs");
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.len(), g.len(), "{name}: output {k} length");
        let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        for (i, (&w, &g)) in w.iter().zip(g).enumerate() {
            assert!(
                (w - g).abs() <= ATOL * scale + RTOL * w.abs(),
                "{name}: output {k}, element {i}: cuda gives {g}, the cpu {w}"
            );
        }
    }
}

/// The output of `f` on parameters of `shapes` (uniform in `[-1, 1)`), then the gradient of
/// `Σ f(x)·r` for every input, `r` fixed random weights.
fn forward_and_grads(device: Device, shapes: &[&[usize]], seed: u64, f: &OpFn<'_>) -> Outputs {
    let inputs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| param(s, -1.0, 1.0, seed + i as u64, device))
        .collect();
    forward_and_grads_of(&inputs, seed, f)
}

/// [`forward_and_grads`] on the given parameters.
fn forward_and_grads_of(inputs: &[Tensor], seed: u64, f: &OpFn<'_>) -> Outputs {
    let device = inputs[0].device();
    let y = f(inputs)?;
    let r = uniform(y.shape(), 0.5, 1.5, seed ^ 0xabc, device);
    let grads = y.mul(&r)?.sum_all()?.backward()?;
    let mut out = vec![y.try_to_vec()?];
    for x in inputs {
        out.push(match grads.get(x) {
            Some(g) => g.try_to_vec()?,
            None => vec![0.0; x.numel()],
        });
    }
    Ok(out)
}

pub fn matmul(device: Device) -> Outputs {
    forward_and_grads(device, &[&[37, 65], &[65, 29]], 1, &|t: &[Tensor]| {
        t[0].matmul(&t[1])
    })
}

pub fn linear_wide(device: Device) -> Outputs {
    forward_and_grads(
        device,
        &[&[128, 784], &[784, 256], &[256]],
        2,
        &|t: &[Tensor]| t[0].linear(&t[1], &t[2])?.relu(),
    )
}

pub fn unary_ops(device: Device) -> Outputs {
    let mut out = Vec::new();
    for (k, op) in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::GeluExact,
        UnaryOp::Square,
    ]
    .into_iter()
    .enumerate()
    {
        out.extend(forward_and_grads(
            device,
            &[&[7, 13]],
            10 + k as u64,
            &|t: &[Tensor]| t[0].unary(op),
        )?);
    }
    // Positive inputs for log and sqrt.
    for (k, op) in [UnaryOp::Log, UnaryOp::Sqrt].into_iter().enumerate() {
        out.extend(forward_and_grads(
            device,
            &[&[5, 11]],
            20 + k as u64,
            &|t: &[Tensor]| t[0].affine(0.5, 1.0)?.unary(op),
        )?);
    }
    Ok(out)
}

pub fn broadcasting(device: Device) -> Outputs {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[6, 9], &[6, 9]),
        (&[6, 9], &[9]),
        (&[6, 1], &[1, 9]),
        (&[2, 3, 4], &[3, 1]),
        (&[4], &[3, 2, 4]),
    ];
    let mut out = Vec::new();
    for (k, (a, b)) in cases.into_iter().enumerate() {
        out.extend(forward_and_grads(
            device,
            &[a, b],
            30 + k as u64,
            &|t: &[Tensor]| {
                t[0].add(&t[1])?
                    .mul(&t[1])?
                    .sub(&t[0])?
                    .div(&t[1].affine(0.1, 2.0)?)
            },
        )?);
    }
    Ok(out)
}

pub fn reductions(device: Device) -> Outputs {
    let mut out = forward_and_grads(device, &[&[300, 70]], 40, &|t: &[Tensor]| t[0].sum_all())?;
    out.extend(forward_and_grads(
        device,
        &[&[3, 50, 4]],
        41,
        &|t: &[Tensor]| t[0].sum(1, false),
    )?);
    out.extend(forward_and_grads(
        device,
        &[&[3, 50, 4]],
        42,
        &|t: &[Tensor]| t[0].mean(-1, true),
    )?);
    out.extend(forward_and_grads(
        device,
        &[&[2000]],
        43,
        &|t: &[Tensor]| t[0].mean_all(),
    )?);
    Ok(out)
}

pub fn softmax(device: Device) -> Outputs {
    let mut out = forward_and_grads(device, &[&[33, 10]], 50, &|t: &[Tensor]| {
        t[0].affine(4.0, 0.0)?.softmax(-1)
    })?;
    out.extend(forward_and_grads(
        device,
        &[&[4, 70, 3]],
        51,
        &|t: &[Tensor]| t[0].log_softmax(1),
    )?);
    out.extend(forward_and_grads(
        device,
        &[&[5, 1000]],
        52,
        &|t: &[Tensor]| t[0].affine(10.0, 0.0)?.log_softmax(-1),
    )?);
    Ok(out)
}

pub fn losses(device: Device) -> Outputs {
    let labels: Vec<f32> = (0..64).map(|i| ((i * 7) % 10) as f32).collect();
    let labels = tensor(&labels, &[64], device);
    let mut out = forward_and_grads(device, &[&[64, 10]], 60, &|t: &[Tensor]| {
        loss::cross_entropy(&t[0].affine(3.0, 0.0)?, &labels)
    })?;
    // More classes than a warp has lanes, so every lane of the fused kernel's reductions counts.
    let wide: Vec<f32> = (0..33).map(|i| ((i * 37) % 100) as f32).collect();
    let wide = tensor(&wide, &[33], device);
    out.extend(forward_and_grads(
        device,
        &[&[33, 100]],
        65,
        &|t: &[Tensor]| loss::cross_entropy(&t[0].affine(3.0, 0.0)?, &wide),
    )?);
    let targets = uniform(&[64, 3], 0.0, 1.0, 61, device);
    out.extend(forward_and_grads(
        device,
        &[&[64, 3]],
        62,
        &|t: &[Tensor]| loss::binary_cross_entropy_with_logits(&t[0].affine(4.0, 0.0)?, &targets),
    )?);
    let y = uniform(&[64, 1], -1.0, 1.0, 63, device);
    out.extend(forward_and_grads(
        device,
        &[&[64, 1]],
        64,
        &|t: &[Tensor]| loss::mse(&t[0], &y),
    )?);
    Ok(out)
}

pub fn layout(device: Device) -> Outputs {
    let mut out = forward_and_grads(device, &[&[2, 3, 4, 5]], 70, &|t: &[Tensor]| {
        t[0].permute(&[2, 0, 3, 1])
    })?;
    out.extend(forward_and_grads(
        device,
        &[&[6, 8]],
        71,
        &|t: &[Tensor]| t[0].transpose(0, 1)?.reshape(&[4, 12])?.narrow(1, 3, 7),
    )?);
    out.extend(forward_and_grads(
        device,
        &[&[3, 2, 4], &[3, 5, 4], &[3, 1, 4]],
        72,
        &|t: &[Tensor]| Tensor::concat(&[&t[0], &t[1], &t[2]], 1),
    )?);
    Ok(out)
}

pub fn embedding(device: Device) -> Outputs {
    let idx = tensor(&[3., 0., 7., 3., 3., 9., 1.], &[7], device);
    forward_and_grads(device, &[&[10, 6]], 80, &|t: &[Tensor]| {
        t[0].index_select(&idx)
    })
}

pub fn dropout(device: Device) -> Outputs {
    // The mask comes from a counter-based stream: the same on every device.
    forward_and_grads(device, &[&[64, 33]], 90, &|t: &[Tensor]| {
        t[0].dropout(0.3, &mut rng::seeded(5, rng::streams::DROPOUT))
    })
}

/// Five steps of `spec` from the same start with the same gradients.
fn optimizer_steps(device: Device, spec: OptimizerSpec) -> Outputs {
    let mut params = ParamStore::new();
    let w = params.insert("w".into(), uniform(&[1000], -1.0, 1.0, 100, device))?;
    let mut opt = Optimizer::new(spec, &params)?;
    let mut grads = GradStore::new();
    let mut out = Vec::new();
    for step in 0..5 {
        let g = uniform(&[1000], -1.0, 1.0, 200 + step, device).to_vec();
        grads.copy_from_slice(&w, &g)?;
        opt.step(0.05, &mut grads)?;
        out.push(w.try_to_vec()?);
    }
    for (_, _, values) in opt.state_tensors()? {
        out.push(values);
    }
    Ok(out)
}

pub fn optimizers(device: Device) -> Outputs {
    let specs = [
        OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.01,
            groups: Vec::new(),
        },
        OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
            weight_decay: 0.0,
            groups: Vec::new(),
        },
        OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.01,
            groups: Vec::new(),
        },
    ];
    let mut out = Vec::new();
    for spec in specs {
        out.extend(optimizer_steps(device, spec)?);
    }
    for text in [
        r#"{"kind": "adagrad", "lr": 0.05, "weight_decay": 0.01}"#,
        r#"{"kind": "adam", "lr": 0.05, "weight_decay": 0.01}"#,
        r#"{"kind": "adamw", "lr": 0.05, "weight_decay": 0.01}"#,
    ] {
        let spec: OptimizerSpec = serde_json::from_str(text)?;
        out.extend(optimizer_steps(device, spec)?);
    }
    Ok(out)
}

/// Ten SGD steps of an MLP with dropout on fixed batches: the losses and the final weights.
pub fn mlp_training(device: Device) -> Outputs {
    let spec = ModelSpec::new(
        "mlp",
        serde_json::json!({ "layers": [20, 64, 64, 5], "activation": "gelu", "dropout": 0.1 }),
    )?;
    let model = Model::build(&spec, &ModelRegistry::default(), 3, device)?;
    let mut opt = Optimizer::new(
        serde_json::from_str(r#"{"kind": "sgd", "lr": 0.1, "momentum": 0.9}"#)?,
        model.params(),
    )?;
    let mut dropout = rng::seeded(9, rng::streams::DROPOUT);
    let mut losses = Vec::new();
    let mut grads = GradStore::new();
    for step in 0..10 {
        let x = uniform(&[32, 20], -1.0, 1.0, 300 + step, device);
        let labels: Vec<f32> = (0..32).map(|i| ((i + step as usize) % 5) as f32).collect();
        let y = tensor(&labels, &[32], device);
        grads.zero();
        let loss = loss::cross_entropy(&model.forward(&x, true, &mut dropout)?, &y)?;
        loss.backward_into(&mut grads)?;
        opt.step(0.1, &mut grads)?;
        losses.push(loss.item()?);
    }
    let mut out = vec![losses];
    for p in model.params().iter() {
        out.push(p.tensor.try_to_vec()?);
    }
    Ok(out)
}

/// Every convolution geometry of the CPU's conformance cases (`conv.rs`: stride, padding,
/// dilation, groups, depthwise with a channel multiplier, rectangular kernels, 1×1, batch 1,
/// LeNet's layers), with a bias: the output and the gradients of input, weight and bias.
pub fn conv2d(device: Device) -> Outputs {
    let mut out = Vec::new();
    for (k, case) in crate::conv::cases().into_iter().enumerate() {
        let shapes: [&[usize]; 3] = [&case.x, &case.w, &[case.w[0]]];
        out.extend(forward_and_grads(
            device,
            &shapes,
            500 + 10 * k as u64,
            &|t: &[Tensor]| t[0].conv2d(&t[1], Some(&t[2]), case.opts),
        )?);
    }
    Ok(out)
}

/// Weights shared by two convolutions in one graph (tied layers), depthwise and dense: the
/// second gradient pass adds to the weight's gradient buffer instead of overwriting it.
pub fn conv2d_shared_weights(device: Device) -> Outputs {
    let depthwise = Conv2dOptions {
        padding: [1, 1],
        groups: 4,
        ..Default::default()
    };
    let dense = Conv2dOptions {
        stride: [2, 1],
        ..Default::default()
    };
    let cases: [(&[usize], &[usize], Conv2dOptions); 2] = [
        (&[2, 4, 6, 5], &[8, 1, 3, 3], depthwise),
        (&[3, 3, 7, 6], &[4, 3, 2, 3], dense),
    ];
    let mut out = Vec::new();
    for (k, (x, w, opts)) in cases.into_iter().enumerate() {
        out.extend(forward_and_grads(
            device,
            &[x, x, w],
            550 + 10 * k as u64,
            &|t: &[Tensor]| {
                t[0].conv2d(&t[2], None, opts)?
                    .add(&t[1].conv2d(&t[2], None, opts)?)
            },
        )?);
    }
    Ok(out)
}

/// Max and average pooling, and their gradients, over non-overlapping windows, overlapping
/// padded ones, rectangular ones and strides that differ per direction; global average pooling.
pub fn pooling(device: Device) -> Outputs {
    let windows = [
        Pool2dOptions::square(2),
        Pool2dOptions {
            kernel: [3, 3],
            stride: Some([2, 2]),
            padding: [1, 1],
        },
        Pool2dOptions {
            kernel: [3, 2],
            stride: Some([1, 1]),
            padding: [1, 1],
        },
        Pool2dOptions {
            kernel: [2, 3],
            stride: Some([1, 2]),
            padding: [1, 0],
        },
    ];
    let mut out = Vec::new();
    for (k, opts) in windows.into_iter().enumerate() {
        let seed = 600 + 10 * k as u64;
        let shape: &[&[usize]] = &[&[2, 3, 7, 6]];
        out.extend(forward_and_grads(
            device,
            shape,
            seed,
            &|t: &[Tensor]| t[0].max_pool2d(opts),
        )?);
        out.extend(forward_and_grads(
            device,
            shape,
            seed + 1,
            &|t: &[Tensor]| t[0].avg_pool2d(opts),
        )?);
    }
    out.extend(forward_and_grads(
        device,
        &[&[3, 4, 5, 6]],
        650,
        &|t: &[Tensor]| t[0].global_avg_pool2d(),
    )?);
    Ok(out)
}

/// Max pooling over tied values (four values, a quarter of the cells each, as on quantized
/// images): every device must send each window's gradient to the same cell, its first maximum
/// in row-major order.
pub fn max_pool_ties(device: Device) -> Outputs {
    let shape = [2, 2, 6, 7];
    let values: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 7 + i / 5) % 4) as f32)
        .collect();
    let overlapping = Pool2dOptions {
        kernel: [3, 3],
        stride: Some([1, 1]),
        padding: [1, 1],
    };
    let mut out = Vec::new();
    for (k, opts) in [overlapping, Pool2dOptions::square(2)]
        .into_iter()
        .enumerate()
    {
        let x = tensor(&values, &shape, device).into_parameter()?;
        out.extend(forward_and_grads_of(
            &[x],
            700 + k as u64,
            &|t: &[Tensor]| t[0].max_pool2d(opts),
        )?);
    }
    Ok(out)
}

/// Batch normalization of images and of vectors: with the batch's statistics (training: the
/// output, the statistics, and the gradients of input, gamma and beta through them) and with
/// given running statistics (evaluation).
pub fn batch_norm(device: Device) -> Outputs {
    let mut out = Vec::new();
    for (k, shape) in [&[4usize, 3, 5, 5][..], &[6, 4]].into_iter().enumerate() {
        let c = shape[1];
        let seed = 800 + 10 * k as u64;
        out.extend(forward_and_grads(
            device,
            &[shape, &[c], &[c]],
            seed,
            &|t: &[Tensor]| {
                let x = t[0].affine(3.0, 1.0)?;
                Ok(x.batch_norm(&t[1], &t[2], BatchNormMode::Train, 1e-5)?.0)
            },
        )?);
        let x = uniform(shape, -2.0, 2.0, seed + 5, device);
        let gamma = uniform(&[c], 0.5, 1.5, seed + 6, device);
        let beta = uniform(&[c], -0.5, 0.5, seed + 7, device);
        let (_, stats) = x.batch_norm(&gamma, &beta, BatchNormMode::Train, 1e-5)?;
        let stats = stats.ok_or("training mode returns the batch's statistics")?;
        out.push(stats.mean.try_to_vec()?);
        out.push(stats.var.try_to_vec()?);
        let mean = uniform(&[c], -0.5, 0.5, seed + 8, device);
        let var = uniform(&[c], 0.5, 2.0, seed + 9, device);
        let eval = BatchNormMode::Eval {
            mean: &mean,
            var: &var,
        };
        out.extend(forward_and_grads(
            device,
            &[shape, &[c], &[c]],
            seed + 3,
            &|t: &[Tensor]| Ok(t[0].batch_norm(&t[1], &t[2], eval, 1e-5)?.0),
        )?);
    }
    Ok(out)
}

/// The parameters of [`cnn_training`]'s network, in a store for the optimizer.
fn cnn_params(device: Device) -> Result<ParamStore, Box<dyn std::error::Error>> {
    let shapes: [(&str, &[usize], f32, f32); 7] = [
        ("conv1.weight", &[4, 1, 3, 3], -0.5, 0.5),
        ("conv1.bias", &[4], -0.1, 0.1),
        ("bn.weight", &[4], 0.9, 1.1),
        ("bn.bias", &[4], -0.1, 0.1),
        ("conv2.weight", &[8, 1, 3, 3], -0.5, 0.5),
        ("fc.weight", &[8, 3], -0.5, 0.5),
        ("fc.bias", &[3], -0.1, 0.1),
    ];
    let mut params = ParamStore::new();
    for (k, (name, shape, low, high)) in shapes.into_iter().enumerate() {
        params.insert(
            name.into(),
            uniform(shape, low, high, 900 + k as u64, device),
        )?;
    }
    Ok(params)
}

/// Eight SGD steps (with momentum) of a small CNN on fixed batches — a convolution with bias,
/// batch normalization, ReLU, max pooling, a depthwise convolution with a channel multiplier,
/// global average pooling, a linear layer, cross-entropy: the losses and the final weights.
pub fn cnn_training(device: Device) -> Outputs {
    let params = cnn_params(device)?;
    let p: Vec<Tensor> = params.iter().map(|p| p.tensor.clone()).collect();
    let mut opt = Optimizer::new(
        serde_json::from_str(r#"{"kind": "sgd", "lr": 0.1, "momentum": 0.9}"#)?,
        &params,
    )?;
    let padded = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let depthwise = Conv2dOptions {
        groups: 4,
        ..padded
    };
    let mut losses = Vec::new();
    let mut grads = GradStore::new();
    for step in 0..8 {
        let x = uniform(&[6, 1, 8, 8], -1.0, 1.0, 950 + step, device);
        let labels: Vec<f32> = (0..6).map(|i| ((i + step as usize) % 3) as f32).collect();
        let y = tensor(&labels, &[6], device);
        grads.zero();
        let h = x.conv2d(&p[0], Some(&p[1]), padded)?;
        let h = h.batch_norm(&p[2], &p[3], BatchNormMode::Train, 1e-5)?.0;
        let h = h.relu()?.max_pool2d(Pool2dOptions::square(2))?;
        let h = h
            .conv2d(&p[4], None, depthwise)?
            .relu()?
            .global_avg_pool2d()?;
        let loss = loss::cross_entropy(&h.linear(&p[5], &p[6])?, &y)?;
        loss.backward_into(&mut grads)?;
        opt.step(0.1, &mut grads)?;
        losses.push(loss.item()?);
    }
    let mut out = vec![losses];
    for t in &p {
        out.push(t.try_to_vec()?);
    }
    Ok(out)
}

mod cuda_matches_cpu {
    cross_device!(
        matmul,
        linear_wide,
        unary_ops,
        broadcasting,
        reductions,
        softmax,
        losses,
        layout,
        embedding,
        dropout,
        optimizers,
        mlp_training,
        conv2d,
        conv2d_shared_weights,
        pooling,
        max_pool_ties,
        batch_norm,
        cnn_training,
    );
}
