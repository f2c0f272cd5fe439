//! [`Trainer`]: one rank's training run, from the model's construction to the final save.
//!
//! [`Trainer::new`] builds the model from the job spec, makes every replica start from rank 0's
//! weights, prepares the data and restores the state (a checkpoint on `--resume`, rank 0's state
//! for a joiner). [`Trainer::run`] then runs the epochs ([`epoch`]); at each epoch's start an
//! elastic run takes a [`CommittedState`] to go back to, and an epoch that ends in
//! [`EpochEnd::Reform`] (the ring broke, or the driver re-forms it) is run again on the
//! re-formed ring after [`Trainer::recover`]. [`Trainer::finish`] evaluates this rank's share of
//! the test split and, on rank 0, saves the model.

mod epoch;
mod ring;

use std::time::Duration;

use ringflow_core::spec::{JobSpec, ResolvedSpec, SpecAsWritten};
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{Model, ModelRegistry, ModelShape};
use ringflow_ml::optim::Optimizer;
use ringflow_ml::{AllocatorStats, Device, GradStore};

use crate::collective::Collective;
use crate::data::features::LabelKind;
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result, Unrunnable};
use crate::train::context::{EvalStats, Recovered, Split, TaskContext};
use crate::train::eval::evaluate;
use crate::train::hooks::TestHooks;
use crate::train::numerics::task_numerics;
use crate::train::setup::{DataOptions, TaskData, prepare_data};
use crate::train::state::{Checkpoints, CommittedState};
use crate::train::sync::GradientSync;
use crate::train::timeline::StepSpans;

pub use epoch::{EpochEnd, ReformCause};
use ring::Ring;

/// One rank's assignment within a job.
#[derive(Clone, Debug)]
pub struct TrainTask {
    /// The job's id (for logs and checkpoints).
    pub job_id: String,
    /// The job spec, as the driver resolved it.
    pub spec: ResolvedSpec,
    /// Optimizer steps in every epoch (identical on every rank).
    pub steps_per_epoch: u64,
    /// Where rank 0 saves the trained model (`<checkpoint_dir>/model`, a path or URL).
    pub model_dir: String,
    /// How the task reads its data.
    pub data: DataOptions,
    /// Continue from the job's last checkpoint (`<checkpoint_dir>/checkpoint`).
    pub resume: bool,
    /// Survive lost executors: on a broken ring, ask the driver to re-form it and continue.
    pub elastic: bool,
    /// Join a running elastic job at a re-formed ring (the state comes from rank 0).
    pub join: bool,
    /// Where this rank's model lives: `spec.cluster.device` as placed on this executor (see
    /// [`crate::placement`]).
    pub device: Device,
    /// The spec as its user wrote it, saved with the model beside `spec` (`None` when the
    /// driver got none).
    pub written: Option<SpecAsWritten>,
}

/// What one rank did.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOutcome {
    /// Epochs trained.
    pub epochs: u64,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Rows trained on by this rank.
    pub samples: u64,
    /// Seconds spent in the training loop (steps only, no evaluation or setup).
    pub train_seconds: f64,
    /// Mean training loss of this rank's last epoch.
    pub final_train_loss: f64,
    /// FNV-1a checksum of the final parameters (equal on every rank when replicas agree).
    pub param_checksum: u64,
    /// Where the model was saved (rank 0 only).
    pub model_dir: Option<String>,
}

/// What the labels must hold for `loss` on a model with `outputs` outputs.
pub fn label_kind(loss: LossKind, outputs: usize) -> LabelKind {
    match loss {
        LossKind::CrossEntropy => LabelKind::Classes(outputs),
        LossKind::BinaryCrossEntropy => LabelKind::Binary,
        LossKind::Mse => LabelKind::Regression,
    }
}

