//! Turning a job spec into work: which files, which partitions, which rank reads what.
//!
//! The planner never reads data rows. It lists the files of each split ([`discover`]), reads
//! only their Parquet footers ([`footer`]) to learn row groups, row counts, schemas and column
//! statistics, and hands them to the planning step of the job's data kind ([`kinds`]: feature
//! columns, images, token sequences), which tells what the data says of the model (a
//! sequential model's input shape and classes). It completes the model spec with that, plans
//! the job's `data.sql` (if any) against the files' schemas with DataFusion, checks the
//! columns of the result against the model as the kind reads them, and each epoch splits the
//! row groups into per-rank partitions ([`assign`]). [`memory`] estimates what one executor
//! needs for the job.

pub mod assign;
pub mod count_error;
pub mod counting;
pub mod discover;
pub mod footer;
pub mod kinds;
pub mod memory;
pub mod parallel;
pub mod plan_error;
pub mod saved;
pub mod saved_error;
pub mod schema_error;
pub mod split;
pub mod sql_planner;
pub mod start;

use datafusion::arrow::datatypes::SchemaRef;
use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;
use ringflow_core::pb::EpochPlan;
use ringflow_core::spec::{JobSpec, ResolvedSpec, SpecAsWritten};
use ringflow_ml::nn::{ModelFootprint, ModelRegistry, ModelShape, ModelSummary};

use crate::error::{DriverError, Result};
use footer::read_footers;
pub use kinds::sequences::PlannedSequences;
use kinds::{KindInput, check_schema};
use plan_error::{LabelMismatch, ResumeError};
pub use saved::{SavedModel, saved_model};
use split::{LabelType, RowGroup, Split};
use sql_planner::SqlPlanner;

/// One split's files and footers, listed and read but not yet checked.
#[derive(Clone, Debug)]
struct ListedSplit {
    files: Vec<String>,
    split: Split,
    /// Entries of its directory or glob skipped because they are not regular files.
    warnings: Vec<String>,
}

/// Lists the split at `path` (spec key `key`) and reads its footers.
fn list_split(key: &str, path: &str) -> Result<ListedSplit> {
    let listing = discover::files(key, path)?;
    let warnings = listing
        .skipped
        .iter()
        .map(|s| format!("{key}: {s}"))
        .collect();
    let files = listing.files;
    let split = read_footers(key, &files)?;
    Ok(ListedSplit {
        files,
        split,
        warnings,
    })
}

/// One split after planning.
#[derive(Clone, Debug)]
struct SplitPlan {
    groups: Vec<RowGroup>,
    files: Vec<String>,
    input_columns: Vec<String>,
    label: LabelType,
    /// Entries of its directory or glob skipped because they are not regular files.
    warnings: Vec<String>,
    /// Where `data.sql` may drop or multiply rows: the input columns counting them reads.
    count_columns: Option<Vec<String>>,
    /// Each file with its schema.
    schemas: Vec<(String, SchemaRef)>,
}

/// Checks the listed split `key` against the spec and the model.
fn check_split(
    key: &str,
    listed: ListedSplit,
    spec: &JobSpec,
    model: &ModelShape,
    label_required: bool,
    prep: Option<&SqlPlanner>,
) -> Result<SplitPlan> {
    let ListedSplit {
        files,
        split,
        warnings,
    } = listed;
    let data = &spec.data;
    let mut label = LabelType::Absent;
    let mut input_columns: Vec<String> = Vec::new();
    let mut count_columns: Option<Vec<String>> = None;
    let mut seen: Vec<SchemaRef> = Vec::new();
    for (file, schema) in &split.schemas {
        if seen.iter().any(|s| s == schema) {
            continue;
        }
        seen.push(schema.clone());
        let (l, columns) = match prep {
            None => {
                let l = check_schema(
                    &format!("{key}: {file}"),
                    schema,
                    spec,
                    model,
                    label_required,
                )?;
                let mut columns = data.feature_columns();
                if l != LabelType::Absent {
                    columns.push(data.label.clone());
                }
                (l, columns)
            }
            Some(prep) => {
                let planned = prep
                    .plan(schema.clone())
                    .map_err(|source| DriverError::SqlPlan {
                        site: format!("{key}: {file}"),
                        source,
                    })?;
                let what = format!("{key}: {file}: the output of data.sql");
                let l = check_schema(&what, &planned.output, spec, model, label_required)?;
                if !planned.keeps_rows {
                    let counted = count_columns.get_or_insert_with(Vec::new);
                    union(counted, planned.count_columns);
                }
                (l, planned.input_columns)
            }
        };
        if seen.len() > 1 && l != label {
            return Err(LabelMismatch::AcrossFiles {
                key: key.to_string(),
                file: file.to_string(),
                label: data.label.clone(),
                first: split.schemas[0].0.to_string(),
            }
            .into());
        }
        label = l;
        union(&mut input_columns, columns);
    }
    Ok(SplitPlan {
        groups: split.groups,
        files,
        input_columns,
        label,
        warnings,
        count_columns,
        schemas: split.schemas,
    })
}

