//! [`MatmulPrecision`]: how the engine multiplies f32 matrices, set once per process
//! ([`set_matmul_precision`]) as PyTorch's `torch.set_float32_matmul_precision` and JAX's
//! `jax_default_matmul_precision` are.
//!
//! Tensors, gradients and optimizer state stay f32 whatever the setting; only the products'
//! operands are rounded. An executor sets it from the job's `train.matmul_precision`.
//!
//! Beside it, whether CPU convolutions may use Winograd's algorithm ([`set_winograd`]), which
//! multiplies less and rounds a little differently (TensorFlow's
//! `TF_ENABLE_WINOGRAD_NONFUSED`): on by default, and set from the job's `train.winograd`.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use serde::{Deserialize, Serialize};

/// The precision of matrix products (dense layers, convolutions, recurrent gates, attention):
/// the job spec's `train.matmul_precision`, `"f32"` or `"bf16"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulPrecision {
    /// Full f32 products (the default).
    #[default]
    F32,
    /// Operands rounded to bfloat16 (8 significant bits, f32's range), products summed in f32:
    /// on a CPU with AVX512_BF16 twice the multiply-add rate of f32. Applies on the CPU to
    /// products of at least 16 rows and 16 columns (every layer of a batch of 16 or more but a
    /// classifier's narrow last one); the GPU backend keeps f32.
    Bf16,
}

impl MatmulPrecision {
    /// The spec's word for it (`"f32"`, `"bf16"`).
    pub fn as_str(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    /// The precision a spec's word names (`"f32"`, `"bf16"`), or a sentence naming both.
    fn from_str(word: &str) -> Result<Self, String> {
        [MatmulPrecision::F32, MatmulPrecision::Bf16]
            .into_iter()
            .find(|p| p.as_str() == word)
            .ok_or_else(|| format!("a matmul precision is `f32` or `bf16`, not `{word}`"))
    }
}

/// The process's setting: 0 for f32, 1 for bf16.
static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the precision of every later matrix product in this process.
pub fn set_matmul_precision(precision: MatmulPrecision) {
    let code = match precision {
        MatmulPrecision::F32 => 0,
        MatmulPrecision::Bf16 => 1,
    };
    PRECISION.store(code, Ordering::Relaxed);
}

/// The precision matrix products run at now.
pub fn matmul_precision() -> MatmulPrecision {
    match PRECISION.load(Ordering::Relaxed) {
        0 => MatmulPrecision::F32,
        _ => MatmulPrecision::Bf16,
    }
}

/// The process's Winograd setting.
static WINOGRAD: AtomicBool = AtomicBool::new(true);

/// Lets (`true`, the default) or forbids every later CPU convolution in this process to run
/// Winograd's minimal filtering where it applies (stride-1 3×3 and 5×5 convolutions with 16
/// channels or more); forbidden, they run as im2col and GEMM.
pub fn set_winograd(enabled: bool) {
    WINOGRAD.store(enabled, Ordering::Relaxed);
}

/// Whether CPU convolutions may run Winograd's algorithm now.
pub fn winograd() -> bool {
    WINOGRAD.load(Ordering::Relaxed)
}

/// How this CPU computes bf16 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Products {
    /// With AVX512_BF16's dot-product instructions: twice the f32 rate.
    Native,
    /// With the f32 kernels on operands rounded as they are packed: the same results, at
    /// about the f32 rate.
    Emulated,
}

#[cfg(test)]
mod tests {
    use super::MatmulPrecision;

    /// The spec's words name each precision and back; any other word is refused by a sentence
    /// naming both.
    #[test]
    fn precisions_are_named_by_the_specs_words() {
        for p in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
            assert_eq!(p.as_str().parse::<MatmulPrecision>(), Ok(p));
        }
        let err = "fp8".parse::<MatmulPrecision>().unwrap_err();
        assert!(
            err.contains("`f32` or `bf16`") && err.contains("`fp8`"),
            "{err}"
        );
    }
}
