//! Products against a naive f64 reference: odd sizes, vectors, depth 1, sizes that are not
//! multiples of the microkernel or of the cache blocks, every transposition, accumulate on and
//! off, serial and threaded; and a property test over random shapes.

use proptest::prelude::*;

use super::*;
use crate::numerics::MatmulPrecision::F32;

/// Operands of one product: `a` stored `m × k` (or `k × m` when transposed), `b` likewise.
pub(super) struct Case {
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Case {
    pub(super) fn new(
        (m, k, n): (usize, usize, usize),
        (a_t, b_t): (bool, bool),
        seed: u64,
    ) -> Self {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 2001) as f32 / 1000.0 - 1.0
        };
        let a = (0..m * k).map(|_| next()).collect();
        let b = (0..k * n).map(|_| next()).collect();
        Case {
            m,
            k,
            n,
            a_t,
            b_t,
            a,
            b,
        }
    }

    pub(super) fn a(&self) -> MatRef<'_> {
        if self.a_t {
            MatRef::new(&self.a, self.k, self.m).t()
        } else {
            MatRef::new(&self.a, self.m, self.k)
        }
    }

    pub(super) fn b(&self) -> MatRef<'_> {
        if self.b_t {
            MatRef::new(&self.b, self.n, self.k).t()
        } else {
            MatRef::new(&self.b, self.k, self.n)
        }
    }

    /// Logical element `(i, p)` of `a` and `(p, j)` of `b`, from the stored layout.
    fn at(&self, i: usize, p: usize, j: usize) -> (f64, f64) {
        let a = if self.a_t {
            self.a[p * self.m + i]
        } else {
            self.a[i * self.k + p]
        };
        let b = if self.b_t {
            self.b[j * self.k + p]
        } else {
            self.b[p * self.n + j]
        };
        (f64::from(a), f64::from(b))
    }

    /// `init + a · b` in f64, and the sum of `|a_ip · b_pj|` per element (the error scale);
    /// with the operands rounded to bfloat16 first when `rounded`.
    pub(super) fn reference(&self, init: &[f32], rounded: bool) -> (Vec<f64>, Vec<f64>) {
        let round = |x: f64| {
            if rounded {
                half::bf16::from_f64(x).to_f64()
            } else {
                x
            }
        };
        let mut want: Vec<f64> = init.iter().map(|&x| f64::from(x)).collect();
        let mut scale = vec![0.0; self.m * self.n];
        for i in 0..self.m {
            for j in 0..self.n {
                for p in 0..self.k {
                    let (x, y) = self.at(i, p, j);
                    let (x, y) = (round(x), round(y));
                    want[i * self.n + j] += x * y;
                    scale[i * self.n + j] += (x * y).abs();
                }
            }
        }
        (want, scale)
    }

    /// Runs the product into a destination holding `init` (`accumulate` set) or garbage (not
    /// set) and checks every element against the reference.
    fn check(&self, accumulate: bool, threaded: bool) -> std::result::Result<(), String> {
        for kernel in kernels() {
            self.check_with(kernel, accumulate, threaded)?;
        }
        Ok(())
    }

    /// [`Case::check`] through one implementation, against the reference of its precision.
    fn check_with(
        &self,
        kernel: Kernel,
        accumulate: bool,
        threaded: bool,
    ) -> std::result::Result<(), String> {
        self.check_against(kernel, (accumulate, threaded), kernel.rounds())
    }

    /// [`Case::check_with`] against the reference with operands rounded to bfloat16 or not.
    fn check_against(
        &self,
        kernel: Kernel,
        (accumulate, threaded): (bool, bool),
        rounded: bool,
    ) -> std::result::Result<(), String> {
        let len = self.m * self.n;
        let init: Vec<f32> = (0..len).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut dst = if accumulate {
            init.clone()
        } else {
            vec![f32::NAN; len]
        };
        product_with(kernel, &mut dst, (self.a(), self.b()), accumulate, threaded);
        let zeros = vec![0.0; len];
        let (want, scale) = self.reference(if accumulate { &init } else { &zeros }, rounded);
        for (idx, (&got, (&w, &s))) in dst.iter().zip(want.iter().zip(&scale)).enumerate() {
            let tolerance = 1e-5 * (s + w.abs()) + 1e-6;
            if (f64::from(got) - w).abs() > tolerance || got.is_nan() {
                let (i, j) = (idx / self.n, idx % self.n);
                return Err(format!(
                    "{kernel:?} {}×{}×{} (a_t {}, b_t {}, accumulate {accumulate}, \
                     threaded {threaded}): element ({i}, {j}) is {got}, want {w}",
                    self.m, self.k, self.n, self.a_t, self.b_t
                ));
            }
        }
        Ok(())
    }
}

