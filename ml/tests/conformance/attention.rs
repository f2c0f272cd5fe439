//! Batched matrix products and the attention layers: `bmm` against nested loops and finite
//! differences; multi-head attention against an f64 reference; padding (a padded batch gives
//! each sequence what it gets alone, padding changes nothing and gets no gradient); finite
//! differences of the attention and the encoder block; position embeddings; errors.

use ringflow_ml::nn::{
    ActivationKind, Linear, Module, MultiHeadAttention, ParamBuilder, ParamStore,
    PositionEmbedding, PositionKind, TransformerEncoder,
};
use ringflow_ml::nn::{Forward, layers::attention};
use ringflow_ml::{Device, GradStore, Tensor, rng};

use crate::helpers::*;

const N: usize = 2;
const T: usize = 3;
const DIM: usize = 4;
const HEADS: usize = 2;
const LENGTHS: [usize; N] = [3, 1];

type Checked<T> = Result<T, Box<dyn std::error::Error>>;

/// `a[i]·op(b[i])` by the definition, in f64.
fn bmm_reference(a: &[f32], b: &[f32], [batch, m, k, p]: [usize; 4], t: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * m * p);
    for i in 0..batch {
        for r in 0..m {
            for c in 0..p {
                let sum: f64 = (0..k)
                    .map(|j| {
                        let bv = if t {
                            b[(i * p + c) * k + j]
                        } else {
                            b[(i * k + j) * p + c]
                        };
                        a[(i * m + r) * k + j] as f64 * bv as f64
                    })
                    .sum();
                out.push(sum as f32);
            }
        }
    }
    out
}

fn bmm_matches_nested_loops(device: Device) -> TestResult {
    // One entry (a plain GEMM on CUDA), a few, and more entries than threads (in parallel on
    // the CPU).
    for (seed, dims) in [(1, [1, 3, 4, 2]), (2, [3, 2, 5, 3]), (3, [17, 4, 3, 5])] {
        let [batch, m, k, p] = dims;
        let a = uniform(&[batch, m, k], -1.0, 1.0, seed, device);
        let b = uniform(&[batch, k, p], -1.0, 1.0, seed + 10, device);
        let bt = uniform(&[batch, p, k], -1.0, 1.0, seed + 20, device);
        let got = a.bmm(&b)?;
        ensure(
            got.shape() == [batch, m, p],
            format!("shape {:?}", got.shape()),
        )?;
        let want = bmm_reference(&a.to_vec(), &b.to_vec(), dims, false);
        assert_close(&got.to_vec(), &want, 1e-5, &format!("bmm {dims:?}"))?;
        let got = a.bmm_t(&bt)?;
        let want = bmm_reference(&a.to_vec(), &bt.to_vec(), dims, true);
        assert_close(&got.to_vec(), &want, 1e-5, &format!("bmm_t {dims:?}"))?;
    }
    Ok(())
}

fn grad_bmm(device: Device) -> TestResult {
    let a = param(&[3, 2, 4], -1.0, 1.0, 31, device);
    let b = param(&[3, 4, 3], -1.0, 1.0, 32, device);
    check_grads(&[a.clone(), b], &|t: &[Tensor]| t[0].bmm(&t[1]))
        .map_err(|e| format!("bmm: {e}"))?;
    let bt = param(&[3, 5, 4], -1.0, 1.0, 33, device);
    check_grads(&[a, bt], &|t: &[Tensor]| t[0].bmm_t(&t[1]))
        .map_err(|e| format!("bmm_t: {e}").into())
}

fn bmm_errors(device: Device) -> TestResult {
    let z = |shape: &[usize]| Tensor::zeros(shape, device);
    let cases = [
        (
            z(&[2, 3, 4])?.bmm(&z(&[2, 3, 4])?),
            "bmm: shapes [2, 3, 4] and [2, 3, 4] are not",
        ),
        (
            z(&[2, 3, 4])?.bmm(&z(&[3, 4, 5])?),
            "bmm: shapes [2, 3, 4] and [3, 4, 5]",
        ),
        (
            z(&[3, 4])?.bmm(&z(&[4, 5])?),
            "bmm: shapes [3, 4] and [4, 5] are not batches",
        ),
        (
            z(&[2, 3, 4])?.bmm_t(&z(&[2, 4, 5])?),
            "bmm_t: shapes [2, 3, 4] and [2, 4, 5]",
        ),
    ];
    for (got, want) in cases {
        let err = got.err().ok_or(format!("accepted: {want}"))?.to_string();
        ensure(err.contains(want), format!("{err:?} does not say {want:?}"))?;
    }
    Ok(())
}

