//! Products in bfloat16 with f32 sums, for [`MatmulPrecision::Bf16`](crate::MatmulPrecision):
//! each operand element is rounded to bfloat16 (8 significant bits, f32's range, round to
//! nearest even) and the products are summed in f32, as PyTorch's
//! `torch.set_float32_matmul_precision("medium")` and JAX's `bfloat16` matmul precision do.
//!
//! Two kernels compute the same thing:
//!
//! - [`Avx512Bf16`], on CPUs with AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and
//!   Sapphire Rapids and later): packing rounds pairs of consecutive depth steps into one
//!   32-bit lane (`pack.rs`), and an 8 × 32 microkernel (`kernel.rs`) multiplies them with
//!   `vdpbf16ps`, two multiply-adds per lane per instruction: twice the f32 FMA rate.
//! - [`Bf16Emulated`], everywhere else with AVX2 and FMA: the f32 kernel on panels whose
//!   elements were rounded to bfloat16 as they were packed. As precise as the native kernel
//!   (a product of two bfloat16 values is exact in f32) and a little slower than f32 products.

mod kernel;
mod pack;

use std::sync::OnceLock;

use super::blocked::{KC, MC, NC};
use super::microkernel::{Microkernel, Steps};
use super::pack::Block;
use super::tokens::Avx2Fma;
use super::view::{DstTile, Onto, Operand};

pub use self::pack::round_to_bf16;

/// Proof that the running CPU has AVX-512F, BW, VL and BF16: the only way to call the native
/// bf16 kernel.
#[derive(Clone, Copy, Debug)]
pub struct Avx512Bf16(());

impl Avx512Bf16 {
    /// The token, when this CPU supports AVX512_BF16 and the AVX-512 subsets its packing uses
    /// (detected once, then cached).
    pub fn detect() -> Option<Self> {
        static DETECTED: OnceLock<bool> = OnceLock::new();
        let yes = *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        });
        yes.then_some(Avx512Bf16(()))
    }
}

impl Microkernel for Avx512Bf16 {
    type Packed = u32;
    const MR: usize = kernel::MR;
    const NR: usize = kernel::NR;
    const DEPTH_PER_STEP: usize = 2;
    /// 256 steps of depth are 128 packed steps: a 32-column `b` panel of 16 KiB, as the f32
    /// kernel's.
    const KC: usize = KC;
    /// An `a` block of half the f32 kernel's bytes per row: twice the rows in the same L2.
    const MC: usize = 2 * MC / kernel::MR * kernel::MR;
    const NC: usize = NC / kernel::NR * kernel::NR;

    fn pack_a(self, out: &mut [u32], a: &Operand<'_>, block: Block) {
        pack::pack_panels(self, out, a, block, Self::MR);
    }

    fn pack_b(self, out: &mut [u32], b: &Operand<'_>, block: Block) {
        // A `b` panel of columns is an `a` panel of the rows of `b`'s transpose.
        let block_t = Block {
            row: block.col,
            col: block.row,
            rows: block.cols,
            cols: block.rows,
        };
        pack::pack_panels(self, out, &b.t(), block_t, Self::NR);
    }

    fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[u32],
        b_panel: (&[u32], usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        kernel::tile(self, steps, a_panel, b_panel, tile, onto);
    }
}

/// The f32 AVX2 kernel on panels rounded to bfloat16 as they are packed: bf16 products where
/// the CPU lacks AVX512_BF16.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Emulated(pub Avx2Fma);

impl Microkernel for Bf16Emulated {
    type Packed = f32;
    const MR: usize = Avx2Fma::MR;
    const NR: usize = Avx2Fma::NR;
    const DEPTH_PER_STEP: usize = 1;
    const KC: usize = Avx2Fma::KC;
    const MC: usize = Avx2Fma::MC;
    const NC: usize = Avx2Fma::NC;

    fn pack_a(self, out: &mut [f32], a: &Operand<'_>, block: Block) {
        self.0.pack_a(out, a, block);
        round_in_place(&mut out[..Self::packed_a_len(block.rows, block.cols)]);
    }

    fn pack_b(self, out: &mut [f32], b: &Operand<'_>, block: Block) {
        self.0.pack_b(out, b, block);
        round_in_place(&mut out[..Self::packed_b_len(block.rows, block.cols)]);
    }

    fn tile(
        self,
        steps: Steps<'_>,
        a_panel: &[f32],
        b_panel: (&[f32], usize),
        tile: DstTile<'_>,
        onto: Onto,
    ) {
        self.0.tile(steps, a_panel, b_panel, tile, onto);
    }
}

/// Rounds every element to the nearest bfloat16 value (ties to even), kept as f32.
pub fn round_in_place(values: &mut [f32]) {
    for x in values {
        *x = round_to_bf16(*x);
    }
}