/// Everything this CPU has, whatever the settings cap.
pub(super) fn this_cpu() -> Features {
    Features::of_this_cpu(None)
}

/// Every implementation this CPU can run: the packed kernel is checked on every shape, also
/// those [`matmul_into`] would send to the `gemm` crate, and the AVX-512 one at both depths it
/// may block by (for a 32 KiB and a 48 KiB L1 data cache), whatever this CPU's L1 cache.
pub(super) fn kernels() -> Vec<Kernel> {
    let cpu = this_cpu();
    let mut kernels = vec![Kernel::Portable];
    kernels.extend(cpu.avx2.map(Kernel::Packed));
    for l1 in [32 << 10, kernel_avx512::LARGE_L1] {
        kernels.extend(
            cpu.packed512
                .map(|cpu| Kernel::Packed512(cpu.for_l1(Some(l1)))),
        );
    }
    kernels.extend(cpu.avx512.map(Kernel::Thin));
    kernels.extend(bf16_kernels());
    kernels
}

/// Every bf16 implementation this CPU can run.
fn bf16_kernels() -> Vec<Kernel> {
    let cpu = this_cpu();
    let mut kernels = vec![Kernel::Bf16Portable];
    kernels.extend(cpu.avx2.map(|cpu| Kernel::Bf16Emulated(Bf16Emulated(cpu))));
    kernels.extend(cpu.bf16.map(Kernel::Bf16));
    kernels
}

impl Kernel {
    /// Whether this implementation rounds its operands to bfloat16.
    pub(super) fn rounds(self) -> bool {
        matches!(
            self,
            Kernel::Bf16(_) | Kernel::Bf16Emulated(_) | Kernel::Bf16Portable
        )
    }
}

/// The public entry points, which pick an implementation by shape, give the same products.
#[test]
fn the_entry_points_match_the_reference() {
    for dims in [(3, 40, 700), (40, 9, 40), (300, 70, 5)] {
        let case = Case::new(dims, (true, false), 7);
        let mut dst = vec![0.0; dims.0 * dims.2];
        matmul_into(&mut dst, (case.a(), case.b()), false, F32);
        let mut serial = vec![0.0; dims.0 * dims.2];
        matmul_into_serial(&mut serial, (case.a(), case.b()), false, F32);
        let (want, _) = case.reference(&vec![0.0; dst.len()], false);
        for ((got, one), w) in dst.iter().zip(&serial).zip(&want) {
            assert!((f64::from(*got) - w).abs() < 1e-4 && (f64::from(*one) - w).abs() < 1e-4);
        }
    }
}

pub(super) const ORIENTATIONS: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

fn check_all(dims: (usize, usize, usize), seed: u64) {
    for orientation in ORIENTATIONS {
        let case = Case::new(dims, orientation, seed);
        for accumulate in [false, true] {
            for threaded in [false, true] {
                if let Err(e) = case.check(accumulate, threaded) {
                    panic!("{e}");
                }
            }
        }
    }
}

#[test]
fn small_and_odd_shapes_match_the_reference() {
    let sizes = [1, 2, 5, 6, 7, 15, 16, 17, 31, 33];
    let mut seed = 0;
    for &m in &sizes {
        for &n in &sizes {
            for k in [1, 3, 17] {
                seed += 1;
                check_all((m, k, n), seed);
            }
        }
    }
}

