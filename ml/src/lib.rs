//! # ringflow-ml: the tensor engine
//!
//! Everything an executor needs to train a model on one device, and nothing about clusters:
//!
//! - [`Tensor`]: n-dimensional f32 arrays on a [`Device`] with NumPy broadcasting. The CPU
//!   backend keeps contiguous ndarray storage and multiplies matrices with its own packed
//!   kernels, chosen at run time for the CPU (in bfloat16 with f32 sums inside a
//!   [`Numerics`] context that asks for it); [`Device::Cuda`] always exists and reports clearly when the
//!   build or the machine has no CUDA.
//! - [`autodiff`]: reverse-mode differentiation over a graph recorded as ops run. Each op in
//!   [`ops`](crate::Tensor) knows its derivative; [`Tensor::backward`] computes the parameters'
//!   gradients into a [`GradStore`] kept beside them; [`no_grad`] turns recording off for
//!   evaluation.
//! - Image ops on NCHW batches `[n, C, H, W]`, with gradients, on every backend:
//!   [`Tensor::conv2d`] (stride, padding, dilation, groups; [`Conv2dOptions`]; im2col and GEMM
//!   on the CPU, direct kernels for depthwise), [`Tensor::max_pool2d`] and
//!   [`Tensor::avg_pool2d`] ([`Pool2dOptions`]), [`Tensor::global_avg_pool2d`],
//!   [`Tensor::flatten`], and [`Tensor::batch_norm`] (training with the batch's statistics,
//!   returned as [`BatchStats`], or evaluation with running ones; [`BatchNormMode`]).
//! - [`nn`]: layers ([`nn::Linear`], [`nn::Embedding`], [`nn::LayerNorm`], ...), models built
//!   from a [`nn::ModelSpec`] and a [`nn::ModelRegistry`] for custom kinds.
//! - [`loss`]: cross-entropy, MSE and binary cross-entropy, fused and numerically stable.
//! - [`optim`]: SGD, Adagrad, Adam and AdamW with schedules and gradient clipping.
//! - [`checkpoint`]: safetensors files plus verified JSON metadata, written atomically.
//!
//! ```
//! use ringflow_ml::{Device, Tensor, nn::ModelSpec, nn::ModelRegistry, nn::Model, loss, rng};
//!
//! let model = Model::build(&ModelSpec::mlp(&[4, 8, 3], "relu"), &ModelRegistry::default(), 7, Device::Cpu)?;
//! let x = Tensor::zeros(&[2, 4], Device::Cpu)?;
//! let y = Tensor::from_vec(vec![0.0, 2.0], &[2], Device::Cpu)?;
//! let mut dropout = rng::seeded(7, rng::streams::DROPOUT);
//! let loss = loss::cross_entropy(&model.forward(&x, true, &mut dropout)?, &y)?;
//! let grads = loss.backward()?;
//! assert!(grads.norm(&model.params().tensors())? > 0.0);
//! # Ok::<(), ringflow_ml::MlError>(())
//! ```

pub mod autodiff;
pub mod backend;
pub mod checkpoint;
pub mod device;
pub mod error;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod loss;
pub mod nn;
mod numerics;
mod ops;
pub mod optim;
pub mod rng;
pub mod settings;
pub mod shape;
mod tensor;

pub use autodiff::{GradStore, NoGradGuard, no_grad};
pub use backend::allocator::AllocatorStats;
/// How this CPU computes bf16 products (detected once): see [`Bf16Products`].
pub use backend::cpu::gemm::bf16_products as cpu_bf16_products;
pub use backend::devices::PinnedHost;
pub use device::Device;
pub use error::{MlError, Result};
pub use numerics::{Bf16Products, MatmulPrecision, Numerics, NumericsGuard, UnknownPrecision};
pub use ops::{BatchNormMode, BatchStats, Conv2dOptions, Pool2dOptions};
pub use tensor::{Tensor, TensorKey};
