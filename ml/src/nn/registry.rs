//! Model kinds: the built-in MLP and user-registered builders.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::layers::{Activation, ActivationKind, Dropout, Init, Linear, Sequential};
use crate::nn::{ModelFootprint, ModelSpec, Module, ParamBuilder};

/// What one example looks like to a model: the shape of its input and the number of outputs.
///
/// A batch of `n` examples is a tensor of shape `[n, input...]` ([`ModelShape::batch`]): `[n,
/// features]` for flat feature vectors, `[n, C, H, W]` for images, `[n, T]` for token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// The shape of one example's input (one dimension, the feature count, for flat vectors).
    pub input: Vec<usize>,
    /// Outputs per example (classes for classification).
    pub outputs: usize,
}

impl ModelShape {
    /// A model of flat feature vectors: `inputs` features in, `outputs` out.
    pub fn flat(inputs: usize, outputs: usize) -> ModelShape {
        ModelShape {
            input: vec![inputs],
            outputs,
        }
    }

    /// The values in one example's input (the product of its dimensions): the width of a row
    /// of features as the data pipeline hands them over.
    pub fn input_width(&self) -> usize {
        self.input.iter().product()
    }

    /// The shape of a batch of `rows` examples: `[rows, input...]`.
    pub fn batch(&self, rows: usize) -> Vec<usize> {
        std::iter::once(rows)
            .chain(self.input.iter().copied())
            .collect()
    }
}

/// Builds the models of one `kind`.
///
/// Implement this to train a model of your own with ringflow: register it in a
/// [`ModelRegistry`] under a kind name and hand the registry to the driver and executors (see
/// `examples/custom_model.rs`).
pub trait ModelBuilder: Send + Sync {
    /// Checks the spec's fields and returns the widths; errors name the offending field.
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape>;

    /// Creates the model's parameters through `params` and returns the network.
    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>>;

    /// The memory the model needs, computed from the spec without building it, so that the
    /// driver can refuse a job that cannot fit an executor (see `docs/job-spec.md`, "Memory").
    /// The default, `None`, leaves the model out of the estimate: implement it for large
    /// custom models.
    fn footprint(&self, spec: &ModelSpec) -> Result<Option<ModelFootprint>> {
        let _ = spec;
        Ok(None)
    }
}

/// The model kinds a process knows, by name.
#[derive(Clone)]
pub struct ModelRegistry {
    kinds: BTreeMap<String, Arc<dyn ModelBuilder>>,
}

impl Default for ModelRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl ModelRegistry {
    /// A registry with the stock kinds (`mlp`).
    pub fn with_builtins() -> Self {
        let mut r = ModelRegistry {
            kinds: BTreeMap::new(),
        };
        r.register("mlp", MlpBuilder);
        r
    }

    /// Adds (or replaces) the builder for `kind`.
    pub fn register(&mut self, kind: impl Into<String>, builder: impl ModelBuilder + 'static) {
        self.kinds.insert(kind.into(), Arc::new(builder));
    }

    /// The builder for a spec's kind, or an error listing the known kinds.
    pub fn builder(&self, spec: &ModelSpec) -> Result<&dyn ModelBuilder> {
        self.kinds
            .get(&spec.kind)
            .map(|b| b.as_ref())
            .ok_or_else(|| {
                let known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
                MlError::spec(format!(
                    "model.kind {:?} is not known to this binary (known: {})",
                    spec.kind,
                    known.join(", ")
                ))
            })
    }

    /// The names of the registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }
}

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
        let mlp: MlpSpec = serde_json::from_value(serde_json::Value::Object(spec.params.clone()))
            .map_err(|e| MlError::spec(format!("model: {e}")))?;
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

struct MlpBuilder;

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
