//! [`Graph`]: an ONNX graph under construction, one node at a time, with fresh value names.

use super::proto::{
    AttributeProto, GraphProto, NodeProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto, attribute_proto, tensor_proto, tensor_shape_proto, type_proto,
};

/// One dimension of a graph input's or output's shape.
#[derive(Clone, Debug)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A size given when the model runs, by name (`batch`).
    Named(&'static str),
}

/// The nodes and constants of a graph being written.
#[derive(Default)]
pub struct Graph {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    names: usize,
}

/// An attribute of a node.
pub enum Attr<'a> {
    /// An integer.
    Int(&'a str, i64),
    /// A float.
    Float(&'a str, f32),
    /// A list of integers.
    Ints(&'a str, Vec<i64>),
    /// A string.
    Str(&'a str, &'a str),
}

impl Graph {
    /// A fresh value name starting with `hint`.
    fn fresh(&mut self, hint: &str) -> String {
        self.names += 1;
        format!("{hint}_{}", self.names)
    }

    /// A float32 graph input `name` of `shape`.
    pub fn input(&mut self, name: &str, shape: &[Dim]) {
        self.inputs.push(value_info(name, shape));
    }

    /// An int64 graph input `name` of `shape` (token ids, lengths).
    pub fn int64_input(&mut self, name: &str, shape: &[Dim]) {
        let mut info = value_info(name, shape);
        if let Some(TypeProto {
            value: Some(type_proto::Value::TensorType(t)),
            ..
        }) = info.r#type.as_mut()
        {
            t.elem_type = Some(tensor_proto::DataType::Int64 as i32);
        }
        self.inputs.push(info);
    }

    /// Marks the value `value` as the graph output `name` of `shape` (through an `Identity`
    /// node, so outputs have the names users read).
    pub fn output(&mut self, value: &str, name: &str, shape: &[Dim]) {
        self.nodes
            .push(node("Identity", &[value], &[name], Vec::new()));
        self.outputs.push(value_info(name, shape));
    }

    /// A float32 constant of `shape` with a fresh name starting with `hint`.
    pub fn constant(&mut self, hint: &str, shape: &[usize], values: &[f32]) -> String {
        let name = self.fresh(hint);
        self.initializer(name, shape, values)
    }

    /// A model parameter of `shape`, under its own name (`layers.0.weight`).
    pub fn parameter(&mut self, name: &str, shape: &[usize], values: &[f32]) -> String {
        self.initializer(name.to_string(), shape, values)
    }

    /// The float32 initializer `name`.
    fn initializer(&mut self, name: String, shape: &[usize], values: &[f32]) -> String {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializers.push(TensorProto {
            name: Some(name.clone()),
            dims: shape.iter().map(|&d| d as i64).collect(),
            data_type: Some(tensor_proto::DataType::Float as i32),
            raw_data: Some(raw),
            ..Default::default()
        });
        name
    }

    /// A float32 scalar constant.
    pub fn scalar(&mut self, value: f32) -> String {
        self.constant("c", &[], &[value])
    }

    /// An int64 constant of `shape` (a `Reshape`'s target shape, say).
    pub fn int64s(&mut self, hint: &str, values: &[i64]) -> String {
        let name = self.fresh(hint);
        self.initializers.push(TensorProto {
            name: Some(name.clone()),
            dims: vec![values.len() as i64],
            data_type: Some(tensor_proto::DataType::Int64 as i32),
            int64_data: values.to_vec(),
            ..Default::default()
        });
        name
    }

    /// Adds the node `op(inputs)` with `attrs` and returns its one output's name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attr<'_>>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.nodes.push(node(op, inputs, &[out.as_str()], attrs));
        out
    }

    /// The graph `name`, with everything added.
    pub fn finish(self, name: &str) -> GraphProto {
        GraphProto {
            name: Some(name.to_string()),
            node: self.nodes,
            initializer: self.initializers,
            input: self.inputs,
            output: self.outputs,
            ..Default::default()
        }
    }
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Attr<'_>>) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs.into_iter().map(attribute).collect(),
        ..Default::default()
    }
}

fn attribute(a: Attr<'_>) -> AttributeProto {
    use attribute_proto::AttributeType;
    let (name, mut proto) = match a {
        Attr::Int(name, i) => (
            name,
            AttributeProto {
                r#type: Some(AttributeType::Int as i32),
                i: Some(i),
                ..Default::default()
            },
        ),
        Attr::Float(name, f) => (
            name,
            AttributeProto {
                r#type: Some(AttributeType::Float as i32),
                f: Some(f),
                ..Default::default()
            },
        ),
        Attr::Ints(name, ints) => (
            name,
            AttributeProto {
                r#type: Some(AttributeType::Ints as i32),
                ints,
                ..Default::default()
            },
        ),
        Attr::Str(name, text) => (
            name,
            AttributeProto {
                r#type: Some(AttributeType::String as i32),
                s: Some(text.as_bytes().to_vec()),
                ..Default::default()
            },
        ),
    };
    proto.name = Some(name.to_string());
    proto
}

fn value_info(name: &str, shape: &[Dim]) -> ValueInfoProto {
    let dim = shape
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Dim::Fixed(n) => tensor_shape_proto::dimension::Value::DimValue(*n as i64),
                Dim::Named(p) => tensor_shape_proto::dimension::Value::DimParam(p.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    let tensor = type_proto::Tensor {
        elem_type: Some(tensor_proto::DataType::Float as i32),
        shape: Some(TensorShapeProto { dim }),
    };
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(tensor)),
            ..Default::default()
        }),
        ..Default::default()
    }
}
