//! The saved model that `eval` and `predict` apply: its `checkpoint.json`, read from a local
//! path or an object store and checked once ([`ringflow_core::saved`]: the job spec against
//! the model, the preprocessing against both) before anything is planned with it.

use std::path::Path;

use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;
pub use ringflow_core::saved::SavedModel;
use ringflow_ml::checkpoint;
use ringflow_ml::nn::ModelRegistry;

use crate::error::Result;
use crate::planner::saved_error::ModelDirError;

/// Reads and checks `checkpoint.json` of the model saved in `model_dir` (a local path or URL)
/// against the model kinds of `registry`.
pub fn saved_model(model_dir: &str, registry: &ModelRegistry) -> Result<SavedModel> {
    let meta = Location::parse(model_dir)
        .map_err(|source| ModelDirError::Location {
            model_dir: model_dir.to_string(),
            source,
        })?
        .join("checkpoint.json");
    let name = meta.as_str().to_string();
    let bytes =
        block_on(async move { meta.read().await }).map_err(|source| ModelDirError::Unreadable {
            model_dir: model_dir.to_string(),
            file: name.clone(),
            source,
        })?;
    let meta = checkpoint::parse_meta(&bytes, Path::new(&name))?;
    Ok(SavedModel::read(&meta, &name, registry)?)
}
