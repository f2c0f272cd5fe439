//! Max and average pooling over NCHW planes: direct loops over each window, planes in parallel.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::{CpuArray, PAR_MIN, filled, slice, slice_mut, zeros};
use crate::backend::conv::Pool2dGeometry;
use crate::error::{MlError, Result};

/// Runs `f(plane, input chunk, output chunk)` for each `(image, channel)` plane, zipping `a`
/// (split in `in_plane` chunks) with `b` (split in `out_plane` chunks); in parallel when the
/// planes are large enough together.
fn for_each_plane<A: Sync, B: Send>(
    a: &[A],
    in_plane: usize,
    b: &mut [B],
    out_plane: usize,
    f: impl Fn(&[A], &mut [B]) + Sync + Send,
) {
    if in_plane == 0 || out_plane == 0 {
        return;
    }
    if a.len() + b.len() < PAR_MIN {
        for (a, b) in a.chunks(in_plane).zip(b.chunks_mut(out_plane)) {
            f(a, b);
        }
    } else {
        a.par_chunks(in_plane)
            .zip(b.par_chunks_mut(out_plane))
            .for_each(|(a, b)| f(a, b));
    }
}

/// Calls `f(out_index, rows, cols)` for every output cell of a plane with the input rows and
/// columns its window covers (padding left out).
fn for_each_window(p: &Pool2dGeometry, mut f: impl FnMut(usize, Range<usize>, Range<usize>)) {
    let [oh, ow] = p.out_size();
    for r in 0..oh {
        let rows = p.window(0, r);
        for c in 0..ow {
            f(r * ow + c, rows.clone(), p.window(1, c));
        }
    }
}

/// Whether `v` takes over from the best so far: larger, or the first NaN (a NaN wins and stays,
/// as in PyTorch). Without short-circuits, so that callers can select without branching.
#[inline(always)]
fn beats(v: f32, best: f32) -> bool {
    (v > best) | (v.is_nan() & !best.is_nan())
}

/// The first maximum of the window `rows` × `cols` of a plane `w` wide, and its flat index.
#[inline(always)]
fn window_max(plane: &[f32], w: usize, rows: Range<usize>, cols: Range<usize>) -> (f32, usize) {
    let mut best = (f32::NEG_INFINITY, rows.start * w + cols.start);
    for y in rows {
        for x in cols.clone() {
            let at = y * w + x;
            if beats(plane[at], best.0) {
                best = (plane[at], at);
            }
        }
    }
    best
}

/// Max pooling of one plane into `dst`, with each maximum's flat index (as f32) into `arg`. The
/// common 2×2 window of stride 2 without padding reads two input rows per output row.
fn max_pool_plane(plane: &[f32], p: &Pool2dGeometry, dst: &mut [f32], arg: &mut [f32]) {
    let w = p.in_size[1];
    let [oh, ow] = p.out_size();
    if p.kernel == [2, 2] && p.stride == [2, 2] && p.padding == [0, 0] {
        for r in 0..oh {
            let (dst, arg) = (
                &mut dst[r * ow..(r + 1) * ow],
                &mut arg[r * ow..(r + 1) * ow],
            );
            let top = 2 * r * w;
            let (upper, lower) = (&plane[top..top + 2 * ow], &plane[top + w..top + w + 2 * ow]);
            let cells = upper.chunks_exact(2).zip(lower.chunks_exact(2));
            for (c, ((d, a), (u, l))) in dst.iter_mut().zip(arg.iter_mut()).zip(cells).enumerate() {
                // Selects, not branches: which cell wins is data, and mispredicts otherwise.
                let first = (top + 2 * c) as f32;
                let (mut value, mut index) = (u[0], first);
                for (v, at) in [
                    (u[1], first + 1.0),
                    (l[0], first + w as f32),
                    (l[1], first + w as f32 + 1.0),
                ] {
                    let take = beats(v, value);
                    value = if take { v } else { value };
                    index = if take { at } else { index };
                }
                (*d, *a) = (value, index);
            }
        }
        return;
    }
    for_each_window(p, |o, rows, cols| {
        let (v, at) = window_max(plane, w, rows, cols);
        (dst[o], arg[o]) = (v, at as f32);
    });
}

/// Max pooling: the maxima and the flat index in its plane of each window's first maximum (a
/// NaN wins and stays, as in PyTorch).
pub fn max_pool2d(x: &CpuArray, p: &Pool2dGeometry) -> (CpuArray, CpuArray) {
    let [h, w] = p.in_size;
    let [oh, ow] = p.out_size();
    let (in_plane, out_plane) = (h * w, oh * ow);
    let mut out = zeros(&p.output_shape());
    let mut argmax = zeros(&p.output_shape());
    let work = |((plane, dst), arg): ((&[f32], &mut [f32]), &mut [f32])| {
        max_pool_plane(plane, p, dst, arg)
    };
    let (xs, os, args) = (slice(x), slice_mut(&mut out), slice_mut(&mut argmax));
    if xs.len() < PAR_MIN {
        xs.chunks(in_plane)
            .zip(os.chunks_mut(out_plane))
            .zip(args.chunks_mut(out_plane))
            .for_each(work);
    } else {
        xs.par_chunks(in_plane)
            .zip(os.par_chunks_mut(out_plane))
            .zip(args.par_chunks_mut(out_plane))
            .for_each(work);
    }
    (out, argmax)
}

