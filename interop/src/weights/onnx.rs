//! An ONNX model's initializers: ringflow's own export (`MatMul` on `[in, out]` weights) and
//! PyTorch's (`Gemm` with `transB = 1` on `[out, in]` ones), each initializer in the layout
//! its operator reads it in.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;
use ringflow_ml::nn::init::{SourceLayout, SourceTensor};
use safetensors::tensor::Dtype;

use crate::onnx::proto::tensor_proto::{DataLocation, DataType};
use crate::onnx::proto::{ModelProto, NodeProto, TensorProto};

/// The initializers of the ONNX model in `bytes`, converted to `f32`; the error sentence names
/// an initializer that cannot be read.
pub fn tensors(bytes: &[u8]) -> Result<BTreeMap<String, SourceTensor>, String> {
    let model = ModelProto::decode(bytes).map_err(|e| format!("is not an ONNX model: {e}"))?;
    let graph = model.graph.ok_or("is an ONNX model without a graph")?;
    let torch_layout = transposed_operands(&graph.node);
    let mut out = BTreeMap::new();
    for init in &graph.initializer {
        let name = init.name.clone().unwrap_or_default();
        let values = values(init).map_err(|why| format!("initializer {name:?} {why}"))?;
        let shape = init
            .dims
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| format!("initializer {name:?} has dimension {d}"))
            })
            .collect::<Result<Vec<usize>, String>>()?;
        if shape.iter().product::<usize>() != values.len() {
            return Err(format!(
                "initializer {name:?} holds {} values for its shape {shape:?}",
                values.len()
            ));
        }
        let layout = match torch_layout.contains(name.as_str()) {
            true => SourceLayout::Torch,
            false => SourceLayout::Ringflow,
        };
        out.insert(
            name,
            SourceTensor {
                shape,
                values,
                layout,
            },
        );
    }
    Ok(out)
}

/// The initializers read as `Gemm`'s second operand with `transB = 1`, PyTorch's `[out, in]`.
fn transposed_operands(nodes: &[NodeProto]) -> BTreeSet<&str> {
    nodes
        .iter()
        .filter(|n| n.op_type() == "Gemm")
        .filter(|n| {
            n.attribute
                .iter()
                .any(|a| a.name() == "transB" && a.i() == 1)
        })
        .filter_map(|n| n.input.get(1).map(String::as_str))
        .collect()
}

/// The values of an initializer as `f32`, from `raw_data` or the typed fields.
fn values(t: &TensorProto) -> Result<Vec<f32>, String> {
    if t.data_location() == DataLocation::External || !t.external_data.is_empty() {
        return Err(
            "keeps its values in an external file, which ringflow does not read: \
             save the model with its weights inside (onnx.save(model, path, \
             save_as_external_data=False))"
                .into(),
        );
    }
    let kind = DataType::try_from(t.data_type()).unwrap_or(DataType::Undefined);
    if let Some(raw) = &t.raw_data {
        let dtype = dtype(kind).ok_or_else(|| unreadable(kind))?;
        return super::safetensors::to_f32(dtype, raw).ok_or_else(|| unreadable(kind));
    }
    Ok(match kind {
        DataType::Float => t.float_data.clone(),
        DataType::Double => t.double_data.iter().map(|&v| v as f32).collect(),
        DataType::Int64 => t.int64_data.iter().map(|&v| v as f32).collect(),
        DataType::Float16 => bits16(&t.int32_data, |b| half::f16::from_bits(b).to_f32()),
        DataType::Bfloat16 => bits16(&t.int32_data, |b| half::bf16::from_bits(b).to_f32()),
        DataType::Int32 | DataType::Int16 | DataType::Int8 | DataType::Uint8 | DataType::Bool => {
            t.int32_data.iter().map(|&v| v as f32).collect()
        }
        other => return Err(unreadable(other)),
    })
}

fn bits16(data: &[i32], f: impl Fn(u16) -> f32) -> Vec<f32> {
    data.iter().map(|&v| f(v as u16)).collect()
}

/// The safetensors dtype with the same little-endian encoding.
fn dtype(kind: DataType) -> Option<Dtype> {
    Some(match kind {
        DataType::Float => Dtype::F32,
        DataType::Float16 => Dtype::F16,
        DataType::Bfloat16 => Dtype::BF16,
        DataType::Double => Dtype::F64,
        DataType::Int64 => Dtype::I64,
        DataType::Int32 => Dtype::I32,
        DataType::Int16 => Dtype::I16,
        DataType::Int8 => Dtype::I8,
        DataType::Uint8 => Dtype::U8,
        DataType::Bool => Dtype::BOOL,
        _ => return None,
    })
}

fn unreadable(kind: DataType) -> String {
    format!(
        "has data type {}, which is not a number ringflow reads",
        kind.as_str_name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::{AttributeProto, GraphProto, attribute_proto};

    fn init(name: &str, dims: &[i64], kind: DataType, raw: Vec<u8>) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(kind as i32),
            raw_data: Some(raw),
            ..TensorProto::default()
        }
    }

    fn gemm(b: &str, trans_b: i64) -> NodeProto {
        NodeProto {
            op_type: Some("Gemm".into()),
            input: vec!["x".into(), b.into()],
            attribute: vec![AttributeProto {
                name: Some("transB".into()),
                i: Some(trans_b),
                r#type: Some(attribute_proto::AttributeType::Int as i32),
                ..AttributeProto::default()
            }],
            ..NodeProto::default()
        }
    }

    #[test]
    fn gemm_operands_with_trans_b_are_in_pytorch_layout() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let model = ModelProto {
            graph: Some(GraphProto {
                node: vec![gemm("fc.weight", 1), gemm("other.weight", 0)],
                initializer: vec![
                    init("fc.weight", &[2, 1], DataType::Float, f32s(&[1.0, 2.0])),
                    init("other.weight", &[1, 2], DataType::Float, f32s(&[3.0, 4.0])),
                    TensorProto {
                        name: Some("fc.bias".into()),
                        dims: vec![2],
                        data_type: Some(DataType::Float16 as i32),
                        int32_data: vec![half::f16::from_f32(0.5).to_bits() as i32; 2],
                        ..TensorProto::default()
                    },
                ],
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        };
        let t = tensors(&model.encode_to_vec()).unwrap();
        assert_eq!(t["fc.weight"].layout, SourceLayout::Torch);
        assert_eq!(t["other.weight"].layout, SourceLayout::Ringflow);
        assert_eq!(t["other.weight"].values, [3.0, 4.0]);
        assert_eq!(t["fc.bias"].values, [0.5, 0.5]);
    }

    #[test]
    fn unreadable_initializers_are_named() {
        let mut bad = init("w", &[3], DataType::Float, vec![0; 8]);
        let model = |t: TensorProto| ModelProto {
            graph: Some(GraphProto {
                initializer: vec![t],
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        };
        let e = tensors(&model(bad.clone()).encode_to_vec()).unwrap_err();
        assert!(e.contains("\"w\" holds 2 values for its shape [3]"), "{e}");
        bad.data_location = Some(DataLocation::External as i32);
        let e = tensors(&model(bad).encode_to_vec()).unwrap_err();
        assert!(e.contains("\"w\"") && e.contains("external file"), "{e}");
        assert!(
            tensors(b"\xff\xff")
                .unwrap_err()
                .contains("is not an ONNX model")
        );
    }
}
