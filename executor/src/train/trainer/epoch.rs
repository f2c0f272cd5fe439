//! One epoch of a [`Trainer`]: its steps (forward, backward, gradient sync, optimizer), the
//! progress reports, the mid-epoch checkpoints, and what ends it ([`EpochEnd`]).

use crate::data::sequences::unknown::SingletonUnk;
use std::fmt;
use std::time::Instant;

use ringflow_core::pb::EpochPlan;
use ringflow_ml::rng::{self, streams};

use super::Trainer;
use crate::collective::ReduceOp;
use crate::data::augment::BatchPosition;
use crate::data::batches::{EpochStream, READ_DEADLINE};
use crate::data::batches_ahead::BatchesAhead;
use crate::error::{CommError, ExecutorError, Result};
use crate::train::context::{EpochStats, PhaseTimes, Split, TrainEvent};
use crate::train::eval::labels_tensor;
use crate::train::forward::forward_batch;
use crate::train::sync::Contribution;

/// Seconds between [`TrainEvent::Step`] reports.
const REPORT_INTERVAL_S: f64 = 1.0;

/// How an epoch ended.
#[derive(Debug)]
pub enum EpochEnd {
    /// Every step ran and every rank reported the epoch.
    Done(EpochDone),
    /// The ring must be re-formed before the epoch can run (an elastic run only).
    Reform(ReformCause),
}

/// What a completed epoch adds to the run's totals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochDone {
    /// Rows whose gradients were part of a step.
    pub samples: u64,
    /// The epoch's mean loss.
    pub loss: f64,
    /// Seconds the epoch's steps took.
    pub seconds: f64,
}

/// Why the ring is re-formed; its text goes to the driver as the cause.
#[derive(Clone, Debug)]
pub enum ReformCause {
    /// Idle executors join at this epoch boundary (planned by the driver).
    AddExecutors,
    /// An executor was lost while this rank's steps did not need it (backup workers).
    LostExecutor,
    /// The ring broke: an operation on it failed with this error.
    Broken(CommError),
}

impl From<CommError> for ReformCause {
    fn from(why: CommError) -> ReformCause {
        ReformCause::Broken(why)
    }
}

impl fmt::Display for ReformCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReformCause::AddExecutors => {
                f.write_str("the driver re-forms the ring to add executors")
            }
            ReformCause::LostExecutor => {
                f.write_str("the driver is re-forming the ring after losing an executor")
            }
            ReformCause::Broken(why) => why.fmt(f),
        }
    }
}

/// An epoch's running sums.
#[derive(Default)]
struct EpochSums {
    loss: f64,
    steps: u64,
    samples: u64,
    /// Backup workers: rows whose gradient came too late.
    late: u64,
    /// Backup workers: rows of steps skipped to catch up.
    skipped: u64,
    phases: PhaseTimes,
    /// Token sequences: real tokens trained, and the padding of their batches.
    tokens: u64,
    padding: u64,
}

/// The loss and throughput since the last progress report.
struct ReportWindow {
    loss: f64,
    steps: u64,
    samples: u64,
    start: Instant,
}

impl ReportWindow {
    fn new() -> ReportWindow {
        ReportWindow {
            loss: 0.0,
            steps: 0,
            samples: 0,
            start: Instant::now(),
        }
    }

    /// The mean loss and samples per second when a report is due.
    fn due(&self) -> Option<(f64, f64)> {
        let seconds = self.start.elapsed().as_secs_f64();
        (seconds >= REPORT_INTERVAL_S).then(|| {
            let loss = self.loss / self.steps as f64;
            (loss, self.samples as f64 / seconds)
        })
    }
}

/// What one step did.
enum Step {
    /// The other ranks finished it without this one (backup workers): their gradient was
    /// applied and this batch of `rows` skipped.
    CaughtUp { rows: u64 },
    /// This rank trained on `rows` rows.
    Trained {
        rows: u64,
        /// Real tokens and padding steps of a batch of sequences (0 otherwise).
        tokens: u64,
        padding: u64,
        loss: f64,
        phases: PhaseTimes,
        contribution: Contribution,
    },
}

