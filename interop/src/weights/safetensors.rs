//! A safetensors state_dict (`safetensors.torch.save_file(model.state_dict())`, or the PyTorch
//! export's): every floating and integer dtype read as `f32`, in PyTorch's layout.

use std::collections::BTreeMap;

use half::{bf16, f16};
use ringflow_ml::nn::init::{SourceLayout, SourceTensor};
use safetensors::tensor::{Dtype, SafeTensors};

/// The tensors of a safetensors file, converted to `f32`; the error sentence names the tensor
/// whose dtype cannot be read.
pub fn tensors(bytes: &[u8]) -> Result<BTreeMap<String, SourceTensor>, String> {
    let file =
        SafeTensors::deserialize(bytes).map_err(|e| format!("is not a safetensors file: {e}"))?;
    let mut out = BTreeMap::new();
    for (name, view) in file.tensors() {
        let values = to_f32(view.dtype(), view.data()).ok_or_else(|| {
            format!(
                "tensor {name:?} has dtype {:?}, which is not a number ringflow reads (floats \
                 of 16, 32 or 64 bits, integers, booleans)",
                view.dtype()
            )
        })?;
        let tensor = SourceTensor {
            shape: view.shape().to_vec(),
            values,
            layout: SourceLayout::Torch,
        };
        out.insert(name, tensor);
    }
    Ok(super::torch_names::to_ringflow(out))
}

/// Little-endian `data` of `dtype` as `f32` (64-bit values rounded), or `None` for a dtype
/// that is not a number.
pub fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    fn each<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
        data.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N bytes")))
            .collect()
    }
    Some(match dtype {
        Dtype::F32 => each(data, f32::from_le_bytes),
        Dtype::F16 => each(data, |b| f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => each(data, |b| bf16::from_le_bytes(b).to_f32()),
        Dtype::F64 => each(data, |b| f64::from_le_bytes(b) as f32),
        Dtype::I64 => each(data, |b| i64::from_le_bytes(b) as f32),
        Dtype::I32 => each(data, |b| i32::from_le_bytes(b) as f32),
        Dtype::I16 => each(data, |b| i16::from_le_bytes(b) as f32),
        Dtype::I8 => each(data, |b: [u8; 1]| b[0] as i8 as f32),
        Dtype::U8 => each(data, |b: [u8; 1]| b[0] as f32),
        Dtype::BOOL => each(data, |b: [u8; 1]| f32::from(b[0] != 0)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn file(entries: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(String, TensorView<'_>)> = entries
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::tensor::serialize(views, None).unwrap()
    }

    #[test]
    fn sixteen_bit_and_integer_tensors_are_converted() {
        let h: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.25f32, 3.0]
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let bytes = file(&[
            ("a.weight", Dtype::F16, vec![2], h),
            ("a.bias", Dtype::BF16, vec![2], b),
            (
                "bn.num_batches_tracked",
                Dtype::I64,
                vec![],
                7i64.to_le_bytes().to_vec(),
            ),
            ("d", Dtype::F64, vec![1], 0.5f64.to_le_bytes().to_vec()),
        ]);
        let t = tensors(&bytes).unwrap();
        assert_eq!(t["a.weight"].values, [1.5, -2.0]);
        assert_eq!(t["a.bias"].values, [0.25, 3.0]);
        assert_eq!(t["bn.num_batches_tracked"].values, [7.0]);
        assert!(t["bn.num_batches_tracked"].shape.is_empty());
        assert_eq!(t["d"].values, [0.5]);
        assert!(t.values().all(|t| t.layout == SourceLayout::Torch));
    }

    #[test]
    fn what_is_not_safetensors_is_named() {
        let e = tensors(b"not a state dict").unwrap_err();
        assert!(e.contains("is not a safetensors file"), "{e}");
    }
}
