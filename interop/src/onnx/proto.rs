//! The messages of ONNX's `onnx.proto`, generated at build time (see `interop/build.rs`).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
