//! [`Features`]: which of the GEMM's kernels a product may run, as the tokens that prove the
//! CPU supports them. The entry points use this process's ([`Features::in_force`]): what the
//! CPU has, detected once, capped by `RINGFLOW_MAX_CPU_ISA` and blocked for the L1 data cache
//! that `RINGFLOW_L1D_KIB` names or CPUID reports (`isa.rs`). Tests build any subset of what
//! the CPU has, to run every choice another CPU would make.

use std::sync::OnceLock;

use super::bf16::Avx512Bf16;
use super::kernel_avx512::Avx512Fma;
use super::l1_cache::l1_data_bytes;
use super::thin_avx512::Avx512;
use super::tokens::Avx2Fma;
use crate::backend::cpu::isa::{self, MaxCpuIsa};

/// The kernels a product may run: one token for each set of features the CPU has and the
/// settings allow. A token cannot be made without the CPU's support, so capping only removes.
#[derive(Clone, Copy, Debug)]
pub struct Features {
    /// AVX2 and FMA: the 6 × 16 packed kernel, and bf16 products emulated on it.
    pub avx2: Option<Avx2Fma>,
    /// AVX-512F: the unpacked kernels for few rows or columns.
    pub avx512: Option<Avx512>,
    /// AVX-512F, AVX2 and FMA: the 8 × 32 packed kernel, with its depth block.
    pub packed512: Option<Avx512Fma>,
    /// AVX512_BF16 (with AVX-512F, BW and VL): the native bf16 kernel.
    pub bf16: Option<Avx512Bf16>,
}

impl Features {
    /// Everything this CPU has, the AVX-512 kernel blocking its depth for an L1 data cache of
    /// `l1_bytes` (None: unknown, the smaller block).
    pub fn of_this_cpu(l1_bytes: Option<usize>) -> Self {
        Features {
            avx2: Avx2Fma::detect(),
            avx512: Avx512::detect(),
            packed512: Avx512Fma::detect().map(|cpu| cpu.for_l1(l1_bytes)),
            bf16: Avx512Bf16::detect(),
        }
    }

    /// These features with none above `max`.
    pub fn capped(self, max: MaxCpuIsa) -> Self {
        let up_to = |isa: MaxCpuIsa| max >= isa;
        Features {
            avx2: self.avx2.filter(|_| up_to(MaxCpuIsa::Avx2)),
            avx512: self.avx512.filter(|_| up_to(MaxCpuIsa::Avx512)),
            packed512: self.packed512.filter(|_| up_to(MaxCpuIsa::Avx512)),
            bf16: self.bf16.filter(|_| up_to(MaxCpuIsa::Avx512Bf16)),
        }
    }

    /// This process's features (found once): the CPU's, capped by the settings in force, the
    /// AVX-512 kernel blocked for the L1 data cache they name, else the one CPUID reports.
    pub fn in_force() -> Self {
        static IN_FORCE: OnceLock<Features> = OnceLock::new();
        *IN_FORCE.get_or_init(|| {
            let settings = isa::in_force();
            let l1 = settings.l1d_kib.map(|kib| kib << 10).or_else(l1_data_bytes);
            Features::of_this_cpu(l1).capped(settings.max_isa)
        })
    }
}
