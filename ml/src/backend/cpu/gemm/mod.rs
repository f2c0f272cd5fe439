//! Matrix products on the CPU.
//!
//! On x86-64 CPUs with AVX2 and FMA (detected at run time, once), products run on this
//! module's own blocked GEMM: operands are packed into panels (`pack.rs`, `pack_avx2.rs`, which
//! also read transposed operands, so callers never copy), a register-blocked microkernel sweeps
//! the tiles of cache-sized blocks (`blocked.rs`) while the next blocks' lines are asked for
//! (`ahead.rs`), and large products are cut into one rectangle per thread of the current rayon
//! pool (`threading.rs`). The microkernel is an 8 × 32 AVX-512 one (`kernel_avx512.rs`) where
//! the CPU has AVX-512F, twice the AVX2 rate on cores with 512-bit FMA units, and a 6 × 16 AVX2
//! one (`kernel_avx2.rs`) elsewhere. Products of 1 to 15 rows with a row-major `b`, of 2 to 15
//! columns with a row-major `a`, or of 1 to 15 columns with a transposed `a` (as their
//! transpose, which has few rows), run on unpacked
//! AVX-512 kernels where the CPU has AVX-512F (`thin_avx512.rs`). Other thin products
//! (fewer than 16 rows or columns), row counts that leave their last panel mostly empty (32
//! rows in 6-row panels), and CPUs without AVX2 and FMA go through the `gemm` crate. Under
//! [`MatmulPrecision::Bf16`], products of 16 rows and columns or more run on the bf16 kernels
//! of `bf16/` instead, through the same blocked loops (`microkernel.rs`). Nothing depends on the
//! machine the binary was built on: no `target-cpu=native` is needed or used. The kernels a
//! product may run are this process's features (`features.rs`): what the CPU has, capped by
//! `RINGFLOW_MAX_CPU_ISA`, the AVX-512 kernel blocked for the L1 data cache `RINGFLOW_L1D_KIB`
//! names or CPUID reports (`../isa.rs`).

mod ahead;
mod bf16;
mod blocked;
mod element;
mod features;
mod kernel_avx2;
mod kernel_avx512;
mod l1_cache;
mod microkernel;
mod pack;
mod pack_avx2;
mod thin_avx512;
mod threading;
mod tokens;
mod view;
mod zero_steps;

use std::mem::MaybeUninit;

use gemm::Parallelism;
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use self::bf16::{Avx512Bf16, Bf16Emulated};
use self::features::Features;
use self::kernel_avx512::Avx512Fma;
use self::microkernel::Microkernel;
use self::thin_avx512::Avx512;
use self::tokens::Avx2Fma;
use self::view::{DstTile, Operand, Start};
use super::{CpuArray, slice, slice_mut};
use crate::backend::matmul::{MatmulOps, MatmulOptions};
use crate::error::Result;
use crate::numerics::{Bf16Products, MatmulPrecision, Numerics};

/// A row-major matrix operand, possibly read transposed.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    /// The stored elements, row-major `rows × cols` of the *stored* matrix.
    pub data: &'a [f32],
    /// Rows of the stored matrix.
    pub rows: usize,
    /// Columns of the stored matrix.
    pub cols: usize,
    /// Read the matrix transposed (no copy: only the strides change).
    pub transposed: bool,
}

impl<'a> MatRef<'a> {
    /// A `rows × cols` row-major matrix, read as stored.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            transposed: false,
        }
    }

    /// The same matrix, read transposed.
    pub fn t(self) -> Self {
        MatRef {
            transposed: !self.transposed,
            ..self
        }
    }

    /// Rows and columns as the product sees them.
    pub fn logical_dims(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (row stride, column stride) of the logical matrix.
    fn strides(&self) -> (isize, isize) {
        if self.transposed {
            (1, self.cols as isize)
        } else {
            (self.cols as isize, 1)
        }
    }
}

/// `dst (m×n) = a (m×k) · b (k×n)`, or `dst += a · b` when `accumulate` is set, at
/// `precision`.
///
/// `dst` is row-major and contiguous. Large products run on all threads of the current rayon
/// pool (the executor sizes it to its `--cores`); small ones stay on the calling thread.
pub fn matmul_into(
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    accumulate: bool,
    precision: MatmulPrecision,
) {
    product(dst, (a, b), accumulate, precision, true);
}

/// [`matmul_into`] on the calling thread only: for the many small products of a loop that is
/// itself parallel (a convolution's images).
pub fn matmul_into_serial(
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    accumulate: bool,
    precision: MatmulPrecision,
) {
    product(dst, (a, b), accumulate, precision, false);
}

