//! `kind = "mlp"`: linear layers with an activation between them.

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::layers::{Activation, ActivationKind, Dropout, Init, Linear, Sequential};
use crate::nn::{
    ModelBuilder, ModelFootprint, ModelShape, ModelSpec, ModelSummary, Module, ParamBuilder,
    SummaryRow,
};

/// `kind = "mlp"`: linear layers with an activation between them (none after the last).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpSpec {
    /// Widths from input to output, e.g. `[784, 100, 10]`: at least two.
    pub layers: Vec<usize>,
    /// Nonlinearity between layers.
    #[serde(default)]
    pub activation: ActivationKind,
    /// Dropout probability after each hidden activation (0 = none).
    #[serde(default)]
    pub dropout: f32,
    /// Weight initialization.
    #[serde(default)]
    pub init: Init,
}

impl MlpSpec {
    /// Reads and checks the MLP fields of a model spec.
    pub fn from_spec(spec: &ModelSpec) -> Result<MlpSpec> {
        let params = serde_json::Value::Object(spec.params.clone());
        let mlp: MlpSpec = crate::settings::from_json("model", &params)
            .map_err(|e| MlError::spec(format!("{}: {}", e.key, e.message)))?;
        if mlp.layers.len() < 2 {
            return Err(MlError::spec(format!(
                "model.layers needs at least an input and an output width, got {:?}",
                mlp.layers
            )));
        }
        if let Some(i) = mlp.layers.iter().position(|&w| w == 0) {
            return Err(MlError::spec(format!(
                "model.layers[{i}] is 0; every width must be at least 1"
            )));
        }
        if !(0.0..1.0).contains(&mlp.dropout) {
            return Err(MlError::spec(format!(
                "model.dropout {} is outside [0, 1)",
                mlp.dropout
            )));
        }
        Ok(mlp)
    }
}

/// The builder of `kind = "mlp"`.
pub(crate) struct MlpBuilder;

impl ModelBuilder for MlpBuilder {
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape> {
        let mlp = MlpSpec::from_spec(spec)?;
        Ok(ModelShape::flat(
            mlp.layers[0],
            *mlp.layers.last().expect("checked length"),
        ))
    }

    fn footprint(&self, spec: &ModelSpec) -> Result<Option<ModelFootprint>> {
        let mlp = MlpSpec::from_spec(spec)?;
        Ok(Some(ModelFootprint::linear_stack(
            &mlp.layers,
            mlp.dropout > 0.0,
        )))
    }

    fn summary(&self, spec: &ModelSpec) -> Result<Option<ModelSummary>> {
        let mlp = MlpSpec::from_spec(spec)?;
        let row = |name: String, kind: &str, width: usize, params: u64| SummaryRow {
            name,
            kind: kind.to_string(),
            output: Some(vec![width]),
            params,
            depth: 0,
        };
        let mut rows = vec![row("input".into(), "", mlp.layers[0], 0)];
        let last = mlp.layers.len() - 2;
        let mut trainable = 0u64;
        for (i, pair) in mlp.layers.windows(2).enumerate() {
            let (inputs, outputs) = (pair[0] as u64, pair[1] as u64);
            let params = inputs.saturating_mul(outputs).saturating_add(outputs);
            trainable = trainable.saturating_add(params);
            rows.push(row(format!("layers.{i}"), "linear", pair[1], params));
            if i < last {
                rows.push(row(String::new(), mlp.activation.name(), pair[1], 0));
                if mlp.dropout > 0.0 {
                    rows.push(row(String::new(), "dropout", pair[1], 0));
                }
            }
        }
        Ok(Some(ModelSummary {
            rows,
            trainable,
            non_trainable: 0,
        }))
    }

    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>> {
        let mlp = MlpSpec::from_spec(spec)?;
        let mut net = Sequential::new();
        let last = mlp.layers.len() - 2;
        for (i, pair) in mlp.layers.windows(2).enumerate() {
            let hidden = i < last;
            let mut scope = params.sub(format!("layers.{i}"));
            net.push(Linear::new(
                &mut scope,
                pair[0],
                pair[1],
                mlp.init,
                hidden.then_some(mlp.activation),
            )?);
            if hidden {
                net.push(Activation(mlp.activation));
                if mlp.dropout > 0.0 {
                    net.push(Dropout { p: mlp.dropout });
                }
            }
        }
        Ok(Box::new(net))
    }
}