#[test]
fn vectors_and_depth_one_match_the_reference() {
    for (i, dims) in [
        (1, 300, 1),
        (1, 64, 777),
        (777, 64, 1),
        (300, 1, 200),
        (1, 1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        check_all(dims, 100 + i as u64);
    }
}

/// Shapes that cross the cache blocks of both packed kernels (depth past `KC`, rows past `MC`)
/// and split across threads into uneven rectangles.
#[test]
fn products_larger_than_a_cache_block_match_the_reference() {
    for (i, dims) in [
        (150, 300, 70),
        (37, 530, 290),
        (291, 257, 33),
        (64, 129, 1000),
    ]
    .into_iter()
    .enumerate()
    {
        check_all(dims, 200 + i as u64);
    }
}

#[test]
fn a_product_wider_than_a_column_block_matches_the_reference() {
    let widest = blocked::NC.max(kernel_avx512::NC);
    let case = Case::new((7, 3, widest + 21), (false, true), 300);
    for accumulate in [false, true] {
        case.check(accumulate, true).unwrap();
        case.check(accumulate, false).unwrap();
    }
}

/// A short rectangle (at most `MC` rows, `b` not read in place) packs `b` a chunk at a time:
/// several chunks, a partial last one, and depth blocks past `KC`, for every layout.
#[test]
fn a_short_product_over_several_chunks_matches_the_reference() {
    let n = 2 * blocked::short_chunk::<Avx512Fma>().max(blocked::short_chunk::<Avx2Fma>()) + 5;
    let shapes = [
        (100, 600, n),
        (blocked::MC, 40, n),
        (kernel_avx512::MC, 40, n),
        (16, 300, 1100),
    ];
    for (i, dims) in shapes.into_iter().enumerate() {
        check_all(dims, 500 + i as u64);
    }
}

/// The AVX-512 kernel for few rows: every row count of a pass, one and two passes, columns that
/// end inside either vector of a pass, serial and split across threads (the last shape), for
/// every layout (a transposed `b` goes to the crate).
#[test]
fn thin_products_match_the_reference() {
    let Some(cpu) = Avx512::detect() else {
        return;
    };
    let mut seed = 600;
    let shapes = [
        (37, 1),
        (37, 16),
        (37, 17),
        (37, 32),
        (37, 45),
        (37, 70),
        (1400, 333),
        (1400, 400),
    ];
    // The last two shapes are split across threads from 9 rows on, the last one also as a
    // single row (passes of 128 columns, then a partial one, in either thread's share).
    const { assert!(9 * 1400 * 333 >= thin_avx512::DOT_PARALLEL_MIN_MACS) };
    const { assert!(1400 * 333 < thin_avx512::ROW_PARALLEL_MIN_MACS) };
    const { assert!(1400 * 400 >= thin_avx512::ROW_PARALLEL_MIN_MACS) };
    for m in 1..SMALL_SIDE {
        for (k, n) in shapes {
            for orientation in ORIENTATIONS {
                seed += 1;
                let case = Case::new((m, k, n), orientation, seed);
                for accumulate in [false, true] {
                    for threaded in [false, true] {
                        let kernel = Kernel::Thin(cpu);
                        case.check_with(kernel, accumulate, threaded).unwrap();
                    }
                }
            }
        }
    }
    for rows in [1, 8] {
        assert!(matches!(
            Kernel::for_product(
                this_cpu(),
                (rows, 512),
                (false, false),
                MatmulPrecision::F32
            ),
            Kernel::Thin(_)
        ));
    }
    assert!(!matches!(
        Kernel::for_product(this_cpu(), (8, 512), (false, true), MatmulPrecision::F32),
        Kernel::Thin(_)
    ));
}

/// The AVX-512 dot-product kernel for few columns: every column count below 16, row counts
/// around its 4-row passes, depths that end inside a 16-wide vector and 1024 (columns 4 KiB
/// apart), serial and split across threads, for every layout (with a transposed `a`, the
/// product runs as its transpose on the kernel for few rows).
#[test]
fn few_column_products_match_the_reference() {
    let Some(cpu) = Avx512::detect() else {
        return;
    };
    let mut seed = 900;
    // The last shape is split across threads from 8 columns on.
    const { assert!(600 * 961 * 8 >= thin_avx512::DOT_PARALLEL_MIN_MACS) };
    for n in 1..SMALL_SIDE {
        for (m, k) in [(16, 37), (19, 1024), (70, 5), (600, 961)] {
            for orientation in ORIENTATIONS {
                seed += 1;
                let case = Case::new((m, k, n), orientation, seed);
                for accumulate in [false, true] {
                    for threaded in [false, true] {
                        case.check_with(Kernel::Thin(cpu), accumulate, threaded)
                            .unwrap();
                    }
                }
            }
        }
    }
    assert!(matches!(
        Kernel::for_product(this_cpu(), (256, 10), (false, false), MatmulPrecision::F32),
        Kernel::Thin(_)
    ));
    assert!(matches!(
        Kernel::for_product(this_cpu(), (1024, 10), (true, false), MatmulPrecision::F32),
        Kernel::Thin(_)
    ));
}

/// bf16 products round their operands: against the f32 reference, they are off by far more
/// than f32 sums can explain (operands in thousandths, not bfloat16 values).
#[test]
fn bf16_products_round_their_operands() {
    let case = Case::new((40, 300, 50), (false, false), 77);
    for kernel in bf16_kernels() {
        let exact = case.check_against(kernel, (false, true), false);
        assert!(exact.is_err(), "{kernel:?} gave f32 products");
        case.check_against(kernel, (false, true), true).unwrap();
    }
}

/// Under bf16 precision, products of 16 rows and columns or more run in bf16, thinner ones
/// in f32.
#[test]
fn bf16_precision_takes_the_products_of_16_rows_and_columns_or_more() {
    let bf16 = MatmulPrecision::Bf16;
    for (m, n) in [(16, 16), (256, 1024), (1024, 256), (32, 576)] {
        let kernel = Kernel::for_product(this_cpu(), (m, n), (false, true), bf16);
        assert!(kernel.rounds(), "{m} × {n} runs in bf16");
        assert!(
            !Kernel::for_product(this_cpu(), (m, n), (false, true), MatmulPrecision::F32).rounds()
        );
    }
    for (m, n) in [(15, 1024), (256, 10), (1, 1)] {
        assert!(!Kernel::for_product(this_cpu(), (m, n), (false, false), bf16).rounds());
    }
}

/// The element-wise rounding matches an independent one on every kind of value: ties to even
/// both ways, values that round up into the next binade or to infinity, subnormals, NaN.
#[test]
fn rounding_to_bf16_matches_the_half_crate() {
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -1.0 - 1.0 / 256.0,
        1.999_999,
        f32::MAX,
        f32::MIN_POSITIVE / 3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let mut state = 0x2545_F491_4F6C_DD1D_u64;
    let random = (0..100_000).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        f32::from_bits(state as u32)
    });
    for x in specials.into_iter().chain(random) {
        let (got, want) = (bf16::round_to_bf16(x), half::bf16::from_f32(x).to_f32());
        if x.is_nan() {
            assert!(got.is_nan(), "{x:e} stays NaN");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
        }
    }
}

