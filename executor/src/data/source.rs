//! Partitions served by the driver over Arrow Flight, for executors that cannot read the data
//! themselves (a path local to the driver's machine).

use std::time::Duration;

use arrow_flight::Ticket;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::{StreamExt, TryStreamExt};
use ringflow_core::data::deadline::block_on_timeout;
use ringflow_core::data::flight::{PartitionTicket, hex};
use ringflow_core::data::partition::{BatchError, PartitionReader};
use ringflow_core::data::runtime::block_on;
use ringflow_core::pb::Partition;
use ringflow_core::security::{AuthenticatedChannel, ClientSecurity};

use crate::data::error::ServeError;
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// How long one partition request may take before it fails.
const REQUEST_DEADLINE: Duration = Duration::from_secs(300);

/// A connection to the driver's Flight service for one job.
#[derive(Debug)]
pub struct DriverSource {
    url: String,
    job_id: String,
    secret: String,
    client: FlightServiceClient<AuthenticatedChannel>,
}

impl DriverSource {
    /// Connects (lazily) to the driver at `url` for `job_id`.
    pub fn connect(
        url: &str,
        security: &ClientSecurity,
        job_id: &str,
        secret: &[u8],
    ) -> Result<DriverSource> {
        let endpoint = security
            .endpoint(url)
            .map_err(|e| CommError::new(Peer::driver(url), CommOp::ReadData, e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(REQUEST_DEADLINE)
            // Pings keep the connection inside the driver's idle timeout between partitions.
            .http2_keep_alive_interval(ringflow_core::listener::CLIENT_KEEPALIVE)
            .keep_alive_timeout(ringflow_core::listener::CLIENT_KEEPALIVE)
            .keep_alive_while_idle(true);
        // The channel's background tasks live on the I/O runtime, where every call runs.
        let channel = block_on(async move { endpoint.connect_lazy() });
        let client = FlightServiceClient::new(security.authenticated(channel))
            .max_decoding_message_size(usize::MAX);
        Ok(DriverSource {
            url: url.to_string(),
            job_id: job_id.to_string(),
            secret: hex(secret),
            client,
        })
    }

    /// Asks the driver for `partition` (its whole row group with `whole`), reading `columns`.
    pub fn open(
        &self,
        partition: &Partition,
        columns: &[String],
        whole: bool,
    ) -> Result<PartitionReader> {
        // A range of `data.sql`'s output needs the whole row group, whose file rows it does
        // not count.
        let (row_offset, row_count, whole) = match partition.query_rows {
            Some(_) => (0, 0, true),
            None => (partition.row_offset, partition.row_count, whole),
        };
        let ticket = PartitionTicket {
            job_id: self.job_id.clone(),
            secret: self.secret.clone(),
            path: partition.path.clone(),
            row_group: partition.row_group,
            row_offset,
            row_count,
            file_row_start: partition.file_row_start,
            columns: columns.to_vec(),
            whole,
        };
        let mut client = self.client.clone();
        let url = self.url.clone();
        let fetched = block_on_timeout(REQUEST_DEADLINE, async move {
            let response = client
                .do_get(Ticket::new(ticket.encode()))
                .await
                .map_err(|s| ServeError::Refused(Box::new(s)))?;
            let flight = response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)));
            let mut stream = FlightRecordBatchStream::new_from_flight_data(flight);
            let first = stream.next().await.transpose()?;
            let schema = stream.schema().cloned();
            Ok::<_, ServeError>((first, schema, stream))
        })
        .unwrap_or_else(|e| Err(e.into()))
        .map_err(|source| ExecutorError::Served {
            path: partition.path.clone(),
            url,
            source,
        })?;
        let (first, schema, rest) = fetched;
        let schema = match (&first, schema) {
            (Some(b), _) => b.schema(),
            (None, Some(s)) => s,
            (None, None) => std::sync::Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        };
        let rest = rest.map_err(BatchError::served);
        let stream = futures::stream::iter(first.map(Ok)).chain(rest).boxed();
        let offset = if whole { 0 } else { row_offset };
        Ok(PartitionReader::from_stream(
            partition, schema, stream, offset,
        ))
    }
}