/// Checks `data.label_classes`, where given (or `counted` by the label pass), against the label
/// (`string_label`: it holds class names) and the model's outputs.
fn check_label_classes(
    spec: &JobSpec,
    string_label: bool,
    model: &ModelShape,
    counted: bool,
) -> Result<()> {
    let Some(classes) = &spec.data.label_classes else {
        return Ok(());
    };
    if counted && classes.len() != model.outputs {
        return Err(kinds::labels::LabelError::NotOutputs {
            column: spec.data.label.clone(),
            classes: classes.len(),
            outputs: model.outputs,
        }
        .into());
    }
    if !string_label {
        return Err(LabelMismatch::ClassesOfNumbers {
            label: spec.data.label.clone(),
        }
        .into());
    }
    if classes.len() != model.outputs {
        return Err(LabelMismatch::ClassesNotOutputs {
            listed: classes.len(),
            outputs: model.outputs,
        }
        .into());
    }
    Ok(())
}

/// Adds to `into` the `columns` it does not hold yet, in order.
fn union(into: &mut Vec<String>, columns: Vec<String>) {
    for c in columns {
        if !into.contains(&c) {
            into.push(c);
        }
    }
}

/// Where `data.sql` may drop or multiply the rows of split `key`, replaces the rows of its
/// groups by the rows the query yields (see [`counting`]), with a line saying so in `notes`.
fn count_rows(
    key: &str,
    split: &mut SplitPlan,
    spec: &JobSpec,
    notes: &mut Vec<String>,
) -> Result<()> {
    let (Some(columns), Some(query)) = (&split.count_columns, &spec.data.sql) else {
        return Ok(());
    };
    let counter = counting::RowCounter::new(spec, query)?;
    let counted = counter.count(key, &mut split.groups, columns, &split.schemas)?;
    notes.push(counted.describe(key));
    Ok(())
}

/// Checks the listed training and test splits against the spec and the resolved `model` (both
/// with a label, of the same type), and counts their rows where `data.sql` may drop or multiply
/// them (a line for each in the notes returned).
fn check_splits(
    (train, test): (ListedSplit, Option<ListedSplit>),
    spec: &JobSpec,
    model: &ModelShape,
    prep: Option<&SqlPlanner>,
) -> Result<(SplitPlan, Option<SplitPlan>, Vec<String>)> {
    let check = |key, listed| check_split(key, listed, spec, model, true, prep);
    let mut notes = Vec::new();
    let mut train = check("data.train", train)?;
    count_rows("data.train", &mut train, spec, &mut notes)?;
    let test = match test {
        Some(listed) => {
            let mut test = check("data.test", listed)?;
            count_rows("data.test", &mut test, spec, &mut notes)?;
            Some(test)
        }
        None => None,
    };
    if let Some(t) = &test
        && t.label != train.label
    {
        return Err(LabelMismatch::AcrossSplits {
            label: spec.data.label.clone(),
            test: kind_name(t.label),
            train: kind_name(train.label),
        }
        .into());
    }
    Ok((train, test, notes))
}

/// A job's data, as the driver knows it after planning.
#[derive(Clone, Debug)]
pub struct JobPlan {
    /// The spec, checked and with its model completed from the data: what executors,
    /// checkpoints and the saved model see.
    pub spec: ResolvedSpec,
    /// The model's input and output widths.
    pub model: ModelShape,
    /// Row groups of the training split, in file order.
    pub train: Vec<RowGroup>,
    /// Row groups of the test split (empty without `data.test`); for evaluation and prediction
    /// jobs, the data set.
    pub test: Vec<RowGroup>,
    /// The Parquet columns executors read.
    pub input_columns: Vec<String>,
    /// True when the label holds class names.
    pub string_label: bool,
    /// For a job whose feature is a token sequence: its columns and the vocabulary and label
    /// classes the planner's statistics pass decided (`None` for other jobs, and for
    /// evaluation and prediction, which take the saved model's).
    pub sequence: Option<PlannedSequences>,
    /// Every file of the job (checked by executors with `data.source = "auto"`).
    pub files: Vec<String>,
    /// Where a resumed job continues from.
    pub resume: Option<ResumePoint>,
    /// The spec as its user wrote it (`None` when the client sent none), kept in the job's
    /// checkpoints beside `spec`.
    pub written: Option<SpecAsWritten>,
    /// What the model needs in memory (`None` for a custom kind that does not say).
    pub footprint: Option<ModelFootprint>,
    /// The model's layers and parameter counts (`None` for a custom kind that does not say).
    pub summary: Option<ModelSummary>,
    /// What planning left out and people should know: entries of a data directory or glob
    /// that are not regular files.
    pub warnings: Vec<String>,
    /// What planning did that people should know: the rows `data.sql` was counted to yield.
    pub notes: Vec<String>,
    /// For string token sequences with a test split: its tokens, and those the vocabulary
    /// lacks.
    pub test_tokens: Option<kinds::TestTokens>,
}

