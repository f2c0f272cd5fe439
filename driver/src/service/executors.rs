//! The service executors call: registration, heartbeats and attachment, task handout (and the
//! report of a task that did not arrive), the job's preprocessing in chunks, preparation,
//! progress, recovery and each task's end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ringflow_core::pb::{self, executors_server::Executors};
use ringflow_core::wire::{CHUNK_BYTES, travels_inline};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{Shared, status};

/// The longest a task poll may wait.
const MAX_POLL: Duration = Duration::from_secs(30);

pub(crate) struct ExecutorsService(pub Arc<Shared>);

/// An executor's attachment stream: one event, then open until the connection closes, when
/// dropping it tells the scheduler ([`crate::scheduler::Scheduler::detach`]).
pub(crate) struct Attached {
    first: Option<pb::AttachEvent>,
    shared: Arc<Shared>,
    executor_id: String,
    attachment: u64,
}

impl Stream for Attached {
    type Item = Result<pb::AttachEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.first.take() {
            Some(event) => Poll::Ready(Some(Ok(event))),
            // Nothing more is ever sent: the stream only ends with its connection.
            None => Poll::Pending,
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        tracing::debug!(executor = %self.executor_id, "attachment stream closed");
        self.shared
            .lock()
            .detach(&self.executor_id, self.attachment, Instant::now());
    }
}

/// The chunks of a fetched preprocessing, each cut from the one shared copy as it is sent.
pub(crate) type Chunks = Pin<Box<dyn Stream<Item = Result<pb::PreprocessingChunk, Status>> + Send>>;

/// `doc` as a stream of chunks of at most [`CHUNK_BYTES`].
fn chunked(doc: Arc<str>) -> Chunks {
    let starts = (0..doc.len()).step_by(CHUNK_BYTES);
    Box::pin(tokio_stream::iter(starts.map(move |at| {
        let end = (at + CHUNK_BYTES).min(doc.len());
        Ok(pb::PreprocessingChunk {
            data: doc.as_bytes()[at..end].to_vec(),
        })
    })))
}

/// The reply of a preparation phase: the merged result inside it when it is small, else its
/// length, for the executor to fetch.
fn prepare_reply(merged: Option<Arc<str>>, cancel: bool) -> pb::PrepareReply {
    let ready = merged.is_some();
    let merged = merged.unwrap_or_else(|| "".into());
    let (merged, merged_bytes) = if travels_inline(merged.len()) {
        (merged.to_string(), 0)
    } else {
        (String::new(), merged.len() as u64)
    };
    pb::PrepareReply {
        ready,
        merged,
        cancel,
        merged_bytes,
    }
}

#[tonic::async_trait]
impl Executors for ExecutorsService {
    type AttachStream = Attached;
    type FetchPreprocessingStream = Chunks;

    async fn attach(
        &self,
        req: Request<pb::ExecutorInfo>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let info = req.into_inner();
        let executor_id = info.executor_id.clone();
        let mut s = self.0.lock();
        let attachment = s.attach(info, Instant::now()).map_err(status)?;
        let first = pb::AttachEvent {
            driver_id: s.driver_id.clone(),
        };
        drop(s);
        Ok(Response::new(Attached {
            first: Some(first),
            shared: self.0.clone(),
            executor_id,
            attachment,
        }))
    }

    async fn last_words(
        &self,
        req: Request<pb::LastWordsRequest>,
    ) -> Result<Response<pb::LastWordsReply>, Status> {
        let req = req.into_inner();
        self.0
            .lock()
            .last_words(&req.executor_id, &req.words)
            .map_err(status)?;
        Ok(Response::new(pb::LastWordsReply {}))
    }

