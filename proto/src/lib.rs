//! # ringflow-proto: the contract between driver, executors and CLI
//!
//! Two things cross process boundaries in ringflow, and both are defined here:
//!
//! - [`spec`]: the job spec users write in TOML, checked with errors that name the key at
//!   fault, and shipped to executors as JSON.
//! - [`pb`]: the control-plane messages and services, generated from `ringflow.proto` at build
//!   time by a pure-Rust protobuf compiler (no system `protoc`).
//!
//! The driver and executor crates never depend on each other; they meet only through this crate.
//! It depends on `ringflow-ml` for the model, optimizer and loss vocabulary of the job spec.

pub mod spec;

/// Messages and services generated from `ringflow.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("ringflow.v1");
}

/// The control-plane protocol version. A driver refuses executors and clients that speak
/// another version, with a message naming both.
pub const PROTOCOL_VERSION: u32 = 1;
