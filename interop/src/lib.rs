//! ringflow's models in other frameworks' formats.
//!
//! A saved model directory ([`SavedModelDir`]: `checkpoint.json` and its tensors, checked as
//! `predict` checks them) becomes an ONNX model ([`onnx::export`]) that onnxruntime, TensorRT or
//! Triton run: the preprocessing the model was trained with is inside the graph, and the spec,
//! classes and vocabulary are in its metadata and a JSON sidecar.
//!
//! The ONNX messages are generated from ONNX's own `onnx.proto` by protox and prost at build
//! time, as `ringflow.proto` is: no `protoc`, no Python.

mod error;
pub mod onnx;
mod saved;

pub use error::ExportError;
pub use saved::SavedModelDir;
