//! # ringflow-executor: where training happens
//!
//! An executor trains one replica of a job's model. It reads its own partitions of the data
//! straight from storage ([`data`]), runs the train loop ([`train`]) on its tensor engine, and
//! keeps its replica identical to the others' through collective operations ([`collective`]).
//! It learns everything about a job — spec, rank, partitions — from the driver, through the
//! [`train::TaskContext`] interface; [`worker`] is the process that registers with the driver
//! and runs the tasks of successive jobs; [`infer`] evaluates or applies a saved model;
//! [`placement`] chooses the GPU (or the CPU) each executor's model lives on; [`memory`] finds
//! how much memory its tasks may use, which it advertises to the driver, and [`allocator`] has
//! `malloc` keep the buffers a training step frees for the next; [`last_words`] reports a panic
//! or a failed allocation to the driver before the process ends.

pub mod allocator;
pub mod collective;
pub mod data;
pub mod error;
pub mod infer;
pub mod last_words;
pub mod memory;
pub mod placement;
pub mod train;
pub mod worker;

pub use error::{ExecutorError, Result};

#[cfg(test)]
mod fuzz;
