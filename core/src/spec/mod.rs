//! The job spec: the TOML contract between users, the driver and the executors.
//!
//! A spec is read from TOML ([`JobSpec::load`]), with `--set a.b.c=value` overrides applied to
//! the parsed document before it is checked, so an override can reach any field, including one
//! inside an inline table (`--set train.optimizer.lr=0.1`). Unknown keys are errors that name
//! the key with its full dotted path. Every field and its default is listed in
//! `docs/job-spec.md`; the types here are the reference.

mod error;
mod fusion;
#[cfg(test)]
mod fuzz;
mod images;
mod load;
mod overrides;
mod resolved;
mod sequences;
mod written;

pub use error::{NameError, SpecError};
pub use fusion::{
    AUTO_CANDIDATES_MIB, BucketSizes, DEFAULT_BUCKET_MIB, FIRST_BUCKET_MIB, Fusion, FusionError,
    MAX_BUCKET_MIB,
};
pub use images::{
    AugmentSpec, DECODING_BYTES_PER_PIXEL, DEFAULT_MAX_IMAGE_PIXELS, ImageSpec, MAX_DECODED_BYTES,
    MAX_EXAMPLE_VALUES, MAX_IMAGE_METADATA_BYTES, MAX_IMAGE_SIDE, MAX_SHAPE_DIMS,
};
pub use overrides::Override;
pub use resolved::ResolvedSpec;
pub use sequences::{
    DEFAULT_MAX_LENGTH, DEFAULT_MAX_TOKEN_BYTES, MAX_SEQUENCE_LENGTH, MAX_TOKEN_BYTES, MAX_VOCAB,
    Metric, OnTooLong, VocabSpec,
};
pub use written::SpecAsWritten;

use std::collections::BTreeMap;
use std::path::Path;

use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::ModelSpec;
use ringflow_ml::optim::{OptimizerSpec, Schedule};
use ringflow_ml::{Device, MatmulPrecision};
use serde::{Deserialize, Serialize};

use crate::data::paths;

/// A whole training job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name (default: the spec file's name without `.toml`): a plain name
    /// ([`check_name`]).
    #[serde(default)]
    pub name: String,
    /// Where the examples come from and how they become tensors.
    pub data: DataSpec,
    /// The model to train.
    pub model: ModelSpec,
    /// How to train it.
    #[serde(default)]
    pub train: TrainSpec,
    /// Where and on how many executors to run.
    #[serde(default)]
    pub cluster: ClusterSpec,
}

/// `[data]`: the data set and its conversion to features and labels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// Training data: a Parquet file, a directory of them, or a glob.
    pub train: String,
    /// Test data, evaluated after training (optional).
    #[serde(default)]
    pub test: Option<String>,
    /// A DataFusion query that prepares each partition: it reads the table `input` (one
    /// partition of the split being read) and the `[data.tables]`, and its output holds the
    /// feature and label columns. Runs on the executors; the driver plans it once to check it.
    #[serde(default)]
    pub sql: Option<String>,
    /// Small lookup tables the query may join against: name = path (Parquet, CSV or JSON).
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
    /// Seconds `sql` may take: to produce one partition's output on an executor (the time
    /// spent in the query, reading the partition included; not the time training waits), to
    /// load the lookup tables, and for the driver to plan it (default 300).
    #[serde(default = "defaults::sql_timeout_s")]
    pub sql_timeout_s: u64,
    /// Feature columns, concatenated in this order: numeric columns and list columns of numbers
    /// (required unless `image` gives the features; empty by default).
    #[serde(default)]
    pub features: Vec<String>,
    /// The label column: integer class index or string class for classification, number for
    /// regression.
    pub label: String,
    /// The classes of a string label, in class-index order (default: the sorted distinct
    /// values of the training split, found by a distributed pass before training).
    #[serde(default)]
    pub label_classes: Option<Vec<String>>,
    /// Divide every feature by this (e.g. 255 for pixels). Default: no scaling.
    #[serde(default)]
    pub scale: Option<f32>,
    /// `"standard"`: subtract each feature's mean and divide by its standard deviation, both
    /// computed over the training split before training and saved with the model.
    #[serde(default)]
    pub normalize: Option<Normalize>,
    /// Where executors read partitions from: `"direct"` (storage), `"driver"` (the driver
    /// serves them over Arrow Flight) or `"auto"` (direct when every executor can read the
    /// data, else the driver; the default).
    #[serde(default)]
    pub source: DataSource,
    /// Rows held by each executor's shuffle buffer (default 10,000). Each batch draws its rows
    /// uniformly from the buffer, which is refilled from the executor's partitions, read in an
    /// order shuffled each epoch.
    #[serde(default = "defaults::shuffle_buffer")]
    pub shuffle_buffer: usize,
    /// MiB of decoded row groups each executor keeps in memory between epochs (default 512;
    /// 0 disables the cache). Row groups beyond it are read from storage every epoch.
    #[serde(default = "defaults::cache_mb")]
    pub cache_mb: usize,
    /// The shape of one example, e.g. `[1, 28, 28]` (channels, height, width): each row's
    /// feature vector, whose length must be the product, is read as an array of this shape and
    /// batches reach the model as `[n, 1, 28, 28]` (default: a flat vector).
    #[serde(default)]
    pub shape: Option<Vec<usize>>,
    /// A column of encoded images decoded into `[channels, height, width]` features
    /// ([`ImageSpec`]); it replaces `features`, which must then be empty (default: none).
    #[serde(default)]
    pub image: Option<ImageSpec>,
    /// Random crops and flips of the training images ([`AugmentSpec`]; default: none).
    #[serde(default)]
    pub augment: Option<AugmentSpec>,
    /// Which string tokens of a sequence column get ids, and how long one may be
    /// ([`VocabSpec`]; default `{ max_size = 50000, min_count = 1, max_token_bytes = 1024 }`).
    #[serde(default)]
    pub vocab: VocabSpec,
    /// The longest token sequence (default 1024); longer ones do what `on_too_long` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
    /// `"fail"` (the default) or `"truncate"`: what a sequence longer than `max_length` does.
    #[serde(default)]
    pub on_too_long: OnTooLong,
    /// Training batches of sequences group rows of similar length, drawn from the shuffle
    /// buffer (default true): less padding, same randomness of what each epoch covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_by_length: Option<bool>,
}