impl Trainer<'_> {
    /// Runs the current epoch; `elastic` lets it end early with [`EpochEnd::Reform`] when the
    /// driver re-forms the ring.
    pub fn run_epoch(&mut self, elastic: bool) -> Result<EpochEnd> {
        let epoch = self.position.epoch;
        let plan = self.ctx.epoch_plan(Split::Train, epoch)?;
        if plan.reform && elastic {
            return Ok(EpochEnd::Reform(ReformCause::AddExecutors));
        }
        if plan.steps != self.plan.steps_per_epoch {
            return Err(ExecutorError::StepPlan {
                epoch,
                planned: plan.steps,
                expected: self.plan.steps_per_epoch,
            });
        }
        let mut stream = self.open_stream(&plan, epoch);
        let first_step = std::mem::take(&mut self.plan.skip_steps);
        for _ in 0..first_step {
            // Steps the resumed checkpoint already took: draw their batches, train on none.
            stream.next_batch(READ_DEADLINE)?;
        }
        let (mut sums, mut window) = (EpochSums::default(), ReportWindow::new());
        let epoch_start = Instant::now();
        for step in first_step..plan.steps {
            if self.ctx.cancelled() {
                return Err(ExecutorError::Cancelled);
            }
            let (rows, loss, phases, contribution) =
                match self.step(&mut stream, step, plan.steps)? {
                    Step::CaughtUp { rows } => {
                        sums.skipped += rows;
                        continue;
                    }
                    Step::Trained {
                        rows,
                        tokens,
                        padding,
                        loss,
                        phases,
                        contribution,
                    } => {
                        (sums.tokens, sums.padding) =
                            (sums.tokens + tokens, sums.padding + padding);
                        (rows, loss, phases, contribution)
                    }
                };
            if contribution == Contribution::Dropped {
                sums.late += rows;
            }
            sums.phases += phases;
            (sums.loss, sums.steps, sums.samples) =
                (sums.loss + loss, sums.steps + 1, sums.samples + rows);
            (window.loss, window.steps, window.samples) =
                (window.loss + loss, window.steps + 1, window.samples + rows);
            if step + 1 < plan.steps
                && let Some((loss, samples_per_s)) = window.due()
            {
                self.ctx.report(TrainEvent::Step {
                    epoch,
                    step: step + 1,
                    steps: plan.steps,
                    loss,
                    samples_per_s,
                    spans: self.spans.take(),
                })?;
                if elastic && self.ctx.reforming() {
                    // Recover now rather than at the epoch's end.
                    return Ok(EpochEnd::Reform(ReformCause::LostExecutor));
                }
                window = ReportWindow::new();
            }
        }
        let seconds = epoch_start.elapsed().as_secs_f64();
        self.log_epoch_costs(&sums);
        let stats = EpochStats {
            epoch,
            steps: plan.steps,
            samples: sums.samples - sums.late,
            dropped_samples: sums.late + sums.skipped,
            loss: sums.loss / sums.steps.max(1) as f64,
            seconds,
            phases: sums.phases,
            spans: self.spans.take(),
            tokens: sums.tokens,
            padding: sums.padding,
            fusion: self.sync.fusion(),
        };
        let done = EpochDone {
            samples: stats.samples,
            loss: stats.loss,
            seconds,
        };
        self.ctx.report(TrainEvent::EpochEnd(stats))?;
        self.sync_buffers()?;
        // No rank goes on to the next epoch (and commits it) before every rank has reported
        // this one: a ring re-formed from any rank's commit finds the driver's record of the
        // epochs before it complete. With backup workers, where no step waited for every rank,
        // this is also where a hung rank is found before the others finish the job.
        self.ring.get().barrier()?;
        Ok(EpochEnd::Done(done))
    }

    /// The epoch's batches, shuffled by a generator of (seed, epoch, rank), drawn ahead of
    /// the steps.
    fn open_stream(&self, plan: &EpochPlan, epoch: u64) -> BatchesAhead {
        let spec = &self.task.spec;
        let shuffle_rng = rng::seeded(
            spec.train.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            streams::SHUFFLE + ((self.position.rank as u64) << 32),
        );
        let shuffle = Some((spec.data.shuffle_buffer, shuffle_rng));
        let unknown =
            SingletonUnk::for_epoch(spec.data.vocab.singleton_unk, spec.train.seed, epoch);
        let stream = EpochStream::start(
            plan,
            self.data.converter.clone(),
            self.shape.input_width(),
            (shuffle, spec.data.buckets_by_length()),
            unknown,
            self.data.read.clone(),
        );
        BatchesAhead::start(stream, spec.train.batch_size)
    }

    /// Step `step` of `steps` in the epoch: the next batch through forward, backward, the
    /// gradient sync and the optimizer; the global step advances, and a checkpoint is written
    /// when one is due.
    fn step(&mut self, stream: &mut BatchesAhead, step: u64, steps: u64) -> Result<Step> {
        let spec = &self.task.spec;
        let (epoch, rank, global_step) = (
            self.position.epoch,
            self.position.rank,
            self.position.global_step,
        );
        let t0 = Instant::now();
        let mut batch = stream
            .next_batch(READ_DEADLINE)?
            .ok_or(ExecutorError::OutOfRows {
                rank,
                step,
                steps,
                epoch,
            })?;
        let rows = batch.rows;
        let (tokens, padding) = (batch.tokens() as u64, batch.padding() as u64);
        let lr = spec
            .train
            .schedule
            .lr_at(self.plan.base_lr, global_step, self.plan.total_steps);
        let params = self.model.params();
        if self
            .sync
            .caught_up(self.ring.get(), params, &mut self.grads, global_step)?
        {
            self.apply(lr)?;
            self.position.global_step += 1;
            return Ok(Step::CaughtUp { rows: rows as u64 });
        }
        if let Some(augment) = &self.data.augment {
            augment.apply(
                &mut batch.features,
                rows,
                BatchPosition { epoch, rank, step },
            );
        }
        let device = self.task.device;
        let labels = std::mem::take(&mut batch.labels);
        let y = labels_tensor(spec.train.loss, labels, self.shape.outputs, device)?;
        let t1 = Instant::now();
        self.grads.zero();
        let mut dropout = self.dropout_rng();
        let output = forward_batch(&self.model, &mut batch, true, &mut dropout, device)?;
        let loss = spec.train.loss.compute(&output, &y)?;
        let t2 = Instant::now();
        if self.updates_in_backward() {
            self.optimizer.backward(&loss, lr, &mut self.grads)?;
        } else {
            self.sync
                .backward(&loss, self.ring.get(), &mut self.grads)?;
        }
        self.hooks.after_backward(rank, global_step);
        let t3 = Instant::now();
        let ring = self.ring.get();
        let contribution = self
            .sync
            .exchange(ring, params, &mut self.grads, global_step)?;
        let t4 = Instant::now();
        self.apply(lr)?;
        let loss_value = loss.item()? as f64;
        let t5 = Instant::now();
        drop((output, loss));
        let phases = PhaseTimes {
            data: (t1 - t0).as_secs_f64(),
            forward: (t2 - t1).as_secs_f64(),
            backward: (t3 - t2).as_secs_f64(),
            allreduce: (t4 - t3).as_secs_f64(),
            optimizer: (t5 - t4).as_secs_f64(),
        };
        self.spans.record(epoch, step, t0, phases);
        if !loss_value.is_finite() {
            return Err(ExecutorError::NonFiniteLoss {
                loss: loss_value,
                epoch,
                step,
            });
        }
        self.position.global_step += 1;
        let every = spec.cluster.checkpoint_every_steps;
        if every > 0 && self.position.global_step.is_multiple_of(every) && step + 1 < steps {
            // Every rank is at this step (no backup workers skip it), so the buffers can be
            // averaged first: a run resumed from this checkpoint continues from the state an
            // uninterrupted run has here.
            if spec.cluster.backup_workers == 0 {
                self.sync_buffers()?;
            }
            self.checkpoint(epoch)?;
        }
        Ok(Step::Trained {
            rows: rows as u64,
            tokens,
            padding,
            loss: loss_value,
            phases,
            contribution,
        })
    }

    /// Whether the step's weights are updated inside the backward pass
    /// ([`ringflow_ml::optim::Optimizer::backward`]): alone (no gradient to combine), without
    /// clipping (which reads every gradient first), with plain SGD, on the CPU (whose GEMM
    /// writes the update from its registers; elsewhere it would only cost a temporary).
    fn updates_in_backward(&self) -> bool {
        self.sync.is_alone()
            && self.task.spec.train.clip_grad_norm.is_none()
            && self.task.device == ringflow_ml::Device::Cpu
            && self.optimizer.updates_in_backward()
    }

    /// Applies the step's common gradient: clipping, then the optimizer at `lr`.
    fn apply(&mut self, lr: f32) -> Result<()> {
        if let Some(max_norm) = self.task.spec.train.clip_grad_norm {
            let params = self.model.params().iter().map(|p| &p.tensor);
            self.grads.clip_norm(params, max_norm)?;
        }
        Ok(self.optimizer.step(lr, &mut self.grads)?)
    }

    /// The dropout masks' generator: they depend only on (seed, rank, step), so a resumed run
    /// draws the same ones.
    fn dropout_rng(&self) -> rng::Rng {
        let step = self.position.global_step;
        rng::seeded(
            self.task.spec.train.seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            streams::DROPOUT + ((self.position.rank as u64) << 32),
        )
    }

    /// After a completed epoch: the run's totals, the end-of-epoch checkpoint and evaluation;
    /// the position moves to the next epoch.
    pub fn end_epoch(&mut self, done: EpochDone) -> Result<()> {
        let epoch = self.position.epoch;
        self.totals.train_seconds += done.seconds;
        self.totals.samples += done.samples;
        self.totals.last_loss = done.loss;
        self.checkpoint(epoch + 1)?;
        let spec = &self.task.spec;
        if spec.data.test.is_some() && spec.train.evaluates_after(epoch) {
            let stats = self.evaluate_test()?;
            self.ctx
                .report(TrainEvent::EpochEvaluated { epoch, stats })?;
        }
        self.position.epoch += 1;
        Ok(())
    }

    /// Averages the model's buffers (batch norm's running statistics) over the ring, so that
    /// every replica holds the same ones. Each rank updates its own from its own batches during
    /// the epoch (they are statistics of the data, not gradients); this runs on every rank at
    /// the end of each epoch and before each mid-epoch checkpoint, so evaluation, checkpoints
    /// and the saved model see the ring's average. Frozen buffers (`model.freeze`) keep their
    /// values; a model with no other buffers sends nothing.
    fn sync_buffers(&mut self) -> Result<()> {
        let params = self.model.params();
        let mut flat = params.flatten_trained_buffers()?;
        if flat.is_empty() || self.position.world == 1 {
            return Ok(());
        }
        self.ring.get().all_reduce(&mut flat, ReduceOp::Average)?;
        Ok(params.load_trained_buffers(&flat)?)
    }

    /// Rank 0 writes the job's checkpoint as of `epochs_done` and reports it.
    fn checkpoint(&mut self, epochs_done: u64) -> Result<()> {
        if self.position.rank != 0 {
            return Ok(());
        }
        let step = self.position.global_step;
        let written = self
            .checkpoints()
            .write(&self.model, &self.optimizer, epochs_done, step)?;
        self.ctx.report(written)
    }

    /// Debug lines on what the epoch spent outside the model: gradient staging on a ring, and
    /// the GPU allocator's reuse.
    fn log_epoch_costs(&mut self, sums: &EpochSums) {
        let (rank, epoch, device) = (self.position.rank, self.position.epoch, self.task.device);
        if let Some(staging) = self.sync.take_staging() {
            let step_s = sums.phases.total() / sums.steps.max(1) as f64;
            let staging_s = staging.as_secs_f64() / sums.steps.max(1) as f64;
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
            let (requests, hits) = match self.alloc_before.replace(now) {
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
    }
}
