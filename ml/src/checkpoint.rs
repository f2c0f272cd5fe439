//! Checkpoints: a model's parameters and buffers, its optimizer's state, and where training
//! stood.
//!
//! A checkpoint is a directory:
//!
//! | file | contents |
//! | --- | --- |
//! | `model-<generation>.safetensors` | parameters and buffers (e.g. a batch norm's `running_mean`), keyed by their stable names, exact f32 values |
//! | `optimizer-<generation>.safetensors` | optimizer state, keyed `<param>.<slot>` (absent for a bare model) |
//! | `checkpoint.json` | [`CheckpointMeta`]: model and optimizer spec, epoch, step, RNG state, caller data, and the name and SHA-256 of each tensor file |
//!
//! Writing is atomic: every save writes its tensor files under a new generation number (each
//! through a temporary name, fsync and rename), then replaces `checkpoint.json` the same way,
//! and only then deletes the previous generation's files. Whatever moment a crash hits, the
//! `checkpoint.json` on disk names complete files, so a reader sees either the previous
//! checkpoint or the new one. Loading verifies every checksum and refuses a truncated or
//! altered file with an error that names it. Restoring checks every parameter and buffer by
//! name and shape before changing anything, and [`Loaded::build_model`] first checks a spec's
//! parameter count against the saved values, so that a spec the tensors do not belong to is
//! refused before it allocates anything. What callers keep in `extra` is theirs to check.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::Device;
use crate::error::{MlError, Result};
use crate::nn::{Model, ModelRegistry, ModelSpec};
use crate::optim::{Optimizer, OptimizerSpec};
use crate::rng::Rng;

/// The version of the on-disk layout.
pub const FORMAT_VERSION: u32 = 1;
const META_FILE: &str = "checkpoint.json";
const MODEL_ROLE: &str = "model";
const OPTIMIZER_ROLE: &str = "optimizer";

/// One tensor file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorFile {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// SHA-256 of its contents, in hex.
    pub sha256: String,
}

/// Everything in `checkpoint.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// [`FORMAT_VERSION`] of the writer.
    pub format: u32,
    /// The model's spec.
    pub model: ModelSpec,
    /// The optimizer's spec, when its state was saved.
    pub optimizer: Option<OptimizerSpec>,
    /// Optimizer steps taken (for bias correction and schedules).
    pub optimizer_steps: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Training steps completed over the whole run.
    pub step: u64,
    /// The dropout generator's state.
    pub rng: Option<Rng>,
    /// The caller's own data (job spec, normalization, label classes, ...).
    #[serde(default)]
    pub extra: serde_json::Value,
    /// Increases with every save into the same directory; part of the tensor files' names.
    pub generation: u64,
    /// The tensor files by role (`model`, `optimizer`).
    pub files: BTreeMap<String, TensorFile>,
}

impl CheckpointMeta {
    /// The file holding the model's parameters.
    pub fn model_file(&self) -> Option<&str> {
        self.files.get(MODEL_ROLE).map(|f| f.name.as_str())
    }

    /// The file holding the optimizer's state, if it was saved.
    pub fn optimizer_file(&self) -> Option<&str> {
        self.files.get(OPTIMIZER_ROLE).map(|f| f.name.as_str())
    }
}

/// Where training stood, saved next to the tensors.
#[derive(Clone, Debug, Default)]
pub struct TrainingState {
    /// Epochs completed.
    pub epoch: u64,
    /// Training steps completed.
    pub step: u64,
    /// The dropout generator's state.
    pub rng: Option<Rng>,
    /// The caller's own data.
    pub extra: serde_json::Value,
}

/// Writes a checkpoint of `model` (and `optimizer`, if given) into `dir`, creating it.
pub fn save(
    dir: &Path,
    model: &Model,
    optimizer: Option<&Optimizer>,
    state: &TrainingState,
) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| io_error(dir, "cannot create the directory", e))?;
    // A damaged `checkpoint.json` is replaced: nothing of it is trusted, nothing it names deleted.
    let previous = read_meta(dir).ok();
    let generation = previous
        .as_ref()
        .and_then(|m| m.generation.checked_add(1))
        .unwrap_or(1);
    let mut files = BTreeMap::new();

    let store = model.params();
    let params: Vec<(String, Vec<usize>, Vec<f32>)> = store
        .named()
        .map(|(_, p)| {
            let values = p.tensor.try_to_vec()?;
            Ok((p.name.clone(), p.tensor.shape().to_vec(), values))
        })
        .collect::<Result<_>>()?;
    files.insert(
        MODEL_ROLE.to_string(),
        write_tensors(dir, MODEL_ROLE, generation, &params)?,
    );
    if let Some(opt) = optimizer {
        files.insert(
            OPTIMIZER_ROLE.to_string(),
            write_tensors(dir, OPTIMIZER_ROLE, generation, &opt.state_tensors()?)?,
        );
    }

    let meta = CheckpointMeta {
        format: FORMAT_VERSION,
        model: model.spec().clone(),
        optimizer: optimizer.map(|o| o.spec().clone()),
        optimizer_steps: optimizer.map(Optimizer::steps).unwrap_or(0),
        epoch: state.epoch,
        step: state.step,
        rng: state.rng.clone(),
        extra: state.extra.clone(),
        generation,
        files,
    };
    let json = serde_json::to_vec_pretty(&meta).expect("checkpoint metadata serializes");
    write_atomic(dir, META_FILE, &json)?;
    // The new generation is in place; the previous one's files are no longer referenced.
    if let Some(old) = previous {
        for f in old.files.values() {
            if !meta.files.values().any(|n| n.name == f.name) {
                let _ = fs::remove_file(dir.join(&f.name));
            }
        }
    }
    Ok(())
}

