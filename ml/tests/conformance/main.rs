//! The conformance suite of the tensor engine: every test runs once per device through
//! `device_test!` (CUDA tests skip themselves in a build or on a machine without CUDA).
//!
//! - `ops`: forward values on hand-computed examples.
//! - `errors`: invalid arguments give errors that name the problem, never panics.
//! - `autodiff`: what the graph records, where gradients go, accumulation and `GradStore::zero`.
//! - `grads`: every differentiable op against central finite differences.
//! - `conv`, `pool`, `norm`: convolution, pooling and batch normalization against direct
//!   nested-loop references (values and gradients) and finite differences, and their errors.
//! - `recurrent`: the LSTM and GRU against scalar references, padding, finite differences.
//! - `attention`: batched matrix products; multi-head attention against a scalar reference,
//!   padding, finite differences of it and of the Transformer encoder block; position
//!   embeddings.
//! - `optim`: optimizer steps, schedules and clipping against hand-computed values.
//! - `optim_in_backward`: plain SGD applied inside the backward pass, against the backward
//!   pass followed by the step.
//! - `nn`: layers, model specs and registries, parameter stores, an MLP that learns XOR.
//! - `checkpoint`: bit-exact resume and refusal of damaged files.
//! - `checkpoint_fuzz`: any damage to a checkpoint is refused by file name or restores exactly
//!   what its files hold (a fuzz target, see docs/testing.md).
//! - `cross_device`: CUDA against the CPU on random inputs (ops, gradients, optimizers, an MLP).
//! - `defaults`: each backend's fused kernels against the default methods built from primitives
//!   that they override (optimizer updates, softmax backward, binary cross-entropy, reductions,
//!   batch normalization).

mod helpers;

mod attention;
mod autodiff;
mod checkpoint;
mod checkpoint_fuzz;
mod conv;
mod cross_device;
mod defaults;
mod errors;
mod grads;
mod nn;
mod norm;
mod ops;
mod optim;
mod optim_in_backward;
mod pool;
mod recurrent;
