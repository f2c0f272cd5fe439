//! The dispatch, for every choice another CPU could make that this one can run: the features
//! capped at each of `RINGFLOW_MAX_CPU_ISA`'s levels, the AVX-512 kernel blocked for a 32 KiB
//! and a 48 KiB L1 data cache, products in f32 and bf16. Through each, the entry points' own
//! selection picks no kernel above the cap, the products and products onto a row match the
//! reference, and the scaled product is the stored one after the SGD step, bit for bit. The
//! process's own dispatch is the one the environment asks for.

use super::scaled_tests::{FACTOR, assert_same_bits, start, stepped};
use super::tests::{Case, this_cpu};
use super::*;
use crate::backend::cpu::isa::{self, MaxCpuIsa};

/// The level of [`MaxCpuIsa`] an implementation needs.
fn level(kernel: Kernel) -> MaxCpuIsa {
    match kernel {
        Kernel::Portable | Kernel::Bf16Portable => MaxCpuIsa::Portable,
        Kernel::Packed(_) | Kernel::Bf16Emulated(_) => MaxCpuIsa::Avx2,
        Kernel::Packed512(_) | Kernel::Thin(_) => MaxCpuIsa::Avx512,
        Kernel::Bf16(_) => MaxCpuIsa::Avx512Bf16,
    }
}

/// The most of [`MaxCpuIsa`] a set of features reaches.
fn reach(features: Features) -> MaxCpuIsa {
    match features {
        Features { bf16: Some(_), .. } => MaxCpuIsa::Avx512Bf16,
        Features {
            packed512: Some(_), ..
        } => MaxCpuIsa::Avx512,
        Features { avx2: Some(_), .. } => MaxCpuIsa::Avx2,
        _ => MaxCpuIsa::Portable,
    }
}

/// One choice of the dispatch: its name, its cap and its features.
struct Choice {
    name: String,
    max: MaxCpuIsa,
    l1_kib: usize,
    features: Features,
}

/// Every choice this CPU can run: each cap up to what it has, and at the AVX-512 levels each
/// L1 size the kernel blocks by.
fn choices() -> Vec<Choice> {
    let has = reach(this_cpu());
    let mut choices = Vec::new();
    for max in MaxCpuIsa::ALL.into_iter().filter(|&max| max <= has) {
        let l1_sizes: &[usize] = if max >= MaxCpuIsa::Avx512 {
            &[32, 48]
        } else {
            &[32]
        };
        for &kib in l1_sizes {
            choices.push(Choice {
                name: format!("{} with a {kib} KiB L1", max.as_str()),
                max,
                l1_kib: kib,
                features: Features::of_this_cpu(Some(kib << 10)).capped(max),
            });
        }
    }
    choices
}

/// Products that take each path of the dispatch: packed within one depth block, at the AVX-512
/// kernel's 192 and past it, at 256 and past it, far past it (a weight gradient of a batch of
/// 1024), few rows, few columns with `a` as stored and transposed, and thin enough for the
/// `gemm` crate.
const SHAPES: [(usize, usize, usize); 10] = [
    (256, 256, 1024),
    (64, 192, 40),
    (64, 193, 40),
    (64, 257, 40),
    (24, 1024, 40),
    (8, 300, 512),
    (256, 300, 10),
    (1024, 256, 10),
    (20, 70, 1),
    (97, 70, 203),
];

/// The depth block of the AVX-512 kernel for an L1 data cache of `kib` KiB: 192 below 48 KiB.
fn depth_block_for(kib: usize) -> usize {
    if kib << 10 >= kernel_avx512::LARGE_L1 {
        kernel_avx512::KC_LARGE_L1
    } else {
        kernel_avx512::KC
    }
}

