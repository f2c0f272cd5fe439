//! Reverse-mode automatic differentiation.
//!
//! Every op that produces a tensor from inputs that need gradients records a [`Node`]: the inputs
//! and a [`Backward`] implementation that knows the op's derivative. [`crate::Tensor::backward`]
//! walks these nodes from a scalar in reverse topological order and hands each op the gradient of
//! its output; the op adds its inputs' gradients through a [`GradSink`]. An op with several
//! outputs (a recurrent cell's next states) records a hidden joint tensor whose
//! [`MultiBackward`] runs once, with the gradients of all its outputs. The parameters'
//! gradients go into a [`GradStore`] that the caller keeps beside the parameters, so gradients
//! accumulate across passes until [`GradStore::zero`] and no parameter-sized buffer is
//! allocated per step. Under [`no_grad`] nothing is recorded at all.

mod grad_mode;
mod grad_store;
mod graph;

pub use grad_mode::{NoGradGuard, is_grad_enabled, no_grad};
pub use grad_store::GradStore;
pub(crate) use grad_store::GradWrite;
pub(crate) use graph::{Backward, Derivative, GradSink, MultiBackward, Node, run_backward};
