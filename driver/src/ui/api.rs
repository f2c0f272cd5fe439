//! The JSON views behind `/api/v1`: what the page shows, computed from the scheduler's state and
//! each job's event history at the moment of the request.

use std::time::Instant;

use ringflow_proto::pb;
use ringflow_proto::pb::job_event::Event;
use ringflow_proto::phases::PhaseTimes;
use serde::Serialize;

use crate::planner::memory::MemoryEstimate;
use crate::scheduler::{Job, Scheduler};
use crate::summary::JobSummary;

/// A job in the jobs table.
#[derive(Serialize)]
pub struct JobView {
    /// The job's id.
    pub id: String,
    /// Its name (the spec's `name`, or `eval-…`, `predict-…`, `bench-allreduce`).
    pub name: String,
    /// `queued`, `waiting`, `running`, `succeeded`, `failed` or `cancelled`.
    pub state: &'static str,
    /// Executors taking part now.
    pub executors: usize,
    /// The latest progress (1-based epoch and step), while training.
    pub progress: Option<Progress>,
    /// Seconds since submission (until the end for a finished job).
    pub duration_s: f64,
    /// The error of a failed job.
    pub error: Option<String>,
    /// What one executor needs for the job, estimated when it was submitted.
    pub memory: MemoryEstimate,
}

/// Where training is.
#[derive(Clone, Copy, Serialize)]
pub struct Progress {
    /// 1-based epoch.
    pub epoch: u64,
    /// Epochs in the job.
    pub epochs: u64,
    /// 1-based step within the epoch.
    pub step: u64,
    /// Steps per epoch.
    pub steps: u64,
    /// The latest training loss.
    pub loss: f64,
    /// The latest throughput of the whole job.
    pub samples_per_s: f64,
    /// Done fraction of the whole job, 0 to 1.
    pub fraction: f64,
}

/// An executor in the executors table.
#[derive(Serialize)]
pub struct ExecutorView {
    /// Its id.
    pub id: String,
    /// Its host.
    pub host: String,
    /// Devices it advertised.
    pub devices: Vec<String>,
    /// `idle` or `busy`.
    pub state: &'static str,
    /// The job it works for.
    pub job_id: Option<String>,
    /// Its rank in that job.
    pub rank: Option<u32>,
    /// Seconds since its last heartbeat.
    pub last_heartbeat_s: f64,
    /// Its latest throughput in the running epoch.
    pub samples_per_s: Option<f64>,
    /// Fractions of its latest epoch's time per phase.
    pub phases: Option<PhaseTimes>,
    /// The memory its tasks may use, in bytes, if it said.
    pub memory_bytes: Option<u64>,
    /// Where that figure comes from (`--memory`, a cgroup limit, the machine).
    pub memory_source: Option<String>,
}

/// A job's metric series, for the charts.
#[derive(Serialize, Default)]
pub struct Series {
    /// Training progress points: seconds since submission, global step, loss, samples/s.
    pub steps: Vec<StepPoint>,
    /// One point per finished epoch.
    pub epochs: Vec<EpochPoint>,
    /// The test split's figures after each epoch it was evaluated after
    /// (`train.eval_every_epochs`), and after training.
    pub tests: Vec<TestPoint>,
    /// Test accuracy (classification) once the job has evaluated after training.
    pub test_accuracy: Option<f64>,
    /// Test loss once the job has evaluated after training.
    pub test_loss: Option<f64>,
}

/// One evaluation of the test split.
#[derive(Serialize)]
pub struct TestPoint {
    /// Seconds since submission.
    pub t: f64,
    /// 1-based epoch after which it was evaluated.
    pub epoch: u64,
    /// Mean test loss.
    pub loss: f64,
    /// Accuracy (classification).
    pub accuracy: Option<f64>,
    /// Mean squared error (regression).
    pub mse: Option<f64>,
}

/// One progress report.
#[derive(Serialize)]
pub struct StepPoint {
    /// Seconds since submission.
    pub t: f64,
    /// Steps since the start of training.
    pub step: u64,
    /// Training loss.
    pub loss: f64,
    /// Throughput of the whole job.
    pub samples_per_s: f64,
}

/// One finished epoch.
#[derive(Serialize)]
pub struct EpochPoint {
    /// Seconds since submission.
    pub t: f64,
    /// 1-based epoch.
    pub epoch: u64,
    /// Steps since the start of training when the epoch ended (the x axis of `steps`).
    pub step: u64,
    /// Mean training loss.
    pub loss: f64,
    /// Throughput over the epoch.
    pub samples_per_s: f64,
    /// Wall time of the epoch.
    pub seconds: f64,
    /// Fractions of the epoch's time per phase (of the mean over the ranks).
    pub phases: Option<PhaseTimes>,
}

/// The state name used by the API.
pub fn state_name(state: pb::JobState) -> &'static str {
    match state {
        pb::JobState::Queued => "queued",
        pb::JobState::Waiting => "waiting",
        pb::JobState::Running => "running",
        pb::JobState::Succeeded => "succeeded",
        pb::JobState::Failed => "failed",
        pb::JobState::Cancelled => "cancelled",
    }
}

