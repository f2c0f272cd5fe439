//! What a job hears from its ranks while it runs: their progress (steps, epochs, evaluations
//! of the test split) and each rank's end.

use super::*;

impl Job {
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
                        phases: PhaseTimes {
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

    /// Logs the test split's evaluation once every rank has reported its share.
    pub(super) fn log_evaluation(&mut self) {
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
    pub(super) fn epoch_tested(&mut self, epoch: u64, e: &pb::EvalReport) {
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
    pub(super) fn test_figures(&self, e: &pb::EvalReport) -> pb::EpochTest {
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
