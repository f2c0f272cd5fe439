//! The executor's RPC client for the driver, with a deadline on every call. It decodes and
//! encodes messages of at most [`MAX_MESSAGE_BYTES`], the bound the driver's service sets too,
//! and fetches a preprocessing too large to travel in a task in chunks
//! ([`DriverClient::fetch_preprocessing`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringflow_core::listener::CLIENT_KEEPALIVE;
use ringflow_core::pb::{self, executors_client::ExecutorsClient};
use ringflow_core::security::{
    AuthenticatedChannel, ClientSecurity, is_certificate_error, status_line,
};
use ringflow_core::wire::{MAX_MESSAGE_BYTES, Reassembly};
use tonic::{Code, Request};
use tracing::warn;

use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// Deadline of an ordinary call.
const CALL: Duration = Duration::from_secs(20);
/// How long a call is retried while the driver is unreachable.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// Deadline of a fetch of the job's preprocessing, per MiB announced (on top of [`CALL`]).
const FETCH_PER_MIB: Duration = Duration::from_secs(2);

/// The test hook (`test-hooks` builds only) that makes this executor decode messages of at
/// most this many bytes from the driver, so that a test can give it a task it cannot receive.
#[cfg(feature = "test-hooks")]
const TASK_LIMIT_ENV: &str = "RINGFLOW_TEST_MAX_TASK_BYTES";

/// The largest message this executor decodes: [`MAX_MESSAGE_BYTES`] (or, in a build with the
/// test hooks, what `RINGFLOW_TEST_MAX_TASK_BYTES` says).
fn decoding_limit() -> usize {
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var(TASK_LIMIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return n;
    }
    MAX_MESSAGE_BYTES
}

/// A cloneable connection to the driver's executor service.
#[derive(Clone)]
pub struct DriverClient {
    inner: ExecutorsClient<AuthenticatedChannel>,
    url: String,
    give_up: Option<Duration>,
}

fn comm(url: &str, what: &str, e: impl std::fmt::Display) -> ExecutorError {
    refused(url, format!("{what} at the driver {url} failed: {e}"))
}

/// A call to the driver at `url` that failed, told by `why`.
fn refused(url: &str, why: String) -> ExecutorError {
    CommError::new(Peer::driver(url), CommOp::DriverCall, why).into()
}

fn with_deadline<T>(msg: T, deadline: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(deadline);
    r
}

