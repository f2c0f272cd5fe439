//! `model.init_from`: the weights a job starts from, read from a ringflow model directory, a
//! safetensors state_dict in PyTorch's names, or an ONNX file's initializers, as
//! [`ringflow_ml::nn::init::Weights`] for the engine to load by name.
//!
//! The source is told apart by what it is: a directory (or a URL not ending in a file
//! extension below) is a ringflow model directory, `*.onnx` an ONNX model, anything else a
//! safetensors file. Local paths and object-store URLs are both read. A file larger than
//! [`max_bytes`] allows for the model is refused before it is read.

mod onnx;
mod safetensors;
mod torch_names;

use std::path::Path;

use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;
use ringflow_ml::checkpoint;
use ringflow_ml::nn::init::{InitReport, SourceLayout, SourceTensor, Weights};
use ringflow_ml::nn::{Model, ModelSpec};
use ringflow_ml::{MlError, Result};

/// The largest `init_from` file read for a model of `model_values` values: eight times the
/// model's size in `f32` (room for a larger pretrained model of which a part is used), and at
/// least 1 GiB.
pub fn max_bytes(model_values: u64) -> u64 {
    model_values.saturating_mul(32).max(1 << 30)
}

/// Reads `model.init_from` of `spec` and loads it into `model` by name (see
/// [`ringflow_ml::nn::init::load_into`]); `None` when the spec names no weights.
pub fn init_model(spec: &ModelSpec, model: &Model) -> Result<Option<InitReport>> {
    let Some(from) = &spec.init_from else {
        return Ok(None);
    };
    let store = model.params();
    let values: u64 = store.named().map(|(_, p)| p.tensor.numel() as u64).sum();
    let weights = read(from, max_bytes(values))?;
    let skip = spec.init_skip_patterns()?;
    ringflow_ml::nn::init::load_into(store, &weights, &skip, spec.init_strict).map(Some)
}

/// Reads the weights at `from` (a path or URL), refusing a file of more than `max` bytes.
pub fn read(from: &str, max: u64) -> Result<Weights> {
    let fail = |message: String| MlError::init_from(from, message);
    let location = Location::parse(from).map_err(|e| fail(e.to_string()))?;
    if is_model_dir(&location) {
        return read_model_dir(from, &location);
    }
    let bytes = read_bounded(&location, max).map_err(fail)?;
    let tensors = match from.ends_with(".onnx") {
        true => onnx::tensors(&bytes),
        false => safetensors::tensors(&bytes),
    }
    .map_err(fail)?;
    Ok(Weights {
        origin: from.to_string(),
        tensors,
    })
}

/// True for a ringflow model directory: a local directory, or a URL that does not name a
/// `.safetensors` or `.onnx` file.
fn is_model_dir(location: &Location) -> bool {
    match location.local_path() {
        Some(path) => path.is_dir(),
        None => {
            let text = location.as_str();
            !(text.ends_with(".safetensors") || text.ends_with(".onnx"))
        }
    }
}

/// The whole file, unless it is larger than `max`.
fn read_bounded(location: &Location, max: u64) -> std::result::Result<Vec<u8>, String> {
    let at = location.clone();
    let size = block_on(async move { at.size().await }).map_err(|e| e.to_string())?;
    if size > max {
        return Err(format!(
            "is {size} bytes, more than the {max} bytes read for this model's weights (eight \
             times its size, at least 1 GiB)"
        ));
    }
    let at = location.clone();
    block_on(async move { at.read().await }).map_err(|e| e.to_string())
}

/// The parameters and buffers of a saved ringflow model, in ringflow's layout (downloaded
/// first when the directory is in an object store).
fn read_model_dir(from: &str, location: &Location) -> Result<Weights> {
    let loaded = match location.local_path() {
        Some(dir) => checkpoint::load(&dir)?,
        None => {
            let tmp = tempfile::tempdir()
                .map_err(|e| MlError::init_from(from, format!("no temporary directory: {e}")))?;
            ringflow_core::data::location::download_dir(location, tmp.path())
                .map_err(|e| MlError::init_from(from, e.to_string()))?;
            checkpoint::load(Path::new(tmp.path()))?
        }
    };
    let tensors = loaded
        .model_tensors()
        .map(|(name, shape, values)| {
            let tensor = SourceTensor {
                shape: shape.to_vec(),
                values: values.to_vec(),
                layout: SourceLayout::Ringflow,
            };
            (name.to_string(), tensor)
        })
        .collect();
    Ok(Weights {
        origin: from.to_string(),
        tensors,
    })
}