/// A layer with random projections and biases (seeded by `seed`), and its store.
fn attention_layer(device: Device, seed: u64) -> Checked<(ParamStore, MultiHeadAttention)> {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(seed, rng::streams::INIT);
    let mha = MultiHeadAttention::new(
        &mut ParamBuilder::new(&mut store, &mut init, device),
        DIM,
        HEADS,
        0.0,
    )?;
    for (i, l) in [&mha.query, &mha.key, &mha.value, &mha.output]
        .into_iter()
        .enumerate()
    {
        let bias = uniform(&[DIM], -0.5, 0.5, seed * 10 + i as u64, device).to_vec();
        l.bias.as_ref().ok_or("no bias")?.copy_from_slice(&bias)?;
    }
    Ok((store, mha))
}

/// Row `x` (`[DIM]`) through a projection, in f64.
fn project(x: &[f64], l: &Linear) -> Vec<f64> {
    let (w, b) = (
        l.weight.to_vec(),
        l.bias.as_ref().map(|b| b.to_vec()).unwrap_or_default(),
    );
    (0..DIM)
        .map(|o| (0..DIM).map(|i| x[i] * w[i * DIM + o] as f64).sum::<f64>() + b[o] as f64)
        .collect()
}

/// One sequence `x` (`[T, DIM]`, the first `len` steps real) through the layer in f64.
fn attention_reference(mha: &MultiHeadAttention, x: &[f32], len: usize) -> Vec<f32> {
    let rows: Vec<Vec<f64>> = x
        .chunks(DIM)
        .map(|r| r.iter().map(|&v| v as f64).collect())
        .collect();
    let q: Vec<_> = rows.iter().map(|r| project(r, &mha.query)).collect();
    let k: Vec<_> = rows.iter().map(|r| project(r, &mha.key)).collect();
    let v: Vec<_> = rows.iter().map(|r| project(r, &mha.value)).collect();
    let width = DIM / HEADS;
    let mut out = vec![0.0f32; x.len()];
    for t in 0..len {
        let mut merged = vec![0.0f64; DIM];
        for h in 0..HEADS {
            let head = h * width..(h + 1) * width;
            let scores: Vec<f64> = (0..len)
                .map(|s| {
                    head.clone().map(|f| q[t][f] * k[s][f]).sum::<f64>() / (width as f64).sqrt()
                })
                .collect();
            let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = exps.iter().sum();
            for f in head {
                merged[f] = (0..len).map(|s| exps[s] / total * v[s][f]).sum();
            }
        }
        for (o, val) in project(&merged, &mha.output).into_iter().enumerate() {
            out[t * DIM + o] = val as f32;
        }
    }
    out
}

fn attention_matches_reference(device: Device) -> TestResult {
    let (_, mha) = attention_layer(device, 3)?;
    let xs = uniform(&[N, T, DIM], -1.0, 1.0, 4, device).to_vec();
    let x = tensor(&xs, &[N, T, DIM], device);
    let mut r = rng::seeded(0, 0);
    let got = mha.run(&x, Some(&LENGTHS), false, &mut r)?.to_vec();
    let want: Vec<f32> = LENGTHS
        .iter()
        .enumerate()
        .flat_map(|(row, &len)| {
            attention_reference(&mha, &xs[row * T * DIM..(row + 1) * T * DIM], len)
        })
        .collect();
    assert_close(&got, &want, 1e-5, "lengths [3, 1]")?;
    // Without lengths every step is real; through `Module::forward`, `ctx.lengths` counts.
    let all = mha.run(&x, None, false, &mut r)?.to_vec();
    let want: Vec<f32> = (0..N)
        .flat_map(|row| attention_reference(&mha, &xs[row * T * DIM..(row + 1) * T * DIM], T))
        .collect();
    assert_close(&all, &want, 1e-5, "no lengths")?;
    let mut ctx = Forward {
        train: false,
        rng: &mut r,
        lengths: Some(&LENGTHS),
    };
    assert_close(
        &mha.forward(&x, &mut ctx)?.to_vec(),
        &got,
        0.0,
        "Module::forward",
    )
}

