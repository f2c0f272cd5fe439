//! The Winograd passes against im2col's (`conv.rs`) on the same inputs: values, both
//! gradients, accumulation, and independence from the number of threads.

use proptest::prelude::*;

use super::*;
use crate::backend::cpu::conv;
use crate::backend::cpu::from_vec;
use crate::numerics::MatmulPrecision::F32;

/// A geometry with stride and dilation 1 and one group.
fn geometry(
    batch: usize,
    [c, o]: [usize; 2],
    in_size: [usize; 2],
    r: usize,
    pad: usize,
) -> Conv2dGeometry {
    Conv2dGeometry {
        batch,
        in_channels: c,
        in_size,
        out_channels: o,
        kernel: [r, r],
        stride: [1, 1],
        padding: [pad, pad],
        dilation: [1, 1],
        groups: 1,
    }
}

/// `shape`'s worth of values in [−1, 1) from a small generator seeded by `seed`.
fn values(shape: &[usize], seed: u64) -> CpuArray {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..shape.iter().product())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    from_vec(shape, data)
}

/// Fails unless `got` and `want` agree within `tolerance` of `want`'s largest magnitude
/// (Winograd sums in another order, through the transforms).
fn assert_near(got: &CpuArray, want: &CpuArray, tolerance: f32, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let within = (g - w).abs() <= tolerance * scale;
        assert!(within, "{what}: element {i} is {g}, im2col gives {w}");
    }
}

/// How far Winograd may be from im2col, relative to the largest magnitude: F(2×2, 5×5)'s
/// transforms round more (against an f64 reference, its weight gradients are off by up to
/// ~1e-5 of the largest magnitude, 2e-6 RMS; im2col's by 3e-7), F(2×2, 3×3)'s as little as
/// im2col.
fn tolerance(g: &Conv2dGeometry) -> f32 {
    if g.kernel[0] == 5 { 5e-5 } else { 1e-5 }
}

/// Every pass of `g` through Winograd against im2col.
fn check(g: &Conv2dGeometry) {
    check_seeded(g, 1);
}

/// [`check`] on inputs drawn from `seed`.
fn check_seeded(g: &Conv2dGeometry, seed: u64) {
    assert!(applies(g), "{g:?} runs here");
    let (x, w) = (
        values(&g.input_shape(), seed),
        values(&g.weight_shape(), seed + 1),
    );
    let (bias, dy) = (
        values(&[g.out_channels], seed + 2),
        values(&g.output_shape(), seed + 3),
    );
    let (what, tol) = (format!("{g:?}"), tolerance(g));
    let y = conv2d(&x, &w, Some(&bias), g);
    let want = conv::conv2d((&x, &w, Some(&bias)), g, F32);
    assert_near(&y, &want, tol, &format!("{what} forward"));
    let dx = conv2d_backward_input(&dy, &w, g);
    let want = conv::conv2d_backward_input((&dy, &w), g, F32);
    assert_near(&dx, &want, tol, &format!("{what} input grad"));
    for accumulate in [false, true] {
        let start = values(&g.weight_shape(), seed + 4);
        let (mut dw, mut want) = (start.clone(), start);
        conv2d_backward_weight(&mut dw, &x, &dy, g, accumulate);
        conv::conv2d_backward_weight((&mut want, accumulate), (&x, &dy), g, F32);
        let what = format!("{what} weight grad, accumulate {accumulate}");
        assert_near(&dw, &want, tol, &what);
    }
}

#[test]
fn five_by_five_matches_im2col() {
    check(&geometry(3, [32, 64], [12, 12], 5, 0));
    check(&geometry(2, [16, 16], [7, 9], 5, 2));
    check(&geometry(1, [17, 23], [5, 5], 5, 0));
}

#[test]
fn three_by_three_matches_im2col() {
    check(&geometry(2, [16, 32], [8, 8], 3, 1));
    check(&geometry(3, [20, 18], [9, 7], 3, 1));
    check(&geometry(2, [16, 24], [6, 11], 3, 0));
}

/// Many chunks (4 images of 16 tiles each) and more of them than weight-gradient runs.
#[test]
fn many_chunks_match_im2col() {
    check(&geometry(37, [16, 16], [10, 10], 3, 1));
}

