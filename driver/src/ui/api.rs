//! The JSON views behind `/api/v1`: what the page shows, computed from the scheduler's state and
//! each job's event history at the moment of the request.

use std::time::Instant;

use ringflow_core::pb;
use ringflow_core::pb::job_event::Event;
use ringflow_core::phases::PhaseTimes;
use serde::Serialize;

use crate::figures;
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
    /// An IOB2 tagger's entity-level F1 once the job has evaluated after training.
    pub test_entity_f1: Option<f64>,
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
    /// A tagger: the accuracy is per token.
    pub per_token: bool,
    /// An IOB2 tagger's entity-level F1.
    pub entity_f1: Option<f64>,
    /// An IOB2 tagger's entity-level precision.
    pub entity_precision: Option<f64>,
    /// An IOB2 tagger's entity-level recall.
    pub entity_recall: Option<f64>,
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
    /// Token sequences: real tokens per second over the epoch.
    pub tokens_per_s: Option<f64>,
    /// Token sequences: the share of padding in the epoch's batches.
    pub padding_fraction: Option<f64>,
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

/// A job's metric series: from its events, with the figures of token-sequence jobs (which
/// the events do not carry) from its combined reports.
pub fn series(j: &Job) -> Series {
    let mut out = Series::default();
    let reports = j.reports();
    for e in j.events() {
        match &e.event {
            Some(Event::Step(s)) => out.steps.push(StepPoint {
                t: e.at_s,
                step: s.epoch * s.steps + s.step,
                loss: s.loss,
                samples_per_s: s.samples_per_s,
            }),
            Some(Event::Epoch(d)) => {
                let done = reports.epochs().iter().find(|e| e.epoch == d.epoch);
                out.epochs.push(EpochPoint {
                    t: e.at_s,
                    epoch: d.epoch + 1,
                    step: (d.epoch + 1) * d.steps,
                    loss: d.loss,
                    samples_per_s: d.samples_per_s,
                    seconds: d.seconds,
                    phases: d.phases.and_then(|p| PhaseTimes::from(p).shares()),
                    tokens_per_s: done.and_then(|e| e.tokens_per_s()),
                    padding_fraction: done.and_then(|e| e.padding_fraction()),
                });
            }
            Some(Event::Test(x)) => {
                let tested = reports.epoch_tests().get(&x.epoch);
                let entities = tested.and_then(figures::entities);
                out.tests.push(TestPoint {
                    t: e.at_s,
                    epoch: x.epoch + 1,
                    loss: x.loss,
                    accuracy: x.accuracy,
                    mse: x.mse,
                    per_token: tested.is_some_and(|r| r.tokens),
                    entity_f1: entities.map(|c| c.f1()),
                    entity_precision: entities.map(|c| c.precision()),
                    entity_recall: entities.map(|c| c.recall()),
                });
            }
            Some(Event::Summary(text)) => {
                if let Ok(summary) = JobSummary::from_payload(text) {
                    summarized(&mut out, &summary, e.at_s);
                }
            }
            _ => {}
        }
    }
    out
}

/// The test figures of a job's `summary`, sent `at_s` seconds after submission.
fn summarized(out: &mut Series, summary: &JobSummary, at_s: f64) {
    out.test_accuracy = summary.test_accuracy;
    out.test_loss = summary.test_loss;
    out.test_entity_f1 = summary.test_entity_f1;
    if let (true, Some(loss)) = (
        summary.kind == crate::work::JobWork::Train,
        summary.test_loss,
    ) {
        out.tests.push(TestPoint {
            t: at_s,
            epoch: summary.epochs,
            loss,
            accuracy: summary.test_accuracy,
            mse: summary.test_mse,
            per_token: summary.test_tokens.is_some(),
            entity_f1: summary.test_entity_f1,
            entity_precision: summary.test_entity_precision,
            entity_recall: summary.test_entity_recall,
        });
    }
}

#[cfg(test)]
pub(super) mod tests {
    use pb::report_request::Report;

    use super::*;
    use crate::scheduler::tests::{info, train_on};

    /// A job on 2 ranks that trained epoch 0 (`sequence`: with tokens) and was tested after
    /// it (`sequence`: as an IOB2 tagger).
    pub(in crate::ui) fn trained(sequence: bool) -> Job {
        let t0 = Instant::now();
        let mut job = Job::new("job-1".into(), train_on("cpu", 2), t0);
        job.start(vec![info("e1", "h1", 1), info("e2", "h1", 2)], t0);
        for rank in 0..2 {
            let epoch = pb::EpochReport {
                steps: 8,
                samples: 225,
                seconds: 2.0,
                tokens: if sequence { 3000 } else { 0 },
                padding: if sequence { 1000 } else { 0 },
                ..Default::default()
            };
            job.report(rank, Some(Report::Epoch(epoch)), t0);
            let share = pb::EvalReport {
                rows: 500,
                correct: 450,
                epoch: Some(0),
                tokens: sequence,
                entities: sequence.then_some(pb::EntityCounts {
                    correct: 3,
                    predicted: 4,
                    gold: 5,
                }),
                ..Default::default()
            };
            job.report(rank, Some(Report::Eval(share)), t0);
        }
        job
    }

    #[test]
    fn a_sequence_jobs_series_has_its_tokens_padding_and_entity_figures() {
        let s = series(&trained(true));
        assert_eq!(s.epochs[0].tokens_per_s, Some(3000.0), "6000 tokens in 2 s");
        assert_eq!(s.epochs[0].padding_fraction, Some(0.25));
        let test = &s.tests[0];
        assert!(test.per_token);
        assert_eq!(test.accuracy, Some(0.9));
        assert_eq!(
            (test.entity_precision, test.entity_recall),
            (Some(0.75), Some(0.6))
        );
        assert!((test.entity_f1.unwrap() - 2.0 / 3.0).abs() < 1e-12);

        let s = series(&trained(false));
        assert_eq!(s.epochs[0].tokens_per_s, None);
        assert_eq!(s.epochs[0].padding_fraction, None);
        assert!(!s.tests[0].per_token);
        assert_eq!(s.tests[0].entity_f1, None);
    }
}
