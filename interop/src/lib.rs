//! ringflow's models in other frameworks' formats.
//!
//! A saved model directory ([`SavedModelDir`]: `checkpoint.json` and its tensors, checked as
//! `predict` checks them) becomes an ONNX model ([`onnx::export`]) that onnxruntime, TensorRT or
//! Triton run: the preprocessing the model was trained with is inside the graph, and the spec,
//! classes and vocabulary are in its metadata and a JSON sidecar. [`torch::export`] writes it
//! for PyTorch: a `state_dict` in PyTorch's names and layouts and a generated `model.py`.
//!
//! Weights come in the other way too: [`weights`] reads `model.init_from` (a ringflow model
//! directory, a PyTorch state_dict, an ONNX file's initializers) for fine-tuning.
//!
//! The ONNX messages are generated from ONNX's own `onnx.proto` by protox and prost at build
//! time, as `ringflow.proto` is: no `protoc`, no Python.

mod error;
mod files;
pub mod onnx;
mod saved;
pub mod torch;
pub mod weights;

pub use error::ExportError;
pub use saved::SavedModelDir;
