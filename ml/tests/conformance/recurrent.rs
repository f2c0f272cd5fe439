//! The LSTM and the GRU against scalar references in f64, their handling of padding (real steps
//! unchanged by what the padding holds, no gradient into it), finite differences, and errors;
//! sequence pooling likewise; and the ops a step is made of (the fused gates, `split`, `addmm`).

use ringflow_ml::backend::Storage;
use ringflow_ml::nn::{
    BiLstm, Gru, Lstm, ParamBuilder, ParamStore, Recurrent, SequencePool, SequencePoolKind,
};
use ringflow_ml::{Device, Tensor, rng};

use crate::helpers::*;

const N: usize = 2;
const T: usize = 3;
const IN: usize = 2;
const H: usize = 2;
const LENGTHS: [usize; N] = [3, 2];

type Checked<T> = Result<T, Box<dyn std::error::Error>>;

fn lstm(device: Device) -> Checked<Lstm> {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(7, rng::streams::INIT);
    let lstm = Lstm::new(&mut ParamBuilder::new(&mut store, &mut init, device), IN, H)?;
    lstm.bias
        .copy_from_slice(&[0.1, -0.2, 0.3, 0.0, 0.5, 0.2, -0.1, 0.4])?;
    Ok(lstm)
}

fn gru(device: Device) -> Checked<Gru> {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(8, rng::streams::INIT);
    let gru = Gru::new(&mut ParamBuilder::new(&mut store, &mut init, device), IN, H)?;
    gru.bias_input
        .copy_from_slice(&[0.1, -0.2, 0.3, 0.0, 0.5, 0.2])?;
    gru.bias_hidden
        .copy_from_slice(&[-0.3, 0.1, 0.2, 0.4, -0.1, 0.6])?;
    Ok(gru)
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// `Σ_j a[j]·W[j, k]` for a row-major `W` of `cols` columns.
fn dot(a: &[f64], w: &[f32], cols: usize, k: usize) -> f64 {
    a.iter()
        .enumerate()
        .map(|(j, &v)| v * w[j * cols + k] as f64)
        .sum()
}

/// One f64 step of a cell: the next states from the input and the states.
type CellFn<'a> = dyn Fn(&[f64], &[[f64; H]]) -> Vec<[f64; H]> + 'a;

/// One sequence `x` (`[steps, IN]`) through `cell` in f64, in the given order: the output (the
/// first state) after each step.
fn reference(
    x: &[f32],
    steps: usize,
    states: usize,
    cell: &CellFn<'_>,
    reverse: bool,
) -> Vec<[f64; H]> {
    let mut state = vec![[0.0f64; H]; states];
    let mut out = vec![[0.0; H]; steps];
    let order: Vec<usize> = if reverse {
        (0..steps).rev().collect()
    } else {
        (0..steps).collect()
    };
    for t in order {
        let input: Vec<f64> = x[t * IN..(t + 1) * IN].iter().map(|&v| v as f64).collect();
        state = cell(&input, &state);
        out[t] = state[0];
    }
    out
}

fn lstm_cell(l: &Lstm) -> impl Fn(&[f64], &[[f64; H]]) -> Vec<[f64; H]> {
    let (wi, wh, b) = (l.w_input.to_vec(), l.w_hidden.to_vec(), l.bias.to_vec());
    move |x, s| {
        let pre = |k: usize| dot(x, &wi, 4 * H, k) + dot(&s[0], &wh, 4 * H, k) + b[k] as f64;
        let (mut h, mut c) = ([0.0; H], s[1]);
        for u in 0..H {
            let (i, f) = (sigmoid(pre(u)), sigmoid(pre(H + u)));
            let (g, o) = (pre(2 * H + u).tanh(), sigmoid(pre(3 * H + u)));
            c[u] = f * c[u] + i * g;
            h[u] = o * c[u].tanh();
        }
        vec![h, c]
    }
}

fn gru_cell(g: &Gru) -> impl Fn(&[f64], &[[f64; H]]) -> Vec<[f64; H]> {
    let (wi, wh) = (g.w_input.to_vec(), g.w_hidden.to_vec());
    let (bi, bh) = (g.bias_input.to_vec(), g.bias_hidden.to_vec());
    move |x, s| {
        let from_x = |k: usize| dot(x, &wi, 3 * H, k) + bi[k] as f64;
        let from_h = |k: usize| dot(&s[0], &wh, 3 * H, k) + bh[k] as f64;
        let mut h = [0.0; H];
        for u in 0..H {
            let r = sigmoid(from_x(u) + from_h(u));
            let z = sigmoid(from_x(H + u) + from_h(H + u));
            let c = (from_x(2 * H + u) + r * from_h(2 * H + u)).tanh();
            h[u] = (1.0 - z) * c + z * s[0][u];
        }
        vec![h]
    }
}

/// The layer's outputs against the reference for every row, padded steps zero, both orders.
fn matches(layer: &dyn Recurrent, states: usize, cell: &CellFn<'_>, device: Device) -> TestResult {
    let xs = uniform(&[N, T, IN], -1.0, 1.0, 3, device).to_vec();
    let x = tensor(&xs, &[N, T, IN], device);
    for reverse in [false, true] {
        let got = layer.run(&x, Some(&LENGTHS), reverse)?.to_vec();
        let mut want = Vec::new();
        for (row, &len) in LENGTHS.iter().enumerate() {
            let seq = &xs[row * T * IN..(row * T + len) * IN];
            let mut outs = reference(seq, len, states, cell, reverse);
            outs.resize(T, [0.0; H]);
            want.extend(outs.iter().flatten().map(|&v| v as f32));
        }
        assert_close(&got, &want, 1e-5, &format!("reverse {reverse}"))?;
    }
    Ok(())
}

fn recurrent_layers_match_their_references(device: Device) -> TestResult {
    let l = lstm(device)?;
    matches(&l, 2, &lstm_cell(&l), device).map_err(|e| format!("lstm: {e}"))?;
    let g = gru(device)?;
    matches(&g, 1, &gru_cell(&g), device).map_err(|e| format!("gru: {e}"))?;
    Ok(())
}

/// What padding holds changes no real step's output and gets no gradient.
fn ignores_padding(layer: &dyn Recurrent, device: Device) -> TestResult {
    let xs = uniform(&[N, T, IN], -1.0, 1.0, 5, device).to_vec();
    let mut noisy = xs.clone();
    // Row 1 is 2 steps long: its third step is padding.
    noisy[(T + 2) * IN] = 40.0;
    noisy[(T + 2) * IN + 1] = -9.0;
    for reverse in [false, true] {
        let clean = layer.run(&tensor(&xs, &[N, T, IN], device), Some(&LENGTHS), reverse)?;
        let x = param(&[N, T, IN], 0.0, 0.0, 0, device);
        x.copy_from_slice(&noisy)?;
        let out = layer.run(&x, Some(&LENGTHS), reverse)?;
        assert_close(
            &out.to_vec(),
            &clean.to_vec(),
            0.0,
            "padding changed a real step",
        )?;
        let grads = out.sum_all()?.backward()?;
        let grad = grads
            .get(&x)
            .ok_or("no gradient reached the input")?
            .to_vec();
        let padded = &grad[(T + 2) * IN..(T + 3) * IN];
        ensure(
            padded == [0.0, 0.0],
            format!("padding got gradient {padded:?}"),
        )?;
        ensure(grad.iter().any(|&g| g != 0.0), "no real step got gradient")?;
    }
    Ok(())
}

fn recurrent_layers_ignore_padding(device: Device) -> TestResult {
    ignores_padding(&lstm(device)?, device).map_err(|e| format!("lstm: {e}"))?;
    ignores_padding(&gru(device)?, device).map_err(|e| format!("gru: {e}"))?;
    Ok(())
}

fn grad_recurrent_layers(device: Device) -> TestResult {
    let x = param(&[N, T, IN], -1.0, 1.0, 11, device);
    let (l, g) = (lstm(device)?, gru(device)?);
    for reverse in [false, true] {
        let inputs = [
            x.clone(),
            l.w_input.clone(),
            l.w_hidden.clone(),
            l.bias.clone(),
        ];
        let f = move |t: &[Tensor]| {
            Lstm::from_parts(t[1].clone(), t[2].clone(), t[3].clone())?.run(
                &t[0],
                Some(&LENGTHS),
                reverse,
            )
        };
        check_grads(&inputs, &f).map_err(|e| format!("lstm, reverse {reverse}: {e}"))?;
        let inputs = [
            x.clone(),
            g.w_input.clone(),
            g.w_hidden.clone(),
            g.bias_input.clone(),
            g.bias_hidden.clone(),
        ];
        let f = move |t: &[Tensor]| {
            Gru::from_parts((t[1].clone(), t[2].clone()), (t[3].clone(), t[4].clone()))?.run(
                &t[0],
                Some(&LENGTHS),
                reverse,
            )
        };
        check_grads(&inputs, &f).map_err(|e| format!("gru, reverse {reverse}: {e}"))?;
    }
    Ok(())
}

/// Both directions side by side: the forward layer's units, then the backward's.
fn bidirectional_concatenates_both_directions(device: Device) -> TestResult {
    let (ahead, behind) = (lstm(device)?, lstm(device)?);
    behind.bias.copy_from_slice(&[0.2; 4 * H])?;
    let x = uniform(&[N, T, IN], -1.0, 1.0, 9, device);
    let a = ahead.run(&x, Some(&LENGTHS), false)?.to_vec();
    let b = behind.run(&x, Some(&LENGTHS), true)?.to_vec();
    let both = BiLstm {
        forward: ahead,
        backward: behind,
    };
    let got = both.run(&x, Some(&LENGTHS))?;
    ensure(
        got.shape() == [N, T, 2 * H],
        format!("shape {:?}", got.shape()),
    )?;
    let want: Vec<f32> = a
        .chunks(H)
        .zip(b.chunks(H))
        .flat_map(|(a, b)| a.iter().chain(b).copied())
        .collect();
    assert_close(&got.to_vec(), &want, 0.0, "bidirectional")
}

fn recurrent_errors(device: Device) -> TestResult {
    let l = lstm(device)?;
    let x = Tensor::zeros(&[N, T, IN], device)?;
    for (lengths, want) in [
        (&[3usize][..], "1 lengths for a batch of 2 sequences"),
        (
            &[3, 4][..],
            "sequence 1 is 4 steps long, but the batch has 3 steps",
        ),
    ] {
        let err = l
            .run(&x, Some(lengths), false)
            .err()
            .ok_or("accepted")?
            .to_string();
        ensure(err.contains(want), format!("{err:?} does not say {want:?}"))?;
    }
    let flat = gru(device)?.run(&Tensor::zeros(&[N, IN], device)?, None, false);
    let err = flat.err().ok_or("a flat input was accepted")?.to_string();
    ensure(err.contains("is not [batch, steps, features]"), err)?;
    let zeros = |shape: &[usize]| Tensor::zeros(shape, device);
    let odd = Lstm::from_parts(zeros(&[IN, 4 * H])?, zeros(&[H, 3 * H])?, zeros(&[4 * H])?);
    let err = odd
        .err()
        .ok_or("mismatched weights were accepted")?
        .to_string();
    ensure(err.contains("are not [in, 4H], [H, 4H] and [4H]"), err)
}

/// Mean and max over each sequence's real steps: values against a direct computation, padding
/// without effect or gradient, finite differences, and sequences without a real step refused.
fn sequence_pool_over_real_steps(device: Device) -> TestResult {
    let xs = uniform(&[N, T, IN], -1.0, 1.0, 13, device).to_vec();
    let mut noisy = xs.clone();
    noisy[(T + 2) * IN] = 50.0; // row 1's padded step
    for kind in [SequencePoolKind::Mean, SequencePoolKind::Max] {
        let pool = SequencePool { kind };
        let x = param(&[N, T, IN], 0.0, 0.0, 0, device);
        x.copy_from_slice(&noisy)?;
        let got = pool.run(&x, Some(&LENGTHS))?;
        let mut want = Vec::new();
        for (row, &len) in LENGTHS.iter().enumerate() {
            for f in 0..IN {
                let steps = (0..len).map(|t| xs[(row * T + t) * IN + f]);
                want.push(match kind {
                    SequencePoolKind::Mean => steps.sum::<f32>() / len as f32,
                    SequencePoolKind::Max => steps.fold(f32::NEG_INFINITY, f32::max),
                });
            }
        }
        assert_close(&got.to_vec(), &want, 1e-6, &format!("{kind:?}"))?;
        let grads = got.sum_all()?.backward()?;
        let grad = grads.get(&x).ok_or("no gradient")?.to_vec();
        let padded = &grad[(T + 2) * IN..(T + 3) * IN];
        ensure(
            padded == [0.0, 0.0],
            format!("{kind:?}: padding got {padded:?}"),
        )?;
        let clean = param(&[N, T, IN], -1.0, 1.0, 17, device);
        check_grads(&[clean], &move |t: &[Tensor]| {
            pool.run(&t[0], Some(&LENGTHS))
        })
        .map_err(|e| format!("{kind:?}: {e}"))?;
        let err = pool
            .run(&x, Some(&[0, 2]))
            .err()
            .ok_or("an empty sequence was pooled")?;
        ensure(
            err.to_string()
                .contains("sequence 0 has 0 real steps; it needs 1 to 3"),
            err.to_string(),
        )?;
    }
    Ok(())
}

/// Lengths out of order, with an empty sequence: every sequence's outputs are what it gets alone
/// (unpadded, in a batch of one), zeros past its length, in both directions; and finite
/// differences through the packed steps (whose batch shrinks as sequences end).
fn recurrent_layers_pack_any_lengths(device: Device) -> TestResult {
    const LENS: [usize; 4] = [1, 3, 0, 2];
    let (n, steps) = (LENS.len(), 3);
    let layers: [(&str, Box<dyn Recurrent>); 2] = [
        ("lstm", Box::new(lstm(device)?)),
        ("gru", Box::new(gru(device)?)),
    ];
    let xs = uniform(&[n, steps, IN], -1.0, 1.0, 31, device).to_vec();
    let x = tensor(&xs, &[n, steps, IN], device);
    for (name, layer) in &layers {
        for reverse in [false, true] {
            let got = layer.run(&x, Some(&LENS), reverse)?.to_vec();
            let mut want = Vec::new();
            for (r, &len) in LENS.iter().enumerate() {
                if len > 0 {
                    let seq = &xs[r * steps * IN..(r * steps + len) * IN];
                    let alone = layer.run(&tensor(seq, &[1, len, IN], device), None, reverse)?;
                    want.extend(alone.to_vec());
                }
                want.resize((r + 1) * steps * H, 0.0);
            }
            assert_close(&got, &want, 1e-6, &format!("{name}, reverse {reverse}"))?;
        }
    }
    let l = lstm(device)?;
    let inputs = [
        param(&[n, steps, IN], -1.0, 1.0, 32, device),
        l.w_hidden.clone(),
    ];
    let w_input = l.w_input.clone();
    let bias = l.bias.clone();
    let f = move |t: &[Tensor]| {
        let layer = Lstm::from_parts(w_input.clone(), t[1].clone(), bias.clone())?;
        layer.run(&t[0], Some(&LENS), true)
    };
    check_grads(&inputs, &f).map_err(|e| format!("lstm gradients: {e}").into())
}

/// Finite differences of the ops a step is made of: the fused LSTM cell through both outputs
/// and through either alone (the other's gradient missing), the fused GRU cell, `split` with a
/// part unused, and `addmm`.
fn grad_recurrent_step_ops(device: Device) -> TestResult {
    let (n, h) = (3, 4);
    let gates = param(&[n, 4 * h], -2.0, 2.0, 21, device);
    let c_prev = param(&[n, h], -1.5, 1.5, 22, device);
    for (name, outputs) in [("h and c", 3), ("h alone", 1), ("c alone", 2)] {
        let f = move |t: &[Tensor]| {
            let (h, c) = t[0].lstm_cell(&t[1])?;
            match outputs {
                1 => Ok(h),
                2 => Ok(c),
                _ => Tensor::concat(&[&h, &c], 1),
            }
        };
        check_grads(&[gates.clone(), c_prev.clone()], &f)
            .map_err(|e| format!("lstm_cell, {name}: {e}"))?;
    }
    let x_gates = param(&[n, 3 * h], -2.0, 2.0, 23, device);
    let h_gates = param(&[n, 3 * h], -2.0, 2.0, 24, device);
    let h_prev = param(&[n, h], -1.0, 1.0, 25, device);
    let f = |t: &[Tensor]| t[0].gru_cell(&t[1], &t[2]);
    check_grads(&[x_gates, h_gates, h_prev], &f).map_err(|e| format!("gru_cell: {e}"))?;
    let x = param(&[6, 5], -1.0, 1.0, 26, device);
    let f = |t: &[Tensor]| {
        let parts = t[0].split(&[2, 3, 1])?;
        Tensor::concat(&[&parts[2], &parts[0].square()?], 0)
    };
    check_grads(&[x], &f).map_err(|e| format!("split: {e}"))?;
    let sum = param(&[3, 5], -1.0, 1.0, 27, device);
    let a = param(&[3, 4], -1.0, 1.0, 28, device);
    let b = param(&[4, 5], -1.0, 1.0, 29, device);
    let f = |t: &[Tensor]| t[0].addmm(&t[1], &t[2]);
    check_grads(&[sum, a, b], &f).map_err(|e| format!("addmm: {e}").into())
}

/// The step ops refuse operands that do not fit, naming the op and the shapes.
fn recurrent_step_op_errors(device: Device) -> TestResult {
    let zeros = |shape: &[usize]| Tensor::zeros(shape, device);
    let expect = |got: ringflow_ml::Result<()>, want: &[&str]| -> TestResult {
        let err = got.err().ok_or(format!("{want:?}: accepted"))?.to_string();
        for w in want {
            ensure(err.contains(w), format!("{err:?} does not say {w:?}"))?;
        }
        Ok(())
    };
    let lstm = zeros(&[2, 8])?.lstm_cell(&zeros(&[2, 3])?).map(drop);
    expect(lstm, &["lstm_cell", "[2, 8]", "[2, 3]", "[n, 4H]"])?;
    let lstm = zeros(&[2, 8])?.lstm_cell(&zeros(&[3, 2])?).map(drop);
    expect(lstm, &["lstm_cell", "[3, 2]"])?;
    let gru = zeros(&[2, 6])?.gru_cell(&zeros(&[2, 9])?, &zeros(&[2, 2])?);
    expect(gru.map(drop), &["gru_cell", "[2, 9]", "[n, 3H]"])?;
    let split = zeros(&[5, 2])?.split(&[2, 2]).map(drop);
    expect(split, &["split", "[5, 2]", "[2, 2]"])?;
    let addmm = zeros(&[2, 2])?.addmm(&zeros(&[2, 3])?, &zeros(&[3, 4])?);
    expect(addmm.map(drop), &["addmm", "[2, 2]", "[2, 4]"])?;
    let storage = |shape: &[usize]| Storage::zeros(shape, device);
    let backend =
        Storage::lstm_cell_backward(&storage(&[2, 13])?, &storage(&[2, 2])?, &storage(&[2, 2])?);
    expect(
        backend.map(drop),
        &["lstm_cell backward", "[2, 13]", "[n, 6H]"],
    )
}

device_test!(
    recurrent_layers_pack_any_lengths,
    grad_recurrent_step_ops,
    recurrent_step_op_errors,
    recurrent_layers_match_their_references,
    sequence_pool_over_real_steps,
    recurrent_layers_ignore_padding,
    grad_recurrent_layers,
    bidirectional_concatenates_both_directions,
    recurrent_errors,
);