/// The same results on one thread as on four: chunks and partial sums follow the batch.
#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    let g = geometry(37, [16, 16], [10, 10], 5, 2);
    let (x, w) = (values(&g.input_shape(), 6), values(&g.weight_shape(), 7));
    let dy = values(&g.output_shape(), 8);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a pool");
        pool.install(|| {
            let mut dw = values(&g.weight_shape(), 9);
            conv2d_backward_weight(&mut dw, &x, &dy, &g, false);
            (
                conv2d(&x, &w, None, &g),
                conv2d_backward_input(&dy, &w, &g),
                dw,
            )
        })
    };
    let (one, four) = (run(1), run(4));
    assert_eq!(one.0, four.0, "forward");
    assert_eq!(one.1, four.1, "input gradient");
    assert_eq!(one.2, four.2, "weight gradient");
}

/// The transforms' portable build (for CPUs without AVX2 and FMA) gives the AVX2 build's
/// results bit for bit, in every pass.
#[test]
fn the_portable_transforms_give_the_avx2_results() {
    let g = geometry(5, [20, 24], [9, 7], 5, 2);
    let (x, w) = (values(&g.input_shape(), 31), values(&g.weight_shape(), 32));
    let (bias, dy) = (values(&[24], 33), values(&g.output_shape(), 34));
    let run = || {
        let mut dw = values(&g.weight_shape(), 35);
        conv2d_backward_weight(&mut dw, &x, &dy, &g, true);
        let dx = conv2d_backward_input(&dy, &w, &g);
        (conv2d(&x, &w, Some(&bias), &g), dx, dw)
    };
    let fast = run();
    passes::PORTABLE.set(true);
    let portable = run();
    passes::PORTABLE.set(false);
    assert_eq!(fast.0, portable.0, "forward");
    assert_eq!(fast.1, portable.1, "input gradient");
    assert_eq!(fast.2, portable.2, "weight gradient");
}

/// Which convolutions run here: few channels, strides, dilations, groups and other kernels
/// keep im2col.
#[test]
fn only_stride_one_three_and_five_with_enough_channels_apply() {
    assert!(applies(&geometry(4, [32, 64], [12, 12], 5, 0)));
    assert!(
        !applies(&geometry(4, [1, 32], [28, 28], 5, 0)),
        "one input channel"
    );
    assert!(
        !applies(&geometry(4, [32, 8], [12, 12], 5, 0)),
        "eight output channels"
    );
    assert!(!applies(&geometry(4, [32, 32], [12, 12], 7, 0)), "7 × 7");
    let strided = Conv2dGeometry {
        stride: [2, 2],
        ..geometry(4, [32, 32], [12, 12], 3, 1)
    };
    assert!(!applies(&strided));
    let dilated = Conv2dGeometry {
        dilation: [2, 2],
        ..geometry(4, [32, 32], [12, 12], 3, 2)
    };
    assert!(!applies(&dilated));
    let grouped = Conv2dGeometry {
        groups: 2,
        ..geometry(4, [32, 32], [12, 12], 3, 1)
    };
    assert!(!applies(&grouped));
}

proptest! {
    #![proptest_config(crate::fuzz::config(128))]
    /// Random geometries that run here against im2col: 3×3 or 5×5, 16–40 channels each way (a
    /// multiple of 8 or not), inputs from the least that gives an output up to 13 × 13, every
    /// padding below the kernel's size that the geometry allows, batches of 1–20 (one chunk or
    /// several, with a short last one), any inputs.
    #[test]
    fn fuzz_winograd_convolutions(
        five: bool,
        c in 16usize..41,
        o in 16usize..41,
        h in 1usize..14,
        w in 1usize..14,
        pad in 0usize..5,
        batch in 1usize..21,
        seed: u64,
    ) {
        let r = if five { 5 } else { 3 };
        let pad = pad % r;
        let size = [h, w].map(|s| s.max(r.saturating_sub(2 * pad)));
        let g = geometry(batch, [c, o], size, r, pad);
        prop_assume!(g.check("winograd fuzz").is_ok());
        check_seeded(&g, seed % 1_000_000);
    }
}