/// Tensors by name: shape and row-major values.
type TensorMap = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct Loaded {
    /// The metadata.
    pub meta: CheckpointMeta,
    /// The directory it was read from, to name its files in errors.
    dir: PathBuf,
    params: TensorMap,
    optimizer: TensorMap,
}

/// Reads and verifies the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Loaded> {
    let meta = read_meta(dir)?;
    let params = read_tensors(dir, MODEL_ROLE, &meta)?;
    let optimizer = if meta.files.contains_key(OPTIMIZER_ROLE) {
        read_tensors(dir, OPTIMIZER_ROLE, &meta)?
    } else {
        BTreeMap::new()
    };
    Ok(Loaded {
        meta,
        dir: dir.to_path_buf(),
        params,
        optimizer,
    })
}

/// Reads and checks `checkpoint.json` alone.
fn read_meta(dir: &Path) -> Result<CheckpointMeta> {
    let meta_path = dir.join(META_FILE);
    let bytes = read_regular(&meta_path)?;
    parse_meta(&bytes, &meta_path)
}

/// Reads and checks the bytes of a `checkpoint.json` (read from `meta_path`, a path or URL that
/// errors name) without opening the files it lists: its format version, and tensor file names
/// that stay inside the checkpoint's directory.
pub fn parse_meta(bytes: &[u8], meta_path: &Path) -> Result<CheckpointMeta> {
    let meta: CheckpointMeta = serde_json::from_slice(bytes).map_err(|e| {
        MlError::checkpoint(meta_path, format!("is not valid checkpoint metadata: {e}"))
    })?;
    if meta.format != FORMAT_VERSION {
        return Err(MlError::checkpoint(
            meta_path,
            format!(
                "has format version {}, this ringflow reads version {FORMAT_VERSION}",
                meta.format
            ),
        ));
    }
    for (role, file) in &meta.files {
        if !is_plain_file_name(&file.name) {
            return Err(MlError::checkpoint(
                meta_path,
                format!(
                    "names the {role} file {:?}, which is not a file name inside the checkpoint \
                     directory",
                    file.name
                ),
            ));
        }
        if file.name == META_FILE {
            return Err(MlError::checkpoint(
                meta_path,
                format!("names itself as the {role} file"),
            ));
        }
    }
    Ok(meta)
}

/// Whether `name` names a file directly inside a directory: not empty, `.` or `..`, and with no
/// separator (a checkpoint's metadata never reaches outside its directory, to read or delete).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// The bytes of `path`, which must be a regular file (a FIFO or a device would block or never
/// end).
fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let meta = fs::metadata(path).map_err(|e| io_error(path, "cannot be read", e))?;
    if !meta.is_file() {
        return Err(MlError::checkpoint(
            path,
            format!(
                "is not a regular file (it is a {})",
                kind(&meta.file_type())
            ),
        ));
    }
    fs::read(path).map_err(|e| io_error(path, "cannot be read", e))
}

fn kind(t: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match () {
        _ if t.is_dir() => "directory",
        _ if t.is_fifo() => "FIFO",
        _ if t.is_socket() => "socket",
        _ if t.is_block_device() || t.is_char_device() => "device",
        _ => "special file",
    }
}

impl Loaded {
    /// The file of the saved parameters and buffers, as errors name it.
    pub fn model_path(&self) -> PathBuf {
        self.dir.join(self.meta.model_file().unwrap_or(MODEL_ROLE))
    }

    /// The saved parameters and buffers by name, as shape and row-major values.
    pub fn model_tensors(&self) -> impl Iterator<Item = (&str, &[usize], &[f32])> {
        self.params
            .iter()
            .map(|(name, (shape, values))| (name.as_str(), shape.as_slice(), values.as_slice()))
    }

    /// Values the saved parameters and buffers hold together.
    pub fn saved_values(&self) -> u64 {
        self.params
            .values()
            .fold(0u64, |n, (_, v)| n.saturating_add(v.len() as u64))
    }

