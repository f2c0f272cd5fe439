//! One job's lifecycle: queued, waiting for executors, running, and how it ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringflow_ml::Device;
use ringflow_proto::pb::{self, JobState};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

use ringflow_proto::data::stats::MAX_CLASSES;
use ringflow_proto::data::{DataStats, Preprocessing};
use ringflow_proto::spec::DataSource;

use ringflow_proto::data::paths;

use crate::events::{Event, EventLog, RankInfo, ResumedFrom, micros};
use crate::outputs::DirLock;
use crate::planner::JobPlan;
use crate::planner::memory::MemoryEstimate;
use crate::progress::JobProgress;
use crate::summary::JobSummary;
use ringflow_proto::phases::PhaseTimes;

mod log;
mod prepare;
mod progress;
mod recovery;

/// What a job does.
#[derive(Debug)]
pub enum JobKind {
    /// Train the planned job.
    Train(Box<JobPlan>),
    /// Evaluate a saved model (`predict: None`) or write its predictions.
    Infer {
        /// The saved model's spec, with the data set as the test split.
        plan: Box<JobPlan>,
        /// Executors to spread the data over.
        executors: usize,
        /// The saved model's directory.
        model_dir: String,
        /// For prediction: the output directory and the id column (may be empty).
        predict: Option<(String, String)>,
        /// The saved model's preprocessing (JSON).
        preprocessing_json: String,
    },
    /// Time ring all-reduces on `executors` executors.
    Bench {
        /// Ranks in the ring.
        executors: usize,
        /// Sizes and counts.
        spec: pb::BenchSpec,
    },
}

impl JobKind {
    /// The job's name.
    pub fn name(&self) -> String {
        match self {
            JobKind::Train(plan) => plan.spec.name.clone(),
            JobKind::Infer { plan, predict, .. } => match predict {
                Some(_) => format!("predict-{}", plan.spec.name),
                None => format!("eval-{}", plan.spec.name),
            },
            JobKind::Bench { .. } => "bench-allreduce".into(),
        }
    }

    /// The directory the job writes into and locks while it runs, with the key or flag that
    /// named it: a training job's checkpoint directory, a prediction's output. Evaluations
    /// and benchmarks write none (an evaluation only appends to its model's event log).
    pub fn output_dir(&self) -> Option<(&'static str, String)> {
        match self {
            JobKind::Train(plan) => Some(("cluster.checkpoint_dir", plan.spec.checkpoint_dir())),
            JobKind::Infer {
                predict: Some((output, _)),
                ..
            } => Some(("--output", output.clone())),
            JobKind::Infer { .. } | JobKind::Bench { .. } => None,
        }
    }

    /// What one executor needs for the job ([`MemoryEstimate`]).
    pub fn memory_estimate(&self) -> MemoryEstimate {
        match self {
            JobKind::Train(plan) => MemoryEstimate::training(plan, plan.spec.cluster.executors),
            JobKind::Infer {
                plan,
                executors,
                predict,
                ..
            } => MemoryEstimate::inference(plan, *executors, predict.is_some()),
            JobKind::Bench { spec, .. } => MemoryEstimate::bench(spec.floats, spec.check),
        }
    }
}

/// The summary of a benchmark job.
#[derive(Clone, Debug, Serialize)]
pub struct BenchSummary {
    /// The job id.
    pub job_id: String,
    /// `"succeeded"` or `"failed"`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
    /// Ranks in the ring.
    pub executors: usize,
    /// Floats per all-reduce.
    pub floats: u64,
    /// Seconds of each timed all-reduce on rank 0.
    pub seconds: Vec<f64>,
}

/// Step spans (`--timeline`) a job keeps for its watchers, all ranks together: about 12 MB.
/// Later spans are dropped, with a message.
pub const MAX_JOB_SPANS: usize = 250_000;

