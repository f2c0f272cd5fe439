//! 2-D convolution by im2col and GEMM.
//!
//! Per image and channel group, the input's windows are unrolled into a `[k, p]` matrix, one row
//! per kernel tap (`k = in_channels / groups · kh · kw`) and one column per output cell
//! (`p = oh · ow`), so that the convolution is one GEMM with the group's `[out_channels / groups,
//! k]` weights, and its backward passes are GEMMs with the transposes (the input's gradient is
//! then folded back onto the image, col2im). A 1×1 convolution with stride 1 and no padding reads
//! the image itself as that matrix. Depthwise convolutions (one input channel per group) take
//! the direct kernels of `depthwise.rs` instead.
//!
//! Images run in parallel on the current rayon pool with single-threaded GEMMs, each thread
//! unrolling into its own scratch buffer, which grows to the largest size needed and is kept, so
//! a training step allocates nothing but its outputs; a batch smaller than the pool runs image
//! by image with threaded GEMMs. The weight's gradient sums per-image products: images are
//! split into at most [`WEIGHT_PARTS`] runs by the batch size alone, each summed into a partial
//! buffer in parallel, then the partials are added in order, so the result does not depend on
//! the number of threads.

use std::cell::Cell;
use std::ops::Range;
use std::thread::LocalKey;

use rayon::prelude::*;

use super::gemm::{MatRef, matmul_into, matmul_into_serial};
use super::{CpuArray, depthwise, pool, slice, slice_mut, zeros};
use crate::backend::conv::{Conv2dGeometry, ConvOps, Pool2dGeometry};
use crate::error::Result;

/// The most runs of images whose weight gradients are summed separately (in parallel).
pub const WEIGHT_PARTS: usize = 16;

thread_local! {
    /// This thread's unrolled-input scratch.
    static COLUMNS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's partial weight gradients.
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Calls `f` with `len` elements of the thread's scratch buffer `key` (stale values: `f` must
/// write before it reads), growing it if needed and keeping it for the next call. A nested call
/// on the same thread (a threaded GEMM stealing work) gets a buffer of its own.
fn with_scratch<R>(
    key: &'static LocalKey<Cell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut buf = key.take();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let out = f(&mut buf[..len]);
    key.with(|cell| {
        let other = cell.take();
        cell.set(if other.len() > buf.len() { other } else { buf });
    });
    out
}

/// Sizes derived from a geometry.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Input channels per group.
    in_group: usize,
    /// Output channels per group.
    out_group: usize,
    /// Rows of the unrolled matrix: `in_group · kh · kw`.
    taps: usize,
    /// Output cells per plane.
    out_plane: usize,
    /// Input cells per plane.
    in_plane: usize,
    /// Whether the input must be unrolled (false for a 1×1, stride 1, unpadded convolution).
    unroll: bool,
}

impl Layout {
    fn of(g: &Conv2dGeometry) -> Layout {
        let in_group = g.in_channels / g.groups;
        let [oh, ow] = g.out_size();
        let pointwise = g.kernel == [1, 1] && g.stride == [1, 1] && g.padding == [0, 0];
        Layout {
            in_group,
            out_group: g.out_channels / g.groups,
            taps: in_group * g.kernel[0] * g.kernel[1],
            out_plane: oh * ow,
            in_plane: g.in_size[0] * g.in_size[1],
            unroll: !pointwise,
        }
    }

    /// Group `group`'s input channels within one image.
    fn in_range(&self, group: usize) -> Range<usize> {
        let len = self.in_group * self.in_plane;
        group * len..(group + 1) * len
    }

    /// Group `group`'s output channels within one image.
    fn out_range(&self, group: usize) -> Range<usize> {
        let len = self.out_group * self.out_plane;
        group * len..(group + 1) * len
    }

    /// Group `group`'s weights as an `[out_group, taps]` matrix.
    fn weights<'a>(&self, w: &'a [f32], group: usize) -> MatRef<'a> {
        let len = self.out_group * self.taps;
        MatRef::new(
            &w[group * len..(group + 1) * len],
            self.out_group,
            self.taps,
        )
    }
}

/// `dst (=|+=) a · b`, threaded or on the calling thread.
fn gemm(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, accumulate: bool, threaded: bool) {
    if threaded {
        matmul_into(dst, a, b, accumulate);
    } else {
        matmul_into_serial(dst, a, b, accumulate);
    }
}