/// Trains the job's model as rank `comm.rank()` of `comm.world()`, evaluates this rank's share
/// of the test split, and (on rank 0) saves the model, with the spec's numerics on this thread.
pub fn run_task(
    task: &TrainTask,
    registry: &ModelRegistry,
    ctx: &mut dyn TaskContext,
    comm: &mut dyn Collective,
) -> Result<TrainOutcome> {
    let _numerics = task_numerics(&task.spec.train, task.device).enter();
    Trainer::new(task, registry, ctx, comm)?.run()
}

/// Where a rank is in its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Epochs completed (the epoch being trained).
    pub epoch: u64,
    /// Optimizer steps taken since the job started.
    pub global_step: u64,
    /// This rank in the current ring.
    pub rank: usize,
    /// The current ring's size.
    pub world: usize,
}

/// The steps of the run as planned for the current ring: they change when the ring is
/// re-formed with another number of ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct StepPlan {
    /// Optimizer steps in every epoch.
    steps_per_epoch: u64,
    /// The step the learning-rate schedule ends at.
    total_steps: u64,
    /// The learning rate before the schedule, scaled for the ring's size.
    base_lr: f32,
    /// Steps of the first epoch that a resumed checkpoint already took.
    skip_steps: u64,
}

impl StepPlan {
    /// The plan of a run that starts, or resumes from a checkpoint, at `at`.
    fn from_start(spec: &JobSpec, steps_per_epoch: u64, at: &Position) -> StepPlan {
        StepPlan {
            steps_per_epoch,
            total_steps: steps_per_epoch * spec.train.epochs,
            base_lr: base_lr(spec, at.world),
            skip_steps: at.global_step.saturating_sub(at.epoch * steps_per_epoch),
        }
    }

    /// The plan on a ring formed during the run (a join or a recovery) at `at`: the remaining
    /// epochs at the new ring's steps per epoch.
    fn on_new_ring(spec: &JobSpec, steps_per_epoch: u64, at: &Position) -> StepPlan {
        StepPlan {
            steps_per_epoch,
            total_steps: at.global_step + (spec.train.epochs - at.epoch) * steps_per_epoch,
            base_lr: base_lr(spec, at.world),
            skip_steps: 0,
        }
    }
}

fn base_lr(spec: &JobSpec, world: usize) -> f32 {
    spec.train.optimizer.lr() * spec.train.lr_scaling.factor(world)
}

/// What the run has done so far, for its outcome.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    samples: u64,
    train_seconds: f64,
    last_loss: f64,
}

/// One rank's training run: the model, its optimizer, how gradients are synchronised, the
/// data, and where the rank stands.
pub struct Trainer<'a> {
    task: &'a TrainTask,
    ctx: &'a mut dyn TaskContext,
    /// The ring: the one the task started with, or the last one re-formed.
    ring: Ring<'a>,
    model: Model,
    /// The gradients of the model's parameters: filled by the backward pass, made common by
    /// the sync, read by the optimizer.
    grads: GradStore,
    shape: ModelShape,
    optimizer: Optimizer,
    sync: GradientSync,
    data: TaskData,
    position: Position,
    plan: StepPlan,
    hooks: TestHooks,
    totals: Totals,
    /// Every step's phases, sent with the next report (`--timeline`).
    spans: StepSpans,
    /// The GPU allocator's counters at the last epoch's end, for its per-epoch debug line.
    alloc_before: Option<AllocatorStats>,
}