/// Which implementation runs a product.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    /// This module's packed GEMM on the AVX2 + FMA microkernel.
    Packed(Avx2Fma),
    /// This module's packed GEMM on the AVX-512 microkernel.
    Packed512(Avx512Fma),
    /// The unpacked AVX-512 kernels for few rows or few columns (`thin_avx512.rs`); products
    /// they do not take go to the `gemm` crate.
    Thin(Avx512),
    /// The `gemm` crate.
    Portable,
    /// Products in bfloat16 with f32 sums, natively (AVX512_BF16).
    Bf16(Avx512Bf16),
    /// Products in bfloat16 with f32 sums, on the f32 kernel with rounded panels.
    Bf16Emulated(Bf16Emulated),
    /// Products in bfloat16 with f32 sums, through the `gemm` crate on rounded copies.
    Bf16Portable,
}

impl Kernel {
    /// The fastest implementation of `features` for an `m × n` product, `a` and `b` read
    /// transposed or not.
    fn for_product(
        features: Features,
        (m, n): (usize, usize),
        (a_transposed, b_transposed): (bool, bool),
        precision: MatmulPrecision,
    ) -> Self {
        if precision == MatmulPrecision::Bf16 && m >= SMALL_SIDE && n >= SMALL_SIDE {
            return Kernel::bf16(features);
        }
        if (few_rows(m, n, b_transposed)
            || few_cols(m, n, a_transposed)
            || few_cols_of_transposed(m, n, a_transposed))
            && let Some(cpu) = features.avx512
        {
            return Kernel::Thin(cpu);
        }
        if let Some(cpu) = features.packed512
            && packing_pays(m, n, kernel_avx512::MR)
        {
            return Kernel::Packed512(cpu);
        }
        match features.avx2 {
            Some(cpu) if packing_pays(m, n, kernel_avx2::MR) => Kernel::Packed(cpu),
            _ => Kernel::Portable,
        }
    }

    /// [`Kernel::for_product`] for the product of these operands.
    fn for_operands(
        features: Features,
        (a, b): (MatRef<'_>, MatRef<'_>),
        precision: MatmulPrecision,
    ) -> Self {
        let (m, n) = (a.logical_dims().0, b.logical_dims().1);
        Kernel::for_product(features, (m, n), (a.transposed, b.transposed), precision)
    }

    /// The fastest bf16 implementation of `features`.
    fn bf16(features: Features) -> Self {
        match (features.bf16, features.avx2) {
            (Some(cpu), _) => Kernel::Bf16(cpu),
            (None, Some(cpu)) => Kernel::Bf16Emulated(Bf16Emulated(cpu)),
            (None, None) => Kernel::Bf16Portable,
        }
    }

    /// The depth a packed microkernel sums in registers before it meets the destination (its
    /// depth block: deeper products meet it once per block); None for the other
    /// implementations, which sum into a destination of their own.
    fn depth_block(self) -> Option<usize> {
        match self {
            Kernel::Packed(cpu) => Some(cpu.kc()),
            Kernel::Packed512(cpu) => Some(cpu.kc()),
            Kernel::Bf16(cpu) => Some(cpu.kc()),
            Kernel::Bf16Emulated(cpu) => Some(cpu.kc()),
            Kernel::Thin(_) | Kernel::Portable | Kernel::Bf16Portable => None,
        }
    }
}

/// How this CPU computes bf16 products.
pub fn bf16_products() -> Bf16Products {
    match Kernel::bf16(Features::in_force()) {
        Kernel::Bf16(_) => Bf16Products::Native,
        _ => Bf16Products::Emulated,
    }
}

/// Whether the AVX-512 kernel for few rows takes an `m × n` product (1 to 15 rows, a single
/// row included): it reads `b` row by row.
fn few_rows(m: usize, n: usize, b_transposed: bool) -> bool {
    (1..SMALL_SIDE).contains(&m) && n >= SMALL_SIDE && !b_transposed
}

/// Whether the AVX-512 dot-product kernel for few columns takes an `m × n` product (2 to 15
/// columns: a single column, a matrix-vector product, the `gemm` crate streams faster): it
/// reads `a`'s rows where they lie.
fn few_cols(m: usize, n: usize, a_transposed: bool) -> bool {
    (2..SMALL_SIDE).contains(&n) && m >= SMALL_SIDE && !a_transposed
}

/// Whether a product of 1 to 15 columns with a transposed `a` (a classifier's weight
/// gradient, `Hᵀ · dY`) runs as its transpose `dYᵀ · H` on the kernel for few rows: `aᵀ` is
/// then a row-major right operand.
fn few_cols_of_transposed(m: usize, n: usize, a_transposed: bool) -> bool {
    few_rows(n, m, !a_transposed)
}