    /// Builds the model `spec` describes (on `device`, initialized from `seed`) and restores
    /// the saved tensors into it ([`Loaded::restore_model`]). A spec whose kind says how many
    /// parameters it has is first checked against the values saved, so a spec that does not
    /// belong to these tensors never allocates more than the checkpoint holds.
    pub fn build_model(
        &self,
        spec: &ModelSpec,
        registry: &ModelRegistry,
        seed: u64,
        device: Device,
    ) -> Result<Model> {
        let builder = registry.builder(spec)?;
        if let Some(footprint) = builder.footprint(spec)?
            && footprint.parameters > self.saved_values()
        {
            return Err(MlError::checkpoint(
                self.model_path(),
                format!(
                    "holds {} values, but the model spec it is loaded into ({}) has {} \
                     parameters: the spec and the tensors do not belong together",
                    self.saved_values(),
                    spec.kind,
                    footprint.parameters
                ),
            ));
        }
        let model = Model::build(spec, registry, seed, device)?;
        self.restore_model(&model)?;
        Ok(model)
    }

    /// Copies the saved parameters and buffers into `model`, which must have the same names
    /// and shapes; on any mismatch nothing is changed.
    pub fn restore_model(&self, model: &Model) -> Result<()> {
        let file = self.model_path();
        // Check everything before changing anything, so a mismatch leaves the model untouched.
        let store = model.params();
        let wanted = store.named();
        let mut sources = Vec::with_capacity(store.len());
        for (what, p) in wanted {
            let (shape, values) = self
                .params
                .get(&p.name)
                .ok_or_else(|| MlError::checkpoint(&file, format!("has no {what} {:?}", p.name)))?;
            if shape != p.tensor.shape() {
                return Err(MlError::checkpoint(
                    &file,
                    format!(
                        "{what} {:?} has shape {shape:?}, the model needs {:?}",
                        p.name,
                        p.tensor.shape()
                    ),
                ));
            }
            sources.push((&p.tensor, values));
        }
        if self.params.len() != sources.len() {
            let extra: Vec<&String> = self
                .params
                .keys()
                .filter(|k| store.get_named(k).is_none())
                .collect();
            return Err(MlError::checkpoint(
                file,
                format!("has tensors the model does not: {extra:?}"),
            ));
        }
        for (tensor, values) in sources {
            tensor.copy_from_slice(values)?;
        }
        Ok(())
    }

    /// Restores the optimizer's state buffers and step count.
    pub fn restore_optimizer(&self, optimizer: &mut Optimizer) -> Result<()> {
        if self.meta.optimizer.as_ref() != Some(optimizer.spec()) {
            return Err(MlError::checkpoint(
                self.dir.join(META_FILE),
                format!(
                    "was saved with optimizer {:?}, the job uses {:?}",
                    self.meta.optimizer,
                    optimizer.spec()
                ),
            ));
        }
        let file = self
            .dir
            .join(self.meta.optimizer_file().unwrap_or(OPTIMIZER_ROLE));
        optimizer
            .load_state(self.meta.optimizer_steps, |key| {
                self.optimizer.get(key).cloned()
            })
            .map_err(|e| MlError::checkpoint(file, e.to_string()))
    }
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> MlError {
    MlError::checkpoint(path, format!("{what}: {e}"))
}

/// Writes a generation's tensor file for `role` and returns its entry.
fn write_tensors(
    dir: &Path,
    role: &str,
    generation: u64,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<TensorFile> {
    let name = format!("{role}-{generation:06}.safetensors");
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.clone(), s.clone(), raw)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, s, raw)| {
            TensorView::new(Dtype::F32, s.clone(), raw)
                .map(|v| (n.clone(), v))
                .map_err(|e| {
                    MlError::checkpoint(dir.join(&name), format!("cannot encode {n}: {e}"))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let encoded = safetensors::tensor::serialize(views, None)
        .map_err(|e| MlError::checkpoint(dir.join(&name), format!("cannot encode: {e}")))?;
    let sha256 = hex(&Sha256::digest(&encoded));
    write_atomic(dir, &name, &encoded)?;
    Ok(TensorFile { name, sha256 })
}

fn read_tensors(dir: &Path, role: &str, meta: &CheckpointMeta) -> Result<TensorMap> {
    let entry = meta
        .files
        .get(role)
        .ok_or_else(|| MlError::checkpoint(dir.join(META_FILE), format!("lists no {role} file")))?;
    let path = dir.join(&entry.name);
    let expected = &entry.sha256;
    let bytes = read_regular(&path)?;
    let actual = hex(&Sha256::digest(&bytes));
    if &actual != expected {
        return Err(MlError::checkpoint(
            &path,
            format!(
                "is corrupted or truncated: its SHA-256 is {actual}, the checkpoint recorded \
                 {expected}; refusing to load it"
            ),
        ));
    }
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| MlError::checkpoint(&path, format!("is not a safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (tname, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(MlError::checkpoint(
                &path,
                format!("tensor {tname} has dtype {:?}, expected F32", view.dtype()),
            ));
        }
        let values = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(tname, (view.shape().to_vec(), values));
    }
    Ok(out)
}

/// Writes `name` in `dir` through a temporary file, fsync and rename.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let dst = dir.join(name);
    let mut f = fs::File::create(&tmp).map_err(|e| io_error(&tmp, "cannot be created", e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| io_error(&tmp, "cannot be written", e))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(|e| io_error(&dst, "cannot be replaced", e))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
