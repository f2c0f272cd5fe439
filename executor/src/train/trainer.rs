//! [`run_task`]: training, evaluation and the final save, for one rank.

use std::time::{Duration, Instant};

use ringflow_ml::checkpoint::{self, TrainingState};
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{Model, ModelRegistry};
use ringflow_ml::optim::Optimizer;
use ringflow_ml::rng::{self, streams};
use ringflow_ml::{Device, Tensor};
use ringflow_proto::data::Location;
use ringflow_proto::data::location::upload_dir;
use ringflow_proto::spec::JobSpec;

use crate::collective::Collective;
use crate::data::batches::EpochStream;
use crate::data::features::LabelKind;
use crate::error::{ExecutorError, Result};
use crate::train::commit::Commit;
use crate::train::context::{EpochStats, PhaseTimes, Split, TaskContext, TrainEvent};
use crate::train::eval::{evaluate, labels_tensor};
use crate::train::setup::{DataOptions, TaskData, prepare_data};
use crate::train::sync::{Contribution, GradientSync, Straggler};
use crate::train::timeline::StepSpans;

/// Seconds between [`TrainEvent::Step`] reports.
const REPORT_INTERVAL_S: f64 = 1.0;

/// One rank's assignment within a job.
#[derive(Clone, Debug)]
pub struct TrainTask {
    /// The job's id (for logs and checkpoints).
    pub job_id: String,
    /// The job spec, as checked by the driver.
    pub spec: JobSpec,
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
/// of the test split, and (on rank 0) saves the model.
pub fn run_task(
    task: &TrainTask,
    registry: &ModelRegistry,
    ctx: &mut dyn TaskContext,
    comm: &mut dyn Collective,
) -> Result<TrainOutcome> {
    let spec = &task.spec;
    let (mut rank, mut world) = (comm.rank(), comm.world());
    let device = task.device;
    let model = Model::build(&spec.model, registry, spec.train.seed, device)?;
    let shape = model.shape();
    if spec.train.loss == LossKind::BinaryCrossEntropy && shape.outputs != 1 {
        return Err(ExecutorError::Spec(format!(
            "train.loss = \"binary_cross_entropy\" needs a model with 1 output, this one has {}",
            shape.outputs
        )));
    }
    if spec.train.loss == LossKind::Mse && shape.outputs != 1 {
        return Err(ExecutorError::Spec(format!(
            "train.loss = \"mse\" needs a model with 1 output, this one has {}",
            shape.outputs
        )));
    }

    // Every replica starts from rank 0's weights (a joiner gets them, and the rest of the
    // state, below).
    if !task.join {
        let mut flat = model.params().flatten_values()?;
        comm.broadcast(&mut flat, 0)?;
        model.params().load_flat_values(&flat)?;
    }

    let mut optimizer = Optimizer::new(spec.train.optimizer.clone(), model.params())?;
    let comm_timeout = Duration::from_secs(spec.cluster.comm_timeout_s);
    let TaskData {
        read,
        converter,
        preprocessing,
    } = prepare_data(
        spec,
        &task.data,
        shape,
        Some(label_kind(spec.train.loss, shape.outputs)),
        ctx,
    )?;
    // This rank's share of the test split, evaluated with the model as it is.
    let evaluate_test = |ctx: &mut dyn TaskContext| -> Result<_> {
        let plan = ctx.epoch_plan(Split::Test, 0)?;
        evaluate(
            &model,
            spec.train.loss,
            &plan,
            converter.clone(),
            read.clone(),
        )
    };
    // Dropout masks depend only on (seed, rank, step), so a resumed run draws the same ones.
    let dropout_at = |rank: usize, step: u64| {
        rng::seeded(
            spec.train.seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            streams::DROPOUT + ((rank as u64) << 32),
        )
    };
    let mut steps_per_epoch = task.steps_per_epoch;
    // The ring after a recovery (the one this task started with is `comm`).
    let mut reformed: Option<Box<dyn Collective>> = None;
    let (start_epoch, mut global_step) = if task.join {
        let (recovered, epoch, step) = Commit::join(ctx, &model, &mut optimizer, comm)?;
        if let Some(r) = recovered {
            // The ring it joined broke before it was in sync: it goes on in the re-formed one.
            steps_per_epoch = r.steps_per_epoch;
            reformed = Some(r.comm);
        }
        (epoch, step)
    } else if task.resume {
        resume(&spec.checkpoint_path(), &model, &mut optimizer)?
    } else {
        (0, 0)
    };
    let mut skip_steps = if task.join {
        0
    } else {
        global_step.saturating_sub(start_epoch * task.steps_per_epoch)
    };
    // Rank 0 saves the model with what eval, predict and --resume need: the job and the
    // preprocessing.
    let save = |dir: &str, epoch: u64, step: u64, optimizer: &Optimizer| -> Result<()> {
        let state = TrainingState {
            epoch,
            step,
            rng: None,
            extra: serde_json::json!({
                "job_id": task.job_id,
                "job": spec,
                "preprocessing": preprocessing,
            }),
        };
        save_model(dir, &model, optimizer, &state)
    };
    // Returns what to report when this rank wrote one.
    let checkpoint =
        |rank: usize, epoch: u64, step: u64, optimizer: &Optimizer| -> Result<Option<TrainEvent>> {
            if rank != 0 {
                return Ok(None);
            }
            let started = Instant::now();
            let path = spec.checkpoint_path();
            save(&path, epoch, step, optimizer)?;
            Ok(Some(TrainEvent::Checkpoint {
                epochs_done: epoch,
                step,
                path,
                seconds: started.elapsed().as_secs_f64(),
            }))
        };
    let mut sync = match reformed.as_mut() {
        Some(c) => {
            (rank, world) = (c.rank(), c.world());
            GradientSync::new(c.as_mut(), model.params(), comm_timeout)
        }
        None => GradientSync::new(comm, model.params(), comm_timeout),
    };
    let mut total_steps = if task.join {
        global_step + (spec.train.epochs - start_epoch) * steps_per_epoch
    } else {
        steps_per_epoch * spec.train.epochs
    };
    let mut base_lr = spec.train.optimizer.lr() * spec.train.lr_scaling.factor(world);
    let batch_size = spec.train.batch_size;

    let mut samples = 0u64;
    let mut train_seconds = 0.0;
    let mut last_loss = f64::NAN;
    let mut epoch = start_epoch;
    // Every step's phases, sent with the next report (`--timeline`).
    let mut spans = StepSpans::new();
    // The GPU allocator's counters at the last epoch's end, for its per-epoch debug line.
    let mut alloc_before = None;
    while epoch < spec.train.epochs {
        let comm: &mut dyn Collective = match reformed.as_mut() {
            Some(c) => c.as_mut(),
            None => &mut *comm,
        };
        let commit = if task.elastic {
            Some(Commit::take(&model, &optimizer, epoch, global_step)?)
        } else {
            None
        };
        let first_step = if epoch == start_epoch { skip_steps } else { 0 };
        let trained: Result<(u64, f64, f64)> = (|| {
            let plan = ctx.epoch_plan(Split::Train, epoch)?;
            if plan.reform && commit.is_some() {
                // Idle executors join at this epoch boundary: re-form like after a failure.
                return Err(ExecutorError::Comm(
                    "the driver re-forms the ring to add executors".into(),
                ));
            }
            if plan.steps != steps_per_epoch {
                return Err(ExecutorError::Spec(format!(
                    "the driver planned {} steps for epoch {epoch}, the task {steps_per_epoch}",
                    plan.steps
                )));
            }
            let shuffle_rng = rng::seeded(
                spec.train.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                streams::SHUFFLE + ((rank as u64) << 32),
            );
            let mut stream = EpochStream::start(
                &plan,
                converter.clone(),
                shape.inputs,
                Some((spec.data.shuffle_buffer, shuffle_rng)),
                read.clone(),
            );
            let mut phases = PhaseTimes::default();
            let mut epoch_loss = 0.0;
            let mut epoch_steps = 0u64;
            let mut epoch_samples = 0u64;
            // Backup workers: rows whose gradient came too late, and rows of skipped steps.
            let (mut late_samples, mut skipped_samples) = (0u64, 0u64);
            let straggler = Straggler::from_env(rank)?;
            let epoch_start = Instant::now();
            let (mut window_loss, mut window_steps, mut window_samples) = (0.0, 0u64, 0u64);
            let mut window_start = Instant::now();
            for _ in 0..first_step {
                // Steps the resumed checkpoint already took: draw their batches, train on none.
                stream.next_batch(batch_size)?;
            }
            let mut step = first_step;
            while step < plan.steps {
                if ctx.cancelled() {
                    return Err(ExecutorError::Cancelled);
                }
                let t0 = Instant::now();
                let batch = stream.next_batch(batch_size)?.ok_or_else(|| {
                    ExecutorError::Spec(format!(
                        "rank {rank} ran out of rows at step {step} of {} in epoch {epoch}: the \
                     partitions hold fewer rows than planned",
                        plan.steps
                    ))
                })?;
                let rows = batch.rows;
                let lr = spec.train.schedule.lr_at(base_lr, global_step, total_steps);
                if sync.caught_up(comm, model.params(), global_step)? {
                    // Backup workers: the others finished this step without this rank; apply
                    // their gradient and skip the batch.
                    if let Some(max_norm) = spec.train.clip_grad_norm {
                        model.params().clip_grad_norm(max_norm)?;
                    }
                    optimizer.step(lr)?;
                    skipped_samples += rows as u64;
                    global_step += 1;
                    step += 1;
                    continue;
                }
                let x = Tensor::from_vec(batch.features, &[rows, shape.inputs], device)?;
                let y = labels_tensor(spec.train.loss, batch.labels, shape.outputs, device)?;
                let t1 = Instant::now();
                model.params().zero_grad();
                let output = model.forward(&x, true, &mut dropout_at(rank, global_step))?;
                let loss = spec.train.loss.compute(&output, &y)?;
                let t2 = Instant::now();
                sync.backward(&loss, comm)?;
                if let Some(delay) = straggler.and_then(|s| s.delay_at(rank, global_step)) {
                    std::thread::sleep(delay);
                }
                let t3 = Instant::now();
                if sync.exchange(comm, model.params(), global_step)? == Contribution::Dropped {
                    late_samples += rows as u64;
                }
                let t4 = Instant::now();
                if let Some(max_norm) = spec.train.clip_grad_norm {
                    model.params().clip_grad_norm(max_norm)?;
                }
                optimizer.step(lr)?;
                let loss_value = loss.item()? as f64;
                let t5 = Instant::now();
                drop((output, loss));
                let step_phases = PhaseTimes {
                    data: (t1 - t0).as_secs_f64(),
                    forward: (t2 - t1).as_secs_f64(),
                    backward: (t3 - t2).as_secs_f64(),
                    allreduce: (t4 - t3).as_secs_f64(),
                    optimizer: (t5 - t4).as_secs_f64(),
                };
                phases += step_phases;
                spans.record(epoch, step, t0, step_phases);
                if !loss_value.is_finite() {
                    return Err(ExecutorError::Spec(format!(
                        "the training loss became {loss_value} at epoch {epoch} step {step}; lower \
                     train.optimizer.lr or set train.clip_grad_norm"
                    )));
                }
                global_step += 1;
                step += 1;
                let every = spec.cluster.checkpoint_every_steps;
                if every > 0
                    && global_step.is_multiple_of(every)
                    && step < plan.steps
                    && let Some(written) = checkpoint(rank, epoch, global_step, &optimizer)?
                {
                    ctx.report(written)?;
                }
                epoch_loss += loss_value;
                epoch_steps += 1;
                epoch_samples += rows as u64;
                window_loss += loss_value;
                window_steps += 1;
                window_samples += rows as u64;
                let window = window_start.elapsed().as_secs_f64();
                if window >= REPORT_INTERVAL_S && step < plan.steps {
                    ctx.report(TrainEvent::Step {
                        epoch,
                        step,
                        steps: plan.steps,
                        loss: window_loss / window_steps as f64,
                        samples_per_s: window_samples as f64 / window,
                        spans: spans.take(),
                    })?;
                    if commit.is_some() && ctx.reforming() {
                        // An executor was lost while this rank's steps did not need it (backup
                        // workers): recover now rather than at the epoch's end.
                        return Err(ExecutorError::Comm(
                            "the driver is re-forming the ring after losing an executor".into(),
                        ));
                    }
                    (window_loss, window_steps, window_samples) = (0.0, 0, 0);
                    window_start = Instant::now();
                }
            }
            let seconds = epoch_start.elapsed().as_secs_f64();
            if let Some(staging) = sync.take_staging() {
                let step_s = phases.total() / epoch_steps.max(1) as f64;
                let staging_s = staging.as_secs_f64() / epoch_steps.max(1) as f64;
                tracing::debug!(
                    "rank {rank} epoch {epoch}: gradient staging (copies between the gradients \
                     and the ring's buckets on {}) took {:.3} ms per step, {:.1}% of a \
                     {:.3} ms step",
                    device.full_name(),
                    1000.0 * staging_s,
                    100.0 * staging_s / step_s.max(f64::MIN_POSITIVE),
                    1000.0 * step_s
                );
            }
            if let Some(now) = device.allocator_stats() {
                let (requests, hits) = match alloc_before.replace(now) {
                    Some(b) => (now.requests - b.requests, now.hits - b.hits),
                    None => (now.requests, now.hits),
                };
                tracing::debug!(
                    "rank {rank} epoch {epoch}: {} allocator: {:.2}% of {requests} \
                     requests this epoch reused a cached block, {:.1} MiB cached",
                    device.full_name(),
                    100.0 * hits as f64 / requests.max(1) as f64,
                    now.cached_bytes as f64 / (1 << 20) as f64
                );
            }
            let stats = EpochStats {
                epoch,
                steps: plan.steps,
                samples: epoch_samples - late_samples,
                dropped_samples: late_samples + skipped_samples,
                loss: epoch_loss / epoch_steps.max(1) as f64,
                seconds,
                phases,
                spans: spans.take(),
            };
            let (trained, loss) = (stats.samples, stats.loss);
            ctx.report(TrainEvent::EpochEnd(stats))?;
            // No rank goes on to the next epoch (and commits it) before every rank has
            // reported this one: a ring re-formed from any rank's commit finds the driver's
            // record of the epochs before it complete. With backup workers, where no step
            // waited for every rank, this is also where a hung rank is found before the others
            // finish the job.
            comm.barrier()?;
            Ok((trained, loss, seconds))
        })();
        match trained {
            Ok((trained, loss, seconds)) => {
                train_seconds += seconds;
                samples += trained;
                last_loss = loss;
                if let Some(written) = checkpoint(rank, epoch + 1, global_step, &optimizer)? {
                    ctx.report(written)?;
                }
                if spec.data.test.is_some() && spec.train.evaluates_after(epoch) {
                    let stats = evaluate_test(ctx)?;
                    ctx.report(TrainEvent::EpochEvaluated { epoch, stats })?;
                }
                epoch += 1;
            }
            Err(ExecutorError::Comm(why)) if commit.is_some() => {
                // Elastic recovery: wait for the driver to re-form the ring, go back to the
                // epoch's start, adopt the new rank 0's state, and run the epoch again on the
                // new ring (the driver re-plans it, so every row is used once).
                comm.close();
                let commit = commit.expect("checked");
                let (recovered, at_epoch, at_step) =
                    commit.rejoin(ctx, &why, &model, &mut optimizer)?;
                (epoch, global_step) = (at_epoch, at_step);
                let mut new_comm = recovered.comm;
                (rank, world, steps_per_epoch) =
                    (new_comm.rank(), new_comm.world(), recovered.steps_per_epoch);
                skip_steps = 0;
                sync = GradientSync::new(new_comm.as_mut(), model.params(), comm_timeout);
                base_lr = spec.train.optimizer.lr() * spec.train.lr_scaling.factor(world);
                total_steps = global_step + (spec.train.epochs - epoch) * steps_per_epoch;
                reformed = Some(new_comm);
            }
            Err(e) => return Err(e),
        }
    }

    match reformed.as_mut() {
        Some(c) => sync.finish(c.as_mut()),
        None => sync.finish(comm),
    }

    if spec.data.test.is_some() {
        let stats = evaluate_test(ctx)?;
        ctx.report(TrainEvent::Evaluated(stats))?;
    }

    let param_checksum = model.params().checksum()?;
    let model_dir = if rank == 0 {
        save(&task.model_dir, spec.train.epochs, global_step, &optimizer)?;
        Some(task.model_dir.clone())
    } else {
        None
    };
    Ok(TrainOutcome {
        epochs: spec.train.epochs,
        steps: global_step,
        samples,
        train_seconds,
        final_train_loss: last_loss,
        param_checksum,
        model_dir,
    })
}

/// Restores the model and optimizer from the checkpoint in `dir`; returns the epochs completed
/// and the steps taken.
fn resume(dir: &str, model: &Model, optimizer: &mut Optimizer) -> Result<(u64, u64)> {
    let loaded = crate::infer::load_checkpoint(dir)?;
    loaded.restore_model(model)?;
    loaded.restore_optimizer(optimizer)?;
    Ok((loaded.meta.epoch, loaded.meta.step))
}

/// Saves the model into `dir`: directly when it is local, else into a temporary directory that
/// is then uploaded to the object store.
fn save_model(
    dir: &str,
    model: &Model,
    optimizer: &Optimizer,
    state: &TrainingState,
) -> Result<()> {
    let location = Location::parse(dir).map_err(|e| ExecutorError::Spec(e.to_string()))?;
    if let Some(local) = location.local_path() {
        checkpoint::save(&local, model, Some(optimizer), state)?;
        return Ok(());
    }
    let staging = tempfile::tempdir().map_err(|e| {
        ExecutorError::Spec(format!("cannot create a staging directory for {dir}: {e}"))
    })?;
    checkpoint::save(staging.path(), model, Some(optimizer), state)?;
    upload_dir(staging.path(), &location).map_err(|e| ExecutorError::Spec(e.to_string()))
}