impl DriverClient {
    /// A client for `url`; the connection is made on first use, so the driver may start later.
    pub async fn connect(
        url: &str,
        security: &ClientSecurity,
        give_up: Option<Duration>,
    ) -> Result<DriverClient> {
        let endpoint = security
            .endpoint(url)
            .map_err(|e| CommError::new(Peer::driver(url), CommOp::Start, e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // Pings keep the connection inside the driver's idle timeout.
            .http2_keep_alive_interval(CLIENT_KEEPALIVE)
            .keep_alive_timeout(CLIENT_KEEPALIVE)
            .keep_alive_while_idle(true);
        let inner = ExecutorsClient::new(security.authenticated(endpoint.connect_lazy()))
            .max_decoding_message_size(decoding_limit())
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(DriverClient {
            inner,
            url: url.to_string(),
            give_up,
        })
    }

    /// The driver's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Registers, retrying while the driver is unreachable; returns the heartbeat interval.
    pub async fn register(
        &mut self,
        info: &pb::ExecutorInfo,
        stop: &Arc<AtomicBool>,
    ) -> Result<Duration> {
        let start = Instant::now();
        let mut last_note = Instant::now();
        loop {
            match self.inner.register(with_deadline(info.clone(), CALL)).await {
                Ok(r) => {
                    return Ok(Duration::from_millis(
                        r.into_inner().heartbeat_interval_ms.max(50),
                    ));
                }
                Err(s)
                    if matches!(
                        s.code(),
                        Code::FailedPrecondition | Code::InvalidArgument | Code::Unauthenticated
                    ) =>
                {
                    let why = format!(
                        "the driver at {} refused this executor: {}",
                        self.url,
                        s.message()
                    );
                    return Err(refused(&self.url, why));
                }
                Err(s) if is_certificate_error(&s) => {
                    let why = format!(
                        "the TLS connection to the driver at {} failed: {} (check --tls-ca, \
                         --tls-cert and --tls-key)",
                        self.url,
                        status_line(&s)
                    );
                    return Err(refused(&self.url, why));
                }
                Err(s) => {
                    if stop.load(Ordering::Relaxed) {
                        return Err(ExecutorError::Cancelled);
                    }
                    if let Some(limit) = self.give_up
                        && start.elapsed() > limit
                    {
                        return Err(comm(&self.url, "registering", status_line(&s)));
                    }
                    if last_note.elapsed() > Duration::from_secs(10) {
                        warn!(
                            "still waiting for the driver at {}: {}",
                            self.url,
                            status_line(&s)
                        );
                        last_note = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// One heartbeat.
    pub async fn heartbeat(
        &mut self,
        info: &pb::ExecutorInfo,
        job_id: &str,
    ) -> Result<pb::HeartbeatReply> {
        let req = pb::HeartbeatRequest {
            info: Some(info.clone()),
            job_id: job_id.to_string(),
        };
        self.inner
            .heartbeat(with_deadline(req, Duration::from_secs(5)))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| comm(&self.url, "heartbeat", s.message()))
    }

    /// Opens the attachment stream, which stays open for as long as the driver and this
    /// process live (no deadline: it ends only with its connection).
    pub async fn attach(
        &mut self,
        info: &pb::ExecutorInfo,
    ) -> std::result::Result<tonic::Streaming<pb::AttachEvent>, tonic::Status> {
        self.inner
            .attach(Request::new(info.clone()))
            .await
            .map(|r| r.into_inner())
    }

    /// Sends this executor's last words, with a deadline of
    /// [`crate::last_words::DELIVERY_WAIT`].
    pub async fn last_words(&self, executor_id: &str, words: &str) -> Result<()> {
        let req = pb::LastWordsRequest {
            executor_id: executor_id.to_string(),
            words: words.to_string(),
        };
        let wait = crate::last_words::DELIVERY_WAIT;
        let mut inner = self.inner.clone();
        match tokio::time::timeout(wait, inner.last_words(with_deadline(req, wait))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) => Err(comm(&self.url, "reporting the last words", s.message())),
            Err(_) => Err(comm(
                &self.url,
                "reporting the last words",
                "no answer in time",
            )),
        }
    }

    /// Waits up to `wait` for a task. An error is the reply's status, which says why the reply
    /// (and the task it may have held) did not arrive or could not be decoded.
    pub async fn poll_task(
        &mut self,
        executor_id: &str,
        wait: Duration,
    ) -> std::result::Result<Option<pb::Task>, tonic::Status> {
        let req = pb::PollTaskRequest {
            executor_id: executor_id.to_string(),
            wait_ms: wait.as_millis() as u64,
        };
        self.inner
            .poll_task(with_deadline(req, wait + CALL))
            .await
            .map(|r| r.into_inner().task)
    }

    /// Tells the driver that this executor could not receive its poll's reply (`error` says
    /// why), so that the job of a task it may have held fails at once.
    pub async fn task_not_received(&mut self, executor_id: &str, error: &str) -> Result<()> {
        let req = pb::TaskNotReceivedRequest {
            executor_id: executor_id.to_string(),
            error: error.to_string(),
        };
        self.inner
            .task_not_received(with_deadline(req, Duration::from_secs(5)))
            .await
            .map(|_| ())
            .map_err(|s| comm(&self.url, "reporting a task not received", s.message()))
    }

    /// Fetches job `job_id`'s preprocessing (or, with `statistics`, its merged statistics),
    /// announced as `announced` bytes, in chunks; refuses more bytes than announced, or an
    /// announced length over [`ringflow_core::wire::MAX_PREPROCESSING_BYTES`].
    pub async fn fetch_preprocessing(
        &self,
        (job_id, rank): (&str, u32),
        statistics: bool,
        announced: u64,
    ) -> Result<String> {
        let what = "fetching the job's preprocessing (its vocabulary)";
        let fail = |e: &dyn std::fmt::Display| comm(&self.url, what, e);
        let mut whole = Reassembly::new(announced).map_err(|e| fail(&e))?;
        let req = pb::FetchPreprocessingRequest {
            job_id: job_id.to_string(),
            rank,
            statistics,
        };
        // The whole transfer has one deadline, growing with its length.
        let deadline = CALL + FETCH_PER_MIB * (1 + (announced >> 20) as u32);
        let started = Instant::now();
        let left = || deadline.saturating_sub(started.elapsed());
        let mut inner = self.inner.clone();
        let opened = tokio::time::timeout(
            left(),
            inner.fetch_preprocessing(with_deadline(req, deadline)),
        );
        let mut stream = opened
            .await
            .map_err(|_| fail(&"no answer in time"))?
            .map_err(|s| fail(&status_line(&s)))?
            .into_inner();
        loop {
            let next = tokio::time::timeout(left(), stream.message())
                .await
                .map_err(|_| fail(&"the transfer did not finish in time"))?
                .map_err(|s| fail(&status_line(&s)))?;
            match next {
                Some(chunk) => whole.push(&chunk.data).map_err(|e| fail(&e))?,
                None => break,
            }
        }
        whole.finish().map_err(|e| fail(&e))
    }

    /// Retries `call` on transient failures for up to [`RETRY_FOR`].
    async fn retrying<T, F, Fut>(&mut self, what: &str, mut call: F) -> Result<T>
    where
        F: FnMut(ExecutorsClient<AuthenticatedChannel>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let start = Instant::now();
        loop {
            match call(self.inner.clone()).await {
                Ok(v) => return Ok(v),
                Err(s)
                    if matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded)
                        && start.elapsed() < RETRY_FOR =>
                {
                    warn!("{what}: {}; retrying", s.message());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(s) => return Err(comm(&self.url, what, s.message())),
            }
        }
    }

    /// This rank's plan for a split and epoch.
    pub async fn epoch_plan(&mut self, req: pb::EpochPlanRequest) -> Result<pb::EpochPlan> {
        self.retrying("asking for partitions", |mut c| {
            let req = req.clone();
            async move {
                c.get_epoch_plan(with_deadline(req, CALL))
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Sends progress; returns whether the task should stop.
    pub async fn report(&mut self, req: pb::ReportRequest) -> Result<pb::ReportReply> {
        self.retrying("reporting progress", |mut c| {
            let req = req.clone();
            async move {
                c.report(with_deadline(req, CALL))
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Sends this rank's partial of a preparation phase (or polls for the merged result).
    pub async fn prepare(&mut self, req: pb::PrepareRequest) -> Result<pb::PrepareReply> {
        let wait = Duration::from_millis(req.wait_ms);
        self.retrying("preparing the job", |mut c| {
            let req = req.clone();
            async move {
                c.prepare(with_deadline(req, wait + CALL))
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Asks to continue on a re-formed ring (or polls for it).
    pub async fn recover(&mut self, req: pb::RecoverRequest) -> Result<pb::RecoverReply> {
        let wait = Duration::from_millis(req.wait_ms);
        self.retrying("recovering the ring", |mut c| {
            let req = req.clone();
            async move {
                c.recover(with_deadline(req, wait + CALL))
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .await
    }

    /// Reports a task's end.
    pub async fn finish_task(&self, req: pb::FinishTaskRequest) -> Result<()> {
        let mut me = self.clone();
        me.retrying("reporting the task's end", |mut c| {
            let req = req.clone();
            async move { c.finish_task(with_deadline(req, CALL)).await.map(|_| ()) }
        })
        .await
    }
}
