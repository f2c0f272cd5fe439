//! The tokens that prove what the running CPU can do: a kernel that needs a feature takes its
//! token, which exists only once the feature was detected at run time, so one binary runs
//! everywhere and fast where it can. A leaf: the kernels, packers and dispatch import it, it
//! imports none of them.

use std::sync::OnceLock;

/// Proof that the running CPU has AVX2 and FMA: the only way to call the microkernel.
#[derive(Clone, Copy, Debug)]
pub struct Avx2Fma(());

impl Avx2Fma {
    /// The token, when this CPU supports AVX2 and FMA (detected once, then cached).
    pub fn detect() -> Option<Self> {
        static DETECTED: OnceLock<bool> = OnceLock::new();
        let yes = *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        });
        yes.then_some(Avx2Fma(()))
    }
}
