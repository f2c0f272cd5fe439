//! Stride-1 3 × 3 and 5 × 5 convolutions by Winograd's minimal filtering F(2 × 2, r × r),
//! which multiplies 2.25 (3 × 3) and 2.78 (5 × 5) times less than im2col's GEMM: what cuDNN
//! and oneDNN call the Winograd algorithm.
//!
//! Each output is cut into 2 × 2 tiles, each reading an `α × α` input tile (`α = r + 1`). The
//! input tiles, the weights and, backward, the outputs' gradients are taken to `α²` points by
//! the small transforms of `transform.rs`; at each point the convolution is then one matrix
//! product over the channels, `M = V · U` (tiles × input channels by input channels × output
//! channels), and the inverse transform takes the products back to the output tiles. Backward
//! runs the transposes: the input's gradient is `dV = dM · Uᵀ` taken back onto the input tiles
//! (overlapping tiles add up), the weight's gradient `dU = dMᵀ · V` summed over the tiles and
//! taken back to the taps. Tiles past the output's edge read zeros and their outputs are
//! dropped, so any output size and padding work.
//!
//! Transforms work on eight channels at a time, so images are laid out channels-last (padding
//! included) in a per-thread plane first; channel counts are rounded up to a multiple of eight
//! with zeros. Images run in chunks of about [`CHUNK_TILES`] tiles, in parallel, each chunk's
//! products on its own thread; chunks and the weight gradient's partial sums are set by the
//! batch size alone, so results do not depend on the number of threads.
//!
//! The products at the points stay in f32 under `train.matmul_precision = "bf16"`: a
//! transformed tile sums inputs with weights of up to 25 (5 × 5), and the inverse transform
//! takes differences of such sums, which amplifies bf16's rounding of them: in bf16, Winograd
//! would be less precise than im2col in bf16, while in f32 it stays close to f32 im2col.

#[macro_use]
mod transform;
mod layout;
mod passes;
#[cfg(test)]
mod tests;

use std::cell::Cell;

use rayon::prelude::*;

use self::layout::{Plane, Points};
use self::passes::Pass;
use self::transform::{F2x3, F2x5, LANES, Minimal};
use super::gemm::{MatRef, matmul_into_serial};
use super::scratch::with_scratch;
use super::{CpuArray, filled, slice, slice_mut};
use crate::backend::conv::Conv2dGeometry;
use crate::numerics::MatmulPrecision;

/// Input and output channels below which im2col is faster: each point's product has as many
/// terms as there are input channels.
const MIN_CHANNELS: usize = 16;

/// Tiles a chunk of images aims for: the rows of each point's product.
const CHUNK_TILES: usize = 64;

/// The most runs of chunks whose weight gradients are summed separately (in parallel).
const WEIGHT_PARTS: usize = 8;

