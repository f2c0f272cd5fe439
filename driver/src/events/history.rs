//! What happened to the jobs of a checkpoint directory, folded from their event log: the model
//! behind `ringflow history DIR`, like Spark's history server.
//!
//! [`History::from_records`] folds the [`Record`]s of a log ([`read`](super::read)) into one
//! [`JobHistory`] per job run (a resumed job adds a run to the same log): its id, name and
//! state, when it was submitted and finished, its executors (and those lost or joined), one
//! [`EpochRow`] per epoch (loss, rows, samples/s, seconds and where the steps' time went; a
//! sequence job's tokens, tokens/s and padding), checkpoints, recoveries, the test figures (a
//! tagger's per token, with its entity F1) and the error of a failed job.
//! [`JobHistory::render`] writes a job for people; serializing a [`History`] gives the same as
//! one JSON object (`ringflow history --json`).

use std::collections::BTreeMap;

use ringflow_core::phases::PhaseTimes;
use serde::Serialize;
use serde_json::Value;

use super::{Event, RankInfo, Record, ResumedFrom};
use crate::figures::{EntityFigures, Tokens};
use crate::planner::memory::MemoryEstimate;

mod render;

/// Everything the event log says about a checkpoint directory.
#[derive(Debug, Serialize)]
pub struct History {
    /// The log that was read.
    pub events_file: String,
    /// Its jobs, in the order they were submitted.
    pub jobs: Vec<JobHistory>,
}

/// A job that `ringflow history --job ID` asked for is not in the log.
#[derive(Debug, thiserror::Error)]
#[error("{events_file} has no events of job {job_id}")]
pub struct NoSuchJob {
    /// The log that was read.
    pub events_file: String,
    /// The job asked for.
    pub job_id: String,
}

/// One job, from its events.
#[derive(Debug, Default, Serialize)]
pub struct JobHistory {
    /// The driver's id of the job.
    pub job_id: String,
    /// The job's name.
    pub name: String,
    /// What the job does (unknown when its log lost the `submitted` event).
    pub kind: Option<crate::work::JobWork>,
    /// `"succeeded"`, `"failed"`, `"cancelled"`, or `"unfinished"` when the log has no end
    /// (the job runs, or its driver stopped).
    pub state: String,
    /// Why it failed.
    pub error: Option<String>,
    /// When the driver accepted it (RFC 3339, UTC).
    pub submitted_at: Option<String>,
    /// When it had its executors.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// Seconds from submission to the end (or to the last event of an unfinished job).
    pub duration_s: f64,
    /// Epochs, steps per epoch, rows, batch size, model and device, as submitted.
    pub plan: Plan,
    /// The executors it started on, by rank.
    pub executors: Vec<RankInfo>,
    /// Executors that registered with the driver while the job waited or ran.
    pub registered: Vec<Registered>,
    /// Executors it lost.
    pub lost: Vec<Lost>,
    /// Its epochs, each the latest run of that epoch.
    pub epochs: Vec<EpochRow>,
    /// The checkpoints rank 0 wrote.
    pub checkpoints: Vec<Checkpoint>,
    /// The times an elastic job re-formed its ring.
    pub recoveries: Vec<Recovery>,
    /// The test split's figures after training.
    pub test: Option<Test>,
    /// Where the model was saved.
    pub model_path: Option<String>,
    /// The job's final summary (as `--summary-json` writes it), kept as the log holds it: a
    /// log may come from another version of ringflow.
    pub summary: Option<Value>,
}

/// The job as submitted.
#[derive(Debug, Default, Serialize)]
pub struct Plan {
    /// Executors it runs on.
    pub executors: usize,
    /// Epochs to train.
    pub epochs: Option<u64>,
    /// Steps per epoch on every rank.
    pub steps_per_epoch: Option<u64>,
    /// Rows of the training split (training) or of the data set (eval, predict).
    pub rows: Option<u64>,
    /// Rows per step and rank.
    pub batch_size: Option<usize>,
    /// `model.kind`.
    pub model: Option<String>,
    /// `cluster.device`.
    pub device: Option<String>,
    /// The checkpoint a `--resume` continued from.
    pub resumed_from: Option<ResumedFrom>,
    /// What one executor needed, as estimated at submission.
    pub memory: Option<MemoryEstimate>,
}

