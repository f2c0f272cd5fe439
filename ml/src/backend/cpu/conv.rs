//! 2-D convolution by im2col and GEMM.
//!
//! Per image and channel group, the input's windows are unrolled into a `[k, p]` matrix, one row
//! per kernel tap (`k = in_channels / groups · kh · kw`) and one column per output cell
//! (`p = oh · ow`), so that the convolution is one GEMM with the group's `[out_channels / groups,
//! k]` weights, and its backward passes are GEMMs with the transposes (the input's gradient is
//! then folded back onto the image, col2im). A 1×1 convolution with stride 1 and no padding reads
//! the image itself as that matrix. Unrolling and folding back are `unroll.rs`'s, from the taps'
//! spans worked out once per call. Depthwise convolutions (one input channel per group) take
//! the direct kernels of `depthwise.rs` instead, and stride-1 3×3 and 5×5 convolutions with
//! enough channels Winograd's minimal filtering of `winograd/` (unless the caller's
//! [`Numerics`] forbid it).
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

use rayon::prelude::*;

use super::gemm::{MatRef, matmul_into, matmul_into_serial};
use super::scratch::with_scratch;
use super::unroll::{TapSpans, col2im, im2col};
use super::{CpuArray, depthwise, filled, pool, slice, slice_mut, winograd, zeros};
use crate::backend::conv::{Conv2dGeometry, ConvOps, Pool2dGeometry};
use crate::error::Result;
use crate::numerics::{MatmulPrecision, Numerics};

/// The most runs of images whose weight gradients are summed separately (in parallel).
pub const WEIGHT_PARTS: usize = 16;

thread_local! {
    /// This thread's unrolled-input scratch.
    static COLUMNS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's partial weight gradients.
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
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

/// How one image's products run: at which precision, and whether on every thread of the pool
/// (the images then run one after the other) or on the calling one.
#[derive(Clone, Copy)]
struct Products {
    precision: MatmulPrecision,
    threaded: bool,
}

/// `dst (=|+=) a · b` as `how` says.
fn gemm(dst: &mut [f32], (a, b): (MatRef<'_>, MatRef<'_>), accumulate: bool, how: Products) {
    if how.threaded {
        matmul_into(dst, (a, b), accumulate, how.precision);
    } else {
        matmul_into_serial(dst, (a, b), accumulate, how.precision);
    }
}

/// A new array of `shape`, `batch` images, made by `f(n, image, threaded)` for each image `n`
/// and its part of the array (zero when `f` gets it): in parallel with `threaded` false when
/// there are at least as many images as threads, in order with `threaded` true otherwise.
fn by_image(
    shape: &[usize],
    batch: usize,
    f: impl Fn(usize, &mut [f32], bool) + Sync + Send,
) -> CpuArray {
    let len: usize = shape.iter().product();
    if batch == 0 || len == 0 {
        return zeros(shape);
    }
    if batch >= rayon::current_num_threads() {
        return filled(shape, len / batch, |n, image| f(n, image, false));
    }
    let mut out = zeros(shape);
    for (n, image) in slice_mut(&mut out).chunks_mut(len / batch).enumerate() {
        f(n, image, true);
    }
    out
}

/// Fills each `plane`-long row of `out` with its channel's value of `bias` (one per row).
fn fill_bias(out: &mut [f32], bias: &[f32], plane: usize) {
    for (row, &b) in out.chunks_mut(plane.max(1)).zip(bias) {
        row.fill(b);
    }
}

/// `conv(x, w) + bias`: `[batch, out_channels, oh, ow]`, its products at `precision`. With a
/// bias, each output block starts as the bias and the product is added to it.
pub fn conv2d(
    (x, w, bias): (&CpuArray, &CpuArray, Option<&CpuArray>),
    g: &Conv2dGeometry,
    precision: MatmulPrecision,
) -> CpuArray {
    let l = Layout::of(g);
    let (xs, ws, bias) = (slice(x), slice(w), bias.map(slice));
    let spans = TapSpans::of(g);
    let image_in = g.in_channels * l.in_plane;
    by_image(&g.output_shape(), g.batch, |n, out, threaded| {
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
                    im2col(x_g, &spans, cols);
                    let cols = MatRef::new(cols, l.taps, l.out_plane);
                    gemm(
                        out_g,
                        (w_g, cols),
                        add,
                        Products {
                            precision,
                            threaded,
                        },
                    );
                });
            } else {
                let x_g = MatRef::new(x_g, l.in_group, l.in_plane);
                gemm(
                    out_g,
                    (w_g, x_g),
                    add,
                    Products {
                        precision,
                        threaded,
                    },
                );
            }
        }
    })
}