/// `layer(x, lengths)` for the padding checks.
type SeqFn<'a> = dyn Fn(&Tensor, Option<&[usize]>) -> ringflow_ml::Result<Tensor> + 'a;

/// Each sequence of a padded batch gets what it gets alone (values, and the input's and the
/// parameters' gradients of `Σ out·R`); what padding holds changes nothing and gets no
/// gradient; a sequence without real steps outputs zeros.
fn respects_padding(layer: &SeqFn<'_>, store: &ParamStore, device: Device) -> TestResult {
    let xs = uniform(&[N, T, DIM], -1.0, 1.0, 21, device).to_vec();
    let weights = uniform(&[N, T, DIM], 0.5, 1.5, 22, device).to_vec();
    let param_grads = |grads: &GradStore| -> Checked<Vec<f32>> {
        let mut all = Vec::new();
        for p in store.iter() {
            all.extend(
                grads
                    .get(&p.tensor)
                    .ok_or("a parameter got no gradient")?
                    .to_vec(),
            );
        }
        Ok(all)
    };
    let mut grads = GradStore::new();
    grads.zero();
    let x = param(&[N, T, DIM], 0.0, 0.0, 0, device);
    x.copy_from_slice(&xs)?;
    let out = layer(&x, Some(&LENGTHS))?;
    out.mul(&tensor(&weights, &[N, T, DIM], device))?
        .sum_all()?
        .backward_into(&mut grads)?;
    let (batch_out, batch_dx, batch_dp) = (
        out.to_vec(),
        grads.get(&x).ok_or("no input gradient")?.to_vec(),
        param_grads(&grads)?,
    );
    let mut alone_dp = vec![0.0f32; batch_dp.len()];
    for (row, &len) in LENGTHS.iter().enumerate() {
        let real = row * T * DIM..(row * T + len) * DIM;
        grads.zero();
        let xi = param(&[1, len, DIM], 0.0, 0.0, 0, device);
        xi.copy_from_slice(&xs[real.clone()])?;
        let out = layer(&xi, None)?;
        out.mul(&tensor(&weights[real.clone()], &[1, len, DIM], device))?
            .sum_all()?
            .backward_into(&mut grads)?;
        assert_close(
            &batch_out[real.clone()],
            &out.to_vec(),
            1e-6,
            &format!("sequence {row}"),
        )?;
        let dx = grads.get(&xi).ok_or("no input gradient")?.to_vec();
        assert_close(
            &batch_dx[real.clone()],
            &dx,
            1e-6,
            &format!("sequence {row}'s gradient"),
        )?;
        let padding = (row * T + len) * DIM..(row + 1) * T * DIM;
        ensure(
            batch_out[padding.clone()].iter().all(|&v| v == 0.0),
            format!(
                "sequence {row}: padding output {:?}",
                &batch_out[padding.clone()]
            ),
        )?;
        ensure(
            batch_dx[padding.clone()].iter().all(|&v| v == 0.0),
            format!(
                "sequence {row}: padding got gradient {:?}",
                &batch_dx[padding]
            ),
        )?;
        for (sum, g) in alone_dp.iter_mut().zip(param_grads(&grads)?) {
            *sum += g;
        }
    }
    assert_close(&batch_dp, &alone_dp, 1e-5, "parameter gradients")?;
    let mut noisy = xs.clone();
    for v in &mut noisy[(T + 1) * DIM..2 * T * DIM] {
        *v = 30.0 - *v * 50.0;
    }
    let changed = layer(&tensor(&noisy, &[N, T, DIM], device), Some(&LENGTHS))?.to_vec();
    assert_close(&changed, &batch_out, 0.0, "padding changed a real step")?;
    let empty = layer(&tensor(&xs, &[N, T, DIM], device), Some(&[T, 0]))?.to_vec();
    ensure(
        empty[..T * DIM].iter().all(|v| v.is_finite()),
        "an empty sequence gave NaN elsewhere",
    )?;
    ensure(
        empty[T * DIM..].iter().all(|&v| v == 0.0),
        format!("an empty sequence gave {:?}", &empty[T * DIM..]),
    )
}