/// Thin products and rows that fill their last panel badly are not packed.
#[test]
fn padding_heavy_products_go_to_the_gemm_crate() {
    for (m, n) in [(64, 576), (256, 1024), (16 * 6, 16), (1024, 10_000)] {
        assert!(packing_pays(m, n, 6), "{m} × {n} is packed in 6-row panels");
    }
    for (m, n) in [(32, 576), (15, 1024), (1024, 15), (20, 512), (8, 512)] {
        assert!(
            !packing_pays(m, n, 6),
            "{m} × {n} is not packed in 6-row panels"
        );
    }
    for (m, n) in [(32, 576), (64, 576), (16, 16), (1024, 10_000)] {
        assert!(packing_pays(m, n, 8), "{m} × {n} is packed in 8-row panels");
    }
    for (m, n) in [(20, 512), (36, 512), (15, 1024), (1024, 15)] {
        assert!(
            !packing_pays(m, n, 8),
            "{m} × {n} is not packed in 8-row panels"
        );
    }
}

#[test]
fn an_empty_depth_clears_or_keeps_the_destination() {
    let (a, b) = (MatRef::new(&[], 3, 0), MatRef::new(&[], 0, 4));
    let mut dst = vec![5.0; 12];
    matmul_into(&mut dst, (a, b), true, F32);
    assert_eq!(dst, vec![5.0; 12]);
    matmul_into(&mut dst, (a, b), false, F32);
    assert_eq!(dst, vec![0.0; 12]);
}

