//! The memory one executor needs for a job, estimated from the plan before any executor starts,
//! so that a job that cannot fit is refused with the estimate, the limit and the setting to
//! lower, instead of an executor dying in the allocator halfway through.
//!
//! The estimate adds up what an executor certainly holds at its peak, each part sized from what
//! is really there (the rows of an executor's share, the files' row groups), never from a
//! setting alone:
//!
//! - **model and optimizer**: the weights, their gradients, the all-reduce buckets (one more
//!   copy), the optimizer's state (0 to 2 copies by kind), and for elastic jobs the snapshot an
//!   epoch can be rolled back to;
//! - **activations**: what one training step keeps for the backward pass, at the effective
//!   batch (`train.batch_size`, or the executor's share of the rows when that is smaller);
//!   evaluation batches are counted instead when they are larger;
//! - **shuffle buffer**: `data.shuffle_buffer` rows of features and label, at most the share;
//! - **row-group cache**: `data.cache_mb`, at most the share's decoded (uncompressed) size;
//! - **read-ahead**: the converted chunks between the reader and the training loop;
//! - **batches ahead**: the training batches drawn ahead of the step ([`BATCHES_AHEAD`] and
//!   the one being drawn, as far as the epoch has more steps);
//! - **image decoding**: for `data.image`, what each thread that decodes images may hold at
//!   once ([`ImageSpec::decoding_bytes`]: the largest image `data.image.max_pixels` allows as
//!   decoded, a progressive JPEG's coefficients, the decoder's metadata and resizing), times
//!   the threads that decode at once ([`images::decoding_threads`]); the image kind's parts
//!   of the estimate are in its folder, `kinds/images/`;
//! - **runtime**: the process itself ([`RUNTIME_BYTES`]).
//!
//! Executors advertise host memory only, so a GPU job counts what stays on the host (one
//! staging copy of the weights, the elastic snapshot, the data buffers) and says so.
//!
//! It leaves out allocator slack and short-lived copies, so it errs low: a job is refused only
//! when the estimate itself exceeds the limit, i.e. when it certainly cannot fit, and a job
//! that fits is never refused (see `docs/job-spec.md`, "Memory").
//!
//! [`ImageSpec::decoding_bytes`]: ringflow_core::spec::ImageSpec::decoding_bytes

use ringflow_core::data::partition::{read_ahead_chunks, read_batch_rows};
use ringflow_core::data::{BATCHES_AHEAD, EVAL_BATCH_ROWS, PREDICT_BATCH_ROWS};
use ringflow_core::size::format_bytes;
use ringflow_core::spec::JobSpec;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelFootprint;
use serde::{Deserialize, Serialize};

use crate::planner::JobPlan;
use crate::planner::kinds::images;
use crate::planner::split::RowGroup;

/// What an executor process needs before any job: code, runtime threads, DataFusion and the
/// RPC stacks (less than an idle executor's resident memory).
pub const RUNTIME_BYTES: u64 = 24 << 20;

/// Bytes of one `f32`.
const F32: u64 = 4;

/// One part of an estimate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPart {
    /// What it is: `"model and optimizer"`, `"activations"`, `"shuffle buffer"`, ….
    pub what: String,
    /// Bytes.
    pub bytes: u64,
    /// The setting that makes it smaller (`None` for what no setting changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
}

/// The memory one executor needs for a job, its biggest parts first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    /// All parts together, in bytes.
    pub bytes: u64,
    /// The parts, biggest first (empty ones left out).
    pub parts: Vec<MemoryPart>,
    /// What the estimate could not count (a custom model kind without a footprint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl MemoryPart {
    /// `bytes` of `what`, made smaller by `setting`.
    pub fn new(what: &str, bytes: u64, setting: Option<&str>) -> MemoryPart {
        MemoryPart {
            what: what.to_string(),
            bytes,
            setting: setting.map(str::to_string),
        }
    }
}

impl MemoryEstimate {
    /// The estimate made of `parts` (empty ones are dropped, the rest sorted biggest first).
    pub fn from_parts(parts: Vec<MemoryPart>, note: Option<String>) -> MemoryEstimate {
        let mut parts: Vec<MemoryPart> = parts.into_iter().filter(|p| p.bytes > 0).collect();
        parts.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        MemoryEstimate {
            bytes: parts.iter().map(|p| p.bytes).fold(0, u64::saturating_add),
            parts,
            note,
        }
    }

