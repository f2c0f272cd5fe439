//! Batch normalization in fused per-channel passes: statistics in one read of the input (sums
//! in f64, shifted by the channel's first value), the normalization in one read and one write,
//! and the backward pass in two reads and one write; the per-channel sum in one read.

use rayon::prelude::*;

use super::{CpuArray, PAR_MIN, from_vec, slice, slice_mut, zeros};
use crate::backend::norm::NormOps;
use crate::error::Result;

/// `[batch, channels, rest]`: the shape with the axes after 1 merged.
fn view(x: &CpuArray) -> [usize; 3] {
    let s = x.shape();
    [s[0], s[1], s[2..].iter().product()]
}

/// `f(c)` for every channel, in parallel when the input is large; the results in channel order.
fn per_channel<T: Send>(x: &CpuArray, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    let channels = view(x)[1];
    if x.len() < PAR_MIN {
        (0..channels).map(f).collect()
    } else {
        (0..channels).into_par_iter().map(f).collect()
    }
}

/// The values of channel `c`: `batch` runs of `rest` values.
fn channel_runs(
    xs: &[f32],
    [_, channels, rest]: [usize; 3],
    c: usize,
) -> impl Iterator<Item = &[f32]> {
    xs.chunks(channels * rest.max(1))
        .map(move |row| &row[c * rest..(c + 1) * rest])
}

/// Writes `out[i] = f(c, i)` for every element `i` of channel `c`, rows in parallel when large.
fn map_rows(
    out: &mut CpuArray,
    [_, channels, rest]: [usize; 3],
    f: impl Fn(usize, usize) -> f32 + Sync + Send,
) {
    let row_len = channels * rest;
    if row_len == 0 {
        return;
    }
    let fill = |(n, row): (usize, &mut [f32])| {
        for (c, run) in row.chunks_mut(rest).enumerate() {
            let base = n * row_len + c * rest;
            for (k, o) in run.iter_mut().enumerate() {
                *o = f(c, base + k);
            }
        }
    };
    let os = slice_mut(out);
    if os.len() < PAR_MIN {
        os.chunks_mut(row_len).enumerate().for_each(fill);
    } else {
        os.par_chunks_mut(row_len).enumerate().for_each(fill);
    }
}

/// `run`'s sum in eight f32 lanes (which the compiler vectorizes), the lanes added in f64.
fn run_sum(run: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = run.chunks_exact(8);
    for chunk in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    lanes.iter().map(|&l| l as f64).sum::<f64>() + tail
}

/// The sum of each channel's elements: runs summed in f32 lanes, runs added in f64.
pub fn channel_sum(x: &CpuArray) -> CpuArray {
    let v = view(x);
    let xs = slice(x);
    let sums = per_channel(x, |c| {
        channel_runs(xs, v, c).map(run_sum).sum::<f64>() as f32
    });
    from_vec(&[v[1]], sums)
}

/// Per-channel mean and biased variance.
pub fn batch_norm_stats(x: &CpuArray) -> (CpuArray, CpuArray) {
    let v = view(x);
    let xs = slice(x);
    let count = (v[0] * v[2]) as f64;
    let stats = per_channel(x, |c| {
        let shift = channel_runs(xs, v, c)
            .flatten()
            .next()
            .copied()
            .unwrap_or(0.0) as f64;
        let (mut s1, mut s2) = (0.0f64, 0.0f64);
        for &value in channel_runs(xs, v, c).flatten() {
            let d = value as f64 - shift;
            s1 += d;
            s2 += d * d;
        }
        if count == 0.0 {
            return (0.0, 0.0);
        }
        let m = s1 / count;
        ((shift + m) as f32, (s2 / count - m * m).max(0.0) as f32)
    });
    let (mean, var): (Vec<f32>, Vec<f32>) = stats.into_iter().unzip();
    (from_vec(&[v[1]], mean), from_vec(&[v[1]], var))
}

