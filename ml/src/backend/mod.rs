//! Backends: where the numbers live and the kernels that transform them.
//!
//! Nothing here knows about gradients or graphs: the autodiff layer (the crate's `ops` module)
//! is written against [`Storage`], and the backward pass of every op is expressed with these
//! same kernels (burn's separation of backend and autodiff).
//!
//! # The contract
//!
//! A backend is a storage type that implements [`BackendStorage`]: one trait per kind of op,
//! each in the file of that kind (as burn's `Backend` is made of `FloatTensorOps`,
//! `ModuleOps`, ...), and each backend implements a kind in the file that holds its kernels for
//! it (`cpu/elementwise.rs`, `cuda/elementwise.rs`, ...):
//!
//! | trait | file | defaults built from primitives |
//! | --- | --- | --- |
//! | [`MemoryOps`] | `memory.rs` | `to_host`, `queue_copy_to_slice` |
//! | [`ElementwiseOps`] | `elementwise.rs` | `scale` |
//! | [`ReduceOps`] | `reduce.rs` | `sum_to_shape_into`, `expand_axis` |
//! | [`MatmulOps`] | `matmul.rs` | `linear` |
//! | [`ConvOps`] | `conv.rs` | |
//! | [`NormOps`] | `norm.rs` | `batch_norm_stats`, `batch_norm`, `batch_norm_backward` |
//! | [`SoftmaxOps`] | `softmax.rs` | `softmax_backward` |
//! | [`LossOps`] | `loss.rs` | `bce_with_logits`, `bce_with_logits_backward` |
//! | [`IndexOps`] | `index.rs` | |
//! | [`RandomOps`] | `random.rs` | |
//! | [`OptimOps`] | `optim.rs` | `sgd_update`, `adagrad_update`, `adam_update`, `sgd_product_update` |
//! | [`RecurrentOps`] | `recurrent.rs` | `lstm_cell`, `gru_cell` and their backward |
//!
//! Required methods are primitives: one kernel per backend. Default methods are composites
//! written once with primitives (those of the ops, in a public `*_from_primitives` function of
//! their file), so a backend that implements only the required methods is complete; a backend
//! overrides a default with a fused kernel where it has one (the CPU's and CUDA's one-pass
//! optimizer updates, softmax backward and losses, the recurrent gates; the CPU's dense layer),
//! and the conformance suite (`defaults.rs`) checks on every device that each override gives the
//! values of its default. The CUDA stub of a build without the `cuda` feature implements the
//! same traits, so the compiler lists whatever a backend lacks.
//!
//! [`Storage`] is the enum over the backends that the rest of the crate holds. Each of its ops
//! is one `dispatch!` line next to the trait it calls: it unwraps every operand to one backend,
//! calls the trait method once per op (static dispatch: no per-element cost, no allocation) and
//! is the only place that finds operands on different devices (the CUDA backend refuses
//! operands on two GPUs in its launch helper, with the same sentence).
//!
//! # Adding an op
//!
//! A primitive op of kind `K` (say a new unary function needing a kernel of its own):
//!
//! 1. `backend/K.rs`: the required method in `KOps`, and its one `dispatch!` line in
//!    `impl Storage`.
//! 2. `backend/cpu/K.rs`: the kernel and its method in `impl KOps for CpuArray`.
//! 3. `backend/cuda/K.rs`: its method in `impl KOps for CudaStorage`, opened by
//!    `launch_new` or `launch_in_place`; the kernel in `cuda/kernels.cu` (image kernels:
//!    `cuda/image_kernels.cu`) and its name in `cuda/kernels.rs`, and its line in the CUDA
//!    emulator's launch table (`testing/cuda-emulator/kernels.cpp`), which CI runs it through.
//! 4. `backend/cuda_stub/ops.rs`: one unreachable line (the compiler asks for it).
//! 5. `ops/<family>.rs`: the `Tensor` method and its backward.
//! 6. `ml/tests/conformance/`: values (`ops.rs`), gradients (`grads.rs`) and CUDA against the
//!    CPU (`cross_device.rs`).
//!
//! A composite op (one that primitives can express):
//!
//! 1. `backend/K.rs`: a default method calling a new `*_from_primitives` function, and its
//!    `dispatch!` line.
//! 2. `ops/<family>.rs`, and the conformance cases as above; a backend that later overrides the
//!    default with a fused kernel adds its case to `defaults.rs`.
//!
//! Each step is checked by the compiler: a backend, or the stub, that lacks the method does not
//! build. What every op needs besides its kernel (the mixed-device error, the same-GPU check,
//! the empty tensor, the handle and the launch) is written once, in `dispatch!` and the CUDA
//! launch helpers, so that an op adds only the lines that are its own.

pub mod allocator;
pub mod conv;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub/mod.rs"]
pub mod cuda;
pub mod devices;
pub mod elementwise;
pub mod index;
pub mod loss;
pub mod matmul;
pub mod memory;
pub mod norm;
pub mod optim;
pub mod random;
pub mod recurrent;
pub mod reduce;
pub mod softmax;
mod storage;

pub use conv::{Conv2dGeometry, ConvOps, Pool2dGeometry};
pub use cuda::CudaStorage;
pub use elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
pub use index::IndexOps;
pub use loss::LossOps;
pub use matmul::{MatmulOps, MatmulOptions};
pub use memory::MemoryOps;
pub use norm::NormOps;
pub use optim::{AdagradStep, AdamStep, OptimOps, SgdStep};
pub use random::RandomOps;
pub use recurrent::RecurrentOps;
pub use reduce::ReduceOps;
pub use softmax::SoftmaxOps;
pub use storage::Storage;

/// The one trait every backend implements: all the kinds of op, each a trait of its own (see the
/// [module documentation](self)). It is implemented for every type that implements them all.
pub trait BackendStorage:
    MemoryOps
    + ElementwiseOps
    + ReduceOps
    + MatmulOps
    + ConvOps
    + NormOps
    + SoftmaxOps
    + LossOps
    + IndexOps
    + RandomOps
    + OptimOps
    + RecurrentOps
{
}

impl<T> BackendStorage for T where
    T: MemoryOps
        + ElementwiseOps
        + ReduceOps
        + MatmulOps
        + ConvOps
        + NormOps
        + SoftmaxOps
        + LossOps
        + IndexOps
        + RandomOps
        + OptimOps
        + RecurrentOps
{
}
