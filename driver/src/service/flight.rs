//! The driver's Arrow Flight service: partitions of a running job's data, read by the driver
//! and streamed as Arrow record batches to executors that cannot read the files themselves.
//!
//! Only `do_get` is served. A ticket names the job, carries the job's secret, and asks for a
//! row range of a row group of one of the job's own files: the driver never serves anything
//! else from its disk.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::stream::{BoxStream, StreamExt};
use ringflow_core::data::flight::{PartitionTicket, hex};
use ringflow_core::data::partition::PartitionReader;
use ringflow_core::security::constant_time_eq;
use tonic::{Request, Response, Status, Streaming};

use super::Shared;

pub(crate) struct PartitionServer(pub Arc<Shared>);

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

fn only_do_get<T>() -> Result<T, Status> {
    Err(Status::unimplemented(
        "the ringflow driver serves partitions with do_get only",
    ))
}

impl PartitionServer {
    /// Checks a ticket against the jobs the driver runs.
    fn authorize(&self, ticket: &PartitionTicket) -> Result<(), Status> {
        let s = self.0.lock();
        let job = s
            .job(&ticket.job_id)
            .ok_or_else(|| Status::not_found(format!("no job {:?}", ticket.job_id)))?;
        if job.state != ringflow_core::pb::JobState::Running {
            // Before it starts a job has no secret yet; after it ends, nobody needs its data.
            return Err(Status::failed_precondition(format!(
                "job {} is not running",
                ticket.job_id
            )));
        }
        if !constant_time_eq(hex(job.secret()).as_bytes(), ticket.secret.as_bytes()) {
            return Err(Status::permission_denied(format!(
                "the ticket does not carry job {}'s secret",
                ticket.job_id
            )));
        }
        let plan = job
            .plan()
            .ok_or_else(|| Status::not_found(format!("job {} reads no data", ticket.job_id)))?;
        if !plan.files.contains(&ticket.path) {
            return Err(Status::permission_denied(format!(
                "{} is not a file of job {}",
                ticket.path, ticket.job_id
            )));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl FlightService for PartitionServer {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoExchangeStream = Stream<FlightData>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;

    async fn do_get(&self, req: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = PartitionTicket::decode(&req.into_inner().ticket)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.authorize(&ticket)?;
        let partition = ticket.partition();
        let columns = ticket.columns.clone();
        // Parquet decoding is blocking work: a blocking thread reads, a channel of two batches
        // keeps memory bounded while the executor consumes them.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<_, FlightError>>(2);
        tokio::task::spawn_blocking(move || {
            let opened = if ticket.whole {
                PartitionReader::open_row_group(&partition, &columns)
            } else {
                PartitionReader::open(&partition, &columns)
            };
            let mut reader = match opened {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.blocking_send(Err(FlightError::ExternalError(Box::new(e))));
                    return;
                }
            };
            loop {
                let item = match reader.next_batch() {
                    Ok(None) => return,
                    Ok(Some((batch, _))) => Ok(batch),
                    Err(e) => Err(FlightError::ExternalError(Box::new(e))),
                };
                let failed = item.is_err();
                if tx.blocking_send(item).is_err() || failed {
                    return;
                }
            }
        });
        let batches: BoxStream<'static, Result<_, FlightError>> =
            tokio_stream::wrappers::ReceiverStream::new(rx).boxed();
        let encoded = FlightDataEncoderBuilder::new()
            .build(batches)
            .map(|r| r.map_err(|e| Status::internal(e.to_string())));
        Ok(Response::new(Box::pin(encoded)))
    }

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        only_do_get()
    }

    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        only_do_get()
    }

    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        only_do_get()
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        only_do_get()
    }

    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        only_do_get()
    }

    async fn do_put(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        only_do_get()
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        only_do_get()
    }

    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        only_do_get()
    }

    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        only_do_get()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use ringflow_core::pb;
    use ringflow_core::spec::JobSpec;
    use ringflow_ml::nn::ModelRegistry;

    use super::*;
    use crate::scheduler::{JobKind, Scheduler, SchedulerConfig};

    fn ticket(job_id: &str, secret: &[u8], path: &str) -> PartitionTicket {
        PartitionTicket {
            job_id: job_id.into(),
            secret: hex(secret),
            path: path.into(),
            row_group: 0,
            row_offset: 0,
            row_count: 10,
            file_row_start: 0,
            columns: vec!["label".into()],
            whole: false,
        }
    }

    /// A driver with one job on the MNIST test file waiting for its executor: the driver, the
    /// job's id and the data file.
    fn waiting_job(dir: &std::path::Path) -> (Arc<Shared>, String, String) {
        let data = format!(
            "{}/../examples/data/mnist/test.parquet",
            env!("CARGO_MANIFEST_DIR")
        );
        let toml = dir.join("job.toml");
        std::fs::write(
            &toml,
            format!(
                "[data]\ntrain = \"{data}\"\nfeatures = [\"image\"]\nlabel = \"label\"\n\
                 [model]\nkind = \"mlp\"\nlayers = [784, 10]\n[cluster]\ncheckpoint_dir = \"{}\"\n",
                dir.display()
            ),
        )
        .unwrap();
        let spec = JobSpec::load(&toml, &[]).unwrap();
        let registry = ModelRegistry::default();
        let submitted = ringflow_core::wire::payload::encode(&spec);
        let plan = Scheduler::plan_job(&registry, &submitted, false, None).unwrap();
        let shared = Arc::new(Shared::new(SchedulerConfig::default(), registry, None));
        let id = shared
            .lock()
            .submit(JobKind::Train(Box::new(plan)), Instant::now());
        (shared, id, data)
    }

    /// Starts job `id` on one executor; returns its secret.
    fn start(shared: &Shared, id: &str) -> Vec<u8> {
        let executor = pb::ExecutorInfo {
            executor_id: "e0".into(),
            host: "h".into(),
            ring_address: "h:1".into(),
            ..Default::default()
        };
        let mut scheduler = shared.lock();
        let job = scheduler.job_mut(id).unwrap();
        job.start(vec![executor], Instant::now());
        job.secret().to_vec()
    }

    /// Only a running job's own files, with its secret, are served.
    #[test]
    fn tickets_are_checked_against_running_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let (shared, id, data) = waiting_job(dir.path());
        let server = PartitionServer(shared.clone());
        // Waiting for executors: nothing is served, whatever the ticket says.
        let e = server.authorize(&ticket(&id, &[0; 32], &data)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");

        let secret = start(&shared, &id);
        server.authorize(&ticket(&id, &secret, &data)).unwrap();
        let e = server.authorize(&ticket(&id, &[7; 32], &data)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
        let e = server
            .authorize(&ticket(&id, &secret, "/etc/passwd"))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
        assert!(e.message().contains("is not a file of job"), "{e}");
        let e = server
            .authorize(&ticket("nope", &secret, &data))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    }

    /// A driver running one job on the MNIST test file, its id and its secret.
    fn running_job(dir: &std::path::Path) -> (PartitionServer, String, Vec<u8>, String) {
        let (shared, id, data) = waiting_job(dir);
        let secret = start(&shared, &id);
        (PartitionServer(shared), id, secret, data)
    }

    /// Any ticket bytes, and the job's own ticket with bytes changed: served only when the
    /// ticket names the running job, carries its secret and names one of its files (and then
    /// the rows asked for, or an error naming the file); refused otherwise; never a panic.
    #[test]
    fn fuzz_flight_tickets() {
        use proptest::prelude::*;
        let dir = tempfile::tempdir().unwrap();
        let (server, id, secret, data) = running_job(dir.path());
        let mut good = ticket(&id, &secret, &data);
        good.row_count = 3;
        let encoded = good.encode();
        let bytes = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..3).prop_map(
                move |edits| {
                    let mut b = encoded.clone();
                    for (at, v) in edits {
                        let i = at.index(b.len());
                        b[i] = v;
                    }
                    b
                }
            ),
        ];
        let mut runner = proptest::test_runner::TestRunner::new(ringflow_ml::fuzz::config(256));
        runner
            .run(&bytes, |bytes| {
                let Ok(t) = PartitionTicket::decode(&bytes) else {
                    return Ok(());
                };
                if server.authorize(&t).is_err() {
                    return Ok(());
                }
                prop_assert_eq!((&t.job_id, &t.secret, &t.path), (&id, &good.secret, &data));
                let opened = match t.whole {
                    true => PartitionReader::open_row_group(&t.partition(), &t.columns),
                    false => PartitionReader::open(&t.partition(), &t.columns),
                };
                match opened {
                    Ok(mut r) => {
                        let mut rows = 0;
                        while let Some((batch, _)) = r.next_batch().map_err(|e| {
                            TestCaseError::fail(format!("{}: {}", e.what, e.message))
                        })? {
                            rows += batch.num_rows() as u64;
                        }
                        // A row range is served whole (a whole row group has its own size).
                        if !t.whole {
                            prop_assert_eq!(rows, t.row_count);
                        }
                    }
                    Err(e) => prop_assert_eq!(e.what, data.clone()),
                }
                Ok(())
            })
            .unwrap();
    }
}