#[test]
fn threads_split_the_longer_side_into_whole_tiles() {
    assert_eq!(threading::grid(256, 1024, 2, (6, 16)), (1, 2));
    assert_eq!(threading::grid(1024, 256, 2, (6, 16)), (2, 1));
    assert_eq!(threading::grid(256, 10, 2, (6, 16)), (2, 1));
    assert_eq!(threading::grid(4, 10, 8, (6, 16)), (1, 1));
    assert_eq!(threading::grid(1024, 1024, 16, (6, 16)), (4, 4));
}

#[test]
fn even_parts_cover_the_length_in_units() {
    let parts: Vec<_> = blocked::even_parts(784, blocked::KC, 1).collect();
    assert_eq!(parts, vec![(0, 196), (196, 196), (392, 196), (588, 196)]);
    let parts: Vec<_> = blocked::even_parts(256, blocked::MC, 6).collect();
    assert_eq!(parts, vec![(0, 132), (132, 124)]);
    assert_eq!(blocked::even_parts(0, 10, 6).count(), 0);
}

/// The same product on a pool of `threads` threads, against the reference.
fn check_on_pool(threads: usize, dims: (usize, usize, usize)) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    for orientation in ORIENTATIONS {
        let case = Case::new(dims, orientation, threads as u64);
        pool.install(|| case.check(true, true)).unwrap();
    }
}

#[test]
fn every_pool_size_gives_the_reference_product() {
    for threads in [1, 2, 3, 5, 8] {
        check_on_pool(threads, (97, 70, 203));
    }
}

