//! Optimizers, learning-rate schedules and gradient clipping.
//!
//! [`Optimizer`] updates a model's parameters in place from their accumulated gradients, with
//! state buffers (momentum, accumulators, moments) allocated once when it is created: a training
//! step allocates nothing of a parameter's size. The update rules are PyTorch's `torch.optim`
//! ones, except that Adagrad's initial accumulator defaults to 0.1 as in TensorFlow's
//! `AdagradOptimizer`, so ports of TensorFlow examples train the same way.

mod groups;
mod optimizer;
mod schedule;

pub use groups::{GroupParams, ParamGroup, ParamHyper};
pub use optimizer::{NamedValues, Optimizer, OptimizerSpec};
pub use schedule::Schedule;