/// An executor that registered with the driver.
#[derive(Debug, Serialize)]
pub struct Registered {
    /// The executor's id.
    pub executor_id: String,
    /// Its machine.
    pub host: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// An executor the job lost.
#[derive(Debug, Serialize)]
pub struct Lost {
    /// Its rank.
    pub rank: usize,
    /// The executor's id.
    pub executor_id: String,
    /// Its machine.
    pub host: String,
    /// What the driver noticed.
    pub reason: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// One epoch over all ranks.
#[derive(Debug, Serialize)]
pub struct EpochRow {
    /// 0-based, as in summaries.
    pub epoch: u64,
    /// Steps every rank took.
    pub steps: u64,
    /// Mean training loss.
    pub loss: f64,
    /// Rows trained on, all ranks together.
    pub samples: u64,
    /// Rows whose gradients backup workers dropped.
    pub dropped_samples: u64,
    /// Wall time of the slowest rank.
    pub seconds: f64,
    /// `samples / seconds`.
    pub samples_per_s: f64,
    /// Mean over ranks of the seconds per step phase.
    pub phases: PhaseTimes,
    /// The phases as percentages of the steps' time, to a tenth of a percent.
    pub phase_percent: PhaseTimes,
    /// Token sequences: the real tokens trained on, all ranks together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Token sequences: the padding steps the batches held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub padding: Option<u64>,
    /// Token sequences: `tokens / seconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Token sequences: `padding / (tokens + padding)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub padding_fraction: Option<f64>,
    /// The test split's figures after this epoch (`train.eval_every_epochs`; the last epoch's
    /// are the job's `test`).
    pub test: Option<Test>,
}

/// A checkpoint rank 0 wrote.
#[derive(Debug, Serialize)]
pub struct Checkpoint {
    /// Epochs completed at the checkpoint.
    pub epochs_done: u64,
    /// Optimizer steps taken.
    pub step: u64,
    /// Where it was written.
    pub path: String,
    /// Seconds the save took.
    pub seconds: f64,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// An elastic job re-formed its ring.
#[derive(Debug, Serialize)]
pub struct Recovery {
    /// The ring's generation after the re-forming.
    pub generation: u32,
    /// Executors before.
    pub world_before: usize,
    /// Executors after.
    pub world_after: usize,
    /// Executors left out (lost), by id.
    pub lost: Vec<String>,
    /// Idle executors that joined, by id.
    pub joined: Vec<String>,
    /// Seconds from the break to the new ring.
    pub waited_s: f64,
    /// What broke (empty when executors joined at an epoch boundary).
    pub cause: String,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// The test split's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Test {
    /// Rows evaluated.
    pub rows: u64,
    /// Mean test loss.
    pub loss: f64,
    /// Accuracy (classification).
    pub accuracy: Option<f64>,
    /// Mean squared error (regression).
    pub mse: Option<f64>,
    /// A tagger: `rows` are its real tokens, and `accuracy` is per token.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub per_token: bool,
    /// An IOB2 tagger's entity-level figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entities: Option<EntityFigures>,
}

impl History {
    /// The jobs of `records`, in the order they were submitted. Each driver numbers its jobs
    /// from 1, so a job resumed under a new driver may reuse an id: a `submitted` event always
    /// starts a new job.
    pub fn from_records(events_file: String, records: Vec<Record>) -> History {
        let mut jobs: Vec<JobHistory> = Vec::new();
        // The latest job of each id.
        let mut current: BTreeMap<String, usize> = BTreeMap::new();
        for r in records {
            let fresh = matches!(r.event, Event::Submitted { .. });
            let index = match current.get(&r.job_id) {
                Some(&i) if !fresh => i,
                _ => {
                    jobs.push(JobHistory::new(&r.job_id));
                    current.insert(r.job_id.clone(), jobs.len() - 1);
                    jobs.len() - 1
                }
            };
            let job = &mut jobs[index];
            job.duration_s = job.duration_s.max(r.elapsed_s);
            job.apply(r.at, r.event);
        }
        History { events_file, jobs }
    }

    /// Keeps only the runs of job `job_id`; fails, naming the log, when it has none.
    pub fn keep_job(&mut self, job_id: &str) -> Result<(), NoSuchJob> {
        self.jobs.retain(|j| j.job_id == job_id);
        if self.jobs.is_empty() {
            return Err(NoSuchJob {
                events_file: self.events_file.clone(),
                job_id: job_id.to_string(),
            });
        }
        Ok(())
    }
}

impl JobHistory {
    /// A job with no events yet.
    fn new(job_id: &str) -> JobHistory {
        JobHistory {
            job_id: job_id.to_string(),
            state: "unfinished".into(),
            ..Default::default()
        }
    }