/// The latest progress of `job`, from its events.
fn latest_progress(events: &[pb::JobEvent]) -> Option<Progress> {
    events.iter().rev().find_map(|e| match &e.event {
        Some(Event::Step(s)) => Some(Progress {
            epoch: s.epoch + 1,
            epochs: s.epochs,
            step: s.step,
            steps: s.steps,
            loss: s.loss,
            samples_per_s: s.samples_per_s,
            fraction: fraction(s.epoch, s.epochs, s.step, s.steps),
        }),
        Some(Event::Epoch(d)) => Some(Progress {
            epoch: d.epoch + 1,
            epochs: d.epochs,
            step: d.steps,
            steps: d.steps,
            loss: d.loss,
            samples_per_s: d.samples_per_s,
            fraction: fraction(d.epoch + 1, d.epochs, 0, 1),
        }),
        _ => None,
    })
}

fn fraction(epoch: u64, epochs: u64, step: u64, steps: u64) -> f64 {
    if epochs == 0 || steps == 0 {
        return 0.0;
    }
    ((epoch as f64 + step as f64 / steps as f64) / epochs as f64).clamp(0.0, 1.0)
}

fn duration(job: &Job, now: Instant) -> f64 {
    job.ended()
        .unwrap_or(now)
        .saturating_duration_since(job.submitted)
        .as_secs_f64()
}

/// The jobs table, newest first.
pub fn jobs(s: &Scheduler, now: Instant) -> Vec<JobView> {
    let mut out: Vec<(Instant, JobView)> = s.jobs().map(|j| (j.submitted, job(j, now))).collect();
    out.sort_by_key(|(submitted, _)| std::cmp::Reverse(*submitted));
    out.into_iter().map(|(_, v)| v).collect()
}

/// One job's row.
pub fn job(j: &Job, now: Instant) -> JobView {
    JobView {
        id: j.id.clone(),
        name: j.kind.name(),
        state: state_name(j.state),
        executors: j.ranks().len(),
        progress: latest_progress(j.events()),
        duration_s: duration(j, now),
        error: j.error().map(str::to_string),
        memory: j.memory().clone(),
    }
}

/// The executors table, by id.
pub fn executors(s: &Scheduler, now: Instant) -> Vec<ExecutorView> {
    let mut out: Vec<ExecutorView> = s
        .executors()
        .map(|e| {
            let assigned = e.assigned.as_ref();
            let job = assigned.and_then(|a| s.job(&a.job_id));
            let rank = assigned.map(|a| a.rank);
            let (samples_per_s, phases) = match (job, rank) {
                (Some(j), Some(r)) => (
                    j.last_step(r as usize).map(|st| st.samples_per_s),
                    j.last_phases(r as usize)
                        .and_then(|p| PhaseTimes::from(p).shares()),
                ),
                _ => (None, None),
            };
            ExecutorView {
                id: e.info.executor_id.clone(),
                host: e.info.host.clone(),
                devices: e.info.devices.clone(),
                state: if assigned.is_some() { "busy" } else { "idle" },
                job_id: assigned.map(|a| a.job_id.clone()),
                rank,
                last_heartbeat_s: now.saturating_duration_since(e.last_seen).as_secs_f64(),
                samples_per_s,
                phases,
                memory_bytes: (e.info.memory_bytes > 0).then_some(e.info.memory_bytes),
                memory_source: (!e.info.memory_source.is_empty())
                    .then(|| e.info.memory_source.clone()),
            }
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// A job's metric series.
pub fn series(j: &Job) -> Series {
    let mut out = Series::default();
    for e in j.events() {
        match &e.event {
            Some(Event::Step(s)) => out.steps.push(StepPoint {
                t: e.at_s,
                step: s.epoch * s.steps + s.step,
                loss: s.loss,
                samples_per_s: s.samples_per_s,
            }),
            Some(Event::Epoch(d)) => out.epochs.push(EpochPoint {
                t: e.at_s,
                epoch: d.epoch + 1,
                step: (d.epoch + 1) * d.steps,
                loss: d.loss,
                samples_per_s: d.samples_per_s,
                seconds: d.seconds,
                phases: d.phases.and_then(|p| PhaseTimes::from(p).shares()),
            }),
            Some(Event::Test(x)) => out.tests.push(TestPoint {
                t: e.at_s,
                epoch: x.epoch + 1,
                loss: x.loss,
                accuracy: x.accuracy,
                mse: x.mse,
            }),
            Some(Event::SummaryJson(json)) => {
                if let Ok(summary) = serde_json::from_str::<JobSummary>(json) {
                    out.test_accuracy = summary.test_accuracy;
                    out.test_loss = summary.test_loss;
                    if let (true, Some(loss)) = (summary.kind == "train", summary.test_loss) {
                        out.tests.push(TestPoint {
                            t: e.at_s,
                            epoch: summary.epochs,
                            loss,
                            accuracy: summary.test_accuracy,
                            mse: summary.test_mse,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    out
}