/// `data.normalize`: feature standardization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    /// `(x − mean) / std` per feature, with whole-training-split statistics.
    Standard,
}

/// `data.source`: how executors reach the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DataSource {
    /// Direct when every executor can read every file, else through the driver.
    #[default]
    Auto,
    /// Each executor reads its partitions from storage.
    Direct,
    /// The driver reads the files and serves partitions over Arrow Flight.
    Driver,
}

/// `[train]`: the optimization.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// Passes over the training data (default 1).
    #[serde(default = "defaults::epochs")]
    pub epochs: u64,
    /// Examples per step on each executor (default 64).
    #[serde(default = "defaults::batch_size")]
    pub batch_size: usize,
    /// The optimizer (default `{ kind = "sgd", lr = 0.01 }`).
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// Learning-rate schedule (default constant).
    #[serde(default)]
    pub schedule: Schedule,
    /// The loss (default `cross_entropy`).
    #[serde(default)]
    pub loss: LossKind,
    /// Seed of every random choice: initial weights, data order, dropout (default 42).
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// Clip gradients to this global L2 norm (default: no clipping).
    #[serde(default)]
    pub clip_grad_norm: Option<f64>,
    /// How the learning rate grows with the number of executors (default `none`).
    #[serde(default)]
    pub lr_scaling: LrScaling,
    /// With test data, evaluate it after every this many epochs as well as after training, so
    /// that test figures follow the job (default 1; 0: only after training).
    #[serde(default = "defaults::eval_every_epochs")]
    pub eval_every_epochs: u64,
    /// Figures evaluation reports besides the loss: `"accuracy"`, `"entity_f1"` (default:
    /// accuracy for a classification).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metric>,
    /// The precision of matrix products on the CPU: `"f32"` (default) or `"bf16"` (operands
    /// rounded to bfloat16, sums in f32; weights, gradients and optimizer state stay f32). See
    /// [`MatmulPrecision`].
    #[serde(default)]
    pub matmul_precision: MatmulPrecision,
    /// Whether CPU convolutions may run Winograd's algorithm where it applies (stride-1 3×3
    /// and 5×5 convolutions with 16 channels or more): fewer multiplications, slightly
    /// different rounding. Default true; false runs every convolution as im2col and GEMM.
    #[serde(default = "defaults::winograd")]
    pub winograd: bool,
}

impl TrainSpec {
    /// Whether the test split is evaluated after 0-based `epoch`, before training ends (the
    /// last epoch's evaluation is the final one).
    pub fn evaluates_after(&self, epoch: u64) -> bool {
        self.eval_every_epochs > 0
            && (epoch + 1).is_multiple_of(self.eval_every_epochs)
            && epoch + 1 < self.epochs
    }
}