/// Runs `f(n, chunk, threaded)` for each image `n` and its chunk of `out` (split in `batch`
/// equal parts): in parallel with `threaded` false when there are at least as many images as
/// threads, in order with `threaded` true otherwise.
fn for_each_image(
    out: &mut [f32],
    batch: usize,
    f: impl Fn(usize, &mut [f32], bool) + Sync + Send,
) {
    if batch == 0 || out.is_empty() {
        return;
    }
    let chunk = out.len() / batch;
    if batch >= rayon::current_num_threads() {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(n, o)| f(n, o, false));
    } else {
        for (n, o) in out.chunks_mut(chunk).enumerate() {
            f(n, o, true);
        }
    }
}

/// The outputs `o` in `0..out` whose input index `o · stride + offset − pad` lies in `0..len`.
fn valid_outputs(out: usize, len: usize, stride: usize, offset: usize, pad: usize) -> Range<usize> {
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    let hi = (len + pad).saturating_sub(offset).div_ceil(stride).min(out);
    lo.min(hi)..hi
}

/// Where one kernel tap (`channel`, `i`, `j`) reads: calls `f(out_row, in_row, cols, first)`
/// for each output row whose input row `in_row` exists, with the valid output columns `cols`
/// and the input column `first` of the first of them (the others follow at the stride).
/// Output rows not listed read only padding.
pub(super) fn for_each_tap_row(
    g: &Conv2dGeometry,
    (i, j): (usize, usize),
    mut f: impl FnMut(usize, usize, Range<usize>, usize),
) {
    let [oh, ow] = g.out_size();
    let rows = valid_outputs(
        oh,
        g.in_size[0],
        g.stride[0],
        i * g.dilation[0],
        g.padding[0],
    );
    let cols = valid_outputs(
        ow,
        g.in_size[1],
        g.stride[1],
        j * g.dilation[1],
        g.padding[1],
    );
    if cols.is_empty() {
        return;
    }
    let first = cols.start * g.stride[1] + j * g.dilation[1] - g.padding[1];
    for r in rows {
        let in_row = r * g.stride[0] + i * g.dilation[0] - g.padding[0];
        f(r, in_row, cols.clone(), first);
    }
}

/// `dst.copy_from_slice(src)` for the short runs of im2col (a row of a small output plane, often
/// 8 or 16 values): whole blocks of 8 are moved inline rather than by a call to `memcpy`, whose
/// overhead would exceed the copy.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    let mut blocks = dst.chunks_exact_mut(8);
    let mut from = src.chunks_exact(8);
    for (d, s) in (&mut blocks).zip(&mut from) {
        let s: &[f32; 8] = s.try_into().expect("a block of 8");
        d.copy_from_slice(s);
    }
    for (d, s) in blocks.into_remainder().iter_mut().zip(from.remainder()) {
        *d = *s;
    }
}

/// Unrolls one group of one image (`[in_group, h, w]`) into `cols` (`[taps, oh · ow]`),
/// writing every element (zeros where a tap reads padding).
fn im2col(x: &[f32], g: &Conv2dGeometry, cols: &mut [f32]) {
    let [h, w] = g.in_size;
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out_size();
    for (tap, row) in cols.chunks_exact_mut(oh * ow).enumerate() {
        let (c, i, j) = (tap / (kh * kw), tap / kw % kh, tap % kw);
        let plane = &x[c * h * w..(c + 1) * h * w];
        if g.padding != [0, 0] {
            // Without padding every tap of every output reads inside the input.
            row.fill(0.0);
        }
        for_each_tap_row(g, (i, j), |r, in_row, valid, first| {
            let src = &plane[in_row * w..(in_row + 1) * w];
            let dst = &mut row[r * ow + valid.start..r * ow + valid.end];
            if g.stride[1] == 1 {
                copy_short(dst, &src[first..first + dst.len()]);
            } else {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = src[first + k * g.stride[1]];
                }
            }
        });
    }
}