/// The input's gradient: per image and group, `col2im(W_gᵀ · dy_g)`, at `precision`.
pub fn conv2d_backward_input(
    (dy, w): (&CpuArray, &CpuArray),
    g: &Conv2dGeometry,
    precision: MatmulPrecision,
) -> CpuArray {
    let l = Layout::of(g);
    let (dys, ws) = (slice(dy), slice(w));
    let spans = TapSpans::of(g);
    let image_out = g.out_channels * l.out_plane;
    by_image(&g.input_shape(), g.batch, |n, dx, threaded| {
        let dy_n = &dys[n * image_out..(n + 1) * image_out];
        for group in 0..g.groups {
            let dy_g = MatRef::new(&dy_n[l.out_range(group)], l.out_group, l.out_plane);
            let w_t = l.weights(ws, group).t();
            let dx_g = &mut dx[l.in_range(group)];
            if l.unroll {
                with_scratch(&COLUMNS, l.taps * l.out_plane, |cols| {
                    gemm(
                        cols,
                        (w_t, dy_g),
                        false,
                        Products {
                            precision,
                            threaded,
                        },
                    );
                    col2im(cols, &spans, dx_g);
                });
            } else {
                gemm(
                    dx_g,
                    (w_t, dy_g),
                    false,
                    Products {
                        precision,
                        threaded,
                    },
                );
            }
        }
    })
}

/// Adds (or, for the first image with `accumulate` false, writes) image `n`'s weight gradient
/// `dy_g · cols_gᵀ` for every group into `dw`.
fn add_image_weight_grad(
    dw: &mut [f32],
    (x, dy): (&[f32], &[f32]),
    (g, l, spans): (&Conv2dGeometry, &Layout, &TapSpans),
    accumulate: bool,
    how: Products,
) {
    for group in 0..g.groups {
        let dy_g = MatRef::new(&dy[l.out_range(group)], l.out_group, l.out_plane);
        let len = l.out_group * l.taps;
        let dw_g = &mut dw[group * len..(group + 1) * len];
        let x_g = &x[l.in_range(group)];
        if l.unroll {
            with_scratch(&COLUMNS, l.taps * l.out_plane, |cols| {
                im2col(x_g, spans, cols);
                let cols_t = MatRef::new(cols, l.taps, l.out_plane).t();
                gemm(dw_g, (dy_g, cols_t), accumulate, how);
            });
        } else {
            let x_t = MatRef::new(x_g, l.in_group, l.in_plane).t();
            gemm(dw_g, (dy_g, x_t), accumulate, how);
        }
    }
}

/// `dst (=|+=) Σₙ dy[n] · cols[n]ᵀ`, per group, at `precision`.
pub fn conv2d_backward_weight(
    (dst, accumulate): (&mut CpuArray, bool),
    (x, dy): (&CpuArray, &CpuArray),
    g: &Conv2dGeometry,
    precision: MatmulPrecision,
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
    let how = Products {
        precision,
        threaded: parts < rayon::current_num_threads(),
    };
    let (size, spans) = (dst.len(), TapSpans::of(g));
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
                    let image = (x_n, dy_n);
                    add_image_weight_grad(sum, image, (g, &l, &spans), *add || i > 0, how);
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

/// How a convolution of geometry `g` runs under the caller's numerics.
enum Algorithm {
    /// The direct depthwise kernels.
    Depthwise,
    /// Winograd's minimal filtering (allowed by the numerics).
    Winograd,
    /// im2col and GEMM at this precision.
    Im2col(MatmulPrecision),
}

impl Algorithm {
    /// The algorithm for `g` under this thread's [`Numerics`].
    fn of(g: &Conv2dGeometry) -> Algorithm {
        let numerics = Numerics::current();
        if depthwise::applies(g) {
            Algorithm::Depthwise
        } else if numerics.winograd && winograd::applies(g) {
            Algorithm::Winograd
        } else {
            Algorithm::Im2col(numerics.matmul_precision)
        }
    }
}

impl ConvOps for CpuArray {
    fn conv2d(x: &Self, w: &Self, bias: Option<&Self>, g: &Conv2dGeometry) -> Result<Self> {
        Ok(match Algorithm::of(g) {
            Algorithm::Depthwise => depthwise::conv2d(x, w, bias, g),
            Algorithm::Winograd => winograd::conv2d(x, w, bias, g),
            Algorithm::Im2col(precision) => conv2d((x, w, bias), g, precision),
        })
    }

    fn conv2d_backward_input(grad: &Self, w: &Self, g: &Conv2dGeometry) -> Result<Self> {
        Ok(match Algorithm::of(g) {
            Algorithm::Depthwise => depthwise::conv2d_backward_input(grad, w, g),
            Algorithm::Winograd => winograd::conv2d_backward_input(grad, w, g),
            Algorithm::Im2col(precision) => conv2d_backward_input((grad, w), g, precision),
        })
    }

    fn conv2d_backward_weight(
        dst: &mut Self,
        x: &Self,
        grad: &Self,
        g: &Conv2dGeometry,
        accumulate: bool,
    ) -> Result<()> {
        match Algorithm::of(g) {
            Algorithm::Depthwise => depthwise::conv2d_backward_weight(dst, x, grad, g, accumulate),
            Algorithm::Winograd => winograd::conv2d_backward_weight(dst, x, grad, g, accumulate),
            Algorithm::Im2col(precision) => {
                conv2d_backward_weight((dst, accumulate), (x, grad), g, precision)
            }
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