/// The state a resumed job continues from: its last checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// Epochs completed.
    pub epoch: u64,
    /// Optimizer steps taken over the whole run.
    pub step: u64,
}

/// Reads the last checkpoint of `spec`'s job (`<checkpoint_dir>/checkpoint/checkpoint.json`) and
/// checks that the spec can continue from it.
pub fn resume_point(spec: &ResolvedSpec) -> Result<ResumePoint> {
    let dir = spec.checkpoint_path();
    let meta = Location::parse(&dir)
        .map_err(ResumeError::Location)?
        .join("checkpoint.json");
    let name = meta.as_str().to_string();
    let bytes = block_on(async move { meta.read().await }).map_err(ResumeError::NoCheckpoint)?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| ResumeError::NotJson {
            name: name.clone(),
            source,
        })?;
    let model: ringflow_ml::nn::ModelSpec =
        serde_json::from_value(json["model"].clone()).map_err(|source| ResumeError::NoModel {
            name: name.clone(),
            source,
        })?;
    if model != spec.model {
        return Err(ResumeError::OtherModel {
            name,
            saved: Box::new(model),
            job: Box::new(spec.model.clone()),
        }
        .into());
    }
    let (epoch, step) = (json["epoch"].as_u64(), json["step"].as_u64());
    let (Some(epoch), Some(step)) = (epoch, step) else {
        return Err(ResumeError::NoEpoch { name }.into());
    };
    if epoch > spec.train.epochs {
        return Err(ResumeError::BeyondEpochs {
            name,
            epoch,
            epochs: spec.train.epochs,
        }
        .into());
    }
    Ok(ResumePoint { epoch, step })
}

impl JobPlan {
    /// Plans `spec`: checks the model against `registry`, lists and inspects the data, and
    /// plans `data.sql`. It is where a spec becomes a [`ResolvedSpec`].
    pub fn new(spec: JobSpec, registry: &ModelRegistry) -> Result<JobPlan> {
        // `cluster.device` is not checked here: the driver needs no GPU. Executors advertise
        // theirs, the scheduler places the job only on executors that have its device, and
        // each executor checks the device it is given.
        let builder = registry.builder(&spec.model)?;
        // Where the model goes must be usable (an object store needs credentials) before any
        // executor trains for it.
        Location::parse(&spec.model_dir()).map_err(DriverError::CheckpointDir)?;
        let prep = SqlPlanner::new(&spec)?;
        let train = list_split("data.train", &spec.data.train)?;
        let test = match &spec.data.test {
            Some(path) => Some(list_split("data.test", path)?),
            None => None,
        };
        // The data kind's planning step tells what the data says of the model; the spec every
        // executor, checkpoint, `eval` and `predict` sees is the one completed with it.
        let (kind, counted) = kinds::plan(&KindInput {
            spec: &spec,
            train: &train.split,
            test: test.as_ref().map(|t| &t.split),
            prep: prep.as_ref(),
            labels: None,
        })?;
        let completed = builder.resolve(&spec.model, kind.facts())?;
        // Class names the label pass counted are the resolved spec's classes.
        let mut spec = spec;
        if let Some(names) = counted.as_ref().and_then(|c| c.names()) {
            spec.data.label_classes = Some(names.to_vec());
        }
        let spec = ResolvedSpec::completed(spec, completed);
        let model = builder.shape(&spec.model)?;
        let test_tokens = match &test {
            Some(test) => kind.check_test(&spec, &test.split, &model)?,
            None => None,
        };
        let footprint = memory::footprint(registry, &kind.footprint_spec(&spec))?;
        let mut summary = builder.summary(&spec.model)?;
        // Every split is checked against the resolved model, as its kind reads it; the training
        // split must then give every rank rows.
        let (train, test, mut notes) = check_splits((train, test), &spec, &model, prep.as_ref())?;
        notes.extend(counted.as_ref().map(|c| c.described.clone()));
        notes.extend(test_tokens.map(|t| t.describe()));
        if let Some(start) = start::check(&spec, registry)? {
            notes.extend(start.loaded.map(|l| l.to_string()));
            summary = Some(start.summary);
        }
        let string_label = train.label == LabelType::String;
        check_label_classes(&spec, string_label, &model, counted.is_some())?;
        let after_sql = train.count_columns.is_some();
        let world = spec.cluster.executors;
        assign::check_enough_rows("data.train", &train.groups, world, after_sql)?;
        let mut input_columns = train.input_columns.clone();
        let mut files = train.files.clone();
        let mut warnings = train.warnings.clone();
        warnings.extend(prep.iter().flat_map(|p| p.warnings.iter().cloned()));
        let test_groups = match test {
            Some(t) => {
                warnings.extend(t.warnings);
                union(&mut input_columns, t.input_columns);
                files.extend(t.files);
                t.groups
            }
            None => Vec::new(),
        };
        Ok(JobPlan {
            spec,
            model,
            train: train.groups,
            test: test_groups,
            input_columns,
            string_label,
            sequence: kind.into_sequences(),
            files,
            resume: None,
            written: None,
            footprint,
            summary,
            warnings,
            notes,
            test_tokens,
        })
    }

