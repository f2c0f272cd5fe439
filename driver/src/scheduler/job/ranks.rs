//! What a job hears from its ranks while it runs ([`RankProgress`]). This file owns:
//!
//! - each rank's latest step, forwarded to watchers as the job's progress;
//! - epochs that every rank finished, logged and forwarded, and the count of them;
//! - evaluations of the test split (after epochs, and at the end);
//! - checkpoints, logged;
//! - each rank's end: its outcome, a failure (held when it may be the consequence of another
//!   executor's loss), and the job's success once every rank has finished.

use std::time::Instant;

use ringflow_core::pb::{self, JobState};
use tracing::{info, warn};

use super::{Job, JobKind};
use crate::error::JobError;
use crate::events::{Event, micros};
use crate::figures::{self, EntityFigures};
use crate::progress::JobProgress;

/// The ranks' reports of one ring (numbered anew when the ring is re-formed).
#[derive(Debug)]
pub(super) struct RankProgress {
    progress: JobProgress,
    finished: Vec<bool>,
    last_step: Vec<Option<pb::StepReport>>,
    bench_seconds: Vec<f64>,
    epochs_done: u64,
    /// The test split's evaluation went into the event log.
    evaluation_logged: bool,
}

impl RankProgress {
    /// Nothing heard: a job that has not started.
    pub fn new() -> RankProgress {
        RankProgress {
            progress: JobProgress::new(1),
            finished: Vec::new(),
            last_step: Vec::new(),
            bench_seconds: Vec::new(),
            epochs_done: 0,
            evaluation_logged: false,
        }
    }

    /// A job starting on `ranks` ranks, with `epochs_done` epochs already trained (resumed).
    pub fn start(&mut self, ranks: usize, epochs_done: u64) {
        self.progress = JobProgress::new(ranks);
        self.epochs_done = epochs_done;
        self.restart_ranks(ranks);
    }

    /// The ring was re-formed into `ranks` ranks: the epoch in progress restarts.
    pub fn regroup(&mut self, ranks: usize) {
        self.progress.regroup(ranks);
        self.restart_ranks(ranks);
    }

    fn restart_ranks(&mut self, ranks: usize) {
        self.finished = vec![false; ranks];
        self.last_step = vec![None; ranks];
    }

    /// The combined reports.
    pub fn reports(&self) -> &JobProgress {
        &self.progress
    }

    /// Epochs completed by every rank.
    pub fn epochs_done(&self) -> u64 {
        self.epochs_done
    }

    /// Seconds of each timed all-reduce on rank 0 of a benchmark.
    pub fn bench_seconds(&self) -> &[f64] {
        &self.bench_seconds
    }

    /// The latest in-epoch report of `rank`.
    pub fn last_step(&self, rank: usize) -> Option<&pb::StepReport> {
        self.last_step.get(rank)?.as_ref()
    }

    /// True once some rank has finished its task.
    pub fn any_finished(&self) -> bool {
        self.finished.iter().any(|&f| f)
    }
}

impl Job {
    /// Progress from a rank.
    pub fn report(
        &mut self,
        rank: usize,
        report: Option<pb::report_request::Report>,
        _now: Instant,
    ) {
        if self.is_finished() || rank >= self.members.ranks().len() {
            return;
        }
        match report {
            Some(pb::report_request::Report::Step(mut s)) => {
                let spans = std::mem::take(&mut s.spans);
                self.forward_spans(rank, spans);
                self.step_reported(rank, s);
            }
            Some(pb::report_request::Report::Epoch(mut e)) => {
                let spans = std::mem::take(&mut e.spans);
                self.forward_spans(rank, spans);
                self.epoch_reported(rank, e);
            }
            Some(pb::report_request::Report::Eval(e)) => match e.epoch {
                Some(epoch) => {
                    if let Some(total) = self.progress.progress.epoch_evaluated(rank, epoch, e) {
                        self.epoch_tested(epoch, &total);
                    }
                }
                None => {
                    self.progress.progress.evaluated(rank, e);
                    self.log_evaluation();
                }
            },
            Some(pb::report_request::Report::Checkpoint(c)) => self.feed.log(Event::Checkpoint {
                epochs_done: c.epochs_done,
                step: c.step,
                path: c.path,
                seconds: micros(c.seconds),
            }),
            None => {}
        }
    }

    /// The epochs the job trains for (none for inference and benchmarks).
    fn epochs(&self) -> u64 {
        match &self.kind {
            JobKind::Train(plan) => plan.spec.train.epochs,
            JobKind::Infer { .. } | JobKind::Bench { .. } => 0,
        }
    }

    /// Forwards `rank`'s step spans to watchers (`--timeline`).
    fn forward_spans(&mut self, rank: usize, spans: Vec<pb::StepSpan>) {
        let executor = self.members.ranks().get(rank);
        let generation = self.members.generation();
        self.feed.forward_spans(rank, executor, generation, spans);
    }

    /// `rank` took a step: rank 0's steps are the job's progress, with the loss and rate of
    /// every rank's latest step in that epoch.
    fn step_reported(&mut self, rank: usize, s: pb::StepReport) {
        let (epoch, step, steps) = (s.epoch, s.step, s.steps);
        self.progress.last_step[rank] = Some(s);
        if rank != 0 {
            return;
        }
        let latest: Vec<&pb::StepReport> = self
            .progress
            .last_step
            .iter()
            .flatten()
            .filter(|r| r.epoch == epoch)
            .collect();
        let loss = latest.iter().map(|r| r.loss).sum::<f64>() / latest.len() as f64;
        let rate: f64 = latest.iter().map(|r| r.samples_per_s).sum::<f64>()
            * self.members.ranks().len() as f64
            / latest.len() as f64;
        let epochs = self.epochs();
        self.feed.push(pb::job_event::Event::Step(pb::StepProgress {
            epoch,
            epochs,
            step,
            steps,
            loss,
            samples_per_s: rate,
        }));
    }