/// Products started from a row (a dense layer's bias) on pools of several sizes, packed
/// (split across threads by columns and rows), thin and of depth 0: every element written (the
/// destination starts as NaN), each the row's value plus the product.
#[test]
fn products_onto_a_row_match_the_reference_on_every_pool_size() {
    for threads in [1, 2, 3, 5] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for dims in [
            (97, 70, 203),
            (300, 64, 40),
            (3, 40, 700),
            (300, 70, 5),
            (20, 0, 30),
        ] {
            let case = Case::new(dims, (false, false), 11 + threads as u64);
            let (m, n) = (dims.0, dims.2);
            let row: Vec<f32> = (0..n).map(|j| (j % 13) as f32 - 6.0).collect();
            let mut dst = vec![MaybeUninit::new(f32::NAN); m * n];
            pool.install(|| matmul_onto_row(&mut dst, (case.a(), case.b()), &row, F32));
            let init: Vec<f32> = (0..m * n).map(|idx| row[idx % n]).collect();
            let (want, scale) = case.reference(&init, false);
            for (idx, got) in dst.iter().enumerate() {
                // SAFETY: every element was initialized (to NaN, then by the product).
                let got = f64::from(unsafe { got.assume_init() });
                let tolerance = 1e-5 * (scale[idx] + want[idx].abs()) + 1e-6;
                assert!(
                    (got - want[idx]).abs() <= tolerance,
                    "{dims:?} on {threads} threads: element {idx} is {got}, want {}",
                    want[idx]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(crate::fuzz::config(256))]
    #[test]
    fn fuzz_gemm_products(
        m in 1usize..80,
        k in 1usize..300,
        n in 1usize..140,
        a_t: bool,
        b_t: bool,
        accumulate: bool,
        threaded: bool,
        zeros in 0usize..3,
        seed: u64,
    ) {
        // Zeros in `a` (none, whole columns, most elements) for the skipping of zero steps.
        let case = Case::new((m, k, n), (a_t, b_t), seed).with_zeros_in_a(|i, p| match zeros {
            0 => false,
            1 => p % 3 != 0,
            _ => (i * 7 + p * 13 + seed as usize % 10) % 10 < 8,
        });
        prop_assert_eq!(case.check(accumulate, threaded), Ok(()));
    }
}

#[test]
fn batched_products_match_the_reference() {
    use ndarray::{ArrayD, IxDyn};
    let (batch, m, k, n) = (3, 9, 20, 18);
    let case: Vec<Case> = (0..batch)
        .map(|i| Case::new((m, k, n), (false, true), 400 + i))
        .collect();
    let stack = |parts: Vec<f32>, shape: &[usize]| ArrayD::from_shape_vec(IxDyn(shape), parts);
    let a = stack(case.iter().flat_map(|c| c.a.clone()).collect(), &[3, m, k]).unwrap();
    let b = stack(case.iter().flat_map(|c| c.b.clone()).collect(), &[3, n, k]).unwrap();
    let mut dst = ArrayD::zeros(IxDyn(&[3, m, n]));
    let opts = MatmulOptions::transposed(false, true);
    <CpuArray as MatmulOps>::bmm_into(&mut dst, (&a, &b), opts).unwrap();
    let out = dst.as_slice().unwrap();
    for (i, c) in case.iter().enumerate() {
        let (want, _) = c.reference(&vec![0.0; m * n], false);
        for (got, w) in out[i * m * n..(i + 1) * m * n].iter().zip(&want) {
            assert!(
                (f64::from(*got) - w).abs() < 1e-4,
                "entry {i}: {got} vs {w}"
            );
        }
    }
}

impl Case {
    /// The same operands with the logical elements `(i, p)` of `a` for which `zero` holds set
    /// to zero (the sign of the zero alternating), so that packed panels have zero steps.
    fn with_zeros_in_a(mut self, zero: impl Fn(usize, usize) -> bool) -> Self {
        for i in 0..self.m {
            for p in 0..self.k {
                if zero(i, p) {
                    let at = if self.a_t {
                        p * self.m + i
                    } else {
                        i * self.k + p
                    };
                    self.a[at] = if (i + p) % 2 == 0 { 0.0 } else { -0.0 };
                }
            }
        }
        self
    }
}

/// Products whose `a` has zero steps (whole zero columns, zeros in most elements, blank
/// regions as in images, or nothing but zeros) give the reference product through every
/// implementation, whether their panels are compacted (`zero_steps.rs`) or not.
#[test]
fn products_with_zeros_in_a_match_the_reference() {
    type Pattern = fn(usize, usize) -> bool;
    let patterns: [Pattern; 5] = [
        |_, p| p % 3 != 0,
        |i, p| (i * 7 + p * 13) % 10 < 8,
        |i, p| !(10..20).contains(&p) || i % 9 == 4,
        |_, p| p >= 5,
        |_, _| true,
    ];
    let mut seed = 400;
    for (dims, pattern) in [(37, 530, 290), (64, 300, 70), (9, 17, 40)]
        .into_iter()
        .flat_map(|dims| patterns.map(|pattern| (dims, pattern)))
    {
        for orientation in ORIENTATIONS {
            seed += 1;
            let case = Case::new(dims, orientation, seed).with_zeros_in_a(pattern);
            for (accumulate, threaded) in [(false, false), (true, true), (false, true)] {
                if let Err(e) = case.check(accumulate, threaded) {
                    panic!("{e}");
                }
            }
        }
    }
}

/// The steps a packed kernel skips are not run at all: where `a`'s columns are zero (two in
/// a row, so that bf16 pairs are zero too), `b`'s rows may hold NaN without reaching the
/// product (the one place where skipping shows, as it does for sparse products elsewhere);
/// where they are not, the NaN does reach it. With `b` read in place (64 rows) and packed,
/// and enough columns that every kernel's blocks are scanned.
#[test]
fn packed_kernels_skip_the_steps_where_a_is_zero() {
    for (m, k, n) in [(64, 96, 128), (128, 96, 128)] {
        let case = Case::new((m, k, n), (false, false), 500);
        let mut case = case.with_zeros_in_a(|_, p| p % 4 >= 2);
        case.b[2 * n..4 * n].fill(f32::NAN);
        for kernel in kernels().into_iter().filter(|k| k.packed()) {
            let mut dst = vec![0.0; m * n];
            product_with(kernel, &mut dst, (case.a(), case.b()), false, false);
            assert!(
                dst.iter().all(|x| x.is_finite()),
                "{kernel:?} ran a zero step"
            );
            case.b[4 * n] = f32::NAN;
            product_with(kernel, &mut dst, (case.a(), case.b()), false, false);
            assert!(
                dst[..n].iter().any(|x| x.is_nan()),
                "{kernel:?} skipped a live step"
            );
            case.b[4 * n] = 0.5;
        }
    }
}

impl Kernel {
    /// Whether this implementation is one of the packed microkernels.
    fn packed(self) -> bool {
        matches!(
            self,
            Kernel::Packed(_) | Kernel::Packed512(_) | Kernel::Bf16(_) | Kernel::Bf16Emulated(_)
        )
    }
}
