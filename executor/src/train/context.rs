//! What the train loop needs from the driver, and what it reports back.

use ringflow_core::data::prepare::{PartitionSource, ReadCheck};
use ringflow_core::data::{DataStats, Preprocessing};
use ringflow_core::metrics::entities::EntityCounts;
use ringflow_core::pb::EpochPlan;

use crate::collective::Collective;
pub use crate::train::timeline::PhaseTimes;
use crate::train::timeline::StepSpan;

use crate::error::Result;
use crate::train::autotune::FusionState;

/// Which part of the data a plan covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `data.train`
    Train,
    /// `data.test` (or the data set of an evaluation or prediction job)
    Test,
    /// `data.train`, every row once, for whole-data statistics
    Stats,
}

/// This executor's place in a re-formed ring.
pub struct Recovered {
    /// The new ring (its rank and world).
    pub comm: Box<dyn Collective>,
    /// Steps per epoch on the new ring.
    pub steps_per_epoch: u64,
}

/// One epoch of one rank.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    /// 0-based epoch.
    pub epoch: u64,
    /// Steps taken.
    pub steps: u64,
    /// Rows whose gradients went into the model.
    pub samples: u64,
    /// Rows of this rank whose gradients were dropped by backup workers (late, or skipped to
    /// catch up).
    pub dropped_samples: u64,
    /// Mean training loss over the epoch's steps.
    pub loss: f64,
    /// Wall time of the epoch's steps.
    pub seconds: f64,
    /// Where that time went.
    pub phases: PhaseTimes,
    /// The steps timed since the previous report (`--timeline`).
    pub spans: Vec<StepSpan>,
    /// For token sequences: the real tokens of the rows trained.
    pub tokens: u64,
    /// For token sequences: the padding steps of the epoch's batches.
    pub padding: u64,
    /// On a ring, the gradient buckets in use at the epoch's end.
    pub fusion: Option<FusionState>,
}

/// Evaluation of one rank's share of the test split; ranks' stats add up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalStats {
    /// Rows evaluated.
    pub rows: u64,
    /// Sum of per-row losses.
    pub loss_sum: f64,
    /// Correct predictions (classification).
    pub correct: u64,
    /// Sum of squared errors (regression).
    pub squared_error: f64,
    /// True when `rows` counts the real tokens of a tagger.
    pub tokens: bool,
    /// Entity counts of an IOB2 tagger (`train.metrics` has `"entity_f1"`).
    pub entities: Option<EntityCounts>,
}

impl EvalStats {
    /// Adds another rank's stats.
    pub fn merge(&mut self, other: &EvalStats) {
        self.rows += other.rows;
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.squared_error += other.squared_error;
        self.tokens |= other.tokens;
        if let Some(e) = other.entities {
            *self.entities.get_or_insert_with(EntityCounts::default) += e;
        }
    }

    /// Fraction of correct predictions.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.rows.max(1) as f64
    }

    /// Mean squared error.
    pub fn mse(&self) -> f64 {
        self.squared_error / self.rows.max(1) as f64
    }

    /// Mean loss.
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.rows.max(1) as f64
    }
}

/// Progress that a rank reports while it works.
#[derive(Clone, Debug, PartialEq)]
pub enum TrainEvent {
    /// Periodic progress within an epoch (about once a second).
    Step {
        /// 0-based epoch.
        epoch: u64,
        /// Steps done in this epoch.
        step: u64,
        /// Steps in this epoch.
        steps: u64,
        /// Mean loss of the steps since the last report.
        loss: f64,
        /// Rows per second since the last report.
        samples_per_s: f64,
        /// The steps timed since the last report (`--timeline`).
        spans: Vec<StepSpan>,
    },
    /// An epoch finished.
    EpochEnd(EpochStats),
    /// Rank 0 wrote a checkpoint.
    Checkpoint {
        /// Epochs completed at the checkpoint.
        epochs_done: u64,
        /// Optimizer steps taken.
        step: u64,
        /// Where it was written.
        path: String,
        /// Seconds the save took.
        seconds: f64,
    },
    /// The rank evaluated its share of the test split after training (or for `eval`).
    Evaluated(EvalStats),
    /// The rank evaluated its share of the test split after 0-based `epoch`, while training
    /// goes on (`train.eval_every_epochs`).
    EpochEvaluated {
        /// The epoch just trained.
        epoch: u64,
        /// This rank's share.
        stats: EvalStats,
    },
}

/// The train loop's view of the driver.
pub trait TaskContext: Send {
    /// This rank's partitions of `split` for `epoch` (the test split uses epoch 0).
    fn epoch_plan(&mut self, split: Split, epoch: u64) -> Result<EpochPlan>;

    /// Reports progress.
    fn report(&mut self, event: TrainEvent) -> Result<()>;

    /// Tells the driver whether this rank can read every file of the job (`data.source =
    /// "auto"`) and waits until every rank has: where every rank reads its partitions from.
    fn prepare_source(&mut self, check: &ReadCheck) -> Result<PartitionSource>;

    /// Sends this rank's statistics of the training split and waits until the driver has
    /// merged every rank's: the preprocessing they decide.
    fn prepare_stats(&mut self, partial: &DataStats) -> Result<Preprocessing>;

    /// The ring broke (`error`) in an elastic job: waits until the driver has re-formed it from
    /// the surviving executors and connects to it. `awaiting_state`: this executor joined the
    /// ring and has not received the job's state yet, so it cannot be the new ring's rank 0. An
    /// error when this executor must stop.
    fn recover(&mut self, error: &str, awaiting_state: bool) -> Result<Recovered>;

    /// True once the job was cancelled; the loop stops at the next step.
    fn cancelled(&self) -> bool;

    /// True when the driver's reply to the last report said that it is re-forming the ring (an
    /// elastic job lost an executor).
    fn reforming(&self) -> bool {
        false
    }
}
