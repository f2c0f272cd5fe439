//! The job manager ([`JobManager`]): every job the driver knows, and the queue of those that
//! wait for executors. This file owns:
//!
//! - **Planning.** A submitted spec is checked and planned (Parquet footers only) before it is
//!   queued; so is an evaluation or prediction of a saved model. What its messages would
//!   carry is checked against their bounds ([`super::bounds`]).
//! - **Job ids.** `<name>-<yyyyMMddHHmmss>-<tag>-<NNNN>`, like Spark's application ids: the
//!   submission time (UTC), a random tag drawn once per driver and the driver's job counter, so
//!   that two drivers, even started in the same second, never give two jobs one id.
//! - **Submission.** A job is queued with its event log opened (`<checkpoint_dir>/events.jsonl`,
//!   [`crate::events`]) and the lock on its output directory ([`crate::outputs::lock`]), which
//!   it holds until it ends.
//! - **Ending a waiting job.** Cancellation, and failure of a job that still waits.
//!
//! Matching queued jobs to executors is [`super::rendezvous`]'s; forgetting old finished jobs
//! is [`super::retention`]'s.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use ringflow_core::pb;
use ringflow_core::spec::{JobSpec, Metric, SpecAsWritten};
use ringflow_core::wire::payload;
use ringflow_ml::nn::ModelRegistry;
use tracing::info;

use super::bounds;
use super::job::{Job, JobKind};
use super::{Refusal, Scheduler};
use crate::error::{DriverError, JobError};
use crate::outputs::DirLock;
use crate::planner::JobPlan;
use crate::planner::saved_error::ModelDirError;

/// What of its training's preprocessing an evaluation or prediction planned as `plan` needs,
/// described; `None` when it needs none.
fn needed_preprocessing(plan: &JobPlan) -> Option<&'static str> {
    let spec = &plan.spec;
    if spec.train.metrics.contains(&Metric::EntityF1) {
        Some("the tag classes (for train.metrics = [\"entity_f1\"])")
    } else if plan.string_label {
        Some("the classes of its string labels")
    } else if spec.data.normalize.is_some() {
        Some("the means and deviations of data.normalize")
    } else {
        None
    }
}

/// The jobs of a driver, and the queue of those that wait for executors.
pub(super) struct JobManager {
    jobs: BTreeMap<String, Job>,
    queue: VecDeque<String>,
    next_job: u64,
    /// Four random base-36 characters of every job id of this driver.
    id_tag: String,
    /// Whether jobs write event logs.
    event_logs: bool,
    /// Finished jobs forgotten so far ([`super::retention`]).
    forgotten: u64,
}

impl JobManager {
    /// No jobs; jobs write event logs.
    pub fn new() -> JobManager {
        JobManager {
            jobs: BTreeMap::new(),
            queue: VecDeque::new(),
            next_job: 1,
            id_tag: random_tag(),
            event_logs: true,
            forgotten: 0,
        }
    }

    /// Jobs submitted from now on write no event logs.
    pub fn without_event_logs(&mut self) {
        self.event_logs = false;
    }

    /// The job `id`.
    pub fn get(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// The job `id`, mutable.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Job> {
        self.jobs.get_mut(id)
    }

    /// The job `id`, mutable, or the error that names the unknown id.
    pub fn find_mut(&mut self, id: &str) -> Result<&mut Job, JobError> {
        self.jobs
            .get_mut(id)
            .ok_or_else(|| JobError::NoSuchJob(id.to_string()))
    }

    /// Every job, by id.
    pub fn values(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// Every job, by id, mutable.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Job> {
        self.jobs.values_mut()
    }

    /// Forgets job `id` (a finished one, [`super::retention`]).
    pub fn forget(&mut self, id: &str) {
        if self.jobs.remove(id).is_some() {
            self.forgotten += 1;
        }
    }

    /// How many finished jobs were forgotten so far.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// The ids of the queued jobs, oldest first.
    pub fn queued(&self) -> Vec<String> {
        self.queue.iter().cloned().collect()
    }

    /// The oldest queued job's id.
    pub fn first_queued(&self) -> Option<&str> {
        self.queue.front().map(String::as_str)
    }

    /// Takes job `id` off the queue.
    pub fn dequeue(&mut self, id: &str) {
        self.queue.retain(|j| j != id);
    }

    /// Adds a line for people to the jobs that wait for executors.
    pub fn message_waiting(&mut self, text: &str) {
        for id in &self.queue {
            if let Some(j) = self.jobs.get_mut(id) {
                j.message(text.to_string());
            }
        }
    }

    /// A new id for a job named `name` (see the module docs).
    fn new_id(&mut self, name: &str) -> String {
        let stamp = crate::events::compact_utc(std::time::SystemTime::now());
        let id = format!("{name}-{stamp}-{}-{:04}", self.id_tag, self.next_job);
        self.next_job += 1;
        id
    }

    /// Queues `job`.
    fn enqueue(&mut self, mut job: Job) {
        if self.event_logs {
            job.open_event_log();
        }
        info!(job = %job.id, "job submitted");
        self.queue.push_back(job.id.clone());
        self.jobs.insert(job.id.clone(), job);
    }
}

/// Four random characters of `0-9a-z`.
fn random_tag() -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 4];
    rand::fill(&mut bytes);
    bytes
        .iter()
        .map(|b| DIGITS[usize::from(*b) % DIGITS.len()] as char)
        .collect()
}