    async fn register(
        &self,
        req: Request<pb::ExecutorInfo>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let mut s = self.0.lock();
        s.register(req.into_inner(), Instant::now())
            .map_err(status)?;
        let reply = pb::RegisterReply {
            heartbeat_interval_ms: s.config().heartbeat_interval.as_millis() as u64,
            driver_id: s.driver_id.clone(),
        };
        drop(s);
        self.0.tick();
        Ok(Response::new(reply))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let req = req.into_inner();
        let info = req
            .info
            .ok_or_else(|| Status::invalid_argument("a heartbeat must carry the registration"))?;
        let mut s = self.0.lock();
        let cancel = s
            .heartbeat(info, &req.job_id, Instant::now())
            .map_err(status)?;
        Ok(Response::new(pb::HeartbeatReply {
            cancel,
            heartbeat_interval_ms: s.config().heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn poll_task(
        &self,
        req: Request<pb::PollTaskRequest>,
    ) -> Result<Response<pb::PollTaskReply>, Status> {
        let req = req.into_inner();
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_POLL);
        loop {
            let notified = self.0.task_ready.notified();
            if let Some(task) = self.0.lock().take_task(&req.executor_id, Instant::now()) {
                return Ok(Response::new(pb::PollTaskReply { task: Some(task) }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Response::new(pb::PollTaskReply { task: None }));
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    async fn get_epoch_plan(
        &self,
        req: Request<pb::EpochPlanRequest>,
    ) -> Result<Response<pb::EpochPlan>, Status> {
        let req = req.into_inner();
        let s = self.0.lock();
        let job = s
            .job(&req.job_id)
            .ok_or_else(|| Status::not_found(format!("no job {:?}", req.job_id)))?;
        let split = pb::Split::try_from(req.split).unwrap_or(pb::Split::Train);
        job.epoch_plan(req.rank as usize, split, req.epoch)
            .map(Response::new)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "job {} has no plan for rank {} (epoch {})",
                    req.job_id, req.rank, req.epoch
                ))
            })
    }

    async fn report(
        &self,
        req: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportReply>, Status> {
        let reply = self
            .0
            .lock()
            .report(req.into_inner(), Instant::now())
            .map_err(status)?;
        Ok(Response::new(reply))
    }

    async fn prepare(
        &self,
        req: Request<pb::PrepareRequest>,
    ) -> Result<Response<pb::PrepareReply>, Status> {
        let req = req.into_inner();
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_POLL);
        let mut partial = req.has_partial.then_some(req.partial.as_str());
        loop {
            let notified = self.0.task_ready.notified();
            let (merged, cancel) = self
                .0
                .lock()
                .prepare(&req, partial.take(), Instant::now())
                .map_err(status)?;
            if merged.is_some() || cancel {
                self.0.task_ready.notify_waiters();
                return Ok(Response::new(prepare_reply(merged, cancel)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Response::new(pb::PrepareReply::default()));
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    async fn recover(
        &self,
        req: Request<pb::RecoverRequest>,
    ) -> Result<Response<pb::RecoverReply>, Status> {
        let req = req.into_inner();
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_POLL);
        loop {
            let notified = self.0.task_ready.notified();
            let got = self.0.lock().recover(&req, Instant::now());
            match got {
                Ok(Some(task)) => {
                    self.0.task_ready.notify_waiters();
                    return Ok(Response::new(pb::RecoverReply {
                        task: Some(task),
                        cancel: false,
                    }));
                }
                Err(why) => {
                    tracing::info!(job = %req.job_id, executor = %req.executor_id, "not recovered: {why}");
                    return Ok(Response::new(pb::RecoverReply {
                        task: None,
                        cancel: true,
                    }));
                }
                Ok(None) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Response::new(pb::RecoverReply::default()));
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    async fn task_not_received(
        &self,
        req: Request<pb::TaskNotReceivedRequest>,
    ) -> Result<Response<pb::TaskNotReceivedReply>, Status> {
        let req = req.into_inner();
        self.0
            .lock()
            .task_not_received(&req.executor_id, &req.error, Instant::now());
        self.0.tick();
        Ok(Response::new(pb::TaskNotReceivedReply {}))
    }

    async fn fetch_preprocessing(
        &self,
        req: Request<pb::FetchPreprocessingRequest>,
    ) -> Result<Response<Self::FetchPreprocessingStream>, Status> {
        let req = req.into_inner();
        let doc = self
            .0
            .lock()
            .preprocessing(&req.job_id, req.statistics)
            .map_err(status)?;
        tracing::debug!(job = %req.job_id, rank = req.rank, bytes = doc.len(), "sending the preprocessing in chunks");
        Ok(Response::new(chunked(doc)))
    }

    async fn finish_task(
        &self,
        req: Request<pb::FinishTaskRequest>,
    ) -> Result<Response<pb::FinishTaskReply>, Status> {
        self.0
            .lock()
            .finish_task(req.into_inner(), Instant::now())
            .map_err(status)?;
        self.0.tick();
        Ok(Response::new(pb::FinishTaskReply {}))
    }
}
