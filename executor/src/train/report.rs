//! Converting the train loop's reports to protocol messages for the driver.

use ringflow_core::pb;

use crate::train::autotune::FusionState;
use crate::train::context::{EpochStats, EvalStats, TrainEvent};
use crate::train::timeline::StepSpan;
use crate::train::trainer::TrainOutcome;

impl From<&StepSpan> for pb::StepSpan {
    fn from(s: &StepSpan) -> Self {
        pb::StepSpan {
            epoch: s.epoch,
            step: s.step,
            start_unix_s: s.start_unix_s,
            data: s.phases.data as f32,
            forward: s.phases.forward as f32,
            backward: s.phases.backward as f32,
            allreduce: s.phases.allreduce as f32,
            optimizer: s.phases.optimizer as f32,
        }
    }
}

fn spans(s: &[StepSpan]) -> Vec<pb::StepSpan> {
    s.iter().map(pb::StepSpan::from).collect()
}

impl From<&EpochStats> for pb::EpochReport {
    fn from(e: &EpochStats) -> Self {
        pb::EpochReport {
            epoch: e.epoch,
            steps: e.steps,
            samples: e.samples,
            dropped_samples: e.dropped_samples,
            loss: e.loss,
            seconds: e.seconds,
            phases: Some((&e.phases).into()),
            spans: spans(&e.spans),
            tokens: e.tokens,
            padding: e.padding,
            fusion: e.fusion.as_ref().map(pb::FusionReport::from),
        }
    }
}

impl From<&FusionState> for pb::FusionReport {
    fn from(f: &FusionState) -> Self {
        pb::FusionReport {
            first_bucket_bytes: f.sizes.first as u64,
            bucket_bytes: f.sizes.rest as u64,
            tuned: f.tuned,
            trials: f
                .trials
                .iter()
                .map(|t| pb::FusionTrial {
                    bucket_bytes: t.sizes.rest as u64,
                    step_seconds: t.step_seconds,
                })
                .collect(),
        }
    }
}

impl From<&EvalStats> for pb::EvalReport {
    fn from(e: &EvalStats) -> Self {
        pb::EvalReport {
            rows: e.rows,
            loss_sum: e.loss_sum,
            correct: e.correct,
            squared_error: e.squared_error,
            epoch: None,
            tokens: e.tokens,
            entities: e.entities.map(|c| pb::EntityCounts {
                correct: c.correct,
                predicted: c.predicted,
                gold: c.gold,
            }),
        }
    }
}

impl From<&TrainOutcome> for pb::TaskOutcome {
    fn from(o: &TrainOutcome) -> Self {
        pb::TaskOutcome {
            epochs: o.epochs,
            steps: o.steps,
            samples: o.samples,
            train_seconds: o.train_seconds,
            final_train_loss: o.final_train_loss,
            param_checksum: o.param_checksum,
            model_dir: o.model_dir.clone().unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// A [`TrainEvent`] as the protocol message the driver receives.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// Progress within an epoch.
    Step(pb::StepReport),
    /// An epoch ended.
    Epoch(pb::EpochReport),
    /// Evaluation finished.
    Eval(pb::EvalReport),
    /// Rank 0 wrote a checkpoint.
    Checkpoint(pb::CheckpointReport),
}

impl From<&TrainEvent> for Report {
    fn from(e: &TrainEvent) -> Self {
        match e {
            TrainEvent::Step {
                epoch,
                step,
                steps,
                loss,
                samples_per_s,
                spans: timed,
            } => Report::Step(pb::StepReport {
                epoch: *epoch,
                step: *step,
                steps: *steps,
                loss: *loss,
                samples_per_s: *samples_per_s,
                spans: spans(timed),
            }),
            TrainEvent::EpochEnd(s) => Report::Epoch(s.into()),
            TrainEvent::Evaluated(s) => Report::Eval(s.into()),
            TrainEvent::EpochEvaluated { epoch, stats } => Report::Eval(pb::EvalReport {
                epoch: Some(*epoch),
                ..stats.into()
            }),
            TrainEvent::Checkpoint {
                epochs_done,
                step,
                path,
                seconds,
            } => Report::Checkpoint(pb::CheckpointReport {
                epochs_done: *epochs_done,
                step: *step,
                path: path.clone(),
                seconds: *seconds,
            }),
        }
    }
}
