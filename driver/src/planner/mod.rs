//! Turning a job spec into work: which files, which partitions, which rank reads what.
//!
//! The planner never reads data rows. It lists the files of each split ([`discover`]), reads
//! only their Parquet footers ([`footer`]) to learn row groups, row counts and schemas, checks
//! the feature and label columns against the model, and each epoch splits the row groups into
//! per-rank partitions ([`assign`]).

pub mod assign;
pub mod discover;
pub mod footer;

use ringflow_ml::nn::{ModelRegistry, ModelShape};
use ringflow_proto::pb::EpochPlan;
use ringflow_proto::spec::JobSpec;

use crate::error::Result;
use footer::{RowGroup, check_columns, read_footers};

/// Lists, inspects and checks the split at `path` (spec key `key`).
fn plan_split(key: &str, path: &str, spec: &JobSpec, model: ModelShape) -> Result<Vec<RowGroup>> {
    let split = read_footers(key, &discover::files(key, path)?)?;
    check_columns(key, &split, &spec.data, model)?;
    Ok(split.groups)
}

/// A job's data, as the driver knows it after planning.
#[derive(Clone, Debug)]
pub struct JobPlan {
    /// The checked spec.
    pub spec: JobSpec,
    /// The model's input and output widths.
    pub model: ModelShape,
    /// Row groups of the training split, in file order.
    pub train: Vec<RowGroup>,
    /// Row groups of the test split (empty without `data.test`).
    pub test: Vec<RowGroup>,
}

impl JobPlan {
    /// Plans `spec`: checks the model against `registry`, lists and inspects the data.
    pub fn new(spec: JobSpec, registry: &ModelRegistry) -> Result<JobPlan> {
        let model = registry.builder(&spec.model)?.shape(&spec.model)?;
        spec.cluster.device.check_available()?;
        let train = plan_split("data.train", &spec.data.train, &spec, model)?;
        let test = match &spec.data.test {
            Some(path) => plan_split("data.test", path, &spec, model)?,
            None => Vec::new(),
        };
        assign::check_enough_rows("data.train", &train, spec.cluster.executors)?;
        Ok(JobPlan {
            spec,
            model,
            train,
            test,
        })
    }

    /// Rows in the training split.
    pub fn train_rows(&self) -> u64 {
        self.train.iter().map(|g| g.rows).sum()
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
}
