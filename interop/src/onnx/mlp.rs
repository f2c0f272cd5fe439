//! `kind = "mlp"` in ONNX: `MatMul` and `Add` per layer, the activation between layers.

use ringflow_ml::nn::MlpSpec;

use super::graph::Graph;
use super::ops::{activation, linear};
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// The MLP of `saved` applied to `x`, `[batch, layers[0]]` → `[batch, layers[last]]`.
pub fn lower(g: &mut Graph, saved: &SavedModelDir, x: &str) -> Result<String, ExportError> {
    let mlp = MlpSpec::from_spec(&saved.saved.spec.model).map_err(|e| ExportError::Load {
        dir: saved.dir.display().to_string(),
        source: e,
    })?;
    let layers = mlp.layers.len() - 1;
    let mut h = x.to_string();
    for i in 0..layers {
        h = linear(g, saved, &h, &format!("layers.{i}"))?;
        if i + 1 < layers {
            // Dropout is the identity at inference.
            h = activation(g, &h, mlp.activation);
        }
    }
    Ok(h)
}
