//! Products written onto their destination times a factor ([`matmul_scaled_onto`]: a plain SGD
//! step whose gradient is the product): bit for bit the stored product followed by the SGD
//! step, on every implementation, depth block, pool size and transposition, and depths within
//! one block, at its edge and past it.

use super::tests::{Case, ORIENTATIONS, kernels};
use super::*;
use crate::backend::cpu::optim::sgd;
use crate::backend::optim::SgdStep;
use crate::numerics::MatmulPrecision::F32;

/// The factor of every case: an SGD step's `-lr`.
pub(super) const FACTOR: f32 = -0.05;

/// What the destination holds before the product: values of both signs.
pub(super) fn start(len: usize) -> Vec<f32> {
    (0..len).map(|i| (i % 11) as f32 * 0.25 - 1.3).collect()
}

/// `init` after the plain SGD step at learning rate `-FACTOR` (the optimizer's own pass) whose
/// gradient is `product`.
pub(super) fn stepped(init: &[f32], product: &[f32]) -> Vec<f32> {
    let mut want = init.to_vec();
    sgd(&mut want, product, None, SgdStep::plain(-FACTOR));
    want
}

/// Checks that `got` is `want` bit for bit, naming the first element that is not.
pub(super) fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(idx) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {idx} is {}, the stored product after the SGD step {}",
            got[idx], want[idx]
        );
    }
}

/// Runs every implementation on `dims` in every orientation, on pools of each of `threads`,
/// and checks the scaled product against the stored one after the SGD step, bit for bit.
fn check_scaled(shapes: &[(usize, usize, usize)], threads: &[usize]) {
    for &threads in threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (dims, orientation) in shapes.iter().flat_map(|&d| ORIENTATIONS.map(|o| (d, o))) {
            let case = Case::new(dims, orientation, 5 + threads as u64);
            let (m, n) = (dims.0, dims.2);
            for kernel in kernels() {
                let mut product = vec![f32::NAN; m * n];
                pool.install(|| {
                    product_with(kernel, &mut product, (case.a(), case.b()), false, true)
                });
                let init = start(m * n);
                let mut got = init.clone();
                pool.install(|| {
                    scaled_product_with(kernel, &mut got, (case.a(), case.b()), FACTOR)
                });
                let what = format!("{kernel:?} {dims:?} {orientation:?} on {threads} threads");
                assert_same_bits(&got, &stepped(&init, &product), &what);
            }
        }
    }
}

#[test]
fn scaled_products_are_the_stored_products_after_the_sgd_step() {
    let shapes = [
        (97, 70, 203),
        (64, 192, 40),
        (3, 40, 700),
        (300, 70, 5),
        (5, 70, 300),
        (20, 0, 30),
    ];
    check_scaled(&shapes, &[1, 2, 3]);
}

/// Depths at the edge of each packed kernel's depth block (192 and 256) and past it, where the
/// stored product adds the blocks' partial sums before the step.
#[test]
fn scaled_products_deeper_than_a_block_are_the_stored_products_after_the_sgd_step() {
    let shapes = [
        (40, 193, 50),
        (40, 256, 50),
        (40, 257, 50),
        (40, 600, 50),
        (24, 1024, 40),
    ];
    check_scaled(&shapes, &[1, 2]);
}

#[test]
fn the_entry_point_scales_what_matmul_into_stores() {
    for dims in [(256, 256, 1024), (256, 193, 1024), (1024, 256, 10)] {
        let case = Case::new(dims, (true, false), 9);
        let mut product = vec![0.0; dims.0 * dims.2];
        matmul_into(&mut product, (case.a(), case.b()), false, F32);
        let init = start(product.len());
        let mut got = init.clone();
        matmul_scaled_onto(&mut got, (case.a(), case.b()), FACTOR, F32);
        let what = format!("{dims:?} through {:?}", Features::in_force());
        assert_same_bits(&got, &stepped(&init, &product), &what);
    }
}