    /// `rank` finished an epoch: once every rank has, the epoch is logged and forwarded.
    fn epoch_reported(&mut self, rank: usize, e: pb::EpochReport) {
        let Some(done) = self.progress.progress.epoch_done(rank, e) else {
            return;
        };
        let tokens = done.tokens();
        self.feed.log(Event::EpochEnd {
            epoch: done.epoch,
            steps: done.steps,
            loss: done.loss,
            samples: done.samples,
            dropped_samples: done.dropped_samples,
            seconds: micros(done.seconds),
            samples_per_s: tenths(done.samples_per_s),
            phases: done.phases.map(micros),
            tokens: tokens.map(|t| t.tokens),
            padding: tokens.map(|t| t.padding),
            tokens_per_s: done.tokens_per_s().map(tenths),
        });
        self.progress.epochs_done = done.epoch + 1;
        info!(
            job = %self.id,
            epoch = done.epoch,
            rows = done.samples,
            dropped_rows = done.dropped_samples,
            tokens = done.tokens,
            padding = done.padding,
            "epoch trained"
        );
        let epochs = self.epochs();
        self.feed.push(pb::job_event::Event::Epoch(pb::EpochDone {
            epoch: done.epoch,
            epochs,
            steps: done.steps,
            samples: done.samples,
            loss: done.loss,
            seconds: done.seconds,
            samples_per_s: done.samples_per_s,
            dropped_samples: done.dropped_samples,
            phases: Some(done.phases.into()),
        }));
        // The epoch's event has no room for a sequence job's tokens: a line for people follows
        // its line.
        if let Some(t) = tokens {
            self.feed.message(format!("  {}", t.line(done.seconds)));
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
        if rank >= self.progress.finished.len() || self.is_finished() {
            return;
        }
        if self.members.ranks()[rank].executor_id != executor_id {
            // An executor that lost its place in a re-formed ring.
            warn!(job = %self.id, "ignoring the end of {who}: no longer rank {rank}");
            return;
        }
        use pb::finish_task_request::Result as R;
        match result {
            Some(R::Outcome(o)) => self.progress.progress.outcome(rank, o),
            Some(R::Bench(b)) => {
                if rank == 0 {
                    self.progress.bench_seconds = b.seconds;
                }
            }
            Some(R::Error(reason)) => {
                let error = JobError::RankFailed {
                    rank: who.to_string(),
                    reason,
                };
                if consequence {
                    self.hold_error(error, now);
                } else {
                    self.fail(error, now);
                }
                return;
            }
            None => {
                self.fail(JobError::NoResult(who.to_string()), now);
                return;
            }
        }
        self.rank_finished(rank, who, now);
    }

    /// `rank` (named `who`) finished its share: the job succeeds once every rank has, and
    /// fails if the ring is being re-formed without a lost rank, whose share no one trains.
    fn rank_finished(&mut self, rank: usize, who: &str, now: Instant) {
        self.progress.finished[rank] = true;
        let lost = self.members.lost_ranks();
        if !lost.is_empty() {
            let lost: Vec<String> = lost.iter().map(|l| format!("rank {l}")).collect();
            let error = JobError::FinishedDuringRecovery {
                rank: who.to_string(),
                lost: lost.join(", "),
            };
            self.fail(error, now);
            return;
        }
        if self.progress.finished.iter().all(|&f| f) {
            if let Err(e) = self.commit_output() {
                self.fail(JobError::Output(e), now);
                return;
            }
            self.end(JobState::Succeeded, now);
        }
    }

    /// Logs the test split's evaluation once every rank has reported its share.
    fn log_evaluation(&mut self) {
        if self.progress.evaluation_logged {
            return;
        }
        let Some(e) = self.progress.progress.evaluation() else {
            return;
        };
        self.progress.evaluation_logged = true;
        let figures = self.test_figures(&e);
        self.feed.log(evaluated(None, &e, &figures));
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
            entity_f1 = figures::entities(e).map(|c| c.f1()),
            "test split evaluated"
        );
        self.feed.log(evaluated(Some(epoch), e, &figures));
        let tagger = figures::tagger_test_line(e, figures.accuracy);
        self.feed.push(pb::job_event::Event::Test(figures));
        // The test event has no room for a tagger's tokens and entity figures: a line for
        // people follows its line.
        if let Some(line) = tagger {
            self.feed.message(format!("  {line}"));
        }
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
}

/// `x` to a tenth, for readable logs.
fn tenths(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The event log's record of an evaluation of the test split after `epoch` (`None`: after
/// training), from the ranks' shares added up (`e`) and their test figures.
fn evaluated(epoch: Option<u64>, e: &pb::EvalReport, figures: &pb::EpochTest) -> Event {
    Event::Evaluated {
        epoch,
        rows: e.rows,
        loss: figures.loss,
        accuracy: figures.accuracy,
        mse: figures.mse,
        per_token: e.tokens,
        entities: figures::entities(e).map(EntityFigures::from),
    }
}
