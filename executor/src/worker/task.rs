//! Running one task the driver assigned: its header becomes the ring this executor connects
//! ([`ring::connect`]: the ring, and shared memory where ranks share hosts), its preprocessing
//! is fetched when it was too large to travel inside it, its work (train, evaluate or predict,
//! benchmark) runs, and its end is reported.

use ringflow_core::pb;
use ringflow_core::spec::ResolvedSpec;
use ringflow_core::wire::payload;
use ringflow_ml::Device;
use ringflow_ml::nn::ModelRegistry;
use tracing::{info, warn};

use super::client::DriverClient;
use super::context::{RemoteContext, RingPlace};
use super::ring;
use super::{Current, ExecutorConfig, bench, peak_rss_bytes};
use crate::collective::{Broken, Collective, RingListener};
use crate::error::{ExecutorError, Result};
use crate::infer::{InferTask, run_inference};
use crate::placement;
use crate::train::setup::DataOptions;
use crate::train::{TrainTask, run_task, with_compute_threads};

use pb::finish_task_request::Result as Finish;

/// What an executor runs its tasks with: the driver's connection, its ring listener, its
/// configuration and model kinds, and what it tells the heartbeat about the current task.
pub struct Worker<'a> {
    /// The runtime of the driver connection.
    pub rt: &'a tokio::runtime::Runtime,
    /// The driver.
    pub client: &'a DriverClient,
    /// Where other ranks connect to this one.
    pub listener: &'a RingListener,
    /// The executor's settings.
    pub config: &'a ExecutorConfig,
    /// The model kinds it knows.
    pub registry: &'a ModelRegistry,
    /// The current task, for the heartbeat (cancellation).
    pub current: &'a Current,
    /// This executor, as registered.
    pub info: &'a pb::ExecutorInfo,
}

impl Worker<'_> {
    /// Runs `task` and reports its end (before the ring closes, so that the failing rank's own
    /// error reaches the driver ahead of its neighbours' "connection closed").
    pub fn run_one(&self, task: &pb::Task) -> Result<()> {
        let (Some(header), Some(work)) = (&task.header, &task.work) else {
            return Err(ExecutorError::Protocol(
                "a task without its header or work; are the driver and this executor of one \
                 version?"
                    .into(),
            ));
        };
        // An elastic job's rank changes when its ring is re-formed; the end is reported under
        // the last one.
        let mut final_rank = header.rank;
        let mut ring: Option<Box<dyn Collective>> = None;
        let result: Result<Finish> = (|| {
            let comm = ring
                .insert(connect_ring(
                    self.listener,
                    header,
                    work,
                    &self.config.driver,
                )?)
                .as_mut();
            match work {
                pb::task::Work::Bench(spec) => bench::all_reduce(comm, spec)
                    .map(|seconds| Finish::Bench(pb::BenchResult { seconds })),
                pb::task::Work::Train(train) => self
                    .train(header, train, comm, &mut final_rank)
                    .map(Finish::Outcome),
                pb::task::Work::Infer(infer) => self.infer(header, infer).map(Finish::Outcome),
            }
        })();
        // A failed connection may be the consequence of another executor's loss: the driver
        // waits briefly for the root cause before failing the job with it.
        let communication = matches!(result, Err(ExecutorError::Comm(_)));
        let result = result.unwrap_or_else(|e| {
            if !matches!(e, ExecutorError::Cancelled) {
                warn!(job = %header.job_id, rank = header.rank, "task failed: {e}");
            }
            Finish::Error(e.to_string())
        });
        let finish = pb::FinishTaskRequest {
            job_id: header.job_id.clone(),
            rank: final_rank,
            executor_id: self.info.executor_id.clone(),
            result: Some(result),
            communication,
        };
        let sent = self.rt.block_on(self.client.finish_task(finish));
        drop(ring);
        sent
    }

    /// Trains as rank `header.rank` of `comm`; `final_rank` is set to the rank it ended as
    /// (a re-formed ring may have given it another), also when training fails.
    fn train(
        &self,
        header: &pb::TaskHeader,
        work: &pb::TrainWork,
        comm: &mut dyn Collective,
        final_rank: &mut u32,
    ) -> Result<pb::TaskOutcome> {
        let (spec, device) = self.job_and_device(header, "trains")?;
        let train = TrainTask {
            job_id: header.job_id.clone(),
            spec,
            steps_per_epoch: work.steps_per_epoch,
            model_dir: work.model_dir.clone(),
            data: self.data_options(header, work.data.as_ref())?,
            resume: work.resume,
            elastic: work.elastic,
            join: work.join,
            device,
            written: work.written.clone().map(Into::into),
        };
        let mut ctx = self.context(header);
        let outcome = with_compute_threads(self.config.threads, || {
            run_task(&train, self.registry, &mut ctx, comm)
        });
        *final_rank = ctx.rank();
        let mut outcome = pb::TaskOutcome::from(&outcome?);
        outcome.peak_rss_bytes = peak_rss_bytes();
        Ok(outcome)
    }

    /// Evaluates the saved model on this rank's share, or predicts with it.
    fn infer(&self, header: &pb::TaskHeader, work: &pb::InferWork) -> Result<pb::TaskOutcome> {
        let verb = if work.predict.is_some() {
            "predicts"
        } else {
            "evaluates"
        };
        let (spec, device) = self.job_and_device(header, verb)?;
        let infer = InferTask {
            job_id: header.job_id.clone(),
            spec,
            model_dir: work.model_dir.clone(),
            data: self.data_options(header, work.data.as_ref())?,
            predict: work
                .predict
                .as_ref()
                .map(|p| (p.output.clone(), p.id_column.clone())),
            rank: header.rank as usize,
            device,
        };
        let mut ctx = self.context(header);
        let rows_written = with_compute_threads(self.config.threads, || {
            run_inference(&infer, self.registry, &mut ctx)
        })?;
        Ok(pb::TaskOutcome {
            rows_written,
            peak_rss_bytes: peak_rss_bytes(),
            ..Default::default()
        })
    }

    /// The job spec, and the device this executor runs it on: before any model is built, a
    /// GPU this executor cannot use fails the task with a sentence naming the executor.
    fn job_and_device(
        &self,
        header: &pb::TaskHeader,
        verb: &str,
    ) -> Result<(ResolvedSpec, Device)> {
        let spec: ResolvedSpec = payload::decode("TaskHeader.job", &header.job)?;
        let device = place_task(spec.cluster.device, header, verb, &self.info.executor_id)?;
        Ok((spec, device))
    }

    /// What the task's code asks the driver through, and where it re-joins a re-formed ring.
    fn context(&self, header: &pb::TaskHeader) -> RemoteContext<'_> {
        RemoteContext::new(
            self.rt.handle().clone(),
            self.client.clone(),
            header.job_id.clone(),
            header.rank,
            self.current.cancel.clone(),
            RingPlace {
                listener: self.listener,
                executor_id: self.info.executor_id.clone(),
                generation: header.generation,
            },
        )
    }

    /// The data part of a task, with its preprocessing fetched from the driver when it was
    /// too large to travel inside the task.
    fn data_options(
        &self,
        header: &pb::TaskHeader,
        data: Option<&pb::DataAccess>,
    ) -> Result<DataOptions> {
        let mut data = data.cloned().unwrap_or_default();
        if data.preprocessing_bytes > 0 {
            let job = (header.job_id.as_str(), header.rank);
            let fetch = self
                .client
                .fetch_preprocessing(job, false, data.preprocessing_bytes);
            data.preprocessing = self.rt.block_on(fetch)?;
            info!(
                job = %header.job_id,
                rank = header.rank,
                "fetched the job's preprocessing ({} bytes) from the driver",
                data.preprocessing_bytes
            );
        }
        let preprocessing =
            payload::decode_optional("DataAccess.preprocessing", &data.preprocessing)?;
        Ok(DataOptions {
            input_columns: data.input_columns,
            preprocessing,
            collect_moments: data.collect_moments,
            collect_labels: data.collect_labels,
            probe_files: data.probe_source.then_some(data.files),
            source_driver: data.source_driver,
            driver_url: self.config.driver.clone(),
            driver_security: self.config.security.clone(),
            job_id: header.job_id.clone(),
            secret: header.secret.clone(),
        })
    }
}

