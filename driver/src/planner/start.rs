//! The weights a job starts from and what it trains of them, checked before any executor
//! starts: `model.init_from` read and matched by name (its summary becomes a note of the
//! plan), `model.freeze` patterns, and `train.optimizer.groups` against the model's
//! parameters. Executors load the same weights the same way (`ringflow_interop::weights`).

use ringflow_core::spec::ResolvedSpec;
use ringflow_ml::nn::{Model, ModelRegistry, ModelSummary};
use ringflow_ml::optim::Optimizer;
use ringflow_ml::{Device, nn::init::InitReport};

use crate::error::Result;

/// What [`check`] found of a job that names starting weights, frozen parameters or groups.
pub struct StartingPoint {
    /// What `model.init_from` loads, when set.
    pub loaded: Option<InitReport>,
    /// The built model's summary, frozen parameters counted as non-trainable.
    pub summary: ModelSummary,
}

/// Checks what `spec` says of its starting weights and trainable parameters, building the
/// model on the CPU when it says anything (`None` otherwise).
pub fn check(spec: &ResolvedSpec, registry: &ModelRegistry) -> Result<Option<StartingPoint>> {
    let model_spec = &spec.model;
    let says_anything = model_spec.init_from.is_some()
        || !model_spec.freeze.is_empty()
        || !model_spec.init_skip.is_empty()
        || !spec.train.optimizer.groups().is_empty();
    if !says_anything {
        return Ok(None);
    }
    let model = Model::build(model_spec, registry, spec.train.seed, Device::Cpu)?;
    if model.params().is_empty() {
        return Err(ringflow_ml::MlError::spec(format!(
            "model.freeze = {:?} freezes every parameter of the model ({} tensors), so the \
             job would train nothing: freeze fewer, or evaluate the weights with `ringflow \
             eval` on a saved model",
            model_spec.freeze,
            model.params().frozen().count()
        ))
        .into());
    }
    Optimizer::new(spec.train.optimizer.clone(), model.params())?;
    if model_spec.init_from.is_none() && !model_spec.init_skip.is_empty() {
        return Err(ringflow_ml::MlError::spec(
            "model.init_skip names tensors to leave out of model.init_from, which is not set",
        )
        .into());
    }
    let loaded = ringflow_interop::weights::init_model(model_spec, &model)?;
    Ok(Some(StartingPoint {
        loaded,
        summary: model.summary().clone(),
    }))
}