thread_local! {
    /// This thread's inputs (or their gradients) at the points, `[α², tiles, in lanes]`.
    static POINTS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// This thread's products (or their gradients) at the points, `[α², tiles, out lanes]`.
    static PRODUCTS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// This thread's channels-last image, `[rows, cols, lanes]`.
    static PLANE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Whether a convolution can run here: one group, stride and dilation 1, a 3 × 3 or 5 × 5
/// kernel, at least [`MIN_CHANNELS`] input and output channels (the caller checks that its
/// [`crate::Numerics`] allow Winograd).
pub fn applies(g: &Conv2dGeometry) -> bool {
    g.groups == 1
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && (g.kernel == [3, 3] || g.kernel == [5, 5])
        && g.in_channels >= MIN_CHANNELS
        && g.out_channels >= MIN_CHANNELS
}

/// `conv(x, w) + bias` (`g` passed [`applies`]).
pub fn conv2d(x: &CpuArray, w: &CpuArray, bias: Option<&CpuArray>, g: &Conv2dGeometry) -> CpuArray {
    match g.kernel[0] {
        3 => forward::<4, 3, F2x3>(x, w, bias, g),
        _ => forward::<6, 5, F2x5>(x, w, bias, g),
    }
}

/// The input's gradient (`g` passed [`applies`]).
pub fn conv2d_backward_input(dy: &CpuArray, w: &CpuArray, g: &Conv2dGeometry) -> CpuArray {
    match g.kernel[0] {
        3 => backward_input::<4, 3, F2x3>(dy, w, g),
        _ => backward_input::<6, 5, F2x5>(dy, w, g),
    }
}

/// `dst (=|+=)` the weight's gradient (`g` passed [`applies`]).
pub fn conv2d_backward_weight(
    dst: &mut CpuArray,
    x: &CpuArray,
    dy: &CpuArray,
    g: &Conv2dGeometry,
    accumulate: bool,
) {
    match g.kernel[0] {
        3 => backward_weight::<4, 3, F2x3>(dst, x, dy, g, accumulate),
        _ => backward_weight::<6, 5, F2x5>(dst, x, dy, g, accumulate),
    }
}

/// Sizes of one convolution's Winograd form.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Images in the batch.
    batch: usize,
    /// Input and output channels.
    channels: [usize; 2],
    /// Input and output channels rounded up to a multiple of [`LANES`].
    lanes: [usize; 2],
    /// Input and output [height, width].
    sizes: [[usize; 2]; 2],
    /// The input's padding, per direction.
    padding: [usize; 2],
    /// Output tiles per column and per row.
    tiles: [usize; 2],
    /// The channels-last input plane: the padded input, plus what the last tiles overhang.
    padded: [usize; 2],
    /// Images per chunk.
    images: usize,
    /// Points per tile, `α²`.
    points: usize,
    /// Whether the passes keep to their portable build (only tests ask for it).
    portable: bool,
}

impl Plan {
    fn of(g: &Conv2dGeometry, alpha: usize) -> Plan {
        let out = g.out_size();
        let tiles = out.map(|o| o.div_ceil(2));
        let per_image = tiles[0] * tiles[1];
        Plan {
            batch: g.batch,
            channels: [g.in_channels, g.out_channels],
            lanes: [g.in_channels, g.out_channels].map(|c| c.next_multiple_of(LANES)),
            sizes: [g.in_size, out],
            padding: g.padding,
            tiles,
            padded: [0, 1].map(|d| 2 * tiles[d] + alpha - 2),
            images: CHUNK_TILES.div_ceil(per_image).clamp(1, g.batch.max(1)),
            points: alpha * alpha,
            portable: passes::portable_planned(),
        }
    }

    fn tiles_per_image(&self) -> usize {
        self.tiles[0] * self.tiles[1]
    }

    /// Elements of one input image and of one output image.
    fn image_sizes(&self) -> [usize; 2] {
        [0, 1].map(|s| self.channels[s] * self.sizes[s][0] * self.sizes[s][1])
    }

    fn chunks(&self) -> usize {
        self.batch.div_ceil(self.images)
    }

    /// The images of chunk `chunk`.
    fn chunk_images(&self, chunk: usize) -> std::ops::Range<usize> {
        chunk * self.images..((chunk + 1) * self.images).min(self.batch)
    }

    /// The input side of a chunk of `images` images: the padded input (or its gradient) of one
    /// image, channels-last, and the chunk's inputs at the points.
    fn input_side(&self, images: usize) -> Side {
        self.side(self.lanes[0], self.padded, images)
    }

    /// The output side: one output image (whole tiles), and the products at the points.
    fn output_side(&self, images: usize) -> Side {
        self.side(self.lanes[1], self.tiles.map(|t| 2 * t), images)
    }

    fn side(&self, lanes: usize, [rows, cols]: [usize; 2], images: usize) -> Side {
        Side {
            plane: Plane { cols, lanes },
            plane_len: rows * cols * lanes,
            points: Points {
                tiles: images * self.tiles_per_image(),
                lanes,
            },
        }
    }
}

/// One side of a convolution for a chunk of images: how one image lies in the channels-last
/// plane, that plane's elements, and the chunk's buffer at the points.
#[derive(Clone, Copy, Debug)]
struct Side {
    plane: Plane,
    plane_len: usize,
    points: Points,
}

