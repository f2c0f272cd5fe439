//! The service the command line calls.

use std::sync::Arc;
use std::time::Instant;

use ringflow_core::pb::{self, jobs_server::Jobs};
use ringflow_core::spec::SpecAsWritten;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Shared, status};
use crate::outputs::{DirLock, LockTiming, OutputError};
use crate::scheduler::{JobKind, Scheduler};

pub(crate) struct JobsService(pub Arc<Shared>);

/// Takes the lock on the job's output directory (its creation is the directory's write probe)
/// and queues the job under a new id; refused, naming the directory and its holder, when
/// another job holds it. Blocking: it writes to storage.
fn queue(shared: &Shared, kind: JobKind) -> Result<String, OutputError> {
    let id = shared.lock().new_job_id(&kind.name());
    let lock = match kind.output_dir() {
        Some((key, dir)) => Some(DirLock::acquire(key, &dir, &id, LockTiming::default())?),
        None => None,
    };
    let id = shared.lock().submit_as(id, kind, lock, Instant::now());
    shared.tick();
    Ok(id)
}

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitReply>, Status> {
        let req = req.into_inner();
        if req.protocol_version != ringflow_core::PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "this client speaks ringflow protocol version {}, the driver speaks version {}; \
                 use the same ringflow version for both",
                req.protocol_version,
                ringflow_core::PROTOCOL_VERSION
            )));
        }
        // Errors about a training job's spec start with its file.
        let prefix = if req.spec_file.is_empty() {
            String::new()
        } else {
            format!("{}: ", req.spec_file)
        };
        let kind = match pb::TaskKind::try_from(req.kind) {
            Ok(pb::TaskKind::BenchAllreduce) => {
                let spec = req.bench.unwrap_or_default();
                if req.bench_executors == 0 || spec.iters == 0 {
                    return Err(Status::invalid_argument(
                        "a benchmark needs at least one executor and one iteration",
                    ));
                }
                JobKind::Bench {
                    executors: req.bench_executors as usize,
                    spec,
                }
            }
            Ok(kind @ (pb::TaskKind::Eval | pb::TaskKind::Predict)) => {
                let registry = self.0.registry.clone();
                let predict =
                    (kind == pb::TaskKind::Predict).then_some((req.output, req.id_column));
                let (model_dir, data) = (req.model_dir, req.data);
                let executors = req.executors.max(1) as usize;
                let predict_for_plan = predict.clone();
                let overwrite = req.overwrite;
                let planned = tokio::task::spawn_blocking(move || {
                    Scheduler::plan_inference(
                        &registry,
                        &model_dir,
                        &data,
                        predict_for_plan.as_ref(),
                        overwrite,
                    )
                    .map(|(plan, pre)| (plan, pre, model_dir))
                })
                .await
                .map_err(|e| Status::internal(format!("planning stopped: {e}")))?
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let (plan, preprocessing, model_dir) = planned;
                JobKind::Infer {
                    plan: Box::new(plan),
                    executors,
                    model_dir,
                    predict,
                    overwrite,
                    preprocessing,
                }
            }
            _ => {
                let registry = self.0.registry.clone();
                let spec = req.spec;
                let resume = req.resume;
                let written = req.written.map(SpecAsWritten::from);
                // Planning reads Parquet footers: keep it off the async workers.
                let plan = tokio::task::spawn_blocking(move || {
                    Scheduler::plan_job(&registry, &spec, resume, written)
                })
                .await
                .map_err(|e| Status::internal(format!("planning stopped: {e}")))?
                .map_err(|e| Status::invalid_argument(format!("{prefix}{e}")))?;
                JobKind::Train(Box::new(plan))
            }
        };
        let shared = self.0.clone();
        let job_id = tokio::task::spawn_blocking(move || queue(&shared, kind))
            .await
            .map_err(|e| Status::internal(format!("submitting stopped: {e}")))?
            .map_err(|e| Status::failed_precondition(format!("{prefix}{e}")))?;
        Ok(Response::new(pb::SubmitReply { job_id }))
    }

    type WatchStream = ReceiverStream<Result<pb::JobEvent, Status>>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let job_id = req.into_inner().job_id;
        if self.0.lock().job(&job_id).is_none() {
            return Err(Status::not_found(format!("no job {job_id:?}")));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let shared = self.0.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            // Held from one look to the next, so that the job counts as followed (and is not
            // forgotten by retention) until its summary has been sent.
            let mut changed;
            loop {
                let events;
                (events, changed) = match shared.lock().job(&job_id) {
                    Some(job) => job.events_since(seen),
                    None => return,
                };
                seen += events.len();
                for e in events {
                    let last = matches!(e.event, Some(pb::job_event::Event::Summary(_)));
                    if tx.send(Ok(e)).await.is_err() || last {
                        return;
                    }
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelReply>, Status> {
        let cancelled = self
            .0
            .lock()
            .cancel(&req.into_inner().job_id, Instant::now())
            .map_err(status)?;
        Ok(Response::new(pb::CancelReply { cancelled }))
    }

    async fn list_jobs(
        &self,
        _: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsReply>, Status> {
        let now = Instant::now();
        let s = self.0.lock();
        let jobs = s
            .jobs()
            .map(|j| pb::JobInfo {
                job_id: j.id.clone(),
                name: j.kind.name(),
                state: j.state as i32,
                executors: j.executors_needed() as u32,
                epoch: j.epochs_done(),
                epochs: match &j.kind {
                    JobKind::Train(p) => p.spec.train.epochs,
                    JobKind::Infer { .. } | JobKind::Bench { .. } => 0,
                },
                age_s: j.age(now),
                error: j.error().unwrap_or_default().to_string(),
            })
            .collect();
        Ok(Response::new(pb::ListJobsReply { jobs }))
    }

    async fn list_executors(
        &self,
        _: Request<pb::ListExecutorsRequest>,
    ) -> Result<Response<pb::ListExecutorsReply>, Status> {
        let now = Instant::now();
        let s = self.0.lock();
        let executors = s
            .executors()
            .map(|e| pb::ExecutorStatus {
                info: Some(e.info.clone()),
                state: if e.assigned.is_some() { "busy" } else { "idle" }.into(),
                job_id: e
                    .assigned
                    .as_ref()
                    .map(|a| a.job_id.clone())
                    .unwrap_or_default(),
                rank: e.assigned.as_ref().map(|a| a.rank).unwrap_or(0),
                last_heartbeat_s: now.duration_since(e.last_seen).as_secs_f64(),
            })
            .collect();
        Ok(Response::new(pb::ListExecutorsReply { executors }))
    }
}