/// `train.lr_scaling`: the learning rate as a function of the number of executors N, whose
/// global batch is N × `batch_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LrScaling {
    /// `lr` whatever N.
    #[default]
    None,
    /// `lr × N` (Goyal et al.'s linear scaling rule; Horovod's advice). Pair it with warm-up.
    Linear,
    /// `lr × √N` (often better for Adam-type optimizers).
    Sqrt,
}

impl LrScaling {
    /// The factor for `executors` executors.
    pub fn factor(self, executors: usize) -> f32 {
        match self {
            LrScaling::None => 1.0,
            LrScaling::Linear => executors as f32,
            LrScaling::Sqrt => (executors as f32).sqrt(),
        }
    }
}

impl Default for TrainSpec {
    fn default() -> Self {
        TrainSpec {
            epochs: defaults::epochs(),
            batch_size: defaults::batch_size(),
            optimizer: OptimizerSpec::default(),
            schedule: Schedule::default(),
            loss: LossKind::default(),
            seed: defaults::seed(),
            clip_grad_norm: None,
            lr_scaling: LrScaling::None,
            eval_every_epochs: defaults::eval_every_epochs(),
            metrics: Vec::new(),
            matmul_precision: MatmulPrecision::F32,
            winograd: defaults::winograd(),
        }
    }
}

/// `[cluster]`: where the job runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Executors that train together (default 1).
    #[serde(default = "defaults::executors")]
    pub executors: usize,
    /// `"cpu"` or `"cuda"` (default `"cpu"`).
    #[serde(default = "defaults::device")]
    pub device: Device,
    /// Where the model and checkpoints are written (default `runs/<name>`).
    #[serde(default)]
    pub checkpoint_dir: Option<String>,
    /// Compute threads per executor (default: the machine's cores divided among the local
    /// executors).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Seconds the driver waits for `executors` executors before failing the job (default 60).
    #[serde(default = "defaults::rendezvous_timeout_s")]
    pub rendezvous_timeout_s: u64,
    /// Deadline in seconds for forming the ring and for every read and write on it: a peer
    /// silent for this long fails the step (default 30).
    #[serde(default = "defaults::comm_timeout_s")]
    pub comm_timeout_s: u64,
    /// Elastic training: the job survives lost executors as long as this many remain (default:
    /// no elasticity, a lost executor fails the job).
    #[serde(default)]
    pub min_executors: Option<usize>,
    /// Elastic training: when the ring is re-formed, idle registered executors join it up to
    /// this many (default: `executors`).
    #[serde(default)]
    pub max_executors: Option<usize>,
    /// Rank 0 checkpoints every this many steps (0: only at the end of each epoch, which it
    /// always does), into `<checkpoint_dir>/checkpoint`.
    #[serde(default)]
    pub checkpoint_every_steps: u64,
    /// Backup workers (the TensorFlow paper's synchronous SGD with backups): each step averages
    /// the gradients of the first `executors − backup_workers` ranks to finish it and drops the
    /// rest (default 0: every step waits for every rank). See docs/backup-workers.md.
    #[serde(default)]
    pub backup_workers: usize,
    /// How gradients travel on the ring: `"none"` (f32, the default), `"fp16"` or `"bf16"`
    /// (16-bit floats on the wire, sums kept in f32; Horovod's `Compression.fp16`). See
    /// docs/job-spec.md.
    #[serde(default)]
    pub compression: Compression,
    /// Tensor fusion: the gradient buckets' size in MiB, or `"auto"` to try a few sizes in the
    /// first steps and keep the fastest (default 25 MiB). See [`Fusion`].
    #[serde(default)]
    pub fusion: Fusion,
    /// Executors that share a host all-reduce through a shared-memory segment instead of TCP,
    /// and a job spanning several hosts reduces within each host first (default true). See
    /// docs/collectives.md.
    #[serde(default = "defaults::shared_memory")]
    pub shared_memory: bool,
}

/// `cluster.compression`: the number format gradients travel in on the ring. Parameters
/// (broadcasts), statistics and metrics always travel as f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// 32-bit floats: exact sums, 4 bytes a value.
    #[default]
    None,
    /// IEEE half precision: 2 bytes a value, 11 significant bits, magnitudes up to 65504.
    Fp16,
    /// bfloat16: 2 bytes a value, 8 significant bits, f32's range.
    Bf16,
}

impl Compression {
    /// Every codec, in the order the docs list them.
    pub const ALL: [Compression; 3] = [Compression::None, Compression::Fp16, Compression::Bf16];