impl<'a> Trainer<'a> {
    /// Builds the model and optimizer, prepares the data and restores the state the task
    /// starts from: rank 0's weights, a checkpoint (`resume`), or the running job's (`join`).
    pub fn new(
        task: &'a TrainTask,
        registry: &ModelRegistry,
        ctx: &'a mut dyn TaskContext,
        comm: &'a mut dyn Collective,
    ) -> Result<Trainer<'a>> {
        let spec = &task.spec;
        let model = Model::build(&spec.model, registry, spec.train.seed, task.device)?;
        let shape = model.shape().clone();
        check_outputs(spec.train.loss, &shape)?;
        // `model.init_from` (checked by the driver when it planned the job) gives every rank
        // the same weights, frozen ones included; a resumed job takes the checkpoint's.
        if !task.resume {
            ringflow_interop::weights::init_model(&spec.model, &model)?;
        }
        // Every replica starts from rank 0's weights (a joiner gets them, and the rest of the
        // state, in `restore`).
        if !task.join {
            let mut flat = model.params().flatten_values()?;
            comm.broadcast(&mut flat, 0)?;
            model.params().load_flat_values(&flat)?;
        }
        let optimizer = Optimizer::new(spec.train.optimizer.clone(), model.params())?;
        let label = label_kind(spec.train.loss, shape.outputs);
        let data = prepare_data(spec, &task.data, &shape, Some(label), ctx)?;
        let position = Position {
            epoch: 0,
            global_step: 0,
            rank: comm.rank(),
            world: comm.world(),
        };
        let mut trainer = Trainer {
            task,
            ctx,
            ring: Ring::Started(comm),
            model,
            grads: GradStore::new(),
            shape,
            optimizer,
            sync: GradientSync::Alone,
            data,
            position,
            plan: StepPlan::from_start(spec, task.steps_per_epoch, &position),
            hooks: TestHooks::default(),
            totals: Totals {
                last_loss: f64::NAN,
                ..Totals::default()
            },
            spans: StepSpans::new(),
            alloc_before: None,
        };
        trainer.restore()?;
        Ok(trainer)
    }

    /// Restores the state the task starts from: the running job's for a joiner (from rank 0,
    /// through a re-formed ring if the one it joined broke first), the checkpoint's on
    /// `--resume`; then connects the gradient synchronisation.
    fn restore(&mut self) -> Result<()> {
        let spec = &self.task.spec;
        if self.task.join {
            let (recovered, epoch, step) =
                CommittedState::join(self.ctx, &self.model, &mut self.optimizer, self.ring.get())?;
            (self.position.epoch, self.position.global_step) = (epoch, step);
            match recovered {
                Some(r) => return self.adopt(r),
                None => {
                    let steps = self.task.steps_per_epoch;
                    self.plan = StepPlan::on_new_ring(spec, steps, &self.position);
                }
            }
        } else if self.task.resume {
            let (epoch, step) = Checkpoints::resume(spec, &self.model, &mut self.optimizer)?;
            (self.position.epoch, self.position.global_step) = (epoch, step);
            self.plan = StepPlan::from_start(spec, self.task.steps_per_epoch, &self.position);
        }
        self.connect_sync()
    }

    /// Goes on in the re-formed ring `recovered`: this rank's place in it, its step plan and
    /// gradient synchronisation.
    fn adopt(&mut self, recovered: Recovered) -> Result<()> {
        self.ring = Ring::Reformed(recovered.comm);
        let comm = self.ring.get();
        (self.position.rank, self.position.world) = (comm.rank(), comm.world());
        let steps = recovered.steps_per_epoch;
        self.plan = StepPlan::on_new_ring(&self.task.spec, steps, &self.position);
        self.connect_sync()
    }

    /// Sets up the gradient synchronisation and the test hooks for the current ring.
    fn connect_sync(&mut self) -> Result<()> {
        let timeout = Duration::from_secs(self.task.spec.cluster.comm_timeout_s);
        let fusion = self.task.spec.cluster.fusion;
        self.sync = GradientSync::new(self.ring.get(), self.model.params(), fusion, timeout);
        self.hooks = TestHooks::for_rank(self.position.rank)?;
        Ok(())
    }

    /// Runs the remaining epochs, then [`Trainer::finish`]es.
    pub fn run(mut self) -> Result<TrainOutcome> {
        while self.position.epoch < self.task.spec.train.epochs {
            let commit = match self.task.elastic {
                true => Some(CommittedState::take(
                    &self.model,
                    &self.optimizer,
                    self.position.epoch,
                    self.position.global_step,
                )?),
                false => None,
            };
            let end = match self.run_epoch(commit.is_some()) {
                Err(ExecutorError::Comm(why)) if commit.is_some() => EpochEnd::Reform(why.into()),
                end => end?,
            };
            match (end, commit) {
                (EpochEnd::Done(done), _) => self.end_epoch(done)?,
                (EpochEnd::Reform(why), Some(commit)) => self.recover(&commit, &why)?,
                // Only an elastic run is ever asked to re-form (`run_epoch(true)`).
                (EpochEnd::Reform(why), None) => {
                    return Err(CommError::new(Peer::Ring, CommOp::Reform, why.to_string()).into());
                }
            }
        }
        self.finish()
    }

    /// Elastic recovery from `commit` after `why`: waits for the driver to re-form the ring,
    /// goes back to the epoch's start and adopts the new rank 0's state; the epoch then runs
    /// again on the new ring (the driver re-plans it, so every row is used once).
    pub fn recover(&mut self, commit: &CommittedState, why: &ReformCause) -> Result<()> {
        self.ring.get().close();
        let (recovered, epoch, step) =
            commit.rejoin(self.ctx, &why.to_string(), &self.model, &mut self.optimizer)?;
        (self.position.epoch, self.position.global_step) = (epoch, step);
        self.adopt(recovered)
    }

    /// Ends training: rank 0 saves the model, then every rank evaluates its share of the test
    /// split. The ranks wait for the save before evaluating, so a test split that fails to
    /// evaluate ends the job with its model saved (the error says where).
    pub fn finish(mut self) -> Result<TrainOutcome> {
        self.sync.finish(self.ring.get());
        let param_checksum = self.model.params().checksum()?;
        let (epochs, steps) = (self.task.spec.train.epochs, self.position.global_step);
        let model_dir = if self.position.rank == 0 {
            let dir = &self.task.model_dir;
            let saver = self.checkpoints();
            saver.save(dir, &self.model, &self.optimizer, epochs, steps)?;
            Some(dir.clone())
        } else {
            None
        };
        if self.task.spec.data.test.is_some() {
            self.ring.get().barrier()?;
            let stats = self
                .evaluate_test()
                .map_err(|e| ExecutorError::FinalEvaluation {
                    model_dir: self.task.model_dir.clone(),
                    source: Box::new(e),
                })?;
            self.ctx
                .report(crate::train::context::TrainEvent::Evaluated(stats))?;
        }
        Ok(TrainOutcome {
            epochs,
            steps,
            samples: self.totals.samples,
            train_seconds: self.totals.train_seconds,
            final_train_loss: self.totals.last_loss,
            param_checksum,
            model_dir,
        })
    }

    /// This rank's share of the test split, evaluated with the model as it is.
    fn evaluate_test(&mut self) -> Result<EvalStats> {
        let plan = self.ctx.epoch_plan(Split::Test, 0)?;
        let data = &self.data;
        let (converter, read) = (data.converter.clone(), data.read.clone());
        evaluate(
            &self.model,
            self.task.spec.train.loss,
            &plan,
            (converter, read),
            data.entities.as_ref(),
        )
    }

    /// The job's checkpoints, with what is saved along with the model.
    fn checkpoints(&self) -> Checkpoints<'_> {
        Checkpoints {
            job_id: &self.task.job_id,
            spec: &self.task.spec,
            written: self.task.written.as_ref(),
            preprocessing: &self.data.preprocessing,
        }
    }
}

/// Checks that the model's outputs suit the loss.
fn check_outputs(loss: LossKind, shape: &ModelShape) -> Result<()> {
    let name = match loss {
        LossKind::BinaryCrossEntropy => "binary_cross_entropy",
        LossKind::Mse => "mse",
        LossKind::CrossEntropy => return Ok(()),
    };
    if shape.outputs != 1 {
        return Err(Unrunnable::LossOutputs {
            loss: name,
            outputs: shape.outputs,
        }
        .into());
    }
    Ok(())
}