fn encoder_layer(device: Device, seed: u64) -> Checked<(ParamStore, TransformerEncoder)> {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(seed, rng::streams::INIT);
    let mut enc = TransformerEncoder::new(
        &mut ParamBuilder::new(&mut store, &mut init, device),
        DIM,
        HEADS,
        6,
        0.1,
    )?;
    enc.activation = ActivationKind::Gelu;
    for (i, p) in store.iter().enumerate() {
        if p.name.ends_with("bias") || p.name.starts_with("norm") {
            let base = if p.name.ends_with("weight") { 1.0 } else { 0.0 };
            let v = uniform(
                p.tensor.shape(),
                base - 0.3,
                base + 0.3,
                seed * 100 + i as u64,
                device,
            )
            .to_vec();
            p.tensor.copy_from_slice(&v)?;
        }
    }
    Ok((store, enc))
}

fn attention_respects_padding(device: Device) -> TestResult {
    let (store, mha) = attention_layer(device, 5)?;
    let run = |x: &Tensor, l: Option<&[usize]>| mha.run(x, l, false, &mut rng::seeded(0, 0));
    respects_padding(&run, &store, device).map_err(|e| format!("attention: {e}"))?;
    let (store, enc) = encoder_layer(device, 6)?;
    let run = |x: &Tensor, l: Option<&[usize]>| enc.run(x, l, false, &mut rng::seeded(0, 0));
    respects_padding(&run, &store, device).map_err(|e| format!("encoder: {e}").into())
}

/// The parameters of a store as finite-difference inputs after `x`, except the key projection's
/// bias: a bias added to every key adds the same `q·b` to all of a query's scores, which the
/// softmax ignores, so its gradient is exactly zero and the check would prove nothing.
struct Inputs {
    names: Vec<String>,
    key_bias: Tensor,
    tensors: Vec<Tensor>,
}

impl Inputs {
    fn new(x: Tensor, store: &ParamStore, key_bias: &str) -> Checked<Inputs> {
        let kept: Vec<_> = store.iter().filter(|p| p.name != key_bias).collect();
        Ok(Inputs {
            names: kept.iter().map(|p| p.name.clone()).collect(),
            key_bias: store.get(key_bias).ok_or("no key bias")?.detach()?,
            tensors: std::iter::once(x)
                .chain(kept.iter().map(|p| p.tensor.clone()))
                .collect(),
        })
    }

    /// The parameter `name` among the inputs `t`.
    fn at(&self, t: &[Tensor], name: &str) -> Tensor {
        match self.names.iter().position(|n| n == name) {
            Some(i) => t[1 + i].clone(),
            None => self.key_bias.clone(),
        }
    }

    /// The projection `name` (`name.weight`, `name.bias`) among the inputs `t`.
    fn linear(&self, t: &[Tensor], name: &str) -> Linear {
        Linear {
            weight: self.at(t, &format!("{name}.weight")),
            bias: Some(self.at(t, &format!("{name}.bias"))),
        }
    }

    /// Multi-head attention from the projections under `prefix` among the inputs `t`.
    fn attention(&self, t: &[Tensor], prefix: &str) -> ringflow_ml::Result<MultiHeadAttention> {
        let parts =
            ["query", "key", "value", "output"].map(|p| self.linear(t, &format!("{prefix}{p}")));
        MultiHeadAttention::from_parts(parts, HEADS, 0.0)
    }
}

/// The four projections of a layer from `t[at..at + 8]` (weight, bias for each).
fn projections(t: &[Tensor], at: usize) -> [Linear; 4] {
    let lin = |i: usize| Linear {
        weight: t[at + 2 * i].clone(),
        bias: Some(t[at + 2 * i + 1].clone()),
    };
    [lin(0), lin(1), lin(2), lin(3)]
}

