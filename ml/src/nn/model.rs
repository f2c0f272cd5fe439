//! [`Model`]: a network built from a [`ModelSpec`] with its parameters.

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::{MlError, Result};
use crate::nn::{
    Forward, ModelRegistry, ModelShape, ModelSummary, Module, NamePattern, ParamBuilder, ParamStore,
};
use crate::rng::{self, Rng};
use crate::tensor::Tensor;

/// The `[model]` table of a job spec: a `kind` and that kind's own fields.
///
/// ```toml
/// [model]
/// kind = "mlp"
/// layers = [784, 100, 10]
/// activation = "relu"
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Which builder makes the model (`"mlp"`, or a kind registered by the binary).
    pub kind: String,
    /// `model.init_from`: the weights training starts from (a ringflow model directory, a
    /// safetensors state_dict in PyTorch's names, or an ONNX file's initializers), instead of
    /// the kind's random initialization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
    /// `model.init_strict` (default true): every tensor of the model must be in `init_from`,
    /// but for those `init_skip` names.
    #[serde(default = "strict_by_default", skip_serializing_if = "is_true")]
    pub init_strict: bool,
    /// `model.init_skip`: name patterns of tensors left at their initialization rather than
    /// loaded from `init_from` (a new head).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_skip: Vec<String>,
    /// `model.freeze`: name patterns of parameters that keep their values while the model
    /// trains ([`crate::nn::NamePattern`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// The remaining fields, checked by the kind's builder.
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

fn strict_by_default() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

impl ModelSpec {
    /// A spec of `kind` with fields given as JSON (the fields every kind shares, such as
    /// `freeze`, included).
    pub fn new(kind: impl Into<String>, params: serde_json::Value) -> Result<ModelSpec> {
        match params {
            serde_json::Value::Object(mut fields) => {
                fields.insert("kind".into(), serde_json::Value::String(kind.into()));
                serde_json::from_value(serde_json::Value::Object(fields))
                    .map_err(|e| MlError::spec(format!("the model table is invalid: {e}")))
            }
            other => Err(MlError::spec(format!(
                "model fields must be a table, not {other}"
            ))),
        }
    }

    /// The `model.freeze` patterns, checked.
    pub fn freeze_patterns(&self) -> Result<Vec<NamePattern>> {
        NamePattern::parse_all("model.freeze", &self.freeze)
    }

    /// The `model.init_skip` patterns, checked.
    pub fn init_skip_patterns(&self) -> Result<Vec<NamePattern>> {
        NamePattern::parse_all("model.init_skip", &self.init_skip)
    }

    /// An MLP with these widths and activation.
    pub fn mlp(layers: &[usize], activation: &str) -> ModelSpec {
        ModelSpec::new(
            "mlp",
            serde_json::json!({ "layers": layers, "activation": activation }),
        )
        .expect("an object")
    }
}

/// A network, its named parameters, and the spec it was built from.
pub struct Model {
    spec: ModelSpec,
    shape: ModelShape,
    module: Box<dyn Module>,
    params: ParamStore,
    summary: ModelSummary,
}

impl Model {
    /// Builds the model of `spec.kind` from `registry`, initializing its parameters from
    /// `seed` (the same seed gives the same weights on every machine).
    pub fn build(
        spec: &ModelSpec,
        registry: &ModelRegistry,
        seed: u64,
        device: Device,
    ) -> Result<Model> {
        device.check_available()?;
        let builder = registry.builder(spec)?;
        let shape = builder.shape(spec)?;
        let mut params = ParamStore::with_freeze(spec.freeze_patterns()?);
        let mut init_rng = rng::seeded(seed, rng::streams::INIT);
        let module = {
            let mut b = ParamBuilder::new(&mut params, &mut init_rng, device);
            builder.build(spec, &mut b)?
        };
        params.check_freeze_used()?;
        let mut summary = match builder.summary(spec)? {
            Some(summary) => summary,
            None => ModelSummary::from_params(&params),
        };
        // Frozen parameters are not trained: the summary counts them with the buffers.
        let frozen: u64 = params.frozen().map(|p| p.tensor.numel() as u64).sum();
        summary.trainable = summary.trainable.saturating_sub(frozen);
        summary.non_trainable = summary.non_trainable.saturating_add(frozen);
        Ok(Model {
            spec: spec.clone(),
            shape,
            module,
            params,
            summary,
        })
    }

    /// The spec the model was built from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The shape of one example's input, and the outputs.
    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// The parameters in their stable order, and the buffers.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The Keras-style table of the model's layers, output shapes and parameter counts (for a
    /// kind whose builder gives no summary, one row per module of the built parameters).
    pub fn summary(&self) -> &ModelSummary {
        &self.summary
    }

    /// The output for a batch `[n, input...]`; dropout is active, and batch norm uses and
    /// updates the batch's statistics, only when `train`.
    pub fn forward(&self, input: &Tensor, train: bool, rng: &mut Rng) -> Result<Tensor> {
        self.module.forward(input, &mut Forward::new(train, rng))
    }

    /// The output for a batch of sequences padded to one length (`[n, T, ...]`), of which the
    /// `i`-th has `lengths[i]` real steps: sequence layers skip the padding (see
    /// [`Forward::lengths`]); otherwise as [`Model::forward`].
    pub fn forward_sequences(
        &self,
        input: &Tensor,
        lengths: &[usize],
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        let mut ctx = Forward {
            train,
            rng,
            lengths: Some(lengths),
        };
        self.module.forward(input, &mut ctx)
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("kind", &self.spec.kind)
            .field("shape", &self.shape)
            .field("parameters", &self.params.numel())
            .finish()
    }
}
