//! The executor's attachment stream: held open to the driver for the process's whole life, so
//! that the driver learns within seconds when the process ends (the kernel closes the
//! connection) instead of waiting for the heartbeat timeout.

use std::time::Duration;

use ringflow_core::pb;
use tracing::{debug, info};

use super::client::DriverClient;

/// Pause before attaching again after the stream ended or could not be opened.
const RETRY: Duration = Duration::from_millis(250);

/// Holds the attachment stream open, attaching again whenever it ends (a driver restart, a
/// network blip), until the task is aborted. A driver that does not know the call (an older
/// version) is left alone: it notices losses by heartbeats only.
pub(super) async fn hold(mut client: DriverClient, info: pb::ExecutorInfo) {
    loop {
        match client.attach(&info).await {
            Ok(mut stream) => {
                while let Ok(Some(event)) = stream.message().await {
                    debug!(driver = %event.driver_id, "attached to the driver");
                }
                debug!("the attachment stream to the driver ended; attaching again");
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                info!(
                    "the driver does not accept attachment streams (an older version): it will \
                     notice this executor's loss by its heartbeats only"
                );
                return;
            }
            Err(s) => debug!("attaching to the driver failed: {}", s.message()),
        }
        tokio::time::sleep(RETRY).await;
    }
}
