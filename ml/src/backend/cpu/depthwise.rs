//! Direct kernels for depthwise convolutions (one input channel per group, MobileNet's
//! `groups = in_channels`): each output plane is the sum of its kernel's taps, each tap a
//! scaled, shifted copy of the input plane, so nothing is unrolled and there is no product
//! of a one-row matrix to call per group.
//!
//! Planes run in parallel; the weight gradient is parallel over output channels, each summing
//! its images in order, so results do not depend on the number of threads.

use rayon::prelude::*;

use super::unroll::TapSpans;
use super::{CpuArray, PAR_MIN, slice, slice_mut, zeros};
use crate::backend::conv::Conv2dGeometry;

/// Whether `g` is depthwise: one input channel per group, more than one group.
pub fn applies(g: &Conv2dGeometry) -> bool {
    g.groups > 1 && g.groups == g.in_channels
}

/// Runs `f(index, chunk)` over `out` in chunks of `len`, in parallel when `out` is large.
fn for_each_chunk(out: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if len == 0 {
        return;
    }
    if out.len() < PAR_MIN {
        out.chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// Calls `f(tap, out_row, in_row, cols, first)` for every kernel tap (flat index `tap = i ·
/// kw + j`) and output row that reads inside the input.
fn for_each_tap(
    spans: &TapSpans,
    mut f: impl FnMut(usize, usize, usize, std::ops::Range<usize>, usize),
) {
    for tap in 0..spans.taps() {
        spans.for_each_row(tap, |r, in_row, cols, first| f(tap, r, in_row, cols, first));
    }
}

/// The forward pass: output plane `(n, o)` from input plane `(n, o / multiplier)`, starting
/// from the bias.
pub fn conv2d(x: &CpuArray, w: &CpuArray, bias: Option<&CpuArray>, g: &Conv2dGeometry) -> CpuArray {
    let [h, wd] = g.in_size;
    let [oh, ow] = g.out_size();
    let taps = g.kernel[0] * g.kernel[1];
    let multiplier = g.out_channels / g.groups;
    let spans = TapSpans::of(g);
    let (xs, ws, bias) = (slice(x), slice(w), bias.map(slice));
    let mut out = zeros(&g.output_shape());
    for_each_chunk(slice_mut(&mut out), oh * ow, |plane, out| {
        let (n, o) = (plane / g.out_channels, plane % g.out_channels);
        if let Some(b) = bias {
            out.fill(b[o]);
        }
        let input = &xs[(n * g.in_channels + o / multiplier) * h * wd..][..h * wd];
        let kernel = &ws[o * taps..(o + 1) * taps];
        for_each_tap(&spans, |tap, r, in_row, cols, first| {
            let weight = kernel[tap];
            let src = &input[in_row * wd..(in_row + 1) * wd];
            let dst = &mut out[r * ow + cols.start..r * ow + cols.end];
            if g.stride[1] == 1 {
                for (d, s) in dst.iter_mut().zip(&src[first..]) {
                    *d += weight * s;
                }
            } else {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d += weight * src[first + k * g.stride[1]];
                }
            }
        });
    });
    out
}

/// The input's gradient: input plane `(n, c)` gathers its `multiplier` output planes' taps.
pub fn conv2d_backward_input(dy: &CpuArray, w: &CpuArray, g: &Conv2dGeometry) -> CpuArray {
    let [h, wd] = g.in_size;
    let [oh, ow] = g.out_size();
    let taps = g.kernel[0] * g.kernel[1];
    let multiplier = g.out_channels / g.groups;
    let spans = TapSpans::of(g);
    let (dys, ws) = (slice(dy), slice(w));
    let mut dx = zeros(&g.input_shape());
    for_each_chunk(slice_mut(&mut dx), h * wd, |plane, dx| {
        let (n, c) = (plane / g.in_channels, plane % g.in_channels);
        for o in c * multiplier..(c + 1) * multiplier {
            let grad = &dys[(n * g.out_channels + o) * oh * ow..][..oh * ow];
            let kernel = &ws[o * taps..(o + 1) * taps];
            for_each_tap(&spans, |tap, r, in_row, cols, first| {
                let weight = kernel[tap];
                let src = &grad[r * ow + cols.start..r * ow + cols.end];
                let dst = &mut dx[in_row * wd..(in_row + 1) * wd];
                if g.stride[1] == 1 {
                    for (d, s) in dst[first..].iter_mut().zip(src) {
                        *d += weight * s;
                    }
                } else {
                    for (k, s) in src.iter().enumerate() {
                        dst[first + k * g.stride[1]] += weight * s;
                    }
                }
            });
        }
    });
    dx
}

/// `dst (=|+=) dL/dw`: each output channel's taps summed over its images in order.
pub fn conv2d_backward_weight(
    dst: &mut CpuArray,
    x: &CpuArray,
    dy: &CpuArray,
    g: &Conv2dGeometry,
    accumulate: bool,
) {
    let [h, wd] = g.in_size;
    let [oh, ow] = g.out_size();
    let taps = g.kernel[0] * g.kernel[1];
    let multiplier = g.out_channels / g.groups;
    let spans = TapSpans::of(g);
    let (xs, dys) = (slice(x), slice(dy));
    let dst = slice_mut(dst);
    if !accumulate {
        dst.fill(0.0);
    }
    // Per tap, products are summed column by column over rows and images (a loop the compiler
    // vectorizes), then across the columns once.
    let work = |(o, kernel): (usize, &mut [f32])| {
        let mut columns = vec![0.0f32; taps * ow];
        for n in 0..g.batch {
            let input = &xs[(n * g.in_channels + o / multiplier) * h * wd..][..h * wd];
            let grad = &dys[(n * g.out_channels + o) * oh * ow..][..oh * ow];
            for_each_tap(&spans, |tap, r, in_row, cols, first| {
                let src = &input[in_row * wd..(in_row + 1) * wd];
                let dy_row = &grad[r * ow + cols.start..r * ow + cols.end];
                let acc = &mut columns[tap * ow..tap * ow + dy_row.len()];
                if g.stride[1] == 1 {
                    for ((a, d), s) in acc.iter_mut().zip(dy_row).zip(&src[first..]) {
                        *a += d * s;
                    }
                } else {
                    for (k, (a, d)) in acc.iter_mut().zip(dy_row).enumerate() {
                        *a += d * src[first + k * g.stride[1]];
                    }
                }
            });
        }
        for (k, sum) in kernel.iter_mut().zip(columns.chunks(ow)) {
            *k += sum.iter().sum::<f32>();
        }
    };
    if xs.len() < PAR_MIN {
        dst.chunks_mut(taps).enumerate().for_each(work);
    } else {
        dst.par_chunks_mut(taps).enumerate().for_each(work);
    }
}