/// Connects this executor to its task's ring. A ring that a joiner of an elastic job cannot
/// connect (another member was lost meanwhile) is [`Broken`]: the joiner recovers from it like
/// the members that were training.
fn connect_ring(
    listener: &RingListener,
    header: &pb::TaskHeader,
    work: &pb::task::Work,
    driver: &str,
) -> Result<Box<dyn Collective>> {
    let (rank, world) = (header.rank as usize, header.ring.len());
    let elastic_joiner = matches!(work, pb::task::Work::Train(t) if t.join && t.elastic);
    match ring::connect(listener, header, driver) {
        Ok(ring) => Ok(ring),
        Err(ExecutorError::Comm(why)) if elastic_joiner => {
            Ok(Box::new(Broken { rank, world, why }))
        }
        Err(e) => Err(e),
    }
}

/// Chooses the device this executor runs a task on (see [`crate::placement`]) and checks that
/// it can use it; the error names the executor. `verb` says what the task does ("trains").
fn place_task(
    requested: Device,
    header: &pb::TaskHeader,
    verb: &str,
    executor_id: &str,
) -> Result<Device> {
    let visible = if requested.is_cpu() {
        0
    } else {
        Device::cuda_devices().len()
    };
    let placed = placement::place(requested, &header.ring, header.rank as usize, visible);
    placed
        .device
        .check_available()
        .map_err(|source| ExecutorError::DeviceUnusable {
            executor: executor_id.to_string(),
            device: requested.to_string(),
            source: Box::new(source),
        })?;
    info!(job = %header.job_id, rank = header.rank, "executor {executor_id} {verb} on {placed}");
    Ok(placed.device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::ring::test_header as header;

    #[test]
    fn cpu_tasks_are_placed_on_the_cpu() {
        let h = header(&["h:1", "h:2"], 1);
        let device = place_task(Device::Cpu, &h, "trains", "exec-1");
        assert_eq!(device.unwrap(), Device::Cpu);
    }

    #[test]
    fn a_gpu_this_executor_cannot_use_fails_the_task_naming_it() {
        if !Device::cuda_devices().is_empty() {
            return; // This machine has a usable GPU.
        }
        let h = header(&["h:1"], 0);
        let err = place_task(Device::Cuda(0), &h, "trains", "exec-1")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("executor exec-1 cannot use the job's cluster.device = \"cuda\": "),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