fn grad_attention(device: Device) -> TestResult {
    let (store, _) = attention_layer(device, 7)?;
    let x = param(&[N, T, DIM], -1.0, 1.0, 41, device);
    let inputs = Inputs::new(x, &store, "key.bias")?;
    for lengths in [Some(&LENGTHS[..]), Some(&[2, 3][..]), None] {
        let f = |t: &[Tensor]| {
            inputs
                .attention(t, "")?
                .run(&t[0], lengths, false, &mut rng::seeded(0, 0))
        };
        check_grads(&inputs.tensors, &f).map_err(|e| format!("lengths {lengths:?}: {e}"))?;
    }
    Ok(())
}

fn grad_transformer_encoder(device: Device) -> TestResult {
    let (store, enc) = encoder_layer(device, 8)?;
    let x = param(&[N, T, DIM], -1.0, 1.0, 43, device);
    let inputs = Inputs::new(x, &store, "attention.key.bias")?;
    let f = |t: &[Tensor]| {
        let norm = |name: &str| ringflow_ml::nn::LayerNorm {
            gamma: inputs.at(t, &format!("{name}.weight")),
            beta: inputs.at(t, &format!("{name}.bias")),
            eps: enc.norm1.eps,
        };
        let layer = TransformerEncoder {
            attention: inputs.attention(t, "attention.")?,
            linear1: inputs.linear(t, "linear1"),
            linear2: inputs.linear(t, "linear2"),
            norm1: norm("norm1"),
            norm2: norm("norm2"),
            activation: enc.activation,
            dropout: 0.0,
        };
        layer.run(&t[0], Some(&[3, 2]), false, &mut rng::seeded(0, 0))
    };
    check_grads(&inputs.tensors, &f)
}

/// Parameter names, and dropout only while training.
fn attention_parameters_and_dropout(device: Device) -> TestResult {
    let (store, enc) = encoder_layer(device, 9)?;
    let names: Vec<&str> = store.iter().map(|p| p.name.as_str()).collect();
    let mut want = Vec::new();
    for p in [
        "attention.query",
        "attention.key",
        "attention.value",
        "attention.output",
        "linear1",
        "linear2",
        "norm1",
        "norm2",
    ] {
        want.push(format!("{p}.weight"));
        want.push(format!("{p}.bias"));
    }
    ensure(names == want, format!("parameters {names:?}"))?;
    ensure(
        store.get("linear1.weight").map(|w| w.shape()) == Some(&[DIM, 6][..]),
        "linear1 is not [dim, ff]",
    )?;
    let x = uniform(&[N, T, DIM], -1.0, 1.0, 51, device);
    let run = |train: bool, seed: u64| {
        enc.run(&x, Some(&LENGTHS), train, &mut rng::seeded(seed, 0))
            .map(|y| y.to_vec())
    };
    let eval = run(false, 1)?;
    assert_close(
        &run(false, 2)?,
        &eval,
        0.0,
        "evaluation depends on the generator",
    )?;
    let (a, b) = (run(true, 1)?, run(true, 2)?);
    ensure(a != eval && a != b, "training applied no dropout")?;
    assert_close(
        &run(true, 1)?,
        &a,
        0.0,
        "training is not reproducible from its generator",
    )
}

