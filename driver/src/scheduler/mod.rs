//! The driver's state: registered executors, jobs, rendezvous, ranks, health.
//!
//! [`Scheduler`] is a plain state machine driven by the RPC handlers and by a periodic
//! [`Scheduler::tick`]; it never blocks and takes the current time as an argument, so every rule
//! (rendezvous deadlines, heartbeat deadlines, rank assignment) is testable without a clock.
//!
//! - **Registration.** Executors register and then heartbeat with their full registration, so a
//!   restarted driver learns them again from their next heartbeat. A protocol version other than
//!   [`ringflow_proto::PROTOCOL_VERSION`] is refused with a message naming both.
//! - **Rendezvous.** A queued job waits for `cluster.executors` idle executors that have its
//!   device (every executor runs CPU jobs; a `cluster.device = "cuda"` job needs executors that
//!   advertised a `cuda:*` device, see [`ExecutorEntry::offers`]). The chosen ones are sorted by
//!   host, ring address and id, and take ranks 0..N−1 in that order. A job that waits longer than
//!   `cluster.rendezvous_timeout_s` fails with a message that says how many executors registered
//!   and from where, and for a GPU job which of them have no GPU. Only executors whose
//!   advertised memory holds the job's estimate are chosen; a job that the registered executors
//!   cannot hold is refused before any task is sent, naming them (module `fit`).
//! - **Health.** An executor whose process ended, whose connection closed, or that misses
//!   heartbeats for `executor_timeout` is dropped; a job it was training fails (or, elastic,
//!   re-forms its ring) with a message naming it and the cause ([`loss`]).
//! - **Event log.** Each training job (and evaluation or prediction of a saved model) writes
//!   what happens to it to `<checkpoint_dir>/events.jsonl` ([`crate::events`]).
//! - **Job ids.** `<name>-<yyyyMMddHHmmss>-<tag>-<NNNN>`, like Spark's application ids: the
//!   submission time (UTC), a random tag drawn once per driver and the driver's job counter, so
//!   that two drivers, even started in the same second, never give two jobs one id.
//! - **Retention.** The driver keeps the `retained_jobs` most recently finished jobs and
//!   forgets older ones ([`retention`]), so its memory does not grow with the jobs it has run.
//! - **Output locks.** A job submitted with the lock on its output directory
//!   ([`crate::outputs::lock`]) holds it until it ends; a job whose lock another job took over
//!   fails.

mod fit;
mod job;
mod loss;
mod registry;
mod retention;

pub use job::{Job, JobKind};
pub use loss::{Gone, MAX_LAST_WORDS, ProcessEnd, signal_name};
pub use registry::ExecutorEntry;
pub use retention::DEFAULT_RETAINED_JOBS;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use ringflow_proto::pb;
use ringflow_proto::spec::JobSpec;
use tracing::info;

use crate::error::{DriverError, Result};
use crate::outputs::DirLock;
use crate::planner::JobPlan;

/// Timing rules of a driver.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// How often executors heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which an executor is considered lost.
    pub executor_timeout: Duration,
    /// How long a closed executor connection waits for a better cause (an exit status, a sign
    /// of life) before the executor is declared lost, and how long a rank's communication error
    /// waits for a root cause before it fails the job.
    pub loss_grace: Duration,
    /// How many finished jobs the driver keeps (with their events and summaries); older ones
    /// are forgotten ([`retention`]).
    pub retained_jobs: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            heartbeat_interval: Duration::from_millis(1000),
            executor_timeout: Duration::from_secs(15),
            loss_grace: Duration::from_millis(1500),
            retained_jobs: DEFAULT_RETAINED_JOBS,
        }
    }
}

/// Everything the driver knows.
pub struct Scheduler {
    config: SchedulerConfig,
    registry: ModelRegistry,
    /// This driver process's id (changes on restart).
    pub driver_id: String,
    executors: BTreeMap<String, ExecutorEntry>,
    /// The number of each executor's open attachment stream (its latest), kept apart from its entry:
    /// an executor dropped as lost (stopped past the heartbeat timeout) that comes back keeps
    /// the stream it opened before, and its end must still count.
    attachments: BTreeMap<String, u64>,
    /// The number the next attachment stream gets (unique in this driver).
    next_attachment: u64,
    jobs: BTreeMap<String, Job>,
    queue: VecDeque<String>,
    next_job: u64,
    /// Four random base-36 characters of every job id of this driver.
    id_tag: String,
    event_logs: bool,
    /// Finished jobs forgotten so far ([`retention`]).
    jobs_forgotten: u64,
}