    /// Adds what `event`, logged `at`, says about the job's life: its submission, start,
    /// executors and end; [`JobHistory::apply_training`] the rest.
    fn apply(&mut self, at: String, event: Event) {
        match event {
            Event::Submitted {
                name,
                kind,
                executors,
                epochs,
                steps_per_epoch,
                rows,
                batch_size,
                model,
                device,
                resumed_from,
                memory,
            } => {
                self.name = name;
                self.kind = Some(kind);
                self.submitted_at = Some(at);
                self.plan = Plan {
                    executors,
                    epochs,
                    steps_per_epoch,
                    rows,
                    batch_size,
                    model,
                    device,
                    resumed_from,
                    memory,
                };
            }
            Event::Started { ranks } => {
                self.started_at = Some(at);
                self.executors = ranks;
            }
            Event::ExecutorRegistered { executor_id, host } => self.registered.push(Registered {
                executor_id,
                host,
                at,
            }),
            Event::ExecutorLost {
                rank,
                executor_id,
                host,
                reason,
            } => self.lost.push(Lost {
                rank,
                executor_id,
                host,
                reason,
                at,
            }),
            Event::Finished {
                state,
                error,
                summary,
            } => {
                self.state = state;
                self.error = error;
                self.finished_at = Some(at);
                self.model_path = summary
                    .as_ref()
                    .and_then(|s| s.get("model_path"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.summary = summary;
            }
            other => self.apply_training(at, other),
        }
    }

    /// Adds what `event`, logged `at`, says about the training: epochs, checkpoints,
    /// recoveries and test figures.
    fn apply_training(&mut self, at: String, event: Event) {
        match event {
            Event::EpochEnd {
                epoch,
                steps,
                loss,
                samples,
                dropped_samples,
                seconds,
                samples_per_s,
                phases,
                tokens,
                padding,
                tokens_per_s,
            } => {
                // An epoch run again after a recovery replaces its earlier run's record.
                self.epochs.retain(|e| e.epoch < epoch);
                let counts = Tokens::new(tokens.unwrap_or(0), padding.unwrap_or(0));
                self.epochs.push(EpochRow {
                    epoch,
                    steps,
                    loss,
                    samples,
                    dropped_samples,
                    seconds,
                    samples_per_s,
                    phases,
                    phase_percent: phases.percent().map(|p| (p * 10.0).round() / 10.0),
                    tokens,
                    padding,
                    tokens_per_s,
                    padding_fraction: counts.map(|t| t.padding_fraction()),
                    test: None,
                })
            }
            Event::Checkpoint {
                epochs_done,
                step,
                path,
                seconds,
            } => self.checkpoints.push(Checkpoint {
                epochs_done,
                step,
                path,
                seconds,
                at,
            }),
            Event::Recovery {
                generation,
                world_before,
                world_after,
                lost,
                joined,
                waited_s,
                cause,
            } => self.recoveries.push(Recovery {
                generation,
                world_before,
                world_after,
                lost,
                joined,
                waited_s,
                cause,
                at,
            }),
            Event::Evaluated {
                epoch,
                rows,
                loss,
                accuracy,
                mse,
                per_token,
                entities,
            } => self.tested(
                epoch,
                Test {
                    rows,
                    loss,
                    accuracy,
                    mse,
                    per_token,
                    entities,
                },
            ),
            _ => {}
        }
    }

    /// The test split was evaluated after `epoch` while training went on, or (`None`) after
    /// training: the figures go to that epoch's row, and to the job's after training.
    fn tested(&mut self, epoch: Option<u64>, test: Test) {
        match epoch {
            // The epoch's row is the latest of that epoch (one may be redone).
            Some(epoch) => {
                if let Some(row) = self.epochs.iter_mut().rev().find(|r| r.epoch == epoch) {
                    row.test = Some(test);
                }
            }
            None => {
                if let Some(row) = self.epochs.last_mut() {
                    row.test = Some(test.clone());
                }
                self.test = Some(test);
            }
        }
    }
}

#[cfg(test)]
mod tests;