/// `x · scale[c] + shift[c]` with `scale = γ / √(var + eps)` and `shift = β − mean · scale`.
pub fn batch_norm(
    x: &CpuArray,
    (mean, var): (&CpuArray, &CpuArray),
    (gamma, beta): (&CpuArray, &CpuArray),
    eps: f32,
) -> CpuArray {
    let v = view(x);
    let (m, var, g, b) = (slice(mean), slice(var), slice(gamma), slice(beta));
    let scale: Vec<f32> = (0..v[1]).map(|c| g[c] / (var[c] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..v[1]).map(|c| b[c] - m[c] * scale[c]).collect();
    let xs = slice(x);
    let mut out = zeros(x.shape());
    map_rows(&mut out, v, |c, i| xs[i] * scale[c] + shift[c]);
    out
}

/// `(dx, dgamma, dbeta)`: the per-channel sums `Σ dy` and `Σ dy · (x − mean)` in one read, then
/// `dx = a·dy + b·x + c` per channel with the coefficients of the full derivative (through the
/// batch statistics when `batch_stats`).
pub fn batch_norm_backward(
    (x, dy): (&CpuArray, &CpuArray),
    (mean, var, gamma): (&CpuArray, &CpuArray, &CpuArray),
    eps: f32,
    batch_stats: bool,
) -> (CpuArray, CpuArray, CpuArray) {
    let v = view(x);
    let (xs, dys, m, var, g) = (slice(x), slice(dy), slice(mean), slice(var), slice(gamma));
    let sums = per_channel(x, |c| {
        let (mut sdy, mut sdyx) = (0.0f64, 0.0f64);
        for (xr, dr) in channel_runs(xs, v, c).zip(channel_runs(dys, v, c)) {
            for (&xv, &d) in xr.iter().zip(dr) {
                sdy += d as f64;
                sdyx += d as f64 * (xv - m[c]) as f64;
            }
        }
        (sdy, sdyx)
    });
    let count = ((v[0] * v[2]) as f64).max(1.0);
    let mut coeffs = Vec::with_capacity(v[1]);
    let (mut dgamma, mut dbeta) = (Vec::with_capacity(v[1]), Vec::with_capacity(v[1]));
    for (c, &(sdy, sdyx)) in sums.iter().enumerate() {
        let inv_std = 1.0 / (var[c] as f64 + eps as f64).sqrt();
        let dg = sdyx * inv_std;
        let a = g[c] as f64 * inv_std;
        let (b, k) = if batch_stats {
            let b = -a * inv_std * dg / count;
            (b, -a * sdy / count - b * m[c] as f64)
        } else {
            (0.0, 0.0)
        };
        coeffs.push((a as f32, b as f32, k as f32));
        dgamma.push(dg as f32);
        dbeta.push(sdy as f32);
    }
    let mut dx = zeros(x.shape());
    map_rows(&mut dx, v, |c, i| {
        let (a, b, k) = coeffs[c];
        a * dys[i] + b * xs[i] + k
    });
    (dx, from_vec(&[v[1]], dgamma), from_vec(&[v[1]], dbeta))
}

impl NormOps for CpuArray {
    /// One pass per channel.
    fn channel_sum(x: &Self) -> Result<Self> {
        Ok(channel_sum(x))
    }

    /// One pass per channel.
    fn batch_norm_stats(x: &Self) -> Result<(Self, Self)> {
        Ok(batch_norm_stats(x))
    }

    /// One pass.
    fn batch_norm(
        x: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        beta: &Self,
        eps: f32,
    ) -> Result<Self> {
        Ok(batch_norm(x, (mean, var), (gamma, beta), eps))
    }

    /// Two reads of the input and the gradient, one write.
    fn batch_norm_backward(
        x: &Self,
        grad: &Self,
        mean: &Self,
        var: &Self,
        gamma: &Self,
        eps: f32,
        batch_stats: bool,
    ) -> Result<(Self, Self, Self)> {
        Ok(batch_norm_backward(
            (x, grad),
            (mean, var, gamma),
            eps,
            batch_stats,
        ))
    }
}
