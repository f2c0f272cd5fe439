//! # ringflow-core: the contract between driver, executors and CLI, and the data they read alike
//!
//! Everything that crosses process boundaries in ringflow is defined here:
//!
//! - [`spec`]: the job spec users write in TOML, checked with errors that name the key at
//!   fault, and shipped to executors as JSON.
//! - [`data`]: how data paths, object stores, `data.sql` and whole-data statistics are
//!   interpreted, identically by the driver, the executors and the CLI.
//! - [`metrics`]: evaluation metrics counted by executors and added up by the driver (entity
//!   F1 of IOB2 tags).
//! - [`saved`]: a saved model's `checkpoint.json` as training writes it (the job spec and
//!   preprocessing kept with the tensors), read and checked once wherever a model is loaded.
//! - [`host`]: this machine's name, as executors and drivers report it.
//! - [`security`]: the cluster's shared secret, the per-call tokens that prove it, and the
//!   control plane's TLS settings.
//! - [`phases`]: the seconds a training step spends in each phase, as executors measure them
//!   and the driver and CLI show them.
//! - [`size`]: sizes in bytes as people write them (`--memory 64MiB`) and read them.
//! - [`listener`]: the bounds, deadlines and counters that every listening port of the driver
//!   and the executors applies to its connections.
//! - [`wire`]: how large each control-plane message and each part of a task may be, the
//!   chunked transfer of what may be larger (a job's vocabulary), and [`wire::payload`], the
//!   one conversion point of the documents that messages carry (the job spec, the
//!   preprocessing, statistics, summaries).
//! - [`pb`]: the control-plane messages and services, generated from `ringflow.proto` at build
//!   time by a pure-Rust protobuf compiler (no system `protoc`).
//!
//! The driver and executor crates never depend on each other; they meet only through this crate.
//! It depends on `ringflow-ml` for the model, optimizer and loss vocabulary of the job spec.

pub mod data;
pub mod host;
pub mod listener;
pub mod metrics;
pub mod phases;
pub mod saved;
pub mod security;
pub mod size;
pub mod spec;
pub mod wire;

/// Messages and services generated from `ringflow.proto` (generated code: its long functions and
/// undocumented items are prost's and tonic's).
#[allow(missing_docs, clippy::all, clippy::too_many_lines)]
pub mod pb {
    tonic::include_proto!("ringflow.v1");
}

/// The control-plane protocol version. A driver refuses executors and clients that speak
/// another version, with a message naming both.
pub const PROTOCOL_VERSION: u32 = 6;
