//! [`Numerics`]: how the ops of a model compute, a context the thread running the model enters
//! ([`Numerics::enter`]) as it enters [`crate::no_grad`]: the precision of matrix products
//! ([`MatmulPrecision`], PyTorch's `torch.set_float32_matmul_precision`, JAX's
//! `default_matmul_precision` context) and whether CPU convolutions may use Winograd's algorithm
//! (TensorFlow's `TF_ENABLE_WINOGRAD_NONFUSED`).
//!
//! The context belongs to a thread, not to the process: two models run on two threads (a
//! prediction beside a training job, tests in parallel) each compute with their own. An op reads
//! it once, on the thread that calls it, and hands it down to the work it splits across the
//! compute pool's threads, so a parallel product computes as its caller asked whichever thread
//! runs it. Outside any context, ops use [`Numerics::default`]: f32 products, Winograd allowed.
//!
//! Tensors, gradients and optimizer state stay f32 whatever the context; only the products'
//! operands are rounded. An executor enters the job's `train.matmul_precision` and
//! `train.winograd` for the task it runs.

use std::cell::Cell;

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

/// A word that names no [`MatmulPrecision`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a matmul precision is `f32` or `bf16`, not `{word}`")]
pub struct UnknownPrecision {
    /// The word given.
    pub word: String,
}

impl std::str::FromStr for MatmulPrecision {
    type Err = UnknownPrecision;

    /// The precision a spec's word names (`"f32"`, `"bf16"`).
    fn from_str(word: &str) -> Result<Self, UnknownPrecision> {
        [MatmulPrecision::F32, MatmulPrecision::Bf16]
            .into_iter()
            .find(|p| p.as_str() == word)
            .ok_or_else(|| UnknownPrecision { word: word.into() })
    }
}

/// How a model's ops compute: the context a thread enters to run a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numerics {
    /// The precision of matrix products (`train.matmul_precision`).
    pub matmul_precision: MatmulPrecision,
    /// Whether CPU convolutions may run Winograd's minimal filtering where it applies (stride-1
    /// 3×3 and 5×5 convolutions with 16 channels or more; `train.winograd`); when not, they run
    /// as im2col and GEMM.
    pub winograd: bool,
}

/// f32 products, Winograd allowed.
const DEFAULT: Numerics = Numerics {
    matmul_precision: MatmulPrecision::F32,
    winograd: true,
};

impl Default for Numerics {
    /// f32 products, Winograd allowed.
    fn default() -> Self {
        DEFAULT
    }
}

thread_local! {
    /// The numerics of the model this thread runs.
    static CURRENT: Cell<Numerics> = const { Cell::new(DEFAULT) };
}

impl Numerics {
    /// The numerics ops called on this thread compute with: the innermost entered, or the
    /// default.
    pub fn current() -> Numerics {
        CURRENT.with(Cell::get)
    }

    /// Makes these the numerics of the ops this thread calls until the guard is dropped (which
    /// restores the ones before).
    pub fn enter(self) -> NumericsGuard {
        NumericsGuard {
            previous: CURRENT.with(|c| c.replace(self)),
        }
    }

    /// Runs `f` with these numerics on this thread.
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        let _guard = self.enter();
        f()
    }
}

/// This thread's numerics until dropped ([`Numerics::enter`]).
#[derive(Debug)]
#[must_use = "the numerics last as long as the guard"]
pub struct NumericsGuard {
    previous: Numerics,
}

impl Drop for NumericsGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
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
    use std::sync::{Arc, Barrier};

    use super::{MatmulPrecision, Numerics};
    use crate::{Conv2dOptions, Device, Tensor};

    const BF16: Numerics = Numerics {
        matmul_precision: MatmulPrecision::Bf16,
        winograd: false,
    };

    /// Values whose products bf16 rounds visibly.
    fn values(shape: &[usize], seed: u32) -> Tensor {
        let len = shape.iter().product::<usize>() as u32;
        let data = (0..len).map(|i| ((i * 7919 + seed) % 1009) as f32 / 1009.0 - 0.37);
        Tensor::from_vec(data.collect(), shape, Device::Cpu).unwrap()
    }

    fn product() -> Vec<f32> {
        values(&[32, 48], 1)
            .matmul(&values(&[48, 40], 2))
            .unwrap()
            .to_vec()
    }

    /// While one thread computes in bf16, another computes in f32 beside it, and each gets its
    /// own numerics' result; leaving the context restores the default.
    #[test]
    fn two_threads_compute_with_their_own_numerics() {
        let f32_product = product();
        let bf16_product = BF16.run(product);
        assert!(f32_product != bf16_product, "bf16 rounds these products");
        let (entered, computed) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let in_bf16 = {
            let (entered, computed) = (entered.clone(), computed.clone());
            std::thread::spawn(move || {
                let _numerics = BF16.enter();
                entered.wait();
                computed.wait();
                product()
            })
        };
        entered.wait();
        let beside = product();
        computed.wait();
        assert!(
            beside == f32_product,
            "the f32 thread saw the other thread's numerics"
        );
        assert!(
            in_bf16.join().unwrap() == bf16_product,
            "the bf16 thread computed in f32"
        );
        assert_eq!(Numerics::current(), Numerics::default());
    }

    /// A convolution whose images run on the pool's threads computes every image at its
    /// caller's precision: called from a thread outside the pool, every image runs on another
    /// thread than the one that entered the numerics.
    #[test]
    fn the_pools_threads_compute_at_their_callers_precision() {
        // At least as many images as the pool has threads, so that they run in parallel.
        let batch = 2 * rayon::current_num_threads().max(3);
        let conv = move || {
            let x = values(&[batch, 16, 16, 16], 3);
            let w = values(&[24, 16, 3, 3], 4);
            let opts = Conv2dOptions {
                padding: [1, 1],
                ..Conv2dOptions::default()
            };
            x.conv2d(&w, None, opts).unwrap().to_vec()
        };
        let on_one_thread = |numerics: Numerics| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            pool.install(|| numerics.run(conv))
        };
        let alone = on_one_thread(BF16);
        let in_f32 = Numerics {
            winograd: false,
            ..Numerics::default()
        };
        assert!(
            alone != on_one_thread(in_f32),
            "bf16 rounds this convolution"
        );
        let from_outside = std::thread::spawn(move || BF16.run(conv)).join().unwrap();
        assert!(from_outside == alone, "an image ran at another precision");
    }

    /// The spec's words name each precision and back; any other word is refused by a sentence
    /// naming both.
    #[test]
    fn precisions_are_named_by_the_specs_words() {
        for p in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
            assert_eq!(p.as_str().parse::<MatmulPrecision>(), Ok(p));
        }
        let err = "fp8".parse::<MatmulPrecision>().unwrap_err().to_string();
        assert!(
            err.contains("`f32` or `bf16`") && err.contains("`fp8`"),
            "{err}"
        );
    }
}
