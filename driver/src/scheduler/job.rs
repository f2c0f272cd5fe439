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
use crate::progress::{JobProgress, PhaseSeconds};
use crate::summary::JobSummary;

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

    /// Every event so far, borrowed (for views that summarize them without copying).
    pub fn events(&self) -> &[pb::JobEvent] {
        &self.events
    }

    /// True while a client follows the job's events ([`Job::events_since`]'s receiver is
    /// alive): the job is not forgotten before its summary reaches that client.
    pub fn is_followed(&self) -> bool {
        self.event_count.receiver_count() > 0
    }

    /// Events from `from` on, and a receiver that changes when more arrive.
    pub fn events_since(&self, from: usize) -> (Vec<pb::JobEvent>, watch::Receiver<usize>) {
        (
            self.events.get(from..).unwrap_or_default().to_vec(),
            self.event_count.subscribe(),
        )
    }

    fn push(&mut self, event: pb::job_event::Event) {
        let at_s = self.submitted.elapsed().as_secs_f64();
        self.events.push(pb::JobEvent {
            job_id: self.id.clone(),
            at_s,
            event: Some(event),
        });
        self.event_count.send_replace(self.events.len());
    }

    /// Where the job's event log goes: `<checkpoint_dir>/events.jsonl` for training, the
    /// directory above the saved model (`<checkpoint_dir>` again) for evaluation and prediction;
    /// benchmarks have none.
    pub fn event_log_path(&self) -> Option<String> {
        match &self.kind {
            JobKind::Train(plan) => Some(plan.spec.events_path()),
            JobKind::Infer { model_dir, .. } => paths::split_last(model_dir)
                .filter(|(dir, name)| {
                    name == ringflow_proto::spec::MODEL_DIR && !paths::is_filesystem_root(dir)
                })
                .map(|(dir, _)| crate::events::log_path(&dir)),
            JobKind::Bench { .. } => None,
        }
    }

    /// Holds `lock`, the lock on the job's output directory, until the job ends; what it says
    /// (a takeover, a store that cannot be locked) goes to the job's messages.
    pub fn hold(&mut self, lock: DirLock) {
        if let Some(note) = lock.note() {
            self.message(note.to_string());
        }
        self.lock = Some(lock);
    }

    /// Fails the job when another job took over the lock on its output directory.
    pub fn check_lock(&mut self, now: Instant) {
        if self.is_finished() {
            return;
        }
        if let Some(why) = self.lock.as_ref().and_then(DirLock::lost) {
            self.lock = None;
            self.fail(why, now);
        }
    }

    /// Removes the lock on the job's output directory, if it holds one.
    pub fn release_lock(&mut self) {
        if let Some(mut lock) = self.lock.take() {
            lock.release(LOCK_RELEASE_WAIT);
        }
    }

    /// Starts the job's event log ([`crate::events`]) with its `submitted` event.
    pub fn open_event_log(&mut self) {
        let Some(path) = self.event_log_path() else {
            return;
        };
        self.log = Some(EventLog::open(path, self.id.clone()));
        let executors = self.executors_needed();
        let name = self.kind.name();
        let event = match &self.kind {
            JobKind::Train(plan) => Event::Submitted {
                name,
                kind: "train".into(),
                executors,
                epochs: Some(plan.spec.train.epochs),
                steps_per_epoch: Some(plan.steps_per_epoch(executors)),
                rows: Some(plan.train_rows()),
                batch_size: Some(plan.spec.train.batch_size),
                model: Some(plan.spec.model.kind.clone()),
                device: Some(plan.spec.cluster.device.to_string()),
                resumed_from: plan.resume.map(|r| ResumedFrom {
                    epochs_done: r.epoch,
                    step: r.step,
                }),
                memory: Some(self.memory.clone()),
            },
            JobKind::Infer { plan, predict, .. } => Event::Submitted {
                name,
                kind: if predict.is_some() { "predict" } else { "eval" }.into(),
                executors,
                epochs: None,
                steps_per_epoch: None,
                rows: Some(plan.test_rows()),
                batch_size: None,
                model: Some(plan.spec.model.kind.clone()),
                device: Some(plan.spec.cluster.device.to_string()),
                resumed_from: None,
                memory: Some(self.memory.clone()),
            },
            JobKind::Bench { .. } => return,
        };
        self.log(event);
    }

    /// Appends `event` to the job's event log, if it has one.
    fn log(&mut self, event: Event) {
        let elapsed = self.submitted.elapsed().as_secs_f64();
        if let Some(log) = self.log.as_mut() {
            log.write(elapsed, event);
        }
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

    /// A rank's partial for a preparation phase (once), and the merged result when every rank
    /// has sent its own.
    pub fn prepare(
        &mut self,
        rank: usize,
        phase: pb::PreparePhase,
        partial: Option<&str>,
        now: Instant,
    ) -> std::result::Result<Option<String>, String> {
        if rank >= self.ranks.len() {
            return Err(format!("job {} has no rank {rank}", self.id));
        }
        let who = self.describe_rank(rank);
        match phase {
            pb::PreparePhase::Source => {
                if let Some(p) = partial {
                    self.prepare.source[rank] = Some(p.to_string());
                }
                if self.prepare.source_merged.is_none()
                    && self.prepare.source.iter().all(Option::is_some)
                {
                    let unreadable: Vec<String> = self
                        .prepare
                        .source
                        .iter()
                        .enumerate()
                        .filter_map(|(r, p)| {
                            p.as_ref()
                                .filter(|p| !p.is_empty())
                                .map(|p| format!("{}: {p}", self.describe_rank(r)))
                        })
                        .collect();
                    let merged = if unreadable.is_empty() {
                        self.message(
                            "every executor can read the data: reading it directly".into(),
                        );
                        "direct"
                    } else {
                        self.message(format!(
                            "serving the data from the driver over Arrow Flight, because {}",
                            unreadable.join("; ")
                        ));
                        "driver"
                    };
                    self.prepare.source_merged = Some(merged.into());
                }
                Ok(self.prepare.source_merged.clone())
            }
            pb::PreparePhase::Stats => {
                if let Some(p) = partial {
                    let stats: DataStats = serde_json::from_str(p)
                        .map_err(|e| format!("{who} sent unreadable statistics: {e}"))?;
                    self.prepare.stats[rank] = Some(stats);
                }
                if self.prepare.stats_merged.is_none()
                    && self.prepare.stats.iter().all(Option::is_some)
                {
                    let mut merged = DataStats::default();
                    for s in self.prepare.stats.iter_mut() {
                        merged.merge(s.take().unwrap_or_default());
                    }
                    match self.merge_stats(&merged) {
                        Ok(p) => self.prepare.stats_merged = Some(p.to_json()),
                        Err(e) => {
                            self.fail(e.clone(), now);
                            return Err(e);
                        }
                    }
                }
                Ok(self.prepare.stats_merged.clone())
            }
        }
    }

    fn merge_stats(&mut self, merged: &DataStats) -> std::result::Result<Preprocessing, String> {
        let Some(plan) = self.plan() else {
            return Err("only training jobs collect statistics".into());
        };
        let data = &plan.spec.data;
        let p = Preprocessing::from_stats(merged, data.label_classes.as_deref());
        let mut lines = Vec::new();
        if let Some(classes) = &p.classes {
            if classes.len() > MAX_CLASSES {
                return Err(format!(
                    "data.label: column `{}` has more than {MAX_CLASSES} distinct values; is it \
                     really a class?",
                    data.label
                ));
            }
            if classes.len() != plan.model.outputs {
                return Err(format!(
                    "data.label: column `{}` has {} distinct classes in data.train, but the model \
                     has {} outputs",
                    data.label,
                    classes.len(),
                    plan.model.outputs
                ));
            }
            lines.push(format!("{} label classes", classes.len()));
        }
        if let Some(m) = &merged.moments {
            lines.push(format!(
                "feature mean and standard deviation over {} rows",
                m.count
            ));
        }
        if !lines.is_empty() {
            self.message(format!("statistics of data.train: {}", lines.join(", ")));
        }
        Ok(p)
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

    /// How many times the ring was re-formed.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// True when the job survives lost executors.
    pub fn is_elastic(&self) -> bool {
        matches!(&self.kind, JobKind::Train(plan) if plan.spec.cluster.min_executors.is_some())
    }

    /// True while an elastic job re-forms its ring (an executor was lost or a rank asked).
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// Counts recoveries and lost executors into a summary.
    pub fn recoveries(&self) -> (u32, usize) {
        (self.recoveries, self.executors_lost.len())
    }

    /// The executor of `rank` stopped heartbeating: an elastic job re-forms its ring without it,
    /// any other job fails.
    pub fn rank_lost(&mut self, rank: usize, why: String, now: Instant) {
        if let Some(e) = self.ranks.get(rank).cloned()
            && !self.is_finished()
        {
            self.log(Event::ExecutorLost {
                rank,
                executor_id: e.executor_id,
                host: e.host,
                reason: why.clone(),
            });
        }
        // A rank already failed over its connections (held, waiting for this root cause): the
        // job cannot be recovered without it.
        if self.held_error.is_some()
            || !self.is_elastic()
            || self.state != JobState::Running
            || rank >= self.ranks.len()
        {
            self.fail(why, now);
            return;
        }
        if self.finished.iter().any(|&f| f) {
            // Training is over on some rank: there is no epoch left to re-form the ring for.
            self.fail(
                format!("{why}, after other ranks had finished the job; it cannot be recovered"),
                now,
            );
            return;
        }
        self.message(format!("{why}; re-forming the ring without it"));
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.lost.insert(rank, why);
        self.executors_lost
            .push(self.ranks[rank].executor_id.clone());
    }

    /// A rank of generation `generation` lost its ring (`error`). Returns its new task once the
    /// ring is re-formed, `Ok(None)` while it is not yet, and `Err` when it must stop.
    pub fn recover(
        &mut self,
        req: &pb::RecoverRequest,
        min_executors: usize,
        idle: Vec<pb::ExecutorInfo>,
        now: Instant,
    ) -> std::result::Result<Option<pb::Task>, String> {
        if self.is_finished() {
            return Err(format!("job {} has ended", self.id));
        }
        if req.generation < self.generation {
            // The ring was re-formed already: is this executor in it?
            return match self
                .ranks
                .iter()
                .position(|e| e.executor_id == req.executor_id)
            {
                Some(rank) if self.recovery.is_none() => Ok(Some(self.task_for(rank as u32))),
                Some(_) => Ok(None),
                None => Err("the ring was re-formed without this executor".into()),
            };
        }
        let rank = req.rank as usize;
        if !self.is_elastic() || rank >= self.ranks.len() {
            return Err(format!("job {} is not elastic", self.id));
        }
        if self.ranks[rank].executor_id != req.executor_id {
            return Err("the ring was re-formed without this executor".into());
        }
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.asked.entry(rank).or_insert_with(|| req.error.clone());
        let settled =
            (0..self.ranks.len()).all(|i| r.asked.contains_key(&i) || r.lost.contains_key(&i));
        if !settled {
            return Ok(None);
        }
        let recovery = self.recovery.take().expect("present");
        let survivors: Vec<pb::ExecutorInfo> = recovery
            .asked
            .keys()
            .filter(|i| !recovery.lost.contains_key(i))
            .map(|&i| self.ranks[i].clone())
            .collect();
        if survivors.len() < min_executors || survivors.is_empty() {
            let e = format!(
                "only {} executors remain after losing {}, fewer than cluster.min_executors = \
                 {min_executors}",
                survivors.len(),
                recovery.lost.len()
            );
            self.fail(e.clone(), now);
            return Err(e);
        }
        let waited = recovery
            .started
            .map_or(0.0, |s| now.duration_since(s).as_secs_f64());
        // The root cause: how a lost executor was lost, before the survivors' broken rings.
        let cause = recovery
            .lost
            .values()
            .chain(recovery.asked.values())
            .next()
            .cloned()
            .unwrap_or_default();
        self.generation += 1;
        let lost_any = !recovery.lost.is_empty();
        if lost_any {
            self.recoveries += 1;
        }
        // Re-formed because idle executors join at an epoch boundary, not because it broke.
        let at_boundary = self
            .reform_before
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some();
        let broke = lost_any || !at_boundary;
        let mut ranks = survivors;
        let order = |a: &pb::ExecutorInfo, b: &pb::ExecutorInfo| {
            (&a.host, &a.ring_address, &a.executor_id).cmp(&(
                &b.host,
                &b.ring_address,
                &b.executor_id,
            ))
        };
        ranks.sort_by(order);
        // Idle executors join after the survivors, so rank 0 (whose state everyone adopts) is
        // always a survivor.
        let max = match &self.kind {
            JobKind::Train(plan) => plan
                .spec
                .cluster
                .max_executors
                .unwrap_or(plan.spec.cluster.executors),
            _ => ranks.len(),
        };
        let mut joiners = idle;
        joiners.sort_by(order);
        joiners.truncate(max.saturating_sub(ranks.len()));
        self.joiners = joiners.iter().map(|e| e.executor_id.clone()).collect();
        for e in &joiners {
            self.message(format!(
                "executor {} on {} joins the job",
                e.executor_id, e.host
            ));
        }
        ranks.extend(joiners);
        if lost_any {
            self.message(format!(
                "recovery {}: the ring is re-formed with {} executors {waited:.1} s after it \
                 broke ({cause}); the epoch in progress restarts from its beginning",
                self.recoveries,
                ranks.len()
            ));
        } else if broke {
            // A rank hung for less than the heartbeat timeout (or the network blipped): every
            // rank asked to recover and none was lost.
            self.message(format!(
                "the ring is re-formed with the same {} executors {waited:.1} s after it broke \
                 ({cause}), with no executor lost; the epoch in progress restarts from its \
                 beginning",
                ranks.len()
            ));
        } else {
            self.message(format!(
                "the ring is re-formed with {} executors at an epoch boundary",
                ranks.len()
            ));
        }
        self.log(Event::Recovery {
            generation: self.generation,
            world_before: self.ranks.len(),
            world_after: ranks.len(),
            lost: recovery
                .lost
                .keys()
                .filter_map(|&r| self.ranks.get(r).map(|e| e.executor_id.clone()))
                .collect(),
            joined: self.joiners.iter().cloned().collect(),
            waited_s: micros(waited),
            cause: if broke { cause } else { String::new() },
        });
        rand::fill(&mut self.secret);
        let n = ranks.len();
        self.ranks = ranks;
        self.progress.regroup(n);
        self.finished = vec![false; n];
        self.last_step = vec![None; n];
        *self.plans.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let rank = self
            .ranks
            .iter()
            .position(|e| e.executor_id == req.executor_id)
            .expect("the caller survived");
        Ok(Some(self.task_for(rank as u32)))
    }

    /// Progress from a rank.
    pub fn report(
        &mut self,
        rank: usize,
        report: Option<pb::report_request::Report>,
        _now: Instant,
    ) {
        if self.is_finished() || rank >= self.ranks.len() {
            return;
        }
        let epochs = match &self.kind {
            JobKind::Train(plan) => plan.spec.train.epochs,
            JobKind::Infer { .. } | JobKind::Bench { .. } => 0,
        };
        match report {
            Some(pb::report_request::Report::Step(mut s)) => {
                let spans = std::mem::take(&mut s.spans);
                self.forward_spans(rank, spans);
                let (epoch, step, steps) = (s.epoch, s.step, s.steps);
                self.last_step[rank] = Some(s);
                if rank == 0 {
                    let latest: Vec<&pb::StepReport> = self
                        .last_step
                        .iter()
                        .flatten()
                        .filter(|r| r.epoch == epoch)
                        .collect();
                    let loss = latest.iter().map(|r| r.loss).sum::<f64>() / latest.len() as f64;
                    let rate: f64 = latest.iter().map(|r| r.samples_per_s).sum::<f64>()
                        * self.ranks.len() as f64
                        / latest.len() as f64;
                    self.push(pb::job_event::Event::Step(pb::StepProgress {
                        epoch,
                        epochs,
                        step,
                        steps,
                        loss,
                        samples_per_s: rate,
                    }));
                }
            }
            Some(pb::report_request::Report::Epoch(mut e)) => {
                let spans = std::mem::take(&mut e.spans);
                self.forward_spans(rank, spans);
                if let Some(done) = self.progress.epoch_done(rank, e) {
                    self.log(Event::EpochEnd {
                        epoch: done.epoch,
                        steps: done.steps,
                        loss: done.loss,
                        samples: done.samples,
                        dropped_samples: done.dropped_samples,
                        seconds: micros(done.seconds),
                        samples_per_s: (done.samples_per_s * 10.0).round() / 10.0,
                        phases: PhaseSeconds {
                            data: micros(done.phases.data),
                            forward: micros(done.phases.forward),
                            backward: micros(done.phases.backward),
                            allreduce: micros(done.phases.allreduce),
                            optimizer: micros(done.phases.optimizer),
                        },
                    });
                    self.epochs_done = done.epoch + 1;
                    info!(
                        job = %self.id,
                        epoch = done.epoch,
                        rows = done.samples,
                        dropped_rows = done.dropped_samples,
                        "epoch trained"
                    );
                    self.push(pb::job_event::Event::Epoch(pb::EpochDone {
                        epoch: done.epoch,
                        epochs,
                        steps: done.steps,
                        samples: done.samples,
                        loss: done.loss,
                        seconds: done.seconds,
                        samples_per_s: done.samples_per_s,
                        dropped_samples: done.dropped_samples,
                        phases: Some(pb::PhaseTimes {
                            data: done.phases.data,
                            forward: done.phases.forward,
                            backward: done.phases.backward,
                            allreduce: done.phases.allreduce,
                            optimizer: done.phases.optimizer,
                        }),
                    }));
                }
            }
            Some(pb::report_request::Report::Eval(e)) => match e.epoch {
                Some(epoch) => {
                    if let Some(total) = self.progress.epoch_evaluated(rank, epoch, e) {
                        self.epoch_tested(epoch, &total);
                    }
                }
                None => {
                    self.progress.evaluated(rank, e);
                    self.log_evaluation();
                }
            },
            Some(pb::report_request::Report::Checkpoint(c)) => self.log(Event::Checkpoint {
                epochs_done: c.epochs_done,
                step: c.step,
                path: c.path,
                seconds: micros(c.seconds),
            }),
            None => {}
        }
    }

    /// A rank ended with `result`; `who` names its executor in errors. An error that may be
    /// the `consequence` of another executor's loss (a broken connection) is held: the job fails
    /// with it only if no root cause comes first ([`Job::settle_held_error`]).
    pub fn finish_rank(
        &mut self,
        rank: usize,
        executor_id: &str,
        result: Option<pb::finish_task_request::Result>,
        consequence: bool,
        who: &str,
        now: Instant,
    ) {
        if rank >= self.finished.len() || self.is_finished() {
            return;
        }
        if self.ranks[rank].executor_id != executor_id {
            // An executor that lost its place in a re-formed ring.
            warn!(job = %self.id, "ignoring the end of {who}: no longer rank {rank}");
            return;
        }
        use pb::finish_task_request::Result as R;
        match result {
            Some(R::Outcome(o)) => self.progress.outcome(rank, o),
            Some(R::Bench(b)) => {
                if rank == 0 {
                    self.bench_seconds = b.seconds;
                }
            }
            Some(R::Error(e)) if consequence => {
                let error = format!("{who} failed: {e}");
                info!(job = %self.id, "holding, while a root cause may come: {error}");
                self.held_error.get_or_insert((error, now));
                return;
            }
            Some(R::Error(e)) => {
                self.fail(format!("{who} failed: {e}"), now);
                return;
            }
            None => {
                self.fail(format!("{who} ended without a result"), now);
                return;
            }
        }
        self.finished[rank] = true;
        if let Some(r) = &self.recovery
            && !r.lost.is_empty()
        {
            let lost: Vec<String> = r.lost.keys().map(|l| format!("rank {l}")).collect();
            self.fail(
                format!(
                    "{who} finished while the ring was being re-formed without {}, which \
                     cannot finish its share",
                    lost.join(", ")
                ),
                now,
            );
            return;
        }
        if self.finished.iter().all(|&f| f) {
            self.end(JobState::Succeeded, now);
        }
    }

    /// Whether a rank's communication error waits for a root cause.
    pub fn has_held_error(&self) -> bool {
        self.held_error.is_some() && !self.is_finished()
    }

    /// Fails the job with its held communication error once `grace` has passed without a root
    /// cause, or, while a lost connection of one of its executors is `settling`, once that has
    /// had its own grace too (at most four graces in all).
    pub fn settle_held_error(&mut self, now: Instant, grace: Duration, settling: bool) {
        let Some((_, since)) = &self.held_error else {
            return;
        };
        let held = now.saturating_duration_since(*since);
        if (held >= grace && !settling) || held >= grace * 4 {
            let (error, _) = self.held_error.take().expect("checked");
            self.fail(error, now);
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

    /// Logs the test split's evaluation once every rank has reported its share.
    fn log_evaluation(&mut self) {
        if self.evaluation_logged {
            return;
        }
        let Some(e) = self.progress.evaluation() else {
            return;
        };
        self.evaluation_logged = true;
        let figures = self.test_figures(&e);
        self.log(Event::Evaluated {
            epoch: None,
            rows: e.rows,
            loss: figures.loss,
            accuracy: figures.accuracy,
            mse: figures.mse,
        });
    }

    /// Every rank evaluated the test split after `epoch` while training goes on: logged, and
    /// sent to watchers (progress lines, TensorBoard, the web UI's chart).
    fn epoch_tested(&mut self, epoch: u64, e: &pb::EvalReport) {
        let figures = pb::EpochTest {
            epoch,
            ..self.test_figures(e)
        };
        info!(
            job = %self.id,
            epoch,
            accuracy = figures.accuracy,
            mse = figures.mse,
            "test split evaluated"
        );
        self.log(Event::Evaluated {
            epoch: Some(epoch),
            rows: e.rows,
            loss: figures.loss,
            accuracy: figures.accuracy,
            mse: figures.mse,
        });
        self.push(pb::job_event::Event::Test(figures));
    }

    /// The test figures of summed evaluation shares (`epoch` left at 0 for the caller).
    fn test_figures(&self, e: &pb::EvalReport) -> pb::EpochTest {
        let classification = self
            .plan()
            .is_some_and(|p| p.spec.train.loss.is_classification());
        let rows = e.rows.max(1) as f64;
        pb::EpochTest {
            epoch: 0,
            epochs: self.plan().map_or(0, |p| p.spec.train.epochs),
            rows: e.rows,
            loss: e.loss_sum / rows,
            accuracy: classification.then(|| e.correct as f64 / rows),
            mse: (!classification).then(|| e.squared_error / rows),
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
