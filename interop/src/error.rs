//! [`ExportError`]: why a model could not be exported.

use ringflow_core::saved::SavedModelError;
use ringflow_ml::MlError;

/// Why a saved model could not be exported, in a sentence that names the directory, file,
/// model kind or layer at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The checkpoint could not be read or does not build into its model.
    #[error("cannot read the saved model in {dir}: {source}")]
    Load {
        /// The model directory.
        dir: String,
        /// What the engine said.
        #[source]
        source: MlError,
    },
    /// The saved spec or preprocessing fails its checks.
    #[error(transparent)]
    Saved(#[from] SavedModelError),
    /// A model kind, layer or setting the format cannot express (yet).
    #[error("{what} cannot be exported to {format}: {why}")]
    Unsupported {
        /// The format asked for (`ONNX`).
        format: &'static str,
        /// The kind, layer or key (`model.kind = "my_net"`, `model.layers[3] (lstm)`).
        what: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// The model directory is a URL.
    #[error(
        "{dir} is not a local directory; export reads a model on this machine (copy it from \
         the object store first)"
    )]
    NotLocal {
        /// The directory given.
        dir: String,
    },
    /// The output exists and replacing it was not asked for.
    #[error("{path} already exists; pass --overwrite to replace it")]
    Exists {
        /// The output file.
        path: String,
    },
    /// The output could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A saved parameter the model's layers need is not there.
    #[error("the saved model has no parameter {name}, which its {layer} needs")]
    MissingParameter {
        /// The parameter's name (`layers.0.weight`).
        name: String,
        /// The layer that needs it.
        layer: String,
    },
}

impl ExportError {
    /// A model kind registered by a binary of its own.
    pub(crate) fn custom_kind(format: &'static str, kind: &str) -> ExportError {
        ExportError::Unsupported {
            format,
            what: format!("model.kind = {kind:?}"),
            why: "a model kind of your own cannot describe itself to ringflow's export yet; \
                  export mlp and sequential models"
                .into(),
        }
    }

    /// A layer (`path` and `kind` name it) that `format`'s lowering of its kind of model does
    /// not express yet.
    pub(crate) fn sequence_layer(format: &'static str, path: &str, kind: &str) -> ExportError {
        ExportError::Unsupported {
            format,
            what: format!("{path} ({kind})"),
            why: "this ringflow exports the layers of fixed-shape examples and, of token \
                  sequences, embedding, lstm, gru and the per-token layers so far"
                .into(),
        }
    }
}