    /// One executor's share of training `plan` on `world` executors.
    pub fn training(plan: &JobPlan, world: usize) -> MemoryEstimate {
        let spec = &plan.spec;
        let share = Share::of(&plan.train, world);
        let width = plan.model.input_width() as u64;
        let batch = (spec.train.batch_size as u64).min(share.rows).max(1);
        let eval = Share::of(&plan.test, world)
            .rows
            .min(EVAL_BATCH_ROWS as u64);
        let footprint = plan.footprint.unwrap_or_default();
        let copies = 3 + spec.train.optimizer.state_buffers() as u64;
        // An elastic job keeps the weights and optimizer state of the epoch's start.
        let snapshot = if spec.cluster.min_executors.is_some() {
            1 + spec.train.optimizer.state_buffers() as u64
        } else {
            0
        };
        // On a GPU the weights, gradients, optimizer state and activations live in device
        // memory, which executors do not advertise: host memory holds one staging copy of the
        // weights (broadcast, all-reduce buckets) and the snapshot.
        let on_gpu = spec.cluster.device != Device::Cpu;
        let copies = if on_gpu { 1 } else { copies };
        let model = F32
            .saturating_mul(footprint.parameters)
            .saturating_mul(copies + snapshot);
        let activations = if on_gpu {
            0
        } else {
            (F32 * batch)
                .saturating_mul(per_row(footprint.activations_per_row, width))
                .saturating_add(F32.saturating_mul(footprint.activations_per_batch))
                .max((F32 * eval).saturating_mul(per_row(footprint.inference_per_row, width)))
        };
        let shuffle =
            row_bytes(width).saturating_mul((spec.data.shuffle_buffer as u64).min(share.rows));
        // Batches beyond the step's own exist only where the epoch has more steps.
        let later_steps = share.rows.div_ceil(batch).saturating_sub(1);
        let ahead =
            row_bytes(width).saturating_mul(batch * (BATCHES_AHEAD as u64 + 1).min(later_steps));
        let cached = Share::of(&plan.test, world)
            .cached_bytes(spec)
            .saturating_add(share.cached_bytes(spec));
        MemoryEstimate::from_parts(
            vec![
                MemoryPart::new(
                    "model and optimizer",
                    model,
                    Some(model_setting(spec).as_str()),
                ),
                MemoryPart::new("activations", activations, Some("train.batch_size")),
                MemoryPart::new("shuffle buffer", shuffle, Some("data.shuffle_buffer")),
                MemoryPart::new(
                    "row-group cache",
                    cache(spec, cached),
                    Some("data.cache_mb"),
                ),
                MemoryPart::new("read-ahead", read_ahead(&plan.train, width), None),
                MemoryPart::new("batches ahead", ahead, Some("train.batch_size")),
                image_decoding(spec, world),
                MemoryPart::new("runtime", RUNTIME_BYTES, None),
            ],
            unknown_model(plan).or_else(|| on_gpu.then(gpu_note)),
        )
    }

    /// One executor's share of evaluating (`predict = false`) or applying a saved model to the
    /// data set of `plan` (its test split) on `world` executors.
    pub fn inference(plan: &JobPlan, world: usize, predict: bool) -> MemoryEstimate {
        let spec = &plan.spec;
        let share = Share::of(&plan.test, world);
        let width = plan.model.input_width() as u64;
        let footprint = plan.footprint.unwrap_or_default();
        let per_batch = if predict {
            PREDICT_BATCH_ROWS
        } else {
            EVAL_BATCH_ROWS
        };
        let rows = share.rows.min(per_batch as u64);
        // The model is read on the host before it goes to a GPU; activations stay there.
        let on_gpu = spec.cluster.device != Device::Cpu;
        let model = F32.saturating_mul(footprint.parameters);
        let activations = if on_gpu {
            0
        } else {
            (F32 * rows).saturating_mul(per_row(footprint.inference_per_row, width))
        };
        MemoryEstimate::from_parts(
            vec![
                MemoryPart::new("model", model, Some(model_setting(spec).as_str())),
                MemoryPart::new("activations", activations, None),
                MemoryPart::new(
                    "row-group cache",
                    cache(spec, share.cached_bytes(spec)),
                    Some("data.cache_mb"),
                ),
                MemoryPart::new("read-ahead", read_ahead(&plan.test, width), None),
                image_decoding(spec, world),
                MemoryPart::new("runtime", RUNTIME_BYTES, None),
            ],
            unknown_model(plan).or_else(|| on_gpu.then(gpu_note)),
        )
    }

