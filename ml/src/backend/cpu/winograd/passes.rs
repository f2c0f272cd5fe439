//! The transforms of the Winograd passes, per chunk of images: weights, inputs and output
//! gradients to the points, products and input gradients back. [`run`] compiles them for AVX2
//! and FMA where the CPU has them, so that each [`Lanes`] of eight channels is one register.

use super::layout::{add, lanes, store};
use super::transform::{LANES, Lanes, Minimal, build, filter, filter_t};
use super::{Plan, Side};
use crate::backend::cpu::isa::{self, MaxCpuIsa};

/// One transform pass and its buffers.
pub enum Pass<'a> {
    /// `[out, in, r, r]` weights to their `[α², in lanes, out lanes]` transforms `G g Gᵀ`.
    Filters { w: &'a [f32], u: &'a mut [f32] },
    /// `[α², out lanes, in lanes]` gradients at the points to the taps, `Gᵀ dU G`, written to
    /// `dst` or added to it.
    FilterGrads {
        du: &'a [f32],
        dst: &'a mut [f32],
        accumulate: bool,
    },
    /// A chunk's images to their inputs at the points, `Bᵀ d B`.
    Inputs { x: &'a [f32], v: &'a mut [f32] },
    /// A chunk's products at the points to its output images, `Aᵀ m A + bias`.
    Outputs {
        m: &'a [f32],
        out: &'a mut [f32],
        bias: Option<&'a [f32]>,
    },
    /// A chunk's output gradients to the products' gradients at the points, `A dy Aᵀ`.
    OutputGrads { dy: &'a [f32], dm: &'a mut [f32] },
    /// A chunk's input gradients at the points back onto its images, `B dv Bᵀ` added up over
    /// overlapping tiles.
    InputGrads { dv: &'a [f32], dx: &'a mut [f32] },
}

/// Runs `pass` (`plane`: the per-thread channels-last scratch the image passes need), compiled
/// for AVX2 and FMA where the CPU has them and `RINGFLOW_MAX_CPU_ISA` allows them.
pub fn run<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    pass: Pass<'_>,
    plane: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && isa::allows(MaxCpuIsa::Avx2)
        && !p.portable
    {
        // SAFETY: this CPU supports AVX2 and FMA (checked just above).
        unsafe { run_avx2::<A, R, F>(p, pass, plane) };
        return;
    }
    run_inline::<A, R, F>(p, pass, plane);
}

#[cfg(test)]
thread_local! {
    /// Set by a test to plan this thread's convolutions on the portable build on a CPU that has
    /// AVX2: both builds compute the same operations in the same order, lane by lane, so they
    /// agree bit for bit.
    pub static PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a convolution planned on this thread keeps to the portable build: only when a test
/// asked for it ([`PORTABLE`]); read once per convolution, into its [`Plan`], so that the
/// pool's threads run the build the caller planned.
pub fn portable_planned() -> bool {
    #[cfg(test)]
    return PORTABLE.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// [`run`] with AVX2 and FMA (the caller checked the CPU has them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    pass: Pass<'_>,
    plane: &mut [f32],
) {
    run_inline::<A, R, F>(p, pass, plane);
}

/// The body of [`run`], inlined into each build of it.
#[inline(always)]
fn run_inline<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    pass: Pass<'_>,
    plane: &mut [f32],
) {
    match pass {
        Pass::Filters { w, u } => filters_to_points::<A, R, F>(p, w, u),
        Pass::FilterGrads {
            du,
            dst,
            accumulate,
        } => {
            filter_grads_to_taps::<A, R, F>(p, du, dst, accumulate);
        }
        Pass::Inputs { x, v } => inputs_to_points::<A, R, F>(p, x, v, plane),
        Pass::Outputs { m, out, bias } => points_to_outputs::<A, R, F>(p, m, (out, bias), plane),
        Pass::OutputGrads { dy, dm } => grads_to_points::<A, R, F>(p, dy, dm, plane),
        Pass::InputGrads { dv, dx } => points_to_input_grads::<A, R, F>(p, dv, dx, plane),
    }
}

/// The `[α², in lanes, out lanes]` transforms `G g Gᵀ` of `[out, in, r, r]` weights.
#[inline(always)]
fn filters_to_points<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    w: &[f32],
    u: &mut [f32],
) {
    let ([c, o], [c8, o8]) = (p.channels, p.lanes);
    for ci in 0..c {
        for group in 0..o8 / LANES {
            let tap = |k: usize, l: usize| -> Lanes {
                build(0.0, |lane| {
                    let oi = group * LANES + lane;
                    if oi < o {
                        w[((oi * c + ci) * R + k) * R + l]
                    } else {
                        0.0
                    }
                })
            };
            let write = |i: usize, j: usize, value: &Lanes| {
                store(u, ((i * A + j) * c8 + ci) * o8 + group * LANES, value);
            };
            filter::<A, R, F>(tap, write);
        }
    }
}

/// `Gᵀ dU G` for each pair of channels: `[α², out lanes, in lanes]` gradients at the points
/// back to the `[out, in, r, r]` weights' taps, written to `dst` or added to it.
#[inline(always)]
fn filter_grads_to_taps<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    du: &[f32],
    dst: &mut [f32],
    accumulate: bool,
) {
    let ([c, o], [c8, o8]) = (p.channels, p.lanes);
    for oi in 0..o {
        for group in 0..c8 / LANES {
            let at = |i: usize, j: usize| (((i * A + j) * o8 + oi) * c8) + group * LANES;
            let write = |k: usize, l: usize, values: &Lanes| {
                for (lane, value) in values.iter().enumerate() {
                    let ci = group * LANES + lane;
                    if ci < c {
                        let d = &mut dst[((oi * c + ci) * R + k) * R + l];
                        *d = if accumulate { *d + value } else { *value };
                    }
                }
            };
            filter_t::<A, R, F>(|i, j| lanes(du, at(i, j)), write);
        }
    }
}

