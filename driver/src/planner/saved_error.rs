//! Why the model directory that `eval` and `predict` name (`--model`) cannot be used:
//! [`ModelDirError`]. A leaf: the saved model's reading, the planning of an evaluation or a
//! prediction, and the driver's error type use it.

use ringflow_core::data::DataError;

/// A `--model` directory that cannot be used; each message starts with `--model <dir>: `.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelDirError {
    /// The directory is no local path or URL that can be read (what the parser said).
    #[error("--model {model_dir}: {}", .source.message)]
    Location {
        /// `--model`, as given.
        model_dir: String,
        /// Why.
        source: DataError,
    },
    /// Its `checkpoint.json` cannot be read (what the store said).
    #[error(
        "--model {model_dir}: {} ({file}); is it the model directory of a finished training job?",
        .source.message
    )]
    Unreadable {
        /// `--model`, as given.
        model_dir: String,
        /// The location of its `checkpoint.json`.
        file: String,
        /// Why.
        source: DataError,
    },
    /// Its `checkpoint.json` holds no preprocessing, and the model needs some.
    #[error(
        "--model {model_dir}: its checkpoint.json holds no preprocessing, but the model needs \
         {needs} it was trained with; use the model directory its training job wrote, unchanged"
    )]
    NoPreprocessing {
        /// `--model`, as given.
        model_dir: String,
        /// What the model needs ("the classes of its string labels").
        needs: &'static str,
    },
}
