//! The recurrent gates ([`RecurrentOps`]) in one pass over the rows: each kernel reads its
//! operands once and writes its outputs once, with the activations evaluated by a branch-free
//! exponential ([`exp`]) so that the loop over a row's units vectorizes. Rows run on rayon's
//! threads only when a call has enough of them to pay for it.

use super::{CpuArray, PAR_MIN, from_vec, slice};
use crate::backend::recurrent::{
    GRU_SAVED_BLOCKS, LSTM_SAVED_BLOCKS, RecurrentOps, gru_shapes, lstm_shapes,
};
use crate::error::Result;

/// `e^x` in f32 without a library call: `x = k·ln 2 + r` with `|r| ≤ ln 2 / 2`, `e^r` by
/// Cephes' minimax polynomial (relative error about 1e-7) and `2^k` built in the exponent bits.
/// Arguments are clamped to `[-87, 88]`, where `e^x` is a normal float (so `e^-∞` is about
/// `1.6e-38`, not 0); NaN stays NaN. Every step is branch-free, so loops vectorize.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Adding 1.5·2²³ rounds to an integer that lands in the low bits of the mantissa.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let k = t - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    er * f32::from_bits(bits)
}

/// The logistic function through [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The hyperbolic tangent through [`exp`]: `1 − 2 / (e^{2x} + 1)` (absolute error about 1e-7).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `σ'` from `s = σ(x)`.
#[inline(always)]
fn sigmoid_slope(s: f32) -> f32 {
    s * (1.0 - s)
}

/// `tanh'` from `t = tanh(x)`.
#[inline(always)]
fn tanh_slope(t: f32) -> f32 {
    1.0 - t * t
}

/// Gate values per block of rows below which a kernel stays on one thread. A call from outside
/// rayon's pool pays a round trip to its threads (tens of microseconds), about what a
/// recurrent step of batch 32 and 128 units costs on one thread, so only larger ones split.
const PAR_GATES: usize = PAR_MIN;

/// An output written row by row, `width` values per row.
struct RowsMut<'a> {
    data: &'a mut [f32],
    width: usize,
}