    /// One executor's share of `ringflow bench allreduce` with `floats` floats: the buffer and
    /// the ring's chunks (timing), or the buffers the check compares (`check`).
    pub fn bench(floats: u64, check: bool) -> MemoryEstimate {
        let copies = if check { 4 } else { 2 };
        MemoryEstimate::from_parts(
            vec![
                MemoryPart::new(
                    "all-reduce buffers",
                    (F32 * copies).saturating_mul(floats),
                    Some("--floats (or --size-mb)"),
                ),
                MemoryPart::new("runtime", RUNTIME_BYTES, None),
            ],
            None,
        )
    }

    /// Whether the job fits `limit` bytes.
    pub fn fits(&self, limit: u64) -> bool {
        self.bytes <= limit
    }

    /// "about 412.3 MiB per executor (activations 250.0 MiB, …)": every part, for the job's
    /// messages.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| format!("{} {}", p.what, format_bytes(p.bytes)))
            .collect();
        let mut text = format!(
            "about {} per executor ({})",
            format_bytes(self.bytes),
            parts.join(", ")
        );
        if let Some(note) = &self.note {
            text.push_str(&format!("; {note}"));
        }
        text
    }

    /// Why the job cannot run with `limit`, which completes "more than …" (e.g. "the 64.0 MiB
    /// (--memory) of executor e1 on host-1"): the estimate with its three biggest parts, and
    /// what to lower.
    pub fn refusal(&self, limit: &str, limit_bytes: u64) -> String {
        let biggest: Vec<String> = self
            .parts
            .iter()
            .take(3)
            .map(|p| format!("{} {}", p.what, format_bytes(p.bytes)))
            .collect();
        let fixed: u64 = self
            .parts
            .iter()
            .filter(|p| p.setting.is_none())
            .map(|p| p.bytes)
            .fold(0, u64::saturating_add);
        let advice = match self.parts.iter().find_map(|p| p.setting.as_deref()) {
            Some(setting) if fixed <= limit_bytes => {
                format!("lower {setting}, or give the executors more memory")
            }
            _ => format!(
                "give the executors more memory: {} is needed whatever the settings",
                format_bytes(fixed)
            ),
        };
        format!(
            "the job needs about {} of memory per executor ({}), more than {limit}; {advice}",
            format_bytes(self.bytes),
            biggest.join(", ")
        )
    }
}

/// The image decoding part: what each decoding thread holds ([`images::decoding_bytes`]; none
/// without `data.image`).
fn image_decoding(spec: &JobSpec, world: usize) -> MemoryPart {
    let bytes = images::decoding_bytes(spec, world);
    MemoryPart::new("image decoding", bytes, Some("data.image.max_pixels"))
}

/// An executor's share of a split: rows and decoded bytes.
struct Share {
    rows: u64,
    bytes: u64,
}

impl Share {
    /// The largest share of `groups` any of `world` executors gets.
    fn of(groups: &[RowGroup], world: usize) -> Share {
        let world = world.max(1) as u64;
        let rows: u64 = groups.iter().map(|g| g.rows).sum();
        let bytes: u64 = groups.iter().map(|g| g.bytes).fold(0, u64::saturating_add);
        Share {
            rows: rows.div_ceil(world),
            bytes: bytes.div_ceil(world),
        }
    }

    /// What the share takes in the row-group cache ([`images::cached_bytes`]: its decoded
    /// size, or at least the pixels of images decoded before caching).
    fn cached_bytes(&self, spec: &JobSpec) -> u64 {
        images::cached_bytes(spec, self.rows, self.bytes)
    }
}

