//! [`SavedModelDir`]: a saved model directory read and checked for export.

use std::path::{Path, PathBuf};

use ringflow_core::saved::SavedModel;
use ringflow_ml::checkpoint::{self, CheckpointMeta};
use ringflow_ml::nn::{Model, ModelRegistry};
use ringflow_ml::{Device, Tensor};

use crate::error::ExportError;

/// A saved model as `predict` reads it: its `checkpoint.json` checked (spec, preprocessing,
/// file digests) and its tensors restored into the model they belong to, on the CPU.
pub struct SavedModelDir {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Its checkpoint's metadata.
    pub meta: CheckpointMeta,
    /// Its resolved job spec and preprocessing.
    pub saved: SavedModel,
    /// The model, with the saved parameters and buffers.
    pub model: Model,
}

impl SavedModelDir {
    /// Reads the model directory `dir` (a local path), with the model kinds of `registry`.
    pub fn open(dir: &Path, registry: &ModelRegistry) -> Result<SavedModelDir, ExportError> {
        if dir.to_string_lossy().contains("://") {
            return Err(ExportError::NotLocal {
                dir: dir.display().to_string(),
            });
        }
        let load = |source| ExportError::Load {
            dir: dir.display().to_string(),
            source,
        };
        let loaded = checkpoint::load(dir).map_err(load)?;
        let file = dir.join("checkpoint.json").display().to_string();
        let saved = SavedModel::read(&loaded.meta, &file, registry)?;
        let spec = &saved.spec;
        let model = loaded
            .build_model(&spec.model, registry, spec.train.seed, Device::Cpu)
            .map_err(load)?;
        Ok(SavedModelDir {
            dir: dir.to_path_buf(),
            meta: loaded.meta,
            saved,
            model,
        })
    }

    /// Refuses, for `format`, a model of token sequences that is not a tagger (one output per
    /// token): a sequence classifier's pooling is not exported yet.
    pub(crate) fn check_tagger(&self, format: &'static str) -> Result<(), ExportError> {
        match self.model.shape().sequence {
            Some(ringflow_ml::nn::SequenceOutput::PerSequence) => Err(ExportError::Unsupported {
                format,
                what: "a sequence classifier (one output per sequence)".into(),
                why: "this ringflow exports taggers of token sequences (one output per token) \
                      so far"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// The saved parameter or buffer `name`, as its shape and row-major values; `layer`
    /// names who needs it in the error when it is missing.
    pub fn tensor(&self, name: &str, layer: &str) -> Result<(Vec<usize>, Vec<f32>), ExportError> {
        let params = self.model.params();
        let t: &Tensor = params
            .get_named(name)
            .ok_or_else(|| ExportError::MissingParameter {
                name: name.to_string(),
                layer: layer.to_string(),
            })?;
        Ok((t.shape().to_vec(), t.to_vec()))
    }
}
