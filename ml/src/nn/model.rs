//! [`Model`]: a network built from a [`ModelSpec`] with its parameters.

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::{MlError, Result};
use crate::nn::{
    Forward, ModelRegistry, ModelShape, ModelSummary, Module, ParamBuilder, ParamStore,
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
    /// The remaining fields, checked by the kind's builder.
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl ModelSpec {
    /// A spec of `kind` with fields given as JSON.
    pub fn new(kind: impl Into<String>, params: serde_json::Value) -> Result<ModelSpec> {
        match params {
            serde_json::Value::Object(params) => Ok(ModelSpec {
                kind: kind.into(),
                params,
            }),
            other => Err(MlError::spec(format!(
                "model fields must be a table, not {other}"
            ))),
        }
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
        let mut params = ParamStore::new();
        let mut init_rng = rng::seeded(seed, rng::streams::INIT);
        let module = {
            let mut b = ParamBuilder::new(&mut params, &mut init_rng, device);
            builder.build(spec, &mut b)?
        };
        let summary = match builder.summary(spec)? {
            Some(summary) => summary,
            None => ModelSummary::from_params(&params),
        };
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