impl Scheduler {
    /// Checks and plans a training job (planning reads Parquet footers), kept with the spec
    /// as its user `written` it; its checkpoint directory must be able to become a writable
    /// directory.
    pub fn plan_job(
        registry: &ModelRegistry,
        spec: &str,
        resume: bool,
        written: Option<SpecAsWritten>,
    ) -> Result<JobPlan, DriverError> {
        let spec: JobSpec = payload::decode("SubmitRequest.spec", spec)?;
        spec.validate(std::path::Path::new("<submitted spec>"))?;
        // Where the job writes must be usable before its data is even listed.
        crate::outputs::check_dir("cluster.checkpoint_dir", &spec.checkpoint_dir())?;
        bounds::check_written(written.as_ref())?;
        let mut plan = JobPlan::new(spec, registry)?;
        plan.written = written;
        if resume {
            plan.resume = Some(crate::planner::resume_point(&plan.spec)?);
        }
        let preprocessing = super::job::training_preprocessing(&plan);
        let what = match &plan.sequence {
            Some(s) => format!(
                "data.train: the vocabulary and classes of column `{}`",
                s.columns.column
            ),
            None => "data.label_classes".into(),
        };
        let fix = "lower data.vocab.max_size or data.vocab.max_token_bytes";
        bounds::check_preprocessing(preprocessing.len(), &what, fix)?;
        bounds::check_messages(&plan)?;
        Ok(plan)
    }

    /// Checks and plans evaluation or prediction (`predict`: output and id column;
    /// `overwrite`: `--overwrite`) of the model saved in `model_dir` over `data`; returns the
    /// plan and the model's preprocessing (a payload, empty for none). A prediction's output that overlaps what the
    /// job reads, or that holds anything without `overwrite`, is refused here.
    pub fn plan_inference(
        registry: &ModelRegistry,
        model_dir: &str,
        data: &str,
        predict: Option<&(String, String)>,
        overwrite: bool,
    ) -> Result<(JobPlan, String), DriverError> {
        use crate::outputs::prediction;
        if let Some((output, _)) = predict {
            crate::outputs::check_dir("--output", output)?;
        }
        let saved = crate::planner::saved_model(model_dir, registry)?;
        if let Some((output, _)) = predict {
            let inputs = prediction::inputs(model_dir, data, &saved.spec);
            prediction::check_inputs(output, &inputs)?;
            prediction::check_existing(output, overwrite)?;
        }
        let preprocessing = payload::encode_optional(saved.preprocessing.as_ref());
        let mut plan = JobPlan::inference(saved.spec, data, registry, predict.is_none())?;
        if preprocessing.is_empty()
            && let Some(what) = needed_preprocessing(&plan)
        {
            return Err(ModelDirError::NoPreprocessing {
                model_dir: model_dir.to_string(),
                needs: what,
            }
            .into());
        }
        // Without SQL the id column is read from the files; with SQL it must be in the query's
        // output, which executors check.
        if let Some((_, id)) = predict
            && !id.is_empty()
            && plan.spec.data.sql.is_none()
            && !plan.input_columns.contains(id)
        {
            plan.input_columns.push(id.clone());
        }
        let what = format!("--model {model_dir}: the saved preprocessing");
        let fix = "train the model again with a smaller data.vocab.max_size";
        bounds::check_preprocessing(preprocessing.len(), &what, fix)?;
        bounds::check_messages(&plan)?;
        Ok((plan, preprocessing))
    }

    /// A new job id for a job named `name`: `<name>-<yyyyMMddHHmmss>-<tag>-<NNNN>`, unique
    /// across drivers and runs (see the module docs).
    pub fn new_job_id(&mut self, name: &str) -> String {
        self.jobs.new_id(name)
    }

    /// Queues a planned job; returns its id.
    pub fn submit(&mut self, kind: JobKind, now: Instant) -> String {
        let id = self.new_job_id(&kind.name());
        self.submit_as(id, kind, None, now)
    }

    /// Queues a planned job under `id` (from [`Scheduler::new_job_id`]), holding `lock`, the
    /// lock on its output directory, until it ends; returns the id.
    pub fn submit_as(
        &mut self,
        id: String,
        kind: JobKind,
        lock: Option<DirLock>,
        now: Instant,
    ) -> String {
        let mut job = Job::new(id.clone(), kind, now);
        if let Some(lock) = lock {
            job.hold(lock);
        }
        self.jobs.enqueue(job);
        id
    }

    /// Releases the output locks of every job (the driver is shutting down, and its jobs with
    /// it).
    pub fn release_locks(&mut self) {
        for job in self.jobs.values_mut() {
            job.release_lock();
        }
    }

    /// A job by id.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// A job by id, mutable.
    pub fn job_mut(&mut self, id: &str) -> Option<&mut Job> {
        self.jobs.get_mut(id)
    }

    /// All jobs, by id.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// Cancels a job; false if it had already ended.
    pub fn cancel(&mut self, job_id: &str, now: Instant) -> Result<bool, Refusal> {
        let job = self.jobs.find_mut(job_id)?;
        if job.is_finished() {
            return Ok(false);
        }
        job.cancel(now);
        self.jobs.dequeue(job_id);
        self.release_finished();
        Ok(true)
    }

    /// Fails job `job_id` with `error` if it still waits for its executors; returns whether it
    /// did.
    pub fn fail_waiting(&mut self, job_id: &str, error: JobError, now: Instant) -> bool {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return false;
        };
        if !matches!(job.state, pb::JobState::Queued | pb::JobState::Waiting) {
            return false;
        }
        job.fail(error, now);
        self.jobs.dequeue(job_id);
        true
    }
}