/// Folds `cols` (`[taps, oh · ow]`) back onto one group of one image (`[in_group, h, w]`),
/// adding each tap's values where it read.
fn col2im(cols: &[f32], g: &Conv2dGeometry, x: &mut [f32]) {
    let [h, w] = g.in_size;
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out_size();
    for (tap, row) in cols.chunks_exact(oh * ow).enumerate() {
        let (c, i, j) = (tap / (kh * kw), tap / kw % kh, tap % kw);
        let plane = &mut x[c * h * w..(c + 1) * h * w];
        for_each_tap_row(g, (i, j), |r, in_row, valid, first| {
            let dst = &mut plane[in_row * w..(in_row + 1) * w];
            let src = &row[r * ow + valid.start..r * ow + valid.end];
            if g.stride[1] == 1 {
                for (d, s) in dst[first..first + src.len()].iter_mut().zip(src) {
                    *d += s;
                }
            } else {
                for (k, s) in src.iter().enumerate() {
                    dst[first + k * g.stride[1]] += s;
                }
            }
        });
    }
}

/// Fills each `plane`-long row of `out` with its channel's value of `bias` (one per row).
fn fill_bias(out: &mut [f32], bias: &[f32], plane: usize) {
    for (row, &b) in out.chunks_mut(plane.max(1)).zip(bias) {
        row.fill(b);
    }
}

/// `conv(x, w) + bias`: `[batch, out_channels, oh, ow]`. With a bias, each output block starts
/// as the bias and the product is added to it.
pub fn conv2d(x: &CpuArray, w: &CpuArray, bias: Option<&CpuArray>, g: &Conv2dGeometry) -> CpuArray {
    let l = Layout::of(g);
    let (xs, ws, bias) = (slice(x), slice(w), bias.map(slice));
    let mut out = zeros(&g.output_shape());
    let image_in = g.in_channels * l.in_plane;
    for_each_image(slice_mut(&mut out), g.batch, |n, out, threaded| {
        let image = &xs[n * image_in..(n + 1) * image_in];
        for group in 0..g.groups {
            let x_g = &image[l.in_range(group)];
            let out_g = &mut out[l.out_range(group)];
            if let Some(b) = bias {
                fill_bias(out_g, &b[group * l.out_group..], l.out_plane);
            }
            let (w_g, add) = (l.weights(ws, group), bias.is_some());
            if l.unroll {
                with_scratch(&COLUMNS, l.taps * l.out_plane, |cols| {
                    im2col(x_g, g, cols);
                    let cols = MatRef::new(cols, l.taps, l.out_plane);
                    gemm(out_g, w_g, cols, add, threaded);
                });
            } else {
                let x_g = MatRef::new(x_g, l.in_group, l.in_plane);
                gemm(out_g, w_g, x_g, add, threaded);
            }
        }
    });
    out
}

/// The input's gradient: per image and group, `col2im(W_gᵀ · dy_g)`.
pub fn conv2d_backward_input(dy: &CpuArray, w: &CpuArray, g: &Conv2dGeometry) -> CpuArray {
    let l = Layout::of(g);
    let (dys, ws) = (slice(dy), slice(w));
    let mut dx = zeros(&g.input_shape());
    let image_out = g.out_channels * l.out_plane;
    for_each_image(slice_mut(&mut dx), g.batch, |n, dx, threaded| {
        let dy_n = &dys[n * image_out..(n + 1) * image_out];
        for group in 0..g.groups {
            let dy_g = MatRef::new(&dy_n[l.out_range(group)], l.out_group, l.out_plane);
            let w_t = l.weights(ws, group).t();
            let dx_g = &mut dx[l.in_range(group)];
            if l.unroll {
                with_scratch(&COLUMNS, l.taps * l.out_plane, |cols| {
                    gemm(cols, w_t, dy_g, false, threaded);
                    col2im(cols, g, dx_g);
                });
            } else {
                gemm(dx_g, w_t, dy_g, false, threaded);
            }
        }
    });
    dx
}

/// Adds (or, for the first image with `accumulate` false, writes) image `n`'s weight gradient
/// `dy_g · cols_gᵀ` for every group into `dw`.
fn add_image_weight_grad(
    dw: &mut [f32],
    (x, dy): (&[f32], &[f32]),
    g: &Conv2dGeometry,
    accumulate: bool,
    threaded: bool,
) {
    let l = Layout::of(g);
    for group in 0..g.groups {
        let dy_g = MatRef::new(&dy[l.out_range(group)], l.out_group, l.out_plane);
        let len = l.out_group * l.taps;
        let dw_g = &mut dw[group * len..(group + 1) * len];
        let x_g = &x[l.in_range(group)];
        if l.unroll {
            with_scratch(&COLUMNS, l.taps * l.out_plane, |cols| {
                im2col(x_g, g, cols);
                let cols_t = MatRef::new(cols, l.taps, l.out_plane).t();
                gemm(dw_g, dy_g, cols_t, accumulate, threaded);
            });
        } else {
            let x_t = MatRef::new(x_g, l.in_group, l.in_plane).t();
            gemm(dw_g, dy_g, x_t, accumulate, threaded);
        }
    }
}

