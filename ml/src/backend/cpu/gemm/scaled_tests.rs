//! Products written onto their destination times a factor ([`matmul_scaled_onto`]: a plain SGD
//! step whose gradient is the product): bit for bit the stored product, scaled and added, on
//! every implementation, pool size and transposition where the depth fits one block; close to
//! the f64 reference where it spans several.

use super::tests::{Case, ORIENTATIONS, kernels};
use super::*;

/// The factor of every case: an SGD step's `-lr`.
const FACTOR: f32 = -0.05;

/// What the destination holds before the product: values of both signs.
fn start(len: usize) -> Vec<f32> {
    (0..len).map(|i| (i % 11) as f32 * 0.25 - 1.3).collect()
}

#[test]
fn scaled_products_are_the_stored_products_scaled_and_added() {
    let shapes = [
        (97, 70, 203),
        (64, 192, 40),
        (3, 40, 700),
        (300, 70, 5),
        (5, 70, 300),
        (20, 0, 30),
    ];
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (dims, orientation) in shapes
            .into_iter()
            .flat_map(|d| ORIENTATIONS.map(|o| (d, o)))
        {
            let case = Case::new(dims, orientation, 5 + threads as u64);
            let (m, n) = (dims.0, dims.2);
            for kernel in kernels() {
                let mut product = vec![f32::NAN; m * n];
                pool.install(|| {
                    product_with(kernel, &mut product, (case.a(), case.b()), false, true)
                });
                let init = start(m * n);
                let want = init.iter().zip(&product).map(|(&d, &p)| d + p * FACTOR);
                let mut got = init.clone();
                pool.install(|| {
                    scaled_product_with(kernel, &mut got, (case.a(), case.b()), FACTOR)
                });
                for (idx, (got, want)) in got.iter().zip(want).enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{kernel:?} {dims:?} {orientation:?} on {threads} threads: element \
                         {idx} is {got}, the stored product scaled and added {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn scaled_products_deeper_than_a_block_match_the_reference() {
    for orientation in ORIENTATIONS {
        let dims = (40, 600, 50);
        let case = Case::new(dims, orientation, 3);
        let init = start(dims.0 * dims.2);
        let (product, scale) = case.reference(&vec![0.0; init.len()], false);
        for kernel in kernels().into_iter().filter(|k| !k.rounds()) {
            let mut got = init.clone();
            scaled_product_with(kernel, &mut got, (case.a(), case.b()), FACTOR);
            for (idx, &got) in got.iter().enumerate() {
                let factor = f64::from(FACTOR);
                let want = f64::from(init[idx]) + factor * product[idx];
                let tolerance = 1e-5 * (factor.abs() * scale[idx] + want.abs()) + 1e-6;
                assert!(
                    (f64::from(got) - want).abs() <= tolerance,
                    "{kernel:?} {orientation:?}: element {idx} is {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn the_entry_point_scales_what_matmul_into_stores() {
    for dims in [(256, 256, 1024), (1024, 256, 10)] {
        let case = Case::new(dims, (true, false), 9);
        let mut product = vec![0.0; dims.0 * dims.2];
        matmul_into(&mut product, case.a(), case.b(), false);
        let init = start(product.len());
        let mut got = init.clone();
        matmul_scaled_onto(&mut got, case.a(), case.b(), FACTOR);
        let want = init.iter().zip(&product).map(|(&d, &p)| d + p * FACTOR);
        assert!(
            got.iter()
                .zip(want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "{dims:?}: the scaled product differs from the stored one, scaled and added"
        );
    }
}
