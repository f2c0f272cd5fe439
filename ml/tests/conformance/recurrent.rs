//! The LSTM against a scalar reference in f64, its handling of padding (real steps unchanged by
//! what the padding holds, no gradient into it), and its gradients against finite differences.

use ringflow_ml::nn::{Lstm, ParamBuilder, ParamStore};
use ringflow_ml::{Device, Tensor, rng};

use crate::helpers::*;

const N: usize = 2;
const T: usize = 3;
const IN: usize = 2;
const H: usize = 2;
const LENGTHS: [usize; N] = [3, 2];

fn layer(device: Device) -> Result<Lstm, Box<dyn std::error::Error>> {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(7, rng::streams::INIT);
    let lstm = Lstm::new(&mut ParamBuilder::new(&mut store, &mut init, device), IN, H)?;
    lstm.bias
        .copy_from_slice(&[0.1, -0.2, 0.3, 0.0, 0.5, 0.2, -0.1, 0.4])?;
    Ok(lstm)
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// One sequence `x` (`[steps, IN]`) through the weights, in f64, in the given step order: the
/// output of each step it visits.
fn reference(x: &[f32], steps: usize, weights: [&[f32]; 3], reverse: bool) -> Vec<[f64; H]> {
    let [wi, wh, b] = weights;
    let (mut h, mut c) = ([0.0f64; H], [0.0f64; H]);
    let mut out = vec![[0.0; H]; steps];
    let order: Vec<usize> = if reverse {
        (0..steps).rev().collect()
    } else {
        (0..steps).collect()
    };
    for t in order {
        let pre = |k: usize| -> f64 {
            let from_x: f64 = (0..IN)
                .map(|j| x[t * IN + j] as f64 * wi[j * 4 * H + k] as f64)
                .sum();
            let from_h: f64 = (0..H).map(|j| h[j] * wh[j * 4 * H + k] as f64).sum();
            from_x + from_h + b[k] as f64
        };
        let mut next = [0.0; H];
        for u in 0..H {
            let (i, f) = (sigmoid(pre(u)), sigmoid(pre(H + u)));
            let (g, o) = (pre(2 * H + u).tanh(), sigmoid(pre(3 * H + u)));
            c[u] = f * c[u] + i * g;
            next[u] = o * c[u].tanh();
        }
        h = next;
        out[t] = h;
    }
    out
}

fn lstm_matches_its_reference(device: Device) -> TestResult {
    let lstm = layer(device)?;
    let xs = uniform(&[N, T, IN], -1.0, 1.0, 3, device).to_vec();
    let x = tensor(&xs, &[N, T, IN], device);
    let (wi, wh, b) = (
        lstm.w_input.to_vec(),
        lstm.w_hidden.to_vec(),
        lstm.bias.to_vec(),
    );
    for reverse in [false, true] {
        let got = lstm.run(&x, Some(&LENGTHS), reverse)?.to_vec();
        let mut want = Vec::new();
        for (row, &len) in LENGTHS.iter().enumerate() {
            let seq = &xs[row * T * IN..(row * T + len) * IN];
            let mut outs = reference(seq, len, [&wi, &wh, &b], reverse);
            outs.resize(T, [0.0; H]); // padded steps give zeros
            want.extend(outs.iter().flatten().map(|&v| v as f32));
        }
        assert_close(&got, &want, 1e-5, &format!("lstm, reverse {reverse}"))?;
    }
    Ok(())
}

fn lstm_ignores_padding(device: Device) -> TestResult {
    let lstm = layer(device)?;
    let xs = uniform(&[N, T, IN], -1.0, 1.0, 5, device).to_vec();
    let mut noisy = xs.clone();
    // Row 1 is 2 steps long: its third step is padding.
    noisy[(T + 2) * IN] = 40.0;
    noisy[(T + 2) * IN + 1] = -9.0;
    for reverse in [false, true] {
        let clean = lstm.run(&tensor(&xs, &[N, T, IN], device), Some(&LENGTHS), reverse)?;
        let x = param(&[N, T, IN], 0.0, 0.0, 0, device);
        x.copy_from_slice(&noisy)?;
        let out = lstm.run(&x, Some(&LENGTHS), reverse)?;
        assert_close(
            &out.to_vec(),
            &clean.to_vec(),
            0.0,
            "padding changed a real step",
        )?;
        out.sum_all()?.backward()?;
        let grad = x.grad().ok_or("no gradient reached the input")?.to_vec();
        let padded = &grad[(T + 2) * IN..(T + 3) * IN];
        ensure(
            padded == [0.0, 0.0],
            format!("padding got gradient {padded:?}"),
        )?;
        ensure(grad.iter().any(|&g| g != 0.0), "no real step got gradient")?;
    }
    Ok(())
}

fn grad_lstm(device: Device) -> TestResult {
    let lstm = layer(device)?;
    let x = param(&[N, T, IN], -1.0, 1.0, 11, device);
    for reverse in [false, true] {
        let inputs = [
            x.clone(),
            lstm.w_input.clone(),
            lstm.w_hidden.clone(),
            lstm.bias.clone(),
        ];
        let f = move |t: &[Tensor]| {
            Lstm::from_parts(t[1].clone(), t[2].clone(), t[3].clone())?.run(
                &t[0],
                Some(&LENGTHS),
                reverse,
            )
        };
        check_grads(&inputs, &f)?;
    }
    Ok(())
}

fn lstm_errors(device: Device) -> TestResult {
    let lstm = layer(device)?;
    let x = Tensor::zeros(&[N, T, IN], device)?;
    for (lengths, want) in [
        (&[3usize][..], "1 lengths for a batch of 2 sequences"),
        (
            &[3, 4][..],
            "sequence 1 is 4 steps long, but the batch has 3 steps",
        ),
    ] {
        let err = lstm
            .run(&x, Some(lengths), false)
            .err()
            .ok_or("accepted")?
            .to_string();
        ensure(err.contains(want), format!("{err:?} does not say {want:?}"))?;
    }
    let flat = lstm.run(&Tensor::zeros(&[N, IN], device)?, None, false);
    ensure(flat.is_err(), "a flat input was accepted")?;
    let w = Tensor::zeros(&[IN, 4 * H], device)?;
    let odd = Lstm::from_parts(
        w.clone(),
        Tensor::zeros(&[H, 3 * H], device)?,
        Tensor::zeros(&[4 * H], device)?,
    );
    ensure(odd.is_err(), "mismatched weights were accepted")
}

device_test!(
    lstm_matches_its_reference,
    lstm_ignores_padding,
    grad_lstm,
    lstm_errors
);