/// How long ending a job waits for its event log to reach storage.
const EVENT_LOG_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How long ending a job waits for the lock on its output directory to be removed.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// A job and everything that happened to it.
pub struct Job {
    /// The job's id.
    pub id: String,
    /// What it does.
    pub kind: JobKind,
    /// Where it is in its lifecycle.
    pub state: JobState,
    /// When it was submitted.
    pub submitted: Instant,
    ended: Option<Instant>,
    ranks: Vec<pb::ExecutorInfo>,
    secret: [u8; 32],
    progress: JobProgress,
    finished: Vec<bool>,
    error: Option<String>,
    bench_seconds: Vec<f64>,
    last_step: Vec<Option<pb::StepReport>>,
    events: Vec<pb::JobEvent>,
    event_count: watch::Sender<usize>,
    plans: Mutex<Option<(u64, Vec<pb::EpochPlan>)>>,
    epochs_done: u64,
    prepare: Prepare,
    generation: u32,
    recovery: Option<Recovery>,
    recoveries: u32,
    executors_lost: Vec<String>,
    joiners: BTreeSet<String>,
    /// Idle executors could join (set by the scheduler); the ring is re-formed at the next
    /// epoch boundary.
    joinable: bool,
    /// The epoch before which the ring is re-formed to add executors.
    reform_before: Mutex<Option<u64>>,
    /// `<checkpoint_dir>/events.jsonl`, once opened by the scheduler.
    log: Option<EventLog>,
    /// The test split's evaluation went into the event log.
    evaluation_logged: bool,
    /// Step spans forwarded to watchers so far.
    spans_kept: usize,
    /// The lock on the job's output directory, held until the job ends.
    lock: Option<DirLock>,
    /// What one executor needs for the job.
    memory: MemoryEstimate,
    /// A rank's communication error, held (since the instant) while a root cause may come.
    held_error: Option<(String, Instant)>,
}

/// A ring being re-formed: which ranks asked to recover (with their error), which were lost
/// (with the cause).
#[derive(Debug, Default)]
struct Recovery {
    asked: BTreeMap<usize, String>,
    /// Ranks that asked before they had the job's state (joiners whose ring broke first).
    awaiting: BTreeSet<usize>,
    lost: BTreeMap<usize, String>,
    started: Option<Instant>,
}

/// Partials of the two preparation phases, per rank, and their merged results.
#[derive(Debug, Default)]
struct Prepare {
    source: Vec<Option<String>>,
    source_merged: Option<String>,
    stats: Vec<Option<DataStats>>,
    stats_merged: Option<String>,
}

impl Job {
    /// A queued job.
    pub fn new(id: String, kind: JobKind, now: Instant) -> Job {
        let (event_count, _) = watch::channel(0);
        let memory = kind.memory_estimate();
        let mut job = Job {
            id,
            kind,
            state: JobState::Queued,
            submitted: now,
            ended: None,
            ranks: Vec::new(),
            secret: [0; 32],
            progress: JobProgress::new(1),
            finished: Vec::new(),
            error: None,
            bench_seconds: Vec::new(),
            last_step: Vec::new(),
            events: Vec::new(),
            event_count,
            plans: Mutex::new(None),
            epochs_done: 0,
            prepare: Prepare::default(),
            generation: 0,
            recovery: None,
            recoveries: 0,
            executors_lost: Vec::new(),
            joiners: BTreeSet::new(),
            joinable: false,
            reform_before: Mutex::new(None),
            log: None,
            evaluation_logged: false,
            spans_kept: 0,
            lock: None,
            memory,
            held_error: None,
        };
        let intro = match &job.kind {
            JobKind::Train(plan) => format!(
                "job {}: {} training rows in {} row groups, {} steps per epoch on each of {} executors",
                job.id,
                plan.train_rows(),
                plan.train.len(),
                plan.steps_per_epoch(plan.spec.cluster.executors),
                plan.spec.cluster.executors
            ),
            JobKind::Infer {
                plan,
                executors,
                predict,
                ..
            } => format!(
                "job {}: {} {} rows in {} row groups on {executors} executors",
                job.id,
                if predict.is_some() {
                    "predicting"
                } else {
                    "evaluating"
                },
                plan.test_rows(),
                plan.test.len(),
            ),
            JobKind::Bench { executors, spec } => format!(
                "job {}: {} timed all-reduces of {} floats on {executors} executors",
                job.id, spec.iters, spec.floats
            ),
        };
        job.message(intro);
        job.message(format!("memory: {}", job.memory.summary()));
        if let JobKind::Train(plan) | JobKind::Infer { plan, .. } = &job.kind {
            let warnings: Vec<String> = plan.warnings.clone();
            for w in warnings {
                // People see it as a job message; the driver's log keeps it too.
                info!(job = %job.id, "{w}");
                job.message(format!("warning: {w}"));
            }
        }
        job.set_state(JobState::Waiting);
        job.message(format!("waiting for {} executors", job.executors_needed()));
        job
    }

    /// What one executor needs for the job, estimated when it was submitted.
    pub fn memory(&self) -> &MemoryEstimate {
        &self.memory
    }