/// Runs `f(first_row, outputs)` over blocks of the `rows` rows of `outputs`, halving blocks on
/// rayon's threads while one holds more than `grain` rows. Each row is written by exactly one
/// call, so results do not depend on the number of threads.
fn for_row_blocks<F>(first: usize, rows: usize, outputs: Vec<RowsMut<'_>>, grain: usize, f: &F)
where
    F: Fn(usize, &mut [RowsMut<'_>]) + Sync,
{
    if rows <= grain.max(1) {
        let mut outputs = outputs;
        f(first, &mut outputs);
        return;
    }
    let half = rows / 2;
    let (low, high): (Vec<_>, Vec<_>) = outputs
        .into_iter()
        .map(|o| {
            let (a, b) = o.data.split_at_mut(half * o.width);
            let width = o.width;
            (RowsMut { data: a, width }, RowsMut { data: b, width })
        })
        .unzip();
    rayon::join(
        || for_row_blocks(first, half, low, grain, f),
        || for_row_blocks(first + half, rows - half, high, grain, f),
    );
}

/// New zero arrays of `[rows, width]` for each width, the kernel `f` run over their rows (see
/// [`for_row_blocks`]; `gates` values per row set the grain), and the arrays.
fn run_rows<const K: usize>(
    rows: usize,
    widths: [usize; K],
    gates: usize,
    f: impl Fn(usize, &mut [RowsMut<'_>]) + Sync,
) -> [CpuArray; K] {
    let mut buffers = widths.map(|w| vec![0.0f32; rows * w]);
    if widths.iter().all(|&w| w > 0) {
        let outputs = buffers
            .iter_mut()
            .zip(widths)
            .map(|(data, width)| RowsMut { data, width })
            .collect();
        let grain = PAR_GATES.div_ceil(gates.max(1));
        for_row_blocks(0, rows, outputs, grain, &f);
    }
    let mut widths = widths.into_iter();
    buffers.map(|b| from_vec(&[rows, widths.next().unwrap_or(0)], b))
}

/// Row `row` of a `[rows, width]` slice.
#[inline(always)]
fn row(x: &[f32], width: usize, row: usize) -> &[f32] {
    &x[row * width..][..width]
}

/// The `N` consecutive blocks of `h` values of `x` (which holds at least `N·h`), each sliced to
/// exactly `h` values so that the compiler drops the bounds checks of a loop over `0..h` (and
/// vectorizes it).
#[inline(always)]
fn blocks<const N: usize>(x: &[f32], h: usize) -> [&[f32]; N] {
    std::array::from_fn(|k| &x[k * h..][..h])
}

/// The `N` consecutive blocks of `h` values of `x` (which holds `N·h`), mutable, each sliced to
/// exactly `h` values.
#[inline(always)]
fn blocks_mut<const N: usize>(x: &mut [f32], h: usize) -> [&mut [f32]; N] {
    let mut rest = x;
    std::array::from_fn(|_| {
        let (block, tail) = std::mem::take(&mut rest).split_at_mut(h);
        rest = tail;
        block
    })
}

impl RowsMut<'_> {
    /// The rows, `width` values each.
    fn rows(&mut self) -> std::slice::ChunksExactMut<'_, f32> {
        self.data.chunks_exact_mut(self.width.max(1))
    }
}

/// One LSTM step: `(h, c, saved)`.
pub fn lstm_cell(gates: &CpuArray, c_prev: &CpuArray) -> Result<[CpuArray; 3]> {
    let h = lstm_shapes(false, gates.shape(), &[c_prev.shape()])?;
    let (gs, cs) = (slice(gates), slice(c_prev));
    let widths = [h, h, LSTM_SAVED_BLOCKS * h];
    Ok(run_rows(
        gates.shape()[0],
        widths,
        4 * h,
        |first, outputs| {
            let [hs, cn, saved] = outputs else { return };
            let rows = hs.rows().zip(cn.rows()).zip(saved.rows());
            for (k, ((hs, cn), saved)) in rows.enumerate() {
                let r = first + k;
                let [gi, gf, gg, go] = blocks::<4>(row(gs, 4 * h, r), h);
                let cp = row(cs, h, r);
                let [i, f, g, o, c_prev, tanh_c] = blocks_mut::<6>(saved, h);
                let (hs, cn) = (&mut hs[..h], &mut cn[..h]);
                for u in 0..h {
                    let (iu, fu) = (sigmoid(gi[u]), sigmoid(gf[u]));
                    let (gu, ou) = (tanh(gg[u]), sigmoid(go[u]));
                    let c = fu * cp[u] + iu * gu;
                    let t = tanh(c);
                    (i[u], f[u], g[u], o[u]) = (iu, fu, gu, ou);
                    (c_prev[u], tanh_c[u]) = (cp[u], t);
                    cn[u] = c;
                    hs[u] = ou * t;
                }
            }
        },
    ))
}

/// The LSTM step's gradients `(dgates, dc_prev)`.
pub fn lstm_cell_backward(saved: &CpuArray, dh: &CpuArray, dc: &CpuArray) -> Result<[CpuArray; 2]> {
    let h = lstm_shapes(true, saved.shape(), &[dh.shape(), dc.shape()])?;
    let (ss, dhs, dcs) = (slice(saved), slice(dh), slice(dc));
    let widths = [4 * h, h];
    Ok(run_rows(
        saved.shape()[0],
        widths,
        4 * h,
        |first, outputs| {
            let [dgates, dc_prev] = outputs else { return };
            for (k, (dgates, dc_prev)) in dgates.rows().zip(dc_prev.rows()).enumerate() {
                let r = first + k;
                let [i, f, g, o, cp, tc] = blocks::<6>(row(ss, LSTM_SAVED_BLOCKS * h, r), h);
                let (dh, dc) = (row(dhs, h, r), row(dcs, h, r));
                let [di, df, dg, d_o] = blocks_mut::<4>(dgates, h);
                let dc_prev = &mut dc_prev[..h];
                for u in 0..h {
                    let dct = dc[u] + dh[u] * o[u] * tanh_slope(tc[u]);
                    di[u] = dct * g[u] * sigmoid_slope(i[u]);
                    df[u] = dct * cp[u] * sigmoid_slope(f[u]);
                    dg[u] = dct * i[u] * tanh_slope(g[u]);
                    d_o[u] = dh[u] * tc[u] * sigmoid_slope(o[u]);
                    dc_prev[u] = dct * f[u];
                }
            }
        },
    ))
}

/// One GRU step: `(h, saved)`.
pub fn gru_cell(
    x_gates: &CpuArray,
    h_gates: &CpuArray,
    h_prev: &CpuArray,
) -> Result<[CpuArray; 2]> {
    let h = gru_shapes(false, &[x_gates.shape(), h_gates.shape()], h_prev.shape())?;
    let (xs, hgs, hps) = (slice(x_gates), slice(h_gates), slice(h_prev));
    let widths = [h, GRU_SAVED_BLOCKS * h];
    Ok(run_rows(
        h_prev.shape()[0],
        widths,
        3 * h,
        |first, outputs| {
            let [hs, saved] = outputs else { return };
            for (k, (hs, saved)) in hs.rows().zip(saved.rows()).enumerate() {
                let r = first + k;
                let [xr, xz, xc] = blocks::<3>(row(xs, 3 * h, r), h);
                let [hr, hz, hc] = blocks::<3>(row(hgs, 3 * h, r), h);
                let hp = row(hps, h, r);
                let [rs, zs, cs, us, h_prev] = blocks_mut::<5>(saved, h);
                let hs = &mut hs[..h];
                for u in 0..h {
                    let (ru, zu) = (sigmoid(xr[u] + hr[u]), sigmoid(xz[u] + hz[u]));
                    let c = tanh(xc[u] + ru * hc[u]);
                    (rs[u], zs[u], cs[u], us[u], h_prev[u]) = (ru, zu, c, hc[u], hp[u]);
                    hs[u] = c + zu * (hp[u] - c);
                }
            }
        },
    ))
}

/// The GRU step's gradients `(dx_gates, dh_gates, dh_prev)`.
pub fn gru_cell_backward(saved: &CpuArray, dh: &CpuArray) -> Result<[CpuArray; 3]> {
    let h = gru_shapes(true, &[saved.shape()], dh.shape())?;
    let (ss, dhs) = (slice(saved), slice(dh));
    let widths = [3 * h, 3 * h, h];
    Ok(run_rows(dh.shape()[0], widths, 3 * h, |first, outputs| {
        let [dx, dhg, dh_prev] = outputs else { return };
        let rows = dx.rows().zip(dhg.rows()).zip(dh_prev.rows());
        for (k, ((dx, dhg), dh_prev)) in rows.enumerate() {
            let row_index = first + k;
            let [r, z, c, u, hp] = blocks::<5>(row(ss, GRU_SAVED_BLOCKS * h, row_index), h);
            let dh = row(dhs, h, row_index);
            let [dxr, dxz, dxc] = blocks_mut::<3>(dx, h);
            let [dhr, dhz, dhc] = blocks_mut::<3>(dhg, h);
            let dh_prev = &mut dh_prev[..h];
            for k in 0..h {
                let dc = dh[k] * (1.0 - z[k]) * tanh_slope(c[k]);
                let dr = dc * u[k] * sigmoid_slope(r[k]);
                let dz = dh[k] * (hp[k] - c[k]) * sigmoid_slope(z[k]);
                (dxr[k], dxz[k], dxc[k]) = (dr, dz, dc);
                (dhr[k], dhz[k], dhc[k]) = (dr, dz, dc * r[k]);
                dh_prev[k] = dh[k] * z[k];
            }
        }
    }))
}

impl RecurrentOps for CpuArray {
    /// One pass over the rows.
    fn lstm_cell(gates: &Self, c_prev: &Self) -> Result<(Self, Self, Self)> {
        let [h, c, saved] = lstm_cell(gates, c_prev)?;
        Ok((h, c, saved))
    }

    /// One pass over the rows.
    fn lstm_cell_backward(saved: &Self, dh: &Self, dc: &Self) -> Result<(Self, Self)> {
        let [dgates, dc_prev] = lstm_cell_backward(saved, dh, dc)?;
        Ok((dgates, dc_prev))
    }

    /// One pass over the rows.
    fn gru_cell(x_gates: &Self, h_gates: &Self, h_prev: &Self) -> Result<(Self, Self)> {
        let [h, saved] = gru_cell(x_gates, h_gates, h_prev)?;
        Ok((h, saved))
    }

    /// One pass over the rows.
    fn gru_cell_backward(saved: &Self, dh: &Self) -> Result<(Self, Self, Self)> {
        let [dx, dh_gates, dh_prev] = gru_cell_backward(saved, dh)?;
        Ok((dx, dh_gates, dh_prev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_match_the_library_functions() {
        let mut worst = [0.0f64; 3];
        for k in -40_000..=40_000 {
            let x = k as f32 * 0.0025;
            let e = (x as f64).exp();
            if (-87.0..=88.0).contains(&x) {
                worst[0] = worst[0].max(((exp(x) as f64 - e) / e).abs());
            }
            worst[1] = worst[1].max((sigmoid(x) as f64 - 1.0 / (1.0 + (-x as f64).exp())).abs());
            worst[2] = worst[2].max((tanh(x) as f64 - (x as f64).tanh()).abs());
        }
        assert!(worst[0] < 3e-7, "exp: relative error {}", worst[0]);
        assert!(worst[1] < 2e-7, "sigmoid: error {}", worst[1]);
        assert!(worst[2] < 3e-7, "tanh: error {}", worst[2]);
    }

    #[test]
    fn activations_saturate_and_keep_nan() {
        assert!((0.0..1e-30).contains(&sigmoid(-1000.0)));
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(tanh(1000.0), 1.0);
        assert_eq!(tanh(-1000.0), -1.0);
        assert!(exp(f32::INFINITY).is_finite() && exp(f32::NEG_INFINITY) > 0.0);
        assert!(exp(f32::NAN).is_nan() && tanh(f32::NAN).is_nan());
    }
}