/// A refusal of an RPC, mapped to a gRPC status by the service.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The caller speaks another protocol version.
    Version(String),
    /// The request names something unknown or is malformed.
    Invalid(String),
    /// No such job or executor.
    NotFound(String),
}

impl Scheduler {
    /// A scheduler with no executors and no jobs.
    pub fn new(config: SchedulerConfig, registry: ModelRegistry) -> Scheduler {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Scheduler {
            config,
            registry,
            driver_id: format!("driver-{:x}", stamp & 0xffff_ffff_ffff),
            executors: BTreeMap::new(),
            attachments: BTreeMap::new(),
            next_attachment: 1,
            jobs: BTreeMap::new(),
            queue: VecDeque::new(),
            next_job: 1,
            id_tag: random_tag(),
            event_logs: true,
            jobs_forgotten: 0,
        }
    }

    /// A scheduler whose jobs write no event logs (for tests of its rules).
    pub fn without_event_logs(mut self) -> Scheduler {
        self.event_logs = false;
        self
    }

    /// The timing rules.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    fn check_version(who: &str, version: u32) -> std::result::Result<(), Refusal> {
        if version != ringflow_proto::PROTOCOL_VERSION {
            return Err(Refusal::Version(format!(
                "{who} speaks ringflow protocol version {version}, this driver speaks version {}; \
                 run the same ringflow version everywhere",
                ringflow_proto::PROTOCOL_VERSION
            )));
        }
        Ok(())
    }

    /// Registers (or re-registers) an executor.
    pub fn register(
        &mut self,
        info: pb::ExecutorInfo,
        now: Instant,
    ) -> std::result::Result<(), Refusal> {
        let who = format!("executor {} on {}", info.executor_id, info.host);
        Self::check_version(&who, info.protocol_version)?;
        if info.executor_id.is_empty() || info.ring_address.is_empty() {
            return Err(Refusal::Invalid(format!(
                "{who} registered without an id or a ring address"
            )));
        }
        match self.executors.get_mut(&info.executor_id) {
            Some(e) => {
                e.info = info;
                e.heard_from(now);
            }
            None => {
                info!(executor = %info.executor_id, host = %info.host, ring = %info.ring_address, "executor registered");
                self.broadcast_message(&format!(
                    "executor {} registered from {} (ring {})",
                    info.executor_id, info.host, info.ring_address
                ));
                for job in self.jobs.values_mut() {
                    job.executor_registered(&info);
                }
                self.executors
                    .insert(info.executor_id.clone(), ExecutorEntry::new(info, now));
            }
        }
        Ok(())
    }

    /// A heartbeat; returns whether the executor's current task should stop.
    pub fn heartbeat(
        &mut self,
        info: pb::ExecutorInfo,
        job_id: &str,
        now: Instant,
    ) -> std::result::Result<bool, Refusal> {
        let id = info.executor_id.clone();
        self.register(info, now)?;
        let entry = self.executors.get_mut(&id).expect("just registered");
        // An executor that says it is idle while we think it busy has finished (or restarted).
        if job_id.is_empty()
            && let Some(a) = &entry.assigned
            && entry.delivered
            && self.jobs.get(&a.job_id).is_none_or(|j| j.is_finished())
        {
            entry.assigned = None;
        }
        Ok(!job_id.is_empty() && self.jobs.get(job_id).is_none_or(|j| j.should_stop()))
    }

    /// The task waiting for `executor_id`, if any (marks it delivered).
    pub fn take_task(&mut self, executor_id: &str) -> Option<pb::Task> {
        let entry = self.executors.get_mut(executor_id)?;
        if entry.delivered {
            return None;
        }
        let assigned = entry.assigned.as_ref()?;
        let job = self.jobs.get(&assigned.job_id)?;
        if job.is_finished() {
            return None;
        }
        let task = job.task_for(assigned.rank);
        entry.delivered = true;
        Some(task)
    }

    /// Checks and plans a training job (planning reads Parquet footers); its checkpoint
    /// directory must be able to become a writable directory.
    pub fn plan_job(registry: &ModelRegistry, spec_json: &str, resume: bool) -> Result<JobPlan> {
        let spec = JobSpec::from_json(spec_json)?;
        spec.validate(std::path::Path::new("<submitted spec>"))?;
        // Where the job writes must be usable before its data is even listed.
        crate::outputs::check_dir("cluster.checkpoint_dir", &spec.checkpoint_dir())?;
        let mut plan = JobPlan::new(spec, registry)?;
        if resume {
            plan.resume = Some(crate::planner::resume_point(&plan.spec)?);
        }
        Ok(plan)
    }

    /// Checks and plans evaluation or prediction (`predict`: output and id column) of the model
    /// saved in `model_dir` over `data`; returns the plan and the model's preprocessing (JSON).
    pub fn plan_inference(
        registry: &ModelRegistry,
        model_dir: &str,
        data: &str,
        predict: Option<&(String, String)>,
    ) -> Result<(JobPlan, String)> {
        if let Some((output, _)) = predict {
            crate::outputs::check_dir("--output", output)?;
        }
        let saved = crate::planner::saved_model(model_dir)?;
        let mut plan = JobPlan::inference(saved.spec, data, registry, predict.is_none())?;
        // Without SQL the id column is read from the files; with SQL it must be in the query's
        // output, which executors check.
        if let Some((_, id)) = predict
            && !id.is_empty()
            && plan.spec.data.sql.is_none()
            && !plan.input_columns.contains(id)
        {
            plan.input_columns.push(id.clone());
        }
        Ok((plan, saved.preprocessing_json))
    }

    /// A rank's partial for a preparation phase: the merged result once every rank has sent
    /// one, and whether the rank should stop.
    pub fn prepare(
        &mut self,
        req: &pb::PrepareRequest,
        partial: Option<&str>,
        now: Instant,
    ) -> std::result::Result<(Option<String>, bool), Refusal> {
        let job = self
            .jobs
            .get_mut(&req.job_id)
            .ok_or_else(|| Refusal::NotFound(format!("no job {:?}", req.job_id)))?;
        if job.should_stop() {
            return Ok((None, true));
        }
        let phase = pb::PreparePhase::try_from(req.phase)
            .map_err(|_| Refusal::Invalid(format!("unknown preparation phase {}", req.phase)))?;
        let merged = job
            .prepare(req.rank as usize, phase, partial, now)
            .map_err(Refusal::Invalid)?;
        let stop = job.should_stop();
        if stop {
            self.release_finished(now);
        }
        Ok((merged, stop))
    }

    /// A rank of an elastic job lost its ring: its new task once the ring is re-formed
    /// (`Ok(None)`: not yet), or a refusal when it must stop.
    pub fn recover(
        &mut self,
        req: &pb::RecoverRequest,
        now: Instant,
    ) -> std::result::Result<Option<pb::Task>, String> {
        let Some(job) = self.jobs.get_mut(&req.job_id) else {
            return Err(format!("no job {:?}", req.job_id));
        };
        let min = match &job.kind {
            JobKind::Train(plan) => plan.spec.cluster.min_executors.unwrap_or(usize::MAX),
            _ => usize::MAX,
        };
        // Only executors with the job's device and memory may join its re-formed ring.
        let (device, memory) = (job.device(), job.memory().bytes);
        let idle: Vec<pb::ExecutorInfo> = self
            .executors
            .values()
            .filter(|e| e.assigned.is_none() && e.offers(device) && e.fits(memory))
            .map(|e| e.info.clone())
            .collect();
        let before = job.generation();
        let task = job.recover(req, min, idle, now);
        if job.generation() > before {
            // Survivors keep working for the job, under their new ranks.
            let ranks: Vec<(String, u32)> = job
                .ranks()
                .iter()
                .enumerate()
                .map(|(r, e)| (e.executor_id.clone(), r as u32))
                .collect();
            for (id, rank) in ranks {
                if let Some(e) = self.executors.get_mut(&id) {
                    // Survivors have their task; joiners pick theirs up with their next poll.
                    let joining = e.assigned.is_none();
                    e.assigned = Some(registry::Assignment {
                        job_id: req.job_id.clone(),
                        rank,
                    });
                    e.delivered = !joining;
                }
            }
        }
        if task.is_err() {
            self.release_finished(now);
        }
        task
    }

    /// The model registry jobs are checked against.
    pub fn registry(&self) -> &ModelRegistry {
        &self.registry
    }

    /// A new job id for a job named `name`: `<name>-<yyyyMMddHHmmss>-<tag>-<NNNN>`, unique
    /// across drivers and runs (see the module docs).
    pub fn new_job_id(&mut self, name: &str) -> String {
        let stamp = crate::events::compact_utc(std::time::SystemTime::now());
        let id = format!("{name}-{stamp}-{}-{:04}", self.id_tag, self.next_job);
        self.next_job += 1;
        id
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
        if self.event_logs {
            job.open_event_log();
        }
        info!(job = %id, "job submitted");
        self.jobs.insert(id.clone(), job);
        self.queue.push_back(id.clone());
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

    /// All jobs, oldest first.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// All executors.
    pub fn executors(&self) -> impl Iterator<Item = &ExecutorEntry> {
        self.executors.values()
    }

    /// Cancels a job; false if it had already ended.
    pub fn cancel(&mut self, job_id: &str, now: Instant) -> std::result::Result<bool, Refusal> {
        let job = self
            .jobs
            .get_mut(job_id)
            .ok_or_else(|| Refusal::NotFound(format!("no job {job_id:?}")))?;
        if job.is_finished() {
            return Ok(false);
        }
        job.cancel(now);
        self.queue.retain(|j| j != job_id);
        self.release_finished(now);
        Ok(true)
    }

    /// A rank's report; returns whether the rank should stop.
    pub fn report(
        &mut self,
        req: pb::ReportRequest,
        now: Instant,
    ) -> std::result::Result<pb::ReportReply, Refusal> {
        let job = self
            .jobs
            .get_mut(&req.job_id)
            .ok_or_else(|| Refusal::NotFound(format!("no job {:?}", req.job_id)))?;
        // Ranks are numbered anew in each generation of the ring: a late report from an older
        // one would be counted for another rank.
        if req.generation == job.generation() {
            job.report(req.rank as usize, req.report, now);
        }
        Ok(pb::ReportReply {
            cancel: job.should_stop(),
            reform: job.is_recovering(),
        })
    }

    /// A rank's end.
    pub fn finish_task(
        &mut self,
        req: pb::FinishTaskRequest,
        now: Instant,
    ) -> std::result::Result<(), Refusal> {
        let entry = self.executors.get(&req.executor_id);
        let executor = entry.map(|e| e.describe(req.rank));
        let words = entry.and_then(|e| e.last_words.clone());
        let job = self
            .jobs
            .get_mut(&req.job_id)
            .ok_or_else(|| Refusal::NotFound(format!("no job {:?}", req.job_id)))?;
        let who = executor.unwrap_or_else(|| format!("rank {} ({})", req.rank, req.executor_id));
        let mut result = req.result;
        // What the executor reported as it failed (a thread's panic) is part of its error, and
        // makes it a root cause rather than a consequence.
        if let (Some(pb::finish_task_request::Result::Error(e)), Some(words)) =
            (&mut result, &words)
        {
            e.push_str("; it reported: ");
            e.push_str(words);
        }
        let consequence = req.communication && words.is_none();
        job.finish_rank(
            req.rank as usize,
            &req.executor_id,
            result,
            consequence,
            &who,
            now,
        );
        if let Some(e) = self.executors.get_mut(&req.executor_id)
            && e.assigned.as_ref().is_some_and(|a| a.job_id == req.job_id)
        {
            e.assigned = None;
        }
        self.release_finished(now);
        Ok(())
    }

    /// Periodic work: drop silent executors, fail jobs that lost one or waited too long, start
    /// queued jobs that now have enough idle executors, and forget old finished jobs.
    pub fn tick(&mut self, now: Instant) {
        self.drop_lost_executors(now);
        self.settle_held_errors(now);
        for job in self.jobs.values_mut() {
            job.check_lock(now);
            let (device, memory) = (job.device(), job.memory().bytes);
            let idle = self
                .executors
                .values()
                .any(|e| e.assigned.is_none() && e.offers(device) && e.fits(memory));
            job.set_joinable(idle && job.state == pb::JobState::Running);
        }
        self.expire_waiting_jobs(now);
        self.start_jobs(now);
        self.release_finished(now);
        self.forget_finished();
    }

    fn expire_waiting_jobs(&mut self, now: Instant) {
        for id in self.queue.clone() {
            let job = &self.jobs[&id];
            let limit = job.rendezvous_timeout();
            if now.duration_since(job.submitted) > limit {
                let error = self.rendezvous_failure(job.executors_needed(), job.device(), limit);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.fail(error, now);
                }
                self.queue.retain(|j| *j != id);
            }
        }
    }

    /// Why a job that needs `need` executors with `device` waited `limit` in vain: how many
    /// executors registered and from where, and for a GPU job, which of them have no GPU.
    fn rendezvous_failure(&self, need: usize, device: Device, limit: Duration) -> String {
        let count = self.executors.len();
        let waited = limit.as_secs_f64();
        let gpu = match device {
            Device::Cpu => None,
            Device::Cuda(0) => Some("a CUDA device".to_string()),
            Device::Cuda(n) => Some(format!("CUDA device cuda:{n}")),
        };
        let wanted = match &gpu {
            None => format!("{need} executors"),
            Some(gpu) => format!("{need} executors with {gpu} (cluster.device = \"{device}\")"),
        };
        if count == 0 {
            return format!(
                "waited {waited:.0} s for {wanted}, but 0 registered (start executors with \
                 `ringflow executor --driver URL`)"
            );
        }
        let registered = self.describe_executors();
        let Some(gpu) = gpu else {
            return format!(
                "waited {waited:.0} s for {wanted}, but {count} registered: {registered}"
            );
        };
        let lacking: Vec<String> = self
            .executors
            .values()
            .filter(|e| !e.offers(device))
            .map(|e| {
                format!(
                    "{} on {} (devices: {})",
                    e.info.executor_id,
                    e.info.host,
                    e.info.devices.join(", ")
                )
            })
            .collect();
        if lacking.is_empty() {
            return format!(
                "waited {waited:.0} s for {wanted}, but {count} registered: {registered}"
            );
        }
        format!(
            "waited {waited:.0} s for {wanted}, but {count} registered: {registered}; without \
             {gpu}: {} (an executor advertises the GPUs it can see when it is built with \
             `--features cuda`)",
            lacking.join(", ")
        )
    }

    fn describe_executors(&self) -> String {
        self.executors
            .values()
            .map(|e| {
                format!(
                    "{} from {} ({})",
                    e.info.executor_id,
                    e.info.host,
                    if e.assigned.is_some() { "busy" } else { "idle" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn start_jobs(&mut self, now: Instant) {
        while let Some(id) = self.queue.front().cloned() {
            let job = &self.jobs[&id];
            let (need, device, memory) = (job.executors_needed(), job.device(), job.memory());
            let (mut idle, busy): (Vec<&ExecutorEntry>, Vec<&ExecutorEntry>) = self
                .executors
                .values()
                .filter(|e| e.offers(device))
                .partition(|e| e.assigned.is_none());
            idle.sort_by(|a, b| {
                (&a.info.host, &a.info.ring_address, &a.info.executor_id).cmp(&(
                    &b.info.host,
                    &b.info.ring_address,
                    &b.info.executor_id,
                ))
            });
            let busy_fitting = busy.iter().filter(|e| e.fits(memory.bytes)).count();
            let chosen = match fit::choose(memory, need, &idle, busy_fitting) {
                fit::Match::Wait => return,
                fit::Match::Start(chosen) => chosen,
                fit::Match::Refuse(why) => {
                    self.queue.pop_front();
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.fail(why, now);
                    }
                    continue;
                }
            };
            self.queue.pop_front();
            for (rank, info) in chosen.iter().enumerate() {
                let e = self
                    .executors
                    .get_mut(&info.executor_id)
                    .expect("chosen from the registry");
                e.assign(&id, rank as u32);
            }
            self.jobs
                .get_mut(&id)
                .expect("queued jobs exist")
                .start(chosen, now);
        }
    }

    /// Fails job `job_id` unless its memory estimate fits `limit_bytes` per executor, which
    /// `limit` describes to complete "more than …"; returns the refusal. Embedded drivers
    /// check this against the machine their executors will share, before starting them.
    pub fn refuse_unless_fits(
        &mut self,
        job_id: &str,
        limit_bytes: u64,
        limit: &str,
        now: Instant,
    ) -> std::result::Result<(), String> {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return Ok(());
        };
        if job.memory().fits(limit_bytes) {
            return Ok(());
        }
        let why = job.memory().refusal(limit, limit_bytes);
        job.fail(why.clone(), now);
        self.queue.retain(|j| j != job_id);
        Err(why)
    }

    /// Frees executors whose job has ended but that are still marked as assigned and have not
    /// yet received their task.
    fn release_finished(&mut self, _now: Instant) {
        for e in self.executors.values_mut() {
            if let Some(a) = &e.assigned
                && !e.delivered
                && self.jobs.get(&a.job_id).is_none_or(|j| j.is_finished())
            {
                e.assigned = None;
            }
        }
    }

    fn broadcast_message(&mut self, text: &str) {
        for id in self.queue.clone() {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.message(text.to_string());
            }
        }
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

/// Maps a planning failure to what the submitter sees.
pub fn planning_refusal(e: DriverError) -> Refusal {
    Refusal::Invalid(e.to_string())
}

#[cfg(test)]
mod tests;
