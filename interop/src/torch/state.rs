//! [`StateDict`]: tensors under PyTorch's names, in PyTorch's layouts, written as safetensors.

use safetensors::tensor::{Dtype, TensorView};

use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// A `state_dict` being written: each tensor's name, element type, shape and bytes.
#[derive(Default)]
pub struct StateDict {
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

impl StateDict {
    /// The saved tensor `name` under the same name, as it is (a convolution's weight, a
    /// bias, a norm's statistics); `layer` names who needs it in errors.
    pub fn copy(
        &mut self,
        saved: &SavedModelDir,
        name: &str,
        layer: &str,
    ) -> Result<(), ExportError> {
        self.copy_as(saved, name, name, layer)
    }

    /// The saved tensor `name` as it is, under PyTorch's name `as_name`.
    pub fn copy_as(
        &mut self,
        saved: &SavedModelDir,
        name: &str,
        as_name: &str,
        layer: &str,
    ) -> Result<(), ExportError> {
        let (shape, values) = saved.tensor(name, layer)?;
        self.f32(as_name, shape, &values);
        Ok(())
    }

    /// The saved `[in, out]` weight `name` as PyTorch's `[out, in]`.
    pub fn transposed(
        &mut self,
        saved: &SavedModelDir,
        name: &str,
        layer: &str,
    ) -> Result<(), ExportError> {
        self.transposed_as(saved, name, name, layer)
    }

    /// The saved `[in, out]` weight `name` as PyTorch's `[out, in]`, under `as_name`.
    pub fn transposed_as(
        &mut self,
        saved: &SavedModelDir,
        name: &str,
        as_name: &str,
        layer: &str,
    ) -> Result<(), ExportError> {
        let (shape, values) = saved.tensor(name, layer)?;
        let [rows, cols] = shape[..] else {
            return Err(ExportError::Unsupported {
                format: "PyTorch",
                what: format!("{name} of shape {shape:?}"),
                why: "a linear layer's weight has two dimensions".into(),
            });
        };
        let t = ringflow_ml::nn::init::transpose(&values, rows, cols);
        self.f32(as_name, vec![cols, rows], &t);
        Ok(())
    }

    /// A float32 tensor.
    pub fn f32(&mut self, name: &str, shape: Vec<usize>, values: &[f32]) {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.to_string(), Dtype::F32, shape, raw));
    }

    /// An int64 scalar (a batch norm's `num_batches_tracked`).
    pub fn i64_scalar(&mut self, name: &str, value: i64) {
        let raw = value.to_le_bytes().to_vec();
        self.tensors
            .push((name.to_string(), Dtype::I64, Vec::new(), raw));
    }

    /// The safetensors bytes.
    pub fn serialize(&self) -> Result<Vec<u8>, ExportError> {
        let encode = |e: safetensors::SafeTensorError| ExportError::Unsupported {
            format: "safetensors",
            what: "the state_dict".into(),
            why: e.to_string(),
        };
        let views = self
            .tensors
            .iter()
            .map(|(n, dtype, shape, raw)| {
                TensorView::new(*dtype, shape.clone(), raw).map(|v| (n.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(encode)?;
        safetensors::tensor::serialize(views, None).map_err(encode)
    }
}