/// Routes each output gradient to the input cell its window's maximum came from; an index
/// that is not a cell of the plane is an error.
pub fn max_pool2d_backward(
    dy: &CpuArray,
    argmax: &CpuArray,
    p: &Pool2dGeometry,
) -> Result<CpuArray> {
    let [h, w] = p.in_size;
    let [oh, ow] = p.out_size();
    let (in_plane, out_plane) = (h * w, oh * ow);
    let (dys, args) = (slice(dy), slice(argmax));
    let invalid = AtomicBool::new(false);
    // Each plane is zeroed just before its gradients are routed (`filled`), in the cache.
    let dx = filled(&p.input_shape(), in_plane, |n, plane| {
        let cells = n * out_plane..(n + 1) * out_plane;
        let valid = dys[cells.clone()]
            .iter()
            .zip(&args[cells])
            .all(|(&g, &at)| {
                // `as` saturates (a negative index or NaN becomes 0), so also check the round trip.
                let i = at as usize;
                let cell = (i as f32 == at).then(|| plane.get_mut(i)).flatten();
                cell.map(|d| *d += g).is_some()
            });
        if !valid {
            invalid.store(true, Ordering::Relaxed);
        }
    });
    if invalid.load(Ordering::Relaxed) {
        return Err(MlError::invalid(
            "max_pool2d backward",
            format!("an index of the maxima is not a cell of a {h}×{w} plane"),
        ));
    }
    Ok(dx)
}

/// Average pooling, each window divided by its cells inside the input.
pub fn avg_pool2d(x: &CpuArray, p: &Pool2dGeometry) -> CpuArray {
    let [h, w] = p.in_size;
    let [oh, ow] = p.out_size();
    let mut out = zeros(&p.output_shape());
    for_each_plane(
        slice(x),
        h * w,
        slice_mut(&mut out),
        oh * ow,
        |plane, dst| {
            for_each_window(p, |o, rows, cols| {
                let count = rows.len() * cols.len();
                let mut sum = 0.0f32;
                for y in rows {
                    sum += plane[y * w + cols.start..y * w + cols.end]
                        .iter()
                        .sum::<f32>();
                }
                dst[o] = sum / count as f32;
            });
        },
    );
    out
}

/// Spreads each output gradient evenly over its window's cells inside the input.
pub fn avg_pool2d_backward(dy: &CpuArray, p: &Pool2dGeometry) -> CpuArray {
    let [h, w] = p.in_size;
    let [oh, ow] = p.out_size();
    let mut dx = zeros(&p.input_shape());
    for_each_plane(
        slice(dy),
        oh * ow,
        slice_mut(&mut dx),
        h * w,
        |src, plane| {
            for_each_window(p, |o, rows, cols| {
                let share = src[o] / (rows.len() * cols.len()) as f32;
                for y in rows {
                    for d in &mut plane[y * w + cols.start..y * w + cols.end] {
                        *d += share;
                    }
                }
            });
        },
    );
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::from_vec;

    /// A 2×2 max pool of stride 2 over `[batch, 1, 4, 4]`.
    fn pool(batch: usize) -> Pool2dGeometry {
        Pool2dGeometry {
            batch,
            channels: 1,
            in_size: [4, 4],
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        }
    }

    /// Each gradient goes to its window's maximum, in every plane, and nowhere else.
    #[test]
    fn backward_routes_each_gradient_to_its_maximum() {
        let p = pool(2);
        let x = from_vec(
            &[2, 1, 4, 4],
            (0..32).map(|i| ((i * 7) % 11) as f32).collect(),
        );
        let (_, argmax) = max_pool2d(&x, &p);
        let dy = from_vec(&[2, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let dx = max_pool2d_backward(&dy, &argmax, &p).expect("valid indices");
        for (n, plane) in slice(&dx).chunks(16).enumerate() {
            let args = &slice(&argmax)[4 * n..4 * n + 4];
            for (i, &g) in plane.iter().enumerate() {
                let routed = args.iter().position(|&a| a as usize == i);
                let want = routed.map_or(0.0, |o| slice(&dy)[4 * n + o]);
                assert_eq!(g, want, "plane {n}, cell {i}");
            }
        }
    }

    /// An index of the maxima outside the plane, negative, fractional or NaN is refused.
    #[test]
    fn backward_refuses_indices_that_are_not_cells() {
        let p = pool(2);
        let dy = from_vec(&[2, 1, 2, 2], vec![1.0; 8]);
        for bad in [16.0, -1.0, 1.5, f32::NAN] {
            let mut args = vec![0.0, 2.0, 8.0, 10.0, 0.0, 2.0, 8.0, 10.0];
            args[5] = bad;
            let argmax = from_vec(&[2, 1, 2, 2], args);
            assert!(
                max_pool2d_backward(&dy, &argmax, &p).is_err(),
                "index {bad}"
            );
        }
    }
}