/// Values one row keeps: the model's count (at least its input, when the model is not counted)
/// and the label.
fn per_row(model: u64, width: u64) -> u64 {
    model.max(width).saturating_add(1)
}

/// Bytes of one row as the executor holds it: `width` features and a label, as `f32`.
fn row_bytes(width: u64) -> u64 {
    F32.saturating_mul(width.saturating_add(1))
}

/// The row-group cache: `data.cache_mb`, but no more than the `share` it could hold.
fn cache(spec: &JobSpec, share: u64) -> u64 {
    (spec.data.cache_mb as u64)
        .saturating_mul(1 << 20)
        .min(share)
}

/// The converted chunks in flight between the decoders and the training loop
/// ([`read_ahead_chunks`]): each at most [`read_batch_rows`] rows of `groups`.
fn read_ahead(groups: &[RowGroup], width: u64) -> u64 {
    let largest = groups.iter().map(|g| g.rows).max().unwrap_or(0);
    let row = row_bytes(width);
    let chunk = largest.min(read_batch_rows(row) as u64);
    (read_ahead_chunks(row) * chunk).saturating_mul(row)
}

/// The setting that sizes the model: `model.layers` for the MLP, the model table otherwise.
fn model_setting(spec: &JobSpec) -> String {
    if spec.model.kind == "mlp" {
        "model.layers".into()
    } else {
        format!("the size of the [model] (kind {:?})", spec.model.kind)
    }
}

/// What a GPU job's estimate leaves out.
fn gpu_note() -> String {
    "GPU memory (weights, gradients, optimizer state, activations) is not counted: executors \
     advertise host memory"
        .into()
}

fn unknown_model(plan: &JobPlan) -> Option<String> {
    plan.footprint.is_none().then(|| {
        format!(
            "the model (kind {:?}) is not counted: its builder gives no footprint",
            plan.spec.model.kind
        )
    })
}