/// The `[α², in lanes, out lanes]` transforms `G g Gᵀ` of `[out, in, r, r]` weights.
fn filters<const A: usize, const R: usize, F: Minimal<A, R>>(p: &Plan, w: &[f32]) -> Vec<f32> {
    let mut u = vec![0.0; p.points * p.lanes[0] * p.lanes[1]];
    passes::run::<A, R, F>(p, Pass::Filters { w, u: &mut u }, &mut []);
    u
}

/// How a buffer holds one matrix per point: `[rows, cols]` as stored, read transposed or
/// not, and the elements from one point's matrix to the next.
type View = ([usize; 2], bool, usize);

/// Point `point`'s matrix of `data`.
fn matrix(data: &[f32], point: usize, ([rows, cols], transposed, stride): View) -> MatRef<'_> {
    let m = MatRef::new(
        &data[point * stride..point * stride + rows * cols],
        rows,
        cols,
    );
    if transposed { m.t() } else { m }
}

/// For each of the `points` points, `dst = a · b` (or `dst += a · b`), `dst` holding
/// `a`-rows × `b`-columns matrices `stride` elements apart.
fn per_point(
    points: usize,
    (dst, stride): (&mut [f32], usize),
    (a, a_view): (&[f32], View),
    (b, b_view): (&[f32], View),
    accumulate: bool,
) {
    for point in 0..points {
        let (a, b) = (matrix(a, point, a_view), matrix(b, point, b_view));
        let len = a.logical_dims().0 * b.logical_dims().1;
        let d = &mut dst[point * stride..point * stride + len];
        matmul_into_serial(d, (a, b), accumulate, MatmulPrecision::F32);
    }
}

/// The forward pass: per chunk, `V = Bᵀ d B`, `M = V · U` at each point, `y = Aᵀ M A + bias`.
fn forward<const A: usize, const R: usize, F: Minimal<A, R>>(
    x: &CpuArray,
    w: &CpuArray,
    bias: Option<&CpuArray>,
    g: &Conv2dGeometry,
) -> CpuArray {
    let p = Plan::of(g, A);
    let u = filters::<A, R, F>(&p, slice(w));
    let (xs, bias) = (slice(x), bias.map(slice));
    let ([image_in, image_out], [c8, o8]) = (p.image_sizes(), p.lanes);
    filled(&g.output_shape(), p.images * image_out, |chunk, out| {
        let images = p.chunk_images(chunk);
        let x = &xs[images.start * image_in..images.end * image_in];
        let (input, output) = (p.input_side(images.len()), p.output_side(images.len()));
        let (inputs, products, tiles) = (input.points, output.points, input.points.tiles);
        with_scratch(&POINTS, inputs.len(p.points), |v| {
            with_scratch(&PRODUCTS, products.len(p.points), |m| {
                with_scratch(&PLANE, input.plane_len, |plane| {
                    passes::run::<A, R, F>(&p, Pass::Inputs { x, v }, plane);
                });
                let v_view = ([tiles, c8], false, inputs.stride());
                let u_view = ([c8, o8], false, c8 * o8);
                let dst = (&mut *m, products.stride());
                per_point(p.points, dst, (v, v_view), (&u, u_view), false);
                with_scratch(&PLANE, output.plane_len, |plane| {
                    passes::run::<A, R, F>(&p, Pass::Outputs { m, out, bias }, plane);
                });
            });
        });
    })
}

