//! The saved model that `eval` and `predict` apply: its `checkpoint.json`, read from a local
//! path or an object store and checked once ([`ringflow_core::saved`]: the job spec against
//! the model, the preprocessing against both) before anything is planned with it.

use std::path::Path;

use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;
pub use ringflow_core::saved::SavedModel;
use ringflow_ml::checkpoint;
use ringflow_ml::nn::ModelRegistry;

use crate::error::{DriverError, Result};

/// Reads and checks `checkpoint.json` of the model saved in `model_dir` (a local path or URL)
/// against the model kinds of `registry`.
pub fn saved_model(model_dir: &str, registry: &ModelRegistry) -> Result<SavedModel> {
    let fail = |m: String| DriverError::Data(format!("--model {model_dir}: {m}"));
    let meta = Location::parse(model_dir)
        .map_err(|e| fail(e.message))?
        .join("checkpoint.json");
    let name = meta.as_str().to_string();
    let bytes = block_on(async move { meta.read().await }).map_err(|e| {
        fail(format!(
            "{} ({name}); is it the model directory of a finished training job?",
            e.message
        ))
    })?;
    let meta = checkpoint::parse_meta(&bytes, Path::new(&name))?;
    Ok(SavedModel::read(&meta, &name, registry)?)
}