/// The footprint of `spec`'s model kind, if its builder knows one.
pub fn footprint(
    registry: &ringflow_ml::nn::ModelRegistry,
    spec: &JobSpec,
) -> crate::error::Result<Option<ModelFootprint>> {
    Ok(registry.builder(&spec.model)?.footprint(&spec.model)?)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ringflow_core::spec::ResolvedSpec;
    use ringflow_ml::nn::{ModelRegistry, ModelShape};

    use super::*;

    /// A plan for `sets` over `groups` row groups of `rows` rows and `bytes` bytes each, with
    /// MNIST's shape (784 inputs, 10 classes) unless `sets` change the layers.
    fn plan(sets: &[&str], groups: usize, rows: u64, bytes: u64) -> JobPlan {
        let text = r#"
[data]
train = "x.parquet"
features = ["image"]
label = "label"
[model]
kind = "mlp"
layers = [784, 100, 10]
[train]
batch_size = 128
optimizer = { kind = "adagrad", lr = 0.05 }
"#;
        let sets: Vec<ringflow_core::spec::Override> =
            sets.iter().map(|s| s.parse().unwrap()).collect();
        let spec = JobSpec::parse(text, Path::new("j.toml"), &sets).unwrap();
        let registry = ModelRegistry::default();
        let shape: ModelShape = registry
            .builder(&spec.model)
            .unwrap()
            .shape(&spec.model)
            .unwrap();
        let train = (0..groups as u32)
            .map(|i| RowGroup {
                path: "x.parquet".into(),
                index: i,
                rows,
                file_row_start: rows * u64::from(i),
                bytes,
                after_sql: false,
            })
            .collect();
        JobPlan {
            footprint: footprint(&registry, &spec).unwrap(),
            spec: ResolvedSpec::as_given(spec),
            model: shape,
            train,
            test: Vec::new(),
            input_columns: vec!["image".into(), "label".into()],
            string_label: false,
            sequence: None,
            files: vec!["x.parquet".into()],
            resume: None,
            written: None,
            summary: None,
            warnings: Vec::new(),
            notes: Vec::new(),
            test_tokens: None,
        }
    }

    fn part(e: &MemoryEstimate, what: &str) -> u64 {
        e.parts
            .iter()
            .find(|p| p.what == what)
            .map_or(0, |p| p.bytes)
    }

    #[test]
    fn every_part_is_sized_from_the_share_it_holds() {
        // 60,000 rows in 6 row groups of 8 MB, on 2 executors: 30,000 rows and 24 MB each.
        let p = plan(&[], 6, 10_000, 8_000_000);
        let e = MemoryEstimate::training(&p, 2);
        let row = 4 * 785;
        assert_eq!(part(&e, "shuffle buffer"), 10_000 * row);
        assert_eq!(part(&e, "row-group cache"), 24_000_000);
        // Chunks of 166 rows (512 KiB): 2 decoders with 64 ready each (their 32 MiB), 1 being
        // converted each, 1 being cut.
        assert_eq!(part(&e, "read-ahead"), (2 * 65 + 1) * 166 * row);
        // The 128-row batch kept ready and the one being drawn.
        assert_eq!(part(&e, "batches ahead"), 2 * 128 * row);
        // 79,510 weights × (weights, gradients, buckets, adagrad's sum).
        assert_eq!(part(&e, "model and optimizer"), 4 * 79_510 * 4);
        // One 128-row step (no test split, so no evaluation batch to compare with).
        let f = p.footprint.unwrap();
        assert_eq!(
            part(&e, "activations"),
            4 * 128 * (f.activations_per_row + 1)
        );
        assert_eq!(part(&e, "runtime"), RUNTIME_BYTES);
        let sum: u64 = e.parts.iter().map(|p| p.bytes).sum();
        assert_eq!(e.bytes, sum);
        assert!(e.parts.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    }

    #[test]
    fn settings_beyond_the_data_cost_only_the_data() {
        let p = plan(
            &[
                "train.batch_size=1000000000",
                "data.shuffle_buffer=1000000000",
                "data.cache_mb=1000000000",
            ],
            6,
            10_000,
            8_000_000,
        );
        let e = MemoryEstimate::training(&p, 1);
        let f = p.footprint.unwrap();
        assert_eq!(
            part(&e, "activations"),
            4 * 60_000 * (f.activations_per_row + 1)
        );
        assert_eq!(part(&e, "shuffle buffer"), 60_000 * 4 * 785);
        // One step per epoch: no batch is drawn ahead of it.
        assert_eq!(part(&e, "batches ahead"), 0);
        assert_eq!(part(&e, "row-group cache"), 48_000_000);
        assert!(e.bytes < 2 << 30, "{}", e.summary());
    }

    #[test]
    fn a_model_too_big_for_any_machine_is_refused_naming_model_layers() {
        let p = plan(&["model.layers=[784, 2000000, 2000000, 10]"], 1, 1000, 1000);
        let e = MemoryEstimate::training(&p, 1);
        assert!(e.bytes > 16 << 40, "{}", e.summary());
        assert_eq!(e.parts[0].what, "model and optimizer");
        assert!(!e.fits(1 << 40));
        let why = e.refusal("this machine's 15.6 GiB (machine memory)", 15 << 30);
        let head = format!(
            "the job needs about {} of memory per executor (model and optimizer {}, activations",
            format_bytes(e.bytes),
            format_bytes(e.parts[0].bytes)
        );
        assert!(why.starts_with(&head), "{why}");
        assert!(
            why.contains("more than this machine's 15.6 GiB (machine memory); lower model.layers"),
            "{why}"
        );
    }

    #[test]
    fn an_elastic_job_keeps_a_snapshot_and_adam_two_moments() {
        let plain = MemoryEstimate::training(&plan(&[], 1, 1000, 1000), 1);
        let elastic = plan(
            &["cluster.min_executors=1", "train.optimizer.kind=adam"],
            1,
            1000,
            1000,
        );
        let e = MemoryEstimate::training(&elastic, 1);
        // Adam: weights, gradients, buckets, 2 moments; the snapshot: weights and 2 moments.
        assert_eq!(
            part(&e, "model and optimizer"),
            part(&plain, "model and optimizer") / 4 * 8
        );
    }

    #[test]
    fn a_limit_below_what_no_setting_changes_asks_for_more_memory() {
        let e = MemoryEstimate::training(&plan(&[], 1, 1000, 1000), 1);
        let why = e.refusal("the 1.0 MiB (--memory) of executor e1 on h1", 1 << 20);
        let fixed = part(&e, "read-ahead") + part(&e, "runtime");
        assert!(
            why.ends_with(&format!(
                "give the executors more memory: {} is needed whatever the settings",
                format_bytes(fixed)
            )),
            "{why}"
        );
        assert!(!why.contains("lower "), "{why}");
    }

    #[test]
    fn the_summary_lists_every_part_and_what_is_not_counted() {
        let mut p = plan(&[], 1, 1000, 1000);
        p.footprint = None;
        let e = MemoryEstimate::training(&p, 1);
        let text = e.summary();
        assert!(text.starts_with("about "), "{text}");
        assert!(text.contains("shuffle buffer 3.0 MiB"), "{text}");
        assert!(text.contains("runtime 24.0 MiB"), "{text}");
        assert!(
            text.ends_with(
                "the model (kind \"mlp\") is not counted: its builder gives no footprint"
            ),
            "{text}"
        );
        assert_eq!(part(&e, "model and optimizer"), 0);
    }

    #[test]
    fn a_gpu_job_counts_only_what_stays_on_the_host() {
        let cpu = MemoryEstimate::training(&plan(&[], 1, 1000, 1000), 1);
        let gpu = MemoryEstimate::training(&plan(&["cluster.device=cuda"], 1, 1000, 1000), 1);
        // One host copy of the weights instead of weights, gradients, buckets and adagrad's sum.
        assert_eq!(
            part(&gpu, "model and optimizer"),
            part(&cpu, "model and optimizer") / 4
        );
        assert_eq!(part(&gpu, "activations"), 0);
        assert_eq!(part(&gpu, "shuffle buffer"), part(&cpu, "shuffle buffer"));
        assert!(
            gpu.note.as_deref().unwrap().contains("GPU memory"),
            "{gpu:?}"
        );
    }

    #[test]
    fn image_decoding_counts_each_decoding_thread() {
        let images = [
            "data.features=[]",
            "data.image={ column = \"png\", size = [28, 28], channels = 1 }",
        ];
        let plain = MemoryEstimate::training(&plan(&images, 1, 1000, 1000), 1);
        // Every image the side limit allows, on one thread: 256 MiB and what comes with it.
        let one = plan(
            &[&images[..], &["cluster.threads=1"]].concat(),
            1,
            1000,
            1000,
        );
        let image = one.spec.data.image.clone().unwrap();
        let e = MemoryEstimate::training(&one, 1);
        assert_eq!(part(&e, "image decoding"), image.decoding_bytes());
        assert!(image.decoding_bytes() > 256 << 20);
        let sets = [
            &images[..],
            &["cluster.threads=8", "data.image.max_pixels=1000000"],
        ]
        .concat();
        let eight = plan(&sets, 1, 1000, 1000);
        let e = MemoryEstimate::training(&eight, 2);
        let image = eight.spec.data.image.clone().unwrap();
        assert_eq!(part(&e, "image decoding"), 8 * image.decoding_bytes());
        assert!(e.summary().contains("image decoding "), "{}", e.summary());
        // Without cluster.threads, this machine's cores shared by the executors.
        let shared =
            crate::planner::kinds::images::decoding_threads(&plan(&images, 1, 1, 1).spec, 1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
        assert_eq!(shared, cores);
        let plain_image = plan(&images, 1, 1, 1).spec.data.image.clone().unwrap();
        assert_eq!(
            part(&plain, "image decoding"),
            shared * plain_image.decoding_bytes()
        );
        let infer = MemoryEstimate::inference(&eight, 3, true);
        assert_eq!(part(&infer, "image decoding"), 8 * image.decoding_bytes());
        // Without images, nothing.
        let none = MemoryEstimate::training(&plan(&["cluster.threads=8"], 1, 1000, 1000), 1);
        assert_eq!(part(&none, "image decoding"), 0);
    }

    #[test]
    fn benchmarks_count_their_buffers() {
        let e = MemoryEstimate::bench(1 << 30, true);
        assert_eq!(part(&e, "all-reduce buffers"), 16 << 30);
        assert!(
            e.refusal("x", 1 << 30)
                .contains("lower --floats (or --size-mb)")
        );
    }
}