/// `dst (m × n) = tᵀ`, or `+= tᵀ` when `accumulate`, for `t` stored `n × m`.
fn add_transposed(dst: &mut [f32], t: &[f32], (m, n): (usize, usize), accumulate: bool) {
    let mut dst = ArrayViewMut2::from_shape((m, n), dst).expect("the caller sized dst m × n");
    let t = ArrayView2::from_shape((n, m), t).expect("t is n × m");
    if accumulate {
        dst += &t.t();
    } else {
        dst.assign(&t.t());
    }
}

/// [`matmul_into`], on the pool's threads when `threaded`.
fn product(
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    accumulate: bool,
    precision: MatmulPrecision,
    threaded: bool,
) {
    let kernel = Kernel::for_operands(Features::in_force(), (a, b), precision);
    product_with(kernel, dst, (a, b), accumulate, threaded);
}

/// [`product`] through the given implementation.
fn product_with(
    kernel: Kernel,
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    accumulate: bool,
    threaded: bool,
) {
    let (m, k) = a.logical_dims();
    let (k2, n) = b.logical_dims();
    assert_eq!(k, k2, "caller checked the inner dimensions");
    assert_eq!(dst.len(), m * n, "caller sized the destination");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    match kernel {
        Kernel::Packed(_) | Kernel::Packed512(_) | Kernel::Bf16(_) | Kernel::Bf16Emulated(_) => {
            let start = Start::accumulating(accumulate);
            on_packed_kernel(kernel, DstTile::new(dst, m, n), (a, b), start, threaded);
        }
        Kernel::Bf16Portable => {
            let (a_data, b_data) = (rounded(a.data), rounded(b.data));
            let (a, b) = (MatRef { data: &a_data, ..a }, MatRef { data: &b_data, ..b });
            portable_product(dst, a, b, accumulate, parallelism(threaded));
        }
        Kernel::Thin(cpu) if few_rows(m, n, b.transposed) => {
            let (a, b) = (Operand::of(a), Operand::of(b));
            cpu.product(DstTile::new(dst, m, n), &a, &b, accumulate, threaded);
        }
        Kernel::Thin(cpu) if few_cols(m, n, a.transposed) => {
            let (a, b) = (Operand::of(a), Operand::of(b));
            cpu.product_few_cols(dst, &a, &b, accumulate, threaded);
        }
        Kernel::Thin(cpu) if few_cols_of_transposed(m, n, a.transposed) => {
            // dstᵀ = bᵀ · aᵀ has few rows and reads aᵀ, stored row-major, in place.
            let mut t = vec![0.0; n * m];
            let (bt, at) = (Operand::of(b.t()), Operand::of(a.t()));
            cpu.product(DstTile::new(&mut t, n, m), &bt, &at, false, threaded);
            add_transposed(dst, &t, (m, n), accumulate);
        }
        Kernel::Thin(_) | Kernel::Portable => {
            portable_product(dst, a, b, accumulate, parallelism(threaded));
        }
    }
}

/// `dst = start + a · b` on `kernel` when it is a packed microkernel (on the pool's threads
/// when `threaded`): whether it was one (nothing is done otherwise).
fn on_packed_kernel(
    kernel: Kernel,
    dst: DstTile<'_>,
    operands: (MatRef<'_>, MatRef<'_>),
    start: Start<'_>,
    threaded: bool,
) -> bool {
    match kernel {
        Kernel::Packed(cpu) => packed_product(cpu, dst, operands, start, threaded),
        Kernel::Packed512(cpu) => packed_product(cpu, dst, operands, start, threaded),
        Kernel::Bf16(cpu) => packed_product(cpu, dst, operands, start, threaded),
        Kernel::Bf16Emulated(cpu) => packed_product(cpu, dst, operands, start, threaded),
        _ => return false,
    }
    true
}

/// `dst = start + a · b` on a packed microkernel, on the pool's threads when `threaded`.
fn packed_product<K: Microkernel>(
    cpu: K,
    mut dst: DstTile<'_>,
    (a, b): (MatRef<'_>, MatRef<'_>),
    start: Start<'_>,
    threaded: bool,
) {
    let (a, b) = (Operand::of(a), Operand::of(b));
    if threaded {
        threading::product(cpu, dst, &a, &b, start);
    } else {
        let onto = start.prepare(&mut dst);
        blocked::product(cpu, dst, &a, &b, onto);
    }
}