/// The tiles of one image: each one's index, counted from `first`, and its corner, its first
/// output cell (and its first input cell in the padded plane).
#[inline(always)]
fn tiles(p: &Plan, first: usize) -> impl Iterator<Item = (usize, [usize; 2])> {
    let [rows, cols] = p.tiles;
    (0..rows * cols).map(move |t| (first + t, [2 * (t / cols), 2 * (t % cols)]))
}

/// A chunk's images (`x`, channels-first) to their inputs at the points, `Bᵀ d B` (`v`).
#[inline(always)]
fn inputs_to_points<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    x: &[f32],
    v: &mut [f32],
    plane: &mut [f32],
) {
    let [image_in, _] = p.image_sizes();
    let Side {
        plane: layout,
        points,
        ..
    } = p.input_side(x.len() / image_in);
    let (pixels, at_points) = (layout.block::<A>(), points.points::<A>());
    for (n, image) in x.chunks_exact(image_in).enumerate() {
        layout.fill(plane, image, p.sizes[0], p.padding);
        for (tile, corner) in tiles(p, n * p.tiles_per_image()) {
            let (origin, base) = (layout.pixel(corner[0], corner[1]), points.tile(tile));
            for group in (0..p.lanes[0]).step_by(LANES) {
                let read = |i: usize, j: usize| lanes(plane, origin + pixels[i][j] + group);
                let write = |i: usize, j: usize, x: &Lanes| {
                    store(v, base + at_points[i][j] + group, x);
                };
                both!(A => A, read, F::input, write);
            }
        }
    }
}

/// A chunk's products at the points (`m`) to its output images, `Aᵀ m A + bias` (`out`).
#[inline(always)]
fn points_to_outputs<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    m: &[f32],
    (out, bias): (&mut [f32], Option<&[f32]>),
    plane: &mut [f32],
) {
    let [_, image_out] = p.image_sizes();
    let Side {
        plane: layout,
        points,
        ..
    } = p.output_side(out.len() / image_out);
    let (pixels, at_points) = (layout.block::<2>(), points.points::<A>());
    for (n, image) in out.chunks_exact_mut(image_out).enumerate() {
        for (tile, corner) in tiles(p, n * p.tiles_per_image()) {
            let (origin, base) = (layout.pixel(corner[0], corner[1]), points.tile(tile));
            for group in (0..p.lanes[1]).step_by(LANES) {
                let read = |i: usize, j: usize| lanes(m, base + at_points[i][j] + group);
                let write = |i: usize, j: usize, y: &Lanes| {
                    store(plane, origin + pixels[i][j] + group, y);
                };
                both!(A => 2, read, F::output, write);
            }
        }
        layout.extract(plane, image, p.sizes[1], [0, 0], bias);
    }
}

/// A chunk's output gradients (`dy`, channels-first) to the products' gradients at the points,
/// `A dy Aᵀ` (`dm`).
#[inline(always)]
fn grads_to_points<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    dy: &[f32],
    dm: &mut [f32],
    plane: &mut [f32],
) {
    let [_, image_out] = p.image_sizes();
    let Side {
        plane: layout,
        points,
        ..
    } = p.output_side(dy.len() / image_out);
    let (pixels, at_points) = (layout.block::<2>(), points.points::<A>());
    for (n, image) in dy.chunks_exact(image_out).enumerate() {
        layout.fill(plane, image, p.sizes[1], [0, 0]);
        for (tile, corner) in tiles(p, n * p.tiles_per_image()) {
            let (origin, base) = (layout.pixel(corner[0], corner[1]), points.tile(tile));
            for group in (0..p.lanes[1]).step_by(LANES) {
                let read = |i: usize, j: usize| lanes(plane, origin + pixels[i][j] + group);
                let write = |i: usize, j: usize, x: &Lanes| {
                    store(dm, base + at_points[i][j] + group, x);
                };
                both!(2 => A, read, F::output_t, write);
            }
        }
    }
}

/// A chunk's input gradients at the points (`dv`) back onto its images, `B dv Bᵀ` added up
/// over overlapping tiles (`dx`, channels-first).
#[inline(always)]
fn points_to_input_grads<const A: usize, const R: usize, F: Minimal<A, R>>(
    p: &Plan,
    dv: &[f32],
    dx: &mut [f32],
    plane: &mut [f32],
) {
    let [image_in, _] = p.image_sizes();
    let Side {
        plane: layout,
        points,
        ..
    } = p.input_side(dx.len() / image_in);
    let (pixels, at_points) = (layout.block::<A>(), points.points::<A>());
    for (n, image) in dx.chunks_exact_mut(image_in).enumerate() {
        plane.fill(0.0);
        for (tile, corner) in tiles(p, n * p.tiles_per_image()) {
            let (origin, base) = (layout.pixel(corner[0], corner[1]), points.tile(tile));
            for group in (0..p.lanes[0]).step_by(LANES) {
                let read = |i: usize, j: usize| lanes(dv, base + at_points[i][j] + group);
                let write = |i: usize, j: usize, x: &Lanes| {
                    add(plane, origin + pixels[i][j] + group, x);
                };
                both!(A => A, read, F::input_t, write);
            }
        }
        layout.extract(plane, image, p.sizes[0], p.padding, None);
    }
}
