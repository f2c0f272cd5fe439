//! A saved model as PyTorch ([`export`]): a `state_dict` in PyTorch's names and layouts
//! (safetensors: `Linear.weight` as `[out, in]`, batch norms with `num_batches_tracked`) and a
//! generated `model.py` whose `Model` takes it with `load_state_dict(strict=True)` and whose
//! forward gives ringflow's outputs (the logits) from the raw features, as the ONNX export
//! does: `data.scale`, the normalization and `data.shape` are in the module.

mod layers;
mod python;
mod state;

use std::path::{Path, PathBuf};

use ringflow_ml::nn::{MlpSpec, SequentialSpec};

use crate::error::ExportError;
use crate::saved::SavedModelDir;
use state::StateDict;

/// A model exported for PyTorch.
pub struct TorchExport {
    /// The `state_dict` as safetensors (`safetensors.torch.load_file` reads it).
    pub state_dict: Vec<u8>,
    /// The module's source, `model.py`.
    pub model_py: String,
}

impl TorchExport {
    /// Where the module of a state_dict written to `path` goes: beside it, `<stem>.py`.
    pub fn module_path(path: &Path) -> PathBuf {
        path.with_extension("py")
    }

    /// Writes the state_dict to `path` and the module beside it, each through a temporary
    /// file; refuses to replace either unless `overwrite`.
    pub fn write(&self, path: &Path, overwrite: bool) -> Result<(), ExportError> {
        let module = TorchExport::module_path(path);
        let files = [
            (path, self.state_dict.as_slice()),
            (module.as_path(), self.model_py.as_bytes()),
        ];
        crate::files::write_new(&files, overwrite)
    }
}

/// `saved` as a PyTorch state_dict and module; an error naming the model kind or layer it
/// cannot express.
pub fn export(saved: &SavedModelDir) -> Result<TorchExport, ExportError> {
    let tagger = saved.model.shape().sequence.is_some();
    saved.check_tagger("PyTorch")?;
    let load = |source| ExportError::Load {
        dir: saved.dir.display().to_string(),
        source,
    };
    let spec = &saved.saved.spec;
    let mut state = StateDict::default();
    let (modules, forward) = match spec.model.kind.as_str() {
        "mlp" => {
            let mlp = MlpSpec::from_spec(&spec.model).map_err(load)?;
            let mut modules = Vec::new();
            for (i, w) in mlp.layers.windows(2).enumerate() {
                let name = format!("layers.{i}");
                let layer = format!("{name} (linear)");
                state.transposed(saved, &format!("{name}.weight"), &layer)?;
                state.copy(saved, &format!("{name}.bias"), &layer)?;
                modules.push(format!("nn.Linear({}, {})", w[0], w[1]));
            }
            let forward = python::Forward::Mlp {
                activation: layers::activation(mlp.activation),
                dropout: mlp.dropout,
            };
            (modules, forward)
        }
        "sequential" => {
            let plan = SequentialSpec::from_spec(&spec.model)
                .and_then(|s| s.plan())
                .map_err(load)?;
            let modules = layers::modules(saved, &plan.layers, &mut state)?;
            match tagger {
                true => (modules, python::Forward::Tagger),
                false => (modules, python::Forward::Layers),
            }
        }
        kind => return Err(ExportError::custom_kind("PyTorch", kind)),
    };
    let model_py = python::source(saved, &modules, &forward);
    Ok(TorchExport {
        state_dict: state.serialize()?,
        model_py,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_goes_beside_the_state_dict() {
        let path = Path::new("out/iris.safetensors");
        assert_eq!(TorchExport::module_path(path), Path::new("out/iris.py"));
    }

    #[test]
    fn an_existing_output_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::write(&path, b"before").unwrap();
        let export = TorchExport {
            state_dict: b"after".to_vec(),
            model_py: "# module".into(),
        };
        let err = export.write(&path, false).unwrap_err();
        assert!(matches!(err, ExportError::Exists { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"before");
        assert!(!TorchExport::module_path(&path).exists());
        export.write(&path, true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"after");
        assert_eq!(
            std::fs::read_to_string(TorchExport::module_path(&path)).unwrap(),
            "# module"
        );
    }
}