/// The kernels each choice picks never need more than its cap; the AVX-512 kernel blocks by
/// the depth its L1 size calls for; and a cap at what the CPU has changes nothing.
#[test]
fn each_cap_picks_no_kernel_above_it() {
    for choice in choices() {
        for precision in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
            for &(m, _, n) in &SHAPES {
                for transposed in [(true, false), (false, false), (false, true)] {
                    let kernel =
                        Kernel::for_product(choice.features, (m, n), transposed, precision);
                    assert!(
                        level(kernel) <= choice.max,
                        "{}: {m} × {n} runs on {kernel:?}",
                        choice.name
                    );
                }
            }
        }
        if let Some(cpu) = choice.features.packed512 {
            assert_eq!(cpu.kc(), depth_block_for(choice.l1_kib), "{}", choice.name);
        }
        assert_eq!(
            reach(choice.features),
            choice.max,
            "{} reaches its cap",
            choice.name
        );
    }
    let cpu = this_cpu();
    assert_eq!(
        reach(cpu.capped(reach(cpu))),
        reach(cpu),
        "a cap at what the CPU has"
    );
    assert_eq!(
        reach(cpu.capped(MaxCpuIsa::default())),
        reach(cpu),
        "the default cap"
    );
}

/// Through every choice and precision, on every path: `matmul_into` and `matmul_onto_row`
/// against the reference, and `matmul_scaled_onto` against `matmul_into`'s product after the
/// SGD step, bit for bit.
#[test]
fn every_choice_scales_what_it_stores() {
    for (i, &dims) in SHAPES.iter().enumerate() {
        let case = Case::new(dims, (i % 2 == 0, false), 40 + i as u64);
        let (m, n) = (dims.0, dims.2);
        let row: Vec<f32> = (0..n).map(|j| (j % 13) as f32 * 0.5 - 3.0).collect();
        let init: Vec<f32> = (0..m * n).map(|idx| row[idx % n]).collect();
        let references = [false, true].map(|rounded| case.reference(&init, rounded));
        for choice in choices() {
            for precision in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
                let kernel = Kernel::for_operands(choice.features, (case.a(), case.b()), precision);
                let (want, scale) = &references[usize::from(kernel.rounds())];
                let what = format!("{} {precision:?} {dims:?} on {kernel:?}", choice.name);
                let mut product = vec![f32::NAN; m * n];
                product_with(kernel, &mut product, (case.a(), case.b()), false, true);
                let mut onto_row = vec![MaybeUninit::new(f32::NAN); m * n];
                onto_row_with(kernel, &mut onto_row, (case.a(), case.b()), &row);
                for idx in 0..m * n {
                    // SAFETY: every element was initialized (to NaN, then by the product).
                    let got = f64::from(unsafe { onto_row[idx].assume_init() });
                    let stored = f64::from(product[idx] + row[idx % n]);
                    let tolerance = 1e-5 * (scale[idx] + want[idx].abs()) + 1e-6;
                    assert!(
                        (got - want[idx]).abs() <= tolerance
                            && (stored - want[idx]).abs() <= tolerance,
                        "{what}: element {idx} is {got} onto the row and {stored} stored, \
                         want {}",
                        want[idx]
                    );
                }
                let before = start(m * n);
                let mut scaled = before.clone();
                scaled_product_with(kernel, &mut scaled, (case.a(), case.b()), FACTOR);
                assert_same_bits(&scaled, &stepped(&before, &product), &what);
            }
        }
    }
}

/// The entry points run this process's choice: the CPU's features capped by
/// `RINGFLOW_MAX_CPU_ISA` and blocked for `RINGFLOW_L1D_KIB` where they are set (a value that
/// cannot be used fails here, by its sentence), so that a test run with them set runs what
/// they name.
#[test]
fn the_dispatch_follows_the_cpu_settings() {
    let settings = isa::cpu_settings().unwrap_or_else(|e| panic!("{e}"));
    let features = Features::in_force();
    let has = reach(this_cpu());
    assert_eq!(reach(features), settings.max_isa.min(has), "{features:?}");
    if let (Some(cpu), Some(kib)) = (features.packed512, settings.l1d_kib) {
        assert_eq!(cpu.kc(), depth_block_for(kib), "{} = {kib}", isa::L1D_VAR);
    }
    let native = bf16_products() == Bf16Products::Native;
    assert_eq!(native, features.bf16.is_some(), "{features:?}");
}