    /// The spec's word for it (`"none"`, `"fp16"`, `"bf16"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
        }
    }

    /// The codec the spec's `word` names, if any.
    pub fn from_word(word: &str) -> Option<Compression> {
        Compression::ALL.into_iter().find(|c| c.as_str() == word)
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            executors: defaults::executors(),
            device: defaults::device(),
            checkpoint_dir: None,
            threads: None,
            rendezvous_timeout_s: defaults::rendezvous_timeout_s(),
            comm_timeout_s: defaults::comm_timeout_s(),
            checkpoint_every_steps: 0,
            backup_workers: 0,
            compression: Compression::None,
            fusion: Fusion::default(),
            shared_memory: defaults::shared_memory(),
            min_executors: None,
            max_executors: None,
        }
    }
}

mod defaults {
    use ringflow_ml::Device;

    pub fn shared_memory() -> bool {
        true
    }
    pub fn sql_timeout_s() -> u64 {
        300
    }
    pub fn shuffle_buffer() -> usize {
        10_000
    }
    pub fn cache_mb() -> usize {
        512
    }
    pub fn epochs() -> u64 {
        1
    }
    pub fn eval_every_epochs() -> u64 {
        1
    }
    pub fn winograd() -> bool {
        true
    }
    pub fn batch_size() -> usize {
        64
    }
    pub fn seed() -> u64 {
        42
    }
    pub fn executors() -> usize {
        1
    }
    pub fn device() -> Device {
        Device::Cpu
    }
    pub fn rendezvous_timeout_s() -> u64 {
        60
    }
    pub fn comm_timeout_s() -> u64 {
        30
    }
}

/// The longest job name, in bytes: a name becomes a directory name and part of every job id.
pub const MAX_NAME_BYTES: usize = 100;

/// What a job name may be, for error messages.
pub const NAME_RULE: &str = "letters, digits, '-', '_' and '.', not starting with '.', at most \
                             100 bytes";

/// Checks that `name` is a plain job name ([`NAME_RULE`]): it names a directory (`runs/<name>`)
/// and starts every job id, so it can never be a path, `.` or `..`. The error says what is
/// wrong, without repeating an overlong name.
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong {
            bytes: name.len(),
            max: MAX_NAME_BYTES,
        });
    }
    let name_of = || name.to_string();
    if name == "." || name == ".." {
        return Err(NameError::Directory { name: name_of() });
    }
    if name.starts_with('.') {
        return Err(NameError::LeadingDot { name: name_of() });
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(*c)))
    {
        return Err(NameError::Character { name: name_of(), c });
    }
    Ok(())
}

/// The directory of a job's trained model, below its checkpoint directory.
pub const MODEL_DIR: &str = "model";
/// The directory of a job's checkpoints (what `--resume` continues from).
pub const CHECKPOINT_DIR: &str = "checkpoint";
/// A job's event log, below its checkpoint directory.
pub const EVENTS_FILE: &str = "events.jsonl";

impl DataSpec {
    /// The limit of `sql_timeout_s` as a duration.
    pub fn sql_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.sql_timeout_s)
    }
}

impl JobSpec {
    /// `cluster.checkpoint_dir` (default `runs/<name>`): the directory, a local path or an
    /// object-store URL, that holds the model, the checkpoints, the event log and the job's
    /// lock.
    pub fn checkpoint_dir(&self) -> String {
        match &self.cluster.checkpoint_dir {
            Some(dir) => dir.clone(),
            None => Path::new("runs").join(&self.name).display().to_string(),
        }
    }

    /// Where the trained model is saved: `<checkpoint_dir>/model` (a local path or URL).
    pub fn model_dir(&self) -> String {
        paths::join(&self.checkpoint_dir(), MODEL_DIR)
    }

    /// The job's event log, `<checkpoint_dir>/events.jsonl` (a local path or URL), which
    /// `ringflow history` reads.
    pub fn events_path(&self) -> String {
        paths::join(&self.checkpoint_dir(), EVENTS_FILE)
    }

    /// Where rank 0 writes the checkpoints that `--resume` continues from:
    /// `<checkpoint_dir>/checkpoint`.
    pub fn checkpoint_path(&self) -> String {
        paths::join(&self.checkpoint_dir(), CHECKPOINT_DIR)
    }

    /// The spec as JSON (what a [`crate::wire::payload`] of it holds).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a job spec serializes")
    }

    /// The spec as a JSON value whose numbers read as they were written: [`JobSpec::to_json`]'s
    /// text read back, so that an `f32` such as `lr = 0.05` stays `0.05` (the `f32` itself as a
    /// JSON number would be widened to `0.05000000074505806`).
    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.to_json()).expect("a job spec's JSON reads back")
    }
}

impl crate::wire::payload::Payload for JobSpec {
    const WHAT: &'static str = "job spec";
}