/// `dst (=|+=) Σₙ dy[n] · cols[n]ᵀ`, per group.
pub fn conv2d_backward_weight(
    dst: &mut CpuArray,
    x: &CpuArray,
    dy: &CpuArray,
    g: &Conv2dGeometry,
    accumulate: bool,
) {
    let l = Layout::of(g);
    let (xs, dys, dst) = (slice(x), slice(dy), slice_mut(dst));
    let parts = g.batch.min(WEIGHT_PARTS);
    if parts == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    let (image_in, image_out) = (g.in_channels * l.in_plane, g.out_channels * l.out_plane);
    let threaded = parts < rayon::current_num_threads();
    let size = dst.len();
    with_scratch(&PARTIALS, (parts - 1) * size, |partials| {
        let mut sums: Vec<(&mut [f32], bool)> = std::iter::once((&mut *dst, accumulate))
            .chain(partials.chunks_mut(size.max(1)).map(|p| (p, false)))
            .collect();
        sums.par_iter_mut()
            .enumerate()
            .for_each(|(part, (sum, add))| {
                let images = part * g.batch / parts..(part + 1) * g.batch / parts;
                for (i, n) in images.enumerate() {
                    let x_n = &xs[n * image_in..(n + 1) * image_in];
                    let dy_n = &dys[n * image_out..(n + 1) * image_out];
                    add_image_weight_grad(sum, (x_n, dy_n), g, *add || i > 0, threaded);
                }
            });
        drop(sums);
        for part in partials.chunks(size.max(1)) {
            for (d, p) in dst.iter_mut().zip(part) {
                *d += p;
            }
        }
    });
}

impl ConvOps for CpuArray {
    fn conv2d(x: &Self, w: &Self, bias: Option<&Self>, g: &Conv2dGeometry) -> Result<Self> {
        Ok(if depthwise::applies(g) {
            depthwise::conv2d(x, w, bias, g)
        } else {
            conv2d(x, w, bias, g)
        })
    }

    fn conv2d_backward_input(grad: &Self, w: &Self, g: &Conv2dGeometry) -> Result<Self> {
        Ok(if depthwise::applies(g) {
            depthwise::conv2d_backward_input(grad, w, g)
        } else {
            conv2d_backward_input(grad, w, g)
        })
    }

    fn conv2d_backward_weight(
        dst: &mut Self,
        x: &Self,
        grad: &Self,
        g: &Conv2dGeometry,
        accumulate: bool,
    ) -> Result<()> {
        if depthwise::applies(g) {
            depthwise::conv2d_backward_weight(dst, x, grad, g, accumulate);
        } else {
            conv2d_backward_weight(dst, x, grad, g, accumulate);
        }
        Ok(())
    }

    fn max_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<(Self, Self)> {
        Ok(pool::max_pool2d(x, p))
    }

    fn max_pool2d_backward(grad: &Self, argmax: &Self, p: &Pool2dGeometry) -> Result<Self> {
        pool::max_pool2d_backward(grad, argmax, p)
    }

    fn avg_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<Self> {
        Ok(pool::avg_pool2d(x, p))
    }

    fn avg_pool2d_backward(grad: &Self, p: &Pool2dGeometry) -> Result<Self> {
        Ok(pool::avg_pool2d_backward(grad, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_outputs_are_those_that_read_inside_the_input() {
        for (out, len, stride, offset, pad) in [
            (5, 5, 1, 0, 1),
            (5, 5, 1, 2, 1),
            (3, 7, 2, 0, 0),
            (4, 7, 2, 1, 1),
            (2, 3, 3, 0, 2),
            (1, 1, 1, 2, 1),
        ] {
            let want: Vec<usize> = (0..out)
                .filter(|&o| {
                    let i = (o * stride + offset) as isize - pad as isize;
                    (0..len as isize).contains(&i)
                })
                .collect();
            let got: Vec<usize> = valid_outputs(out, len, stride, offset, pad).collect();
            assert_eq!(
                got, want,
                "out {out} len {len} stride {stride} offset {offset}"
            );
        }
    }
}
