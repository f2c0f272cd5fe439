//! # ringflow
//!
//! Spark-like data-parallel training in Rust: a driver plans Parquet data into partitions and
//! schedules training tasks on executors, which keep their model replicas identical with a ring
//! all-reduce. This crate is the `ringflow` command line ([`cli`]) and re-exports the libraries
//! it is built from, so that a program of your own can extend it — most often by registering a
//! model kind, as `examples/custom_model.rs` does:
//!
//! ```no_run
//! use ringflow::ml::nn::ModelRegistry;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut models = ModelRegistry::default();
//!     // models.register("my_model", MyModelBuilder);
//!     ringflow::cli::main(models)
//! }
//! ```
//!
//! Such a binary works as driver, executor and `local` exactly like the stock one, and its
//! executors know its model kinds.

pub mod cli;
pub mod local;

pub use ringflow_core as core;
pub use ringflow_driver as driver;
pub use ringflow_executor as executor;
pub use ringflow_ml as ml;