fn position_embedding_values(device: Device) -> TestResult {
    let (max_length, dim) = (8, 6);
    let mut store = ParamStore::new();
    let mut init = rng::seeded(1, rng::streams::INIT);
    let mut b = ParamBuilder::new(&mut store, &mut init, device);
    let fixed = PositionEmbedding::new(
        &mut b.sub("fixed"),
        PositionKind::Sinusoidal,
        max_length,
        dim,
    )?;
    let learned = PositionEmbedding::new(
        &mut b.sub("learned"),
        PositionKind::Learned,
        max_length,
        dim,
    )?;
    let table = fixed.table.to_vec();
    let angle = |p: f64, pair: f64| p / 10_000f64.powf(pair / dim as f64);
    for (p, f, want) in [
        (0, 0, 0.0),
        (0, 1, 1.0),
        (1, 0, 1f64.sin()),
        (3, 2, angle(3.0, 2.0).sin()),
        (5, 5, angle(5.0, 4.0).cos()),
        (7, 4, angle(7.0, 4.0).sin()),
    ] {
        assert_close(
            &[table[p * dim + f]],
            &[want as f32],
            1e-6,
            &format!("sinusoid at ({p}, {f})"),
        )?;
    }
    let names: Vec<&str> = store.iter().map(|p| p.name.as_str()).collect();
    ensure(names == ["learned.weight"], format!("parameters {names:?}"))?;
    let x = uniform(&[2, 5, dim], -1.0, 1.0, 61, device);
    for (layer, rows) in [(&fixed, table.clone()), (&learned, learned.table.to_vec())] {
        let got = layer.run(&x)?.to_vec();
        let want: Vec<f32> = x
            .to_vec()
            .iter()
            .enumerate()
            .map(|(i, v)| v + rows[i % (5 * dim)])
            .collect();
        assert_close(&got, &want, 1e-6, &format!("{:?}", layer.kind))?;
    }
    let table = learned.table.clone();
    check_grads(&[table], &|t: &[Tensor]| {
        PositionEmbedding {
            kind: PositionKind::Learned,
            table: t[0].clone(),
        }
        .run(&x)
    })?;
    let long = Tensor::zeros(&[1, 9, dim], device)?;
    let err = fixed
        .run(&long)
        .err()
        .ok_or("9 steps passed a table of 8")?
        .to_string();
    ensure(err.contains("9 steps") && err.contains("8 positions"), err)?;
    let kind: PositionKind = serde_json::from_str("\"learned\"")?;
    ensure(
        kind == PositionKind::Learned && attention::sinusoidal_table(1, 2) == [0.0, 1.0],
        "serde name or table",
    )
}

fn attention_errors(device: Device) -> TestResult {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(1, rng::streams::INIT);
    let mut b = ParamBuilder::new(&mut store, &mut init, device);
    let err = MultiHeadAttention::new(&mut b.sub("a"), 6, 4, 0.0)
        .err()
        .ok_or("6 features in 4 heads")?
        .to_string();
    ensure(err.contains("dim 6 is not divisible by 4 heads"), err)?;
    let err = TransformerEncoder::new(&mut b.sub("e"), 10, 3, 8, 0.1)
        .err()
        .ok_or("10 features in 3 heads")?
        .to_string();
    ensure(err.contains("dim 10 is not divisible by 3 heads"), err)?;
    let err = MultiHeadAttention::new(&mut b.sub("d"), 4, 2, 1.0)
        .err()
        .ok_or("dropout 1 accepted")?
        .to_string();
    ensure(err.contains("dropout in [0, 1), not 1"), err)?;
    let (layer_store, mha) = attention_layer(device, 1)?;
    let mut r = rng::seeded(0, 0);
    let z = |shape: &[usize]| Tensor::zeros(shape, device);
    for (x, lengths, want) in [
        (
            z(&[N, T, 6])?,
            None,
            "the input [2, 3, 6] has 6 features per step, the layer 4",
        ),
        (
            z(&[N, DIM])?,
            None,
            "the input [2, 4] is not [batch, steps, features]",
        ),
        (
            z(&[N, T, DIM])?,
            Some(&[3usize][..]),
            "1 lengths for a batch of 2 sequences",
        ),
        (
            z(&[N, T, DIM])?,
            Some(&[3, 4][..]),
            "sequence 1 is 4 steps long, but the batch has 3 steps",
        ),
    ] {
        let err = mha
            .run(&x, lengths, false, &mut r)
            .err()
            .ok_or(format!("accepted: {want}"))?
            .to_string();
        ensure(
            err.starts_with("multi_head_attention: ") && err.contains(want),
            format!("{err:?} does not say {want:?}"),
        )?;
    }
    let mut parts = projections(&layer_store.tensors(), 0);
    parts[2].weight = z(&[DIM, 3])?;
    let err = MultiHeadAttention::from_parts(parts, HEADS, 0.0)
        .err()
        .ok_or("a [4, 3] value projection")?
        .to_string();
    ensure(
        err.contains("the value projection's weight [4, 3] and bias [4] are not [4, 4]"),
        err,
    )
}

device_test!(
    bmm_matches_nested_loops,
    grad_bmm,
    bmm_errors,
    attention_matches_reference,
    attention_respects_padding,
    grad_attention,
    grad_transformer_encoder,
    attention_parameters_and_dropout,
    position_embedding_values,
    attention_errors,
);