    /// Plans evaluation (`label_required`) or prediction of the saved model's `spec` over the
    /// data at `path`, which the plan holds as its test split.
    pub fn inference(
        spec: ResolvedSpec,
        path: &str,
        registry: &ModelRegistry,
        label_required: bool,
    ) -> Result<JobPlan> {
        let builder = registry.builder(&spec.model)?;
        let model = builder.shape(&spec.model)?;
        let footprint = memory::footprint(registry, &spec)?;
        let summary = builder.summary(&spec.model)?;
        let prep = SqlPlanner::new(&spec)?;
        let listed = list_split("--data", path)?;
        let mut data = check_split(
            "--data",
            listed,
            &spec,
            &model,
            label_required,
            prep.as_ref(),
        )?;
        let mut notes = Vec::new();
        count_rows("--data", &mut data, &spec, &mut notes)?;
        let mut warnings = data.warnings;
        warnings.extend(prep.iter().flat_map(|p| p.warnings.iter().cloned()));
        Ok(JobPlan {
            spec,
            model,
            train: Vec::new(),
            test: data.groups,
            input_columns: data.input_columns,
            string_label: data.label == LabelType::String,
            sequence: None,
            files: data.files,
            resume: None,
            written: None,
            footprint,
            summary,
            warnings,
            notes,
            test_tokens: None,
        })
    }

    /// Rows in the training split.
    pub fn train_rows(&self) -> u64 {
        self.train.iter().map(|g| g.rows).sum()
    }

    /// Rows in the test split (the data set of an inference job).
    pub fn test_rows(&self) -> u64 {
        self.test.iter().map(|g| g.rows).sum()
    }

    /// Steps each rank takes per epoch with `world` ranks.
    pub fn steps_per_epoch(&self, world: usize) -> u64 {
        let per_rank = self.train_rows() / world as u64;
        per_rank.div_ceil(self.spec.train.batch_size as u64)
    }

    /// Every rank's training partitions for `epoch` (index = rank).
    pub fn train_epoch(&self, epoch: u64, world: usize) -> Vec<EpochPlan> {
        assign::train_epoch(
            &self.train,
            world,
            self.spec.train.seed,
            epoch,
            self.spec.train.batch_size,
        )
    }

    /// Every rank's share of the test split (index = rank).
    pub fn test_split(&self, world: usize) -> Vec<EpochPlan> {
        assign::evaluation(&self.test, world)
    }

    /// Every rank's share of the training split, each row once (for statistics).
    pub fn stats_split(&self, world: usize) -> Vec<EpochPlan> {
        assign::evaluation(&self.train, world)
    }

    /// True when training needs a statistics pass first.
    pub fn needs_stats(&self) -> (bool, bool) {
        let moments = self.spec.data.normalize.is_some();
        // A sequence job's classes come with its vocabulary, from the planner's own pass.
        let labels =
            self.string_label && self.spec.data.label_classes.is_none() && self.sequence.is_none();
        (moments, labels)
    }
}

fn kind_name(l: LabelType) -> &'static str {
    match l {
        LabelType::Number => "numbers",
        LabelType::String => "strings",
        LabelType::Absent => "nothing",
    }
}