/// `dst = row + a · b` at `precision`, `row` added to every row of the product (a dense
/// layer's output, `x · w + bias`), on the pool's threads. Every element of `dst` is written, and none read
/// before it is: on the packed kernels each thread starts its rectangle from `row` just before
/// it multiplies into it (in cache, on every core, where a broadcast bias was one core's pass
/// over the whole output); elsewhere `dst` is filled with `row` first.
pub fn matmul_onto_row(
    dst: &mut [MaybeUninit<f32>],
    (a, b): (MatRef<'_>, MatRef<'_>),
    row: &[f32],
    precision: MatmulPrecision,
) {
    let kernel = Kernel::for_operands(Features::in_force(), (a, b), precision);
    onto_row_with(kernel, dst, (a, b), row);
}

/// [`matmul_onto_row`] through the given implementation.
fn onto_row_with(
    kernel: Kernel,
    dst: &mut [MaybeUninit<f32>],
    (a, b): (MatRef<'_>, MatRef<'_>),
    row: &[f32],
) {
    let ((m, k), n) = (a.logical_dims(), b.logical_dims().1);
    assert_eq!(dst.len(), m * n, "caller sized the destination");
    assert_eq!(row.len(), n, "the row has one value per column");
    let start = Start::Row(row);
    let packed = k > 0 && m > 0 && n > 0;
    if packed && on_packed_kernel(kernel, DstTile::uninit(dst, m, n), (a, b), start, true) {
        return;
    }
    start.prepare(&mut DstTile::uninit(dst, m, n));
    // SAFETY: every element was written just above, and `MaybeUninit<f32>` has the size,
    // alignment and (once initialized) the values of `f32`.
    let dst = unsafe { &mut *(dst as *mut [MaybeUninit<f32>] as *mut [f32]) };
    product_with(kernel, dst, (a, b), true, true);
}

/// `dst += factor · (a · b)` at `precision` on the pool's threads, bit for bit as [`matmul_into`] storing the
/// product `g` and a separate pass `dst += g · factor` compute it (with `factor = -lr`, as the
/// plain SGD step `dst -= lr · g` does), on every implementation, blocking, precision and pool
/// size: a plain SGD step for a weight whose gradient is the product, without storing the
/// gradient.
///
/// Where a packed microkernel sums the whole depth in registers (one depth block: at most 192
/// or 256 on the AVX-512 kernel, by the L1 data cache it blocks for, 256 on the others), it
/// writes `dst + factor · sum` onto the weight from there, rounding after the multiplication
/// and after the addition. Deeper products, whose stored sums add the blocks' partial sums
/// first, and the other implementations multiply into a temporary and add it scaled.
pub fn matmul_scaled_onto(
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    factor: f32,
    precision: MatmulPrecision,
) {
    let kernel = Kernel::for_operands(Features::in_force(), (a, b), precision);
    scaled_product_with(kernel, dst, (a, b), factor);
}

/// [`matmul_scaled_onto`] through the given implementation.
fn scaled_product_with(
    kernel: Kernel,
    dst: &mut [f32],
    (a, b): (MatRef<'_>, MatRef<'_>),
    factor: f32,
) {
    let ((m, k), n) = (a.logical_dims(), b.logical_dims().1);
    assert_eq!(dst.len(), m * n, "caller sized the destination");
    let in_registers = kernel.depth_block().is_some_and(|block| k <= block);
    let start = Start::Scaled(factor);
    if k > 0
        && in_registers
        && on_packed_kernel(kernel, DstTile::new(dst, m, n), (a, b), start, true)
    {
        return;
    }
    let mut product = vec![0.0; m * n];
    product_with(kernel, &mut product, (a, b), false, true);
    let add = |(d, p): (&mut [f32], &[f32])| {
        d.iter_mut().zip(p).for_each(|(d, &p)| *d += p * factor);
    };
    dst.par_chunks_mut(SCALED_CHUNK)
        .zip(product.par_chunks(SCALED_CHUNK))
        .for_each(add);
}

/// Elements of the destination a thread adds at a time in [`matmul_scaled_onto`]'s fallback.
const SCALED_CHUNK: usize = 1 << 14;

