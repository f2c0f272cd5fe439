//! [`Checkpoints`]: the model, optimizer state, position and preprocessing a run saves (rank 0)
//! and resumes from.

use std::time::Instant;

use ringflow_core::data::location::upload_dir;
use ringflow_core::data::{Location, Preprocessing};
use ringflow_core::spec::{JobSpec, ResolvedSpec, SpecAsWritten};
use ringflow_ml::checkpoint::{self, TrainingState};
use ringflow_ml::nn::Model;
use ringflow_ml::optim::Optimizer;

use crate::error::{ExecutorError, Result};
use crate::train::context::TrainEvent;

/// Saves and restores one job's training state: what eval, predict and `--resume` need (the
/// model, the optimizer, the epoch and step, the job spec and its preprocessing).
pub struct Checkpoints<'a> {
    /// The job's id.
    pub job_id: &'a str,
    /// The job spec as the driver resolved it, saved with the model (`extra.job`).
    pub spec: &'a ResolvedSpec,
    /// The spec as its user wrote it, saved beside `spec` when the driver had it.
    pub written: Option<&'a SpecAsWritten>,
    /// The preprocessing the data went through, saved with the model.
    pub preprocessing: &'a Preprocessing,
}

impl Checkpoints<'_> {
    /// Saves the model and optimizer into `dir` (a path or URL) as of `epoch` epochs done and
    /// `step` steps taken.
    pub fn save(
        &self,
        dir: &str,
        model: &Model,
        optimizer: &Optimizer,
        epoch: u64,
        step: u64,
    ) -> Result<()> {
        let state = TrainingState {
            epoch,
            step,
            rng: None,
            extra: serde_json::json!({
                "job_id": self.job_id,
                "spec_as_written": self.written,
                "job": self.spec.to_json_value(),
                "preprocessing": self.preprocessing,
            }),
        };
        save_model(dir, model, optimizer, &state)
    }

    /// Writes the job's checkpoint (`spec.checkpoint_path()`) and returns the event that
    /// reports it.
    pub fn write(
        &self,
        model: &Model,
        optimizer: &Optimizer,
        epoch: u64,
        step: u64,
    ) -> Result<TrainEvent> {
        let started = Instant::now();
        let path = self.spec.checkpoint_path();
        self.save(&path, model, optimizer, epoch, step)?;
        Ok(TrainEvent::Checkpoint {
            epochs_done: epoch,
            step,
            path,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Restores the model and optimizer from the checkpoint of the job `spec`; returns the
    /// epochs completed and the steps taken.
    pub fn resume(spec: &JobSpec, model: &Model, optimizer: &mut Optimizer) -> Result<(u64, u64)> {
        let loaded = crate::infer::load_checkpoint(&spec.checkpoint_path())?;
        loaded.restore_model(model)?;
        loaded.restore_optimizer(optimizer)?;
        Ok((loaded.meta.epoch, loaded.meta.step))
    }
}

/// Saves the model into `dir`: directly when it is local, else into a temporary directory that
/// is then uploaded to the object store.
fn save_model(
    dir: &str,
    model: &Model,
    optimizer: &Optimizer,
    state: &TrainingState,
) -> Result<()> {
    let location = Location::parse(dir).map_err(ExecutorError::Storage)?;
    if let Some(local) = location.local_path() {
        checkpoint::save(&local, model, Some(optimizer), state)?;
        return Ok(());
    }
    let staging = tempfile::tempdir()
        .map_err(|e| ExecutorError::output(format!("create a staging directory for {dir}"), e))?;
    checkpoint::save(staging.path(), model, Some(optimizer), state)?;
    upload_dir(staging.path(), &location).map_err(ExecutorError::Storage)
}