/// The input's gradient: per chunk, `dM = A dy Aᵀ`, `dV = dM · Uᵀ` at each point, and
/// `B dV Bᵀ` added back onto the images.
fn backward_input<const A: usize, const R: usize, F: Minimal<A, R>>(
    dy: &CpuArray,
    w: &CpuArray,
    g: &Conv2dGeometry,
) -> CpuArray {
    let p = Plan::of(g, A);
    let u = filters::<A, R, F>(&p, slice(w));
    let dys = slice(dy);
    let ([image_in, image_out], [c8, o8]) = (p.image_sizes(), p.lanes);
    filled(&g.input_shape(), p.images * image_in, |chunk, dx| {
        let images = p.chunk_images(chunk);
        let dy = &dys[images.start * image_out..images.end * image_out];
        let (input, output) = (p.input_side(images.len()), p.output_side(images.len()));
        let (inputs, products, tiles) = (input.points, output.points, input.points.tiles);
        with_scratch(&PRODUCTS, products.len(p.points), |dm| {
            with_scratch(&POINTS, inputs.len(p.points), |dv| {
                with_scratch(&PLANE, output.plane_len, |plane| {
                    passes::run::<A, R, F>(&p, Pass::OutputGrads { dy, dm }, plane);
                });
                let dm_view = ([tiles, o8], false, products.stride());
                let u_view = ([c8, o8], true, c8 * o8);
                let dst = (&mut *dv, inputs.stride());
                per_point(p.points, dst, (dm, dm_view), (&u, u_view), false);
                with_scratch(&PLANE, input.plane_len, |plane| {
                    passes::run::<A, R, F>(&p, Pass::InputGrads { dv, dx }, plane);
                });
            });
        });
    })
}

/// The weight's gradient: per chunk, `dU += dMᵀ · V` at each point, the chunks' sums split in
/// at most [`WEIGHT_PARTS`] runs summed in parallel and then in order, and `Gᵀ dU G` back to
/// the taps.
fn backward_weight<const A: usize, const R: usize, F: Minimal<A, R>>(
    dst: &mut CpuArray,
    x: &CpuArray,
    dy: &CpuArray,
    g: &Conv2dGeometry,
    accumulate: bool,
) {
    let p = Plan::of(g, A);
    let (xs, dys, dst) = (slice(x), slice(dy), slice_mut(dst));
    let chunks = p.chunks();
    if chunks == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    let ([image_in, image_out], [c8, o8]) = (p.image_sizes(), p.lanes);
    let (parts, size) = (chunks.min(WEIGHT_PARTS), p.points * o8 * c8);
    // A buffer per call, not a thread's scratch as conv.rs's `PARTIALS` is: on the LeNet step
    // the scratch is the slower of the two.
    let mut sums = vec![0.0; parts * size];
    sums.par_chunks_mut(size)
        .enumerate()
        .for_each(|(part, du)| {
            for (i, chunk) in (part * chunks / parts..(part + 1) * chunks / parts).enumerate() {
                let images = p.chunk_images(chunk);
                let x = &xs[images.start * image_in..images.end * image_in];
                let dy = &dys[images.start * image_out..images.end * image_out];
                let (input, output) = (p.input_side(images.len()), p.output_side(images.len()));
                let (inputs, products, tiles) = (input.points, output.points, input.points.tiles);
                with_scratch(&POINTS, inputs.len(p.points), |v| {
                    with_scratch(&PRODUCTS, products.len(p.points), |dm| {
                        with_scratch(&PLANE, input.plane_len, |plane| {
                            passes::run::<A, R, F>(&p, Pass::Inputs { x, v }, plane);
                        });
                        with_scratch(&PLANE, output.plane_len, |plane| {
                            passes::run::<A, R, F>(&p, Pass::OutputGrads { dy, dm }, plane);
                        });
                        let dm_view = ([tiles, o8], true, products.stride());
                        let v_view = ([tiles, c8], false, inputs.stride());
                        let du = (&mut *du, o8 * c8);
                        per_point(p.points, du, (dm, dm_view), (v, v_view), i > 0);
                    });
                });
            }
        });
    let (total, rest) = sums.split_at_mut(size);
    for part in rest.chunks_exact(size) {
        for (t, v) in total.iter_mut().zip(part) {
            *t += v;
        }
    }
    let pass = Pass::FilterGrads {
        du: total,
        dst,
        accumulate,
    };
    passes::run::<A, R, F>(&p, pass, &mut []);
}