/// The `gemm` crate's threading for a product on the pool's threads or on this one.
fn parallelism(threaded: bool) -> Parallelism {
    if threaded {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// A copy of `values` rounded to bfloat16.
fn rounded(values: &[f32]) -> Vec<f32> {
    let mut copy = values.to_vec();
    bf16::round_in_place(&mut copy);
    copy
}

/// Whether a product suits a packed microkernel of `mr` rows: with fewer than [`SMALL_SIDE`]
/// rows or columns (a recurrent step of a small batch, a classifier's last layer) it would
/// compute mostly padding, and packing would cost as much as the product; and rows that fill
/// their last panel badly (32 rows take 36 on the 6-row kernel, a ninth more) waste more than
/// the `gemm` crate loses (as on `lenet1.fwd`, 32 × 25 × 576). The `gemm` crate's kernels,
/// which vectorize along the rows, are faster there.
fn packing_pays(m: usize, n: usize, mr: usize) -> bool {
    let padded = m.div_ceil(mr) * mr;
    m >= SMALL_SIDE && n >= SMALL_SIDE && padded * MAX_PADDING.1 <= m * MAX_PADDING.0
}

/// The most row padding the packed kernel accepts, as a ratio of padded to real rows.
const MAX_PADDING: (usize, usize) = (11, 10);

/// Rows or columns below which a product goes to the `gemm` crate (see [`packing_pays`]).
const SMALL_SIDE: usize = 16;

/// The product through the `gemm` crate: thin products, and CPUs without AVX2 and FMA.
fn portable_product(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let (m, k) = a.logical_dims();
    let n = b.logical_dims().1;
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    assert!(
        a.data.len() >= m * k && b.data.len() >= k * n,
        "operands hold their elements"
    );
    // SAFETY: the pointers cover m×k, k×n and m×n elements with the given strides (asserted
    // here and in `product`), `dst` does not alias `a` or `b` (it is a unique borrow), and f32
    // is one of gemm's supported element types.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// A 2-D array as a GEMM operand.
pub fn mat_ref(x: &CpuArray, transposed: bool) -> MatRef<'_> {
    MatRef {
        data: slice(x),
        rows: x.shape()[0],
        cols: x.shape()[1],
        transposed,
    }
}

impl MatmulOps for CpuArray {
    fn matmul_into(dst: &mut Self, (a, b): (&Self, &Self), opts: MatmulOptions) -> Result<()> {
        let (a, b) = (mat_ref(a, opts.transpose_a), mat_ref(b, opts.transpose_b));
        let precision = Numerics::current().matmul_precision;
        matmul_into(slice_mut(dst), (a, b), opts.accumulate, precision);
        Ok(())
    }

    fn linear(x: &Self, w: &Self, bias: &Self) -> Result<Self> {
        let (m, n) = (x.shape()[0], w.shape()[1]);
        let mut data = Vec::with_capacity(m * n);
        let (x, w) = (mat_ref(x, false), mat_ref(w, false));
        let precision = Numerics::current().matmul_precision;
        let dst = &mut data.spare_capacity_mut()[..m * n];
        matmul_onto_row(dst, (x, w), slice(bias), precision);
        // SAFETY: `matmul_onto_row` wrote every one of the m × n elements.
        unsafe { data.set_len(m * n) };
        Ok(super::from_vec(&[m, n], data))
    }

    fn bmm_into(dst: &mut Self, (a, b): (&Self, &Self), opts: MatmulOptions) -> Result<()> {
        let MatmulOptions {
            transpose_a,
            transpose_b,
            accumulate,
        } = opts;
        let entry = |x: &CpuArray| (x.shape()[0], x.shape()[1], x.shape()[2]);
        let ((batch, a_rows, a_cols), (_, b_rows, b_cols)) = (entry(a), entry(b));
        let out = dst.shape()[1] * dst.shape()[2];
        if batch == 0 || out == 0 {
            return Ok(());
        }
        let (a_data, b_data) = (slice(a), slice(b));
        let operands = |i: usize| {
            let (a_len, b_len) = (a_rows * a_cols, b_rows * b_cols);
            let a = MatRef::new(&a_data[i * a_len..(i + 1) * a_len], a_rows, a_cols);
            let b = MatRef::new(&b_data[i * b_len..(i + 1) * b_len], b_rows, b_cols);
            let a = if transpose_a { a.t() } else { a };
            (a, if transpose_b { b.t() } else { b })
        };
        let dst = slice_mut(dst);
        let precision = Numerics::current().matmul_precision;
        // Enough entries to keep every thread busy: one single-threaded product per entry, in
        // parallel; otherwise one entry after the other, each on every thread.
        if batch > 1 && batch >= rayon::current_num_threads() {
            dst.par_chunks_mut(out).enumerate().for_each(|(i, c)| {
                let (a, b) = operands(i);
                matmul_into_serial(c, (a, b), accumulate, precision);
            });
        } else {
            for (i, c) in dst.chunks_mut(out).enumerate() {
                let (a, b) = operands(i);
                matmul_into(c, (a, b), accumulate, precision);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod dispatch_tests;
#[cfg(test)]
mod scaled_tests;
#[cfg(test)]
mod tests;