    /// Executors the job trains on.
    pub fn executors_needed(&self) -> usize {
        match &self.kind {
            JobKind::Train(plan) => plan.spec.cluster.executors,
            JobKind::Infer { executors, .. } | JobKind::Bench { executors, .. } => *executors,
        }
    }

    /// The device the job's executors must have: `cluster.device` for training and inference,
    /// the CPU for benchmarks.
    pub fn device(&self) -> Device {
        match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => plan.spec.cluster.device,
            JobKind::Bench { .. } => Device::Cpu,
        }
    }

    /// How long the job may wait for its executors.
    pub fn rendezvous_timeout(&self) -> Duration {
        match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => {
                Duration::from_secs(plan.spec.cluster.rendezvous_timeout_s)
            }
            JobKind::Bench { .. } => Duration::from_secs(60),
        }
    }

    fn comm_timeout(&self) -> Duration {
        match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => {
                Duration::from_secs(plan.spec.cluster.comm_timeout_s)
            }
            JobKind::Bench { .. } => Duration::from_secs(60),
        }
    }

    /// True once the job succeeded, failed or was cancelled.
    pub fn is_finished(&self) -> bool {
        matches!(
            self.state,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// True when running tasks should stop.
    pub fn should_stop(&self) -> bool {
        self.is_finished()
    }

    /// Why it failed.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Epochs completed by every rank.
    pub fn epochs_done(&self) -> u64 {
        self.epochs_done
    }

    /// Seconds since submission (or until the end).
    pub fn age(&self, now: Instant) -> f64 {
        self.ended
            .unwrap_or(now)
            .duration_since(self.submitted)
            .as_secs_f64()
    }

    /// The job's secret (authenticates ring connections and Flight tickets).
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The latest in-epoch progress report of `rank`, if any (for the web UI).
    pub fn last_step(&self, rank: usize) -> Option<&pb::StepReport> {
        self.last_step.get(rank)?.as_ref()
    }

    /// The step-phase times of `rank`'s latest reported epoch (for the web UI).
    pub fn last_phases(&self, rank: usize) -> Option<pb::PhaseTimes> {
        self.progress.latest_phases(rank)
    }

    /// When the job ended, if it has.
    pub fn ended(&self) -> Option<Instant> {
        self.ended
    }

    /// The executors of the running job, by rank.
    pub fn ranks(&self) -> &[pb::ExecutorInfo] {
        &self.ranks
    }

    /// An executor registered with the driver while this job waits or runs.
    pub fn executor_registered(&mut self, info: &pb::ExecutorInfo) {
        if !self.is_finished() {
            self.log(Event::ExecutorRegistered {
                executor_id: info.executor_id.clone(),
                host: info.host.clone(),
            });
        }
    }

    /// Forwards `rank`'s step spans to watchers (`--timeline`), up to [`MAX_JOB_SPANS`] per job.
    fn forward_spans(&mut self, rank: usize, mut spans: Vec<pb::StepSpan>) {
        if spans.is_empty() || self.spans_kept >= MAX_JOB_SPANS {
            return;
        }
        let room = MAX_JOB_SPANS - self.spans_kept;
        if spans.len() >= room {
            spans.truncate(room);
            self.message(format!(
                "timeline: the job keeps the first {MAX_JOB_SPANS} step spans of its ranks; later \
                 steps are left out"
            ));
        }
        self.spans_kept += spans.len();
        let (executor_id, host) = self
            .ranks
            .get(rank)
            .map(|e| (e.executor_id.clone(), e.host.clone()))
            .unwrap_or_default();
        self.push(pb::job_event::Event::Spans(pb::RankSpans {
            rank: rank as u32,
            executor_id,
            host,
            generation: self.generation,
            spans,
        }));
    }

    /// Adds a line for people to the job's events.
    pub fn message(&mut self, text: String) {
        self.push(pb::job_event::Event::Message(text));
    }

    fn set_state(&mut self, state: JobState) {
        self.state = state;
        self.push(pb::job_event::Event::State(state as i32));
    }

    /// Starts the job on `ranks` (index = rank).
    pub fn start(&mut self, ranks: Vec<pb::ExecutorInfo>, _now: Instant) {
        let n = ranks.len();
        rand::fill(&mut self.secret);
        for (rank, e) in ranks.iter().enumerate() {
            let line = format!(
                "rank {rank}: executor {} on {} (ring {})",
                e.executor_id, e.host, e.ring_address
            );
            self.message(line);
        }
        info!(job = %self.id, executors = n, "job started");
        self.ranks = ranks;
        self.progress = JobProgress::new(n);
        if let JobKind::Train(plan) = &self.kind
            && let Some(r) = plan.resume
        {
            self.epochs_done = r.epoch;
            self.message(format!(
                "resuming from the checkpoint at epoch {} step {}",
                r.epoch, r.step
            ));
        }
        self.finished = vec![false; n];
        self.last_step = vec![None; n];
        self.prepare = Prepare {
            source: vec![None; n],
            stats: vec![None; n],
            ..Default::default()
        };
        let ranks = self.rank_infos();
        self.log(Event::Started { ranks });
        self.set_state(JobState::Running);
    }

    /// The task of `rank`.
    pub fn task_for(&self, rank: u32) -> pb::Task {
        let ring = self.ranks.iter().map(|e| e.ring_address.clone()).collect();
        let base = pb::Task {
            job_id: self.id.clone(),
            rank,
            ring,
            generation: self.generation,
            secret: self.secret.to_vec(),
            ring_timeout_ms: self.comm_timeout().as_millis() as u64,
            ..Default::default()
        };
        match &self.kind {
            JobKind::Train(plan) => {
                let (moments, labels) = plan.needs_stats();
                let given = plan
                    .spec
                    .data
                    .label_classes
                    .clone()
                    .map(|classes| Preprocessing {
                        normalize: None,
                        classes: Some(classes),
                    });
                pb::Task {
                    kind: pb::TaskKind::Train as i32,
                    spec_json: plan.spec.to_json(),
                    backup_workers: plan.spec.cluster.backup_workers as u32,
                    steps_per_epoch: plan.steps_per_epoch(self.ranks.len()),
                    model_dir: plan.spec.model_dir(),
                    input_columns: plan.input_columns.clone(),
                    preprocessing_json: match (&self.prepare.stats_merged, given) {
                        // A joiner gets the statistics the others computed.
                        (Some(merged), _) => merged.clone(),
                        (None, given) => given.map(|p| p.to_json()).unwrap_or_default(),
                    },
                    collect_moments: moments && self.generation == 0,
                    collect_labels: labels && self.generation == 0,
                    resume: plan.resume.is_some(),
                    elastic: plan.spec.cluster.min_executors.is_some(),
                    join: self
                        .joiners
                        .contains(&self.ranks[rank as usize].executor_id),
                    ..self.source_fields(plan, base)
                }
            }
            JobKind::Infer {
                plan,
                model_dir,
                predict,
                preprocessing_json,
                ..
            } => {
                let (kind, output, id_column) = match predict {
                    Some((o, id)) => (pb::TaskKind::Predict, o.clone(), id.clone()),
                    None => (pb::TaskKind::Eval, String::new(), String::new()),
                };
                pb::Task {
                    kind: kind as i32,
                    spec_json: plan.spec.to_json(),
                    model_dir: model_dir.clone(),
                    input_columns: plan.input_columns.clone(),
                    preprocessing_json: preprocessing_json.clone(),
                    output,
                    id_column,
                    ..self.source_fields(plan, base)
                }
            }
            JobKind::Bench { spec, .. } => pb::Task {
                kind: pb::TaskKind::BenchAllreduce as i32,
                bench: Some(*spec),
                ..base
            },
        }
    }

    /// The data-source fields of a task.
    fn source_fields(&self, plan: &JobPlan, base: pb::Task) -> pb::Task {
        let source = match self.prepare.source_merged.as_deref() {
            // Decided already (a re-formed ring): joiners read the same way.
            Some("driver") => DataSource::Driver,
            Some(_) => DataSource::Direct,
            None => plan.spec.data.source,
        };
        pb::Task {
            probe_source: source == DataSource::Auto,
            source_driver: source == DataSource::Driver,
            files: if source == DataSource::Auto {
                plan.files.clone()
            } else {
                Vec::new()
            },
            ..base
        }
    }

    /// The plan of a training or inference job.
    pub fn plan(&self) -> Option<&JobPlan> {
        match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => Some(plan),
            JobKind::Bench { .. } => None,
        }
    }

    /// `rank`'s partitions of `split` for `epoch`.
    pub fn epoch_plan(&self, rank: usize, split: pb::Split, epoch: u64) -> Option<pb::EpochPlan> {
        let plan = self.plan()?;
        let world = self.ranks.len();
        if rank >= world {
            return None;
        }
        match split {
            pb::Split::Test => return plan.test_split(world).into_iter().nth(rank),
            pb::Split::Stats => return plan.stats_split(world).into_iter().nth(rank),
            pb::Split::Train => {}
        }
        let mut cache = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let mut reform = self.reform_before.lock().unwrap_or_else(|p| p.into_inner());
        if cache.as_ref().is_none_or(|(e, _)| *e != epoch) {
            *cache = Some((epoch, plan.train_epoch(epoch, world)));
            // At an epoch boundary (never the first epoch of this ring's plan), idle executors
            // join: every rank is told to re-form before training this epoch.
            let max = plan
                .spec
                .cluster
                .max_executors
                .unwrap_or(plan.spec.cluster.executors);
            if self.joinable && self.is_elastic() && epoch > 0 && world < max && reform.is_none() {
                *reform = Some(epoch);
            }
        }
        let mut out = cache
            .as_ref()
            .and_then(|(_, plans)| plans.get(rank).cloned())?;
        // A pending recovery also re-forms at the boundary: with backup workers the survivors
        // of a lost executor may reach it without a failed collective.
        out.reform = *reform == Some(epoch) || self.recovery.is_some();
        Some(out)
    }

    /// Whether idle executors are waiting that this job could take (elastic jobs add them at
    /// the next epoch boundary).
    pub fn set_joinable(&mut self, joinable: bool) {
        self.joinable = joinable;
    }

    fn rank_infos(&self) -> Vec<RankInfo> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(rank, e)| RankInfo {
                rank,
                executor_id: e.executor_id.clone(),
                host: e.host.clone(),
            })
            .collect()
    }

    fn describe_rank(&self, rank: usize) -> String {
        match self.ranks.get(rank) {
            Some(e) => format!("rank {rank} (executor {} on {})", e.executor_id, e.host),
            None => format!("rank {rank}"),
        }
    }

    /// Fails the job (once; later failures are consequences and are only logged).
    pub fn fail(&mut self, error: String, now: Instant) {
        if self.is_finished() {
            warn!(job = %self.id, "after the job ended: {error}");
            return;
        }
        warn!(job = %self.id, "job failed: {error}");
        self.error = Some(error);
        self.end(JobState::Failed, now);
    }

    /// Cancels the job.
    pub fn cancel(&mut self, now: Instant) {
        if !self.is_finished() {
            self.message("cancelled".into());
            self.end(JobState::Cancelled, now);
        }
    }

    fn end(&mut self, state: JobState, now: Instant) {
        self.ended = Some(now);
        let wall_s = now.duration_since(self.submitted).as_secs_f64();
        let json = match &self.kind {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => {
                let mut s = JobSummary::new(
                    &self.kind.name(),
                    &self.id,
                    self.ranks.len().max(self.executors_needed()),
                    plan.spec.train.loss.is_classification(),
                    &self.progress,
                    wall_s,
                    self.error.clone(),
                    state == JobState::Cancelled,
                );
                s.data_source = self.prepare.source_merged.clone().or_else(|| {
                    Some(match plan.spec.data.source {
                        DataSource::Driver => "driver".into(),
                        _ => "direct".into(),
                    })
                });
                s.recoveries = self.recoveries;
                s.executors_lost = self.executors_lost.len();
                if let JobKind::Infer { predict, .. } = &self.kind {
                    s.kind = if predict.is_some() { "predict" } else { "eval" }.into();
                    s.output = predict.as_ref().map(|(o, _)| o.clone());
                    s.model_path = None;
                }
                serde_json::to_string(&s)
            }
            JobKind::Bench { executors, spec } => serde_json::to_string(&BenchSummary {
                job_id: self.id.clone(),
                status: match state {
                    JobState::Succeeded => "succeeded",
                    JobState::Cancelled => "cancelled",
                    _ => "failed",
                }
                .into(),
                error: self.error.clone(),
                executors: *executors,
                floats: spec.floats,
                seconds: self.bench_seconds.clone(),
            }),
        };
        let json = json.expect("summaries serialize");
        if self.log.is_some() {
            self.log(Event::Finished {
                state: match state {
                    JobState::Succeeded => "succeeded",
                    JobState::Cancelled => "cancelled",
                    _ => "failed",
                }
                .into(),
                error: self.error.clone(),
                summary: serde_json::from_str(&json).ok(),
            });
            // The log is complete before watchers learn that the job ended.
            if let Some(log) = self.log.as_mut() {
                log.close(EVENT_LOG_CLOSE_WAIT);
            }
        }
        // So is the output directory free for the next job.
        self.release_lock();
        self.set_state(state);
        self.push(pb::job_event::Event::SummaryJson(json));
    }
}
