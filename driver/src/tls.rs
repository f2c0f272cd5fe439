//! TLS for the driver's servers: a listener that hands the control plane (tonic) and the web UI
//! (axum) only connections whose TLS handshake finished. Connections pass the listener's gate
//! before any TLS work, and handshakes run concurrently under the gate's first-request
//! deadline, so a slow or silent client never holds up the others. A refused handshake (a
//! client certificate missing or signed by another CA, a client speaking plain HTTP) is counted
//! and logged with the client's address, since the client is the only other party that learns
//! why. A client that keeps retrying is logged once a minute per cause, not at every attempt.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringflow_core::listener::{
    ConnectionGate, GatedListener, GuardedStream, PeerInfo, RefusalReason,
};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;

/// The same refusal of the same client address is logged at most once in this time.
const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// How long after the gate's first-request deadline a handshake is abandoned, should the
/// gate's own timer not have ended it.
const HANDSHAKE_GRACE: Duration = Duration::from_secs(1);

/// A connection whose TLS handshake finished.
type Ready = (TlsStream<GuardedStream<TcpStream>>, PeerInfo);

/// Connections that completed their handshake, accepted on a background task.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<Ready>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting the connections that pass `tcp`'s gate with `config`. The accepting
    /// task ends when this listener is dropped.
    pub(crate) fn new(mut tcp: GatedListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr();
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let refusals = Arc::new(Refusals::default());
        let gate = tcp.gate().clone();
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = tcp.accept_admitted() => accepted,
                    _ = tx.closed() => return,
                };
                tokio::spawn(handshake(
                    acceptor.clone(),
                    stream,
                    peer,
                    gate.clone(),
                    tx.clone(),
                    refusals.clone(),
                ));
            }
        });
        Ok(TlsListener { ready, local })
    }

    /// The connections as the stream tonic serves.
    pub(crate) fn into_incoming(
        self,
    ) -> impl tokio_stream::Stream<Item = std::io::Result<TlsStream<GuardedStream<TcpStream>>>>
    {
        use tokio_stream::StreamExt;
        tokio_stream::wrappers::ReceiverStream::new(self.ready).map(|(tls, _)| Ok(tls))
    }
}

/// Runs one client's TLS handshake under its connection's deadlines: a finished one goes to
/// `ready`, a refused one to the counters and the log.
async fn handshake(
    acceptor: TlsAcceptor,
    mut stream: GuardedStream<TcpStream>,
    peer: PeerInfo,
    gate: Arc<ConnectionGate>,
    ready: mpsc::Sender<Ready>,
    refusals: Arc<Refusals>,
) {
    let server = gate.kind().name();
    let limit = stream
        .connection()
        .first_request_deadline()
        .saturating_duration_since(std::time::Instant::now())
        + HANDSHAKE_GRACE;
    // TLS state is made only for a client that speaks: a silent one costs a socket and this
    // task until the gate closes it.
    let handshake = async {
        stream.readable().await?;
        acceptor.accept(stream).await
    };
    let why = match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(tls)) => {
            let _ = ready.send((tls, peer)).await;
            return;
        }
        // A client that connected and left without a word (a port check).
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!("{} left the {server} before a TLS handshake", peer.addr);
            return;
        }
        // The gate closed it (too slow, or to make room) and counted it.
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::ConnectionAborted
            ) =>
        {
            return;
        }
        Ok(Err(e)) => refusal(&e),
        Err(_) => {
            gate.count(RefusalReason::FirstRequestTimeout);
            return;
        }
    };
    gate.count(RefusalReason::Handshake);
    if refusals.first_in_a_while(peer.addr.ip(), &why) {
        tracing::warn!(
            "refused a TLS connection to the {server} from {}: {why}",
            peer.addr
        );
    }
}

/// When each (client address, cause) was last logged.
#[derive(Default)]
struct Refusals(Mutex<HashMap<(IpAddr, String), Instant>>);

impl Refusals {
    /// Whether this refusal should be logged: not if the same address was refused for the
    /// same cause within [`REPEAT_LOG_INTERVAL`].
    fn first_in_a_while(&self, ip: IpAddr, why: &str) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        seen.retain(|_, at| now.duration_since(*at) < REPEAT_LOG_INTERVAL);
        match seen.entry((ip, why.to_string())) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(now);
                true
            }
        }
    }
}

/// Why a handshake failed, with a hint for the usual causes.
fn refusal(e: &std::io::Error) -> String {
    let why = e.to_string();
    if why.contains("InvalidContentType") || why.contains("corrupt message") {
        format!("{why} (the client did not speak TLS: it should use an https:// URL)")
    } else if why.contains("no certificates") || why.contains("CertificateRequired") {
        format!("{why} (the client sent no certificate: it needs --tls-cert and --tls-key)")
    } else if why.contains("UnknownCA") || why.contains("BadCertificate") {
        format!(
            "{why} (the client does not trust the driver's certificate: its --tls-ca must hold \
             the CA that signed the driver's --tls-cert)"
        )
    } else if why.contains("invalid peer certificate") {
        format!("{why} (the client's certificate is not signed by the driver's --tls-ca)")
    } else {
        why
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<GuardedStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some((tls, peer)) => (tls, peer.addr),
            // The accepting task ended (it only does so when this listener is gone).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_refusal_is_logged_once_a_while() {
        let r = Refusals::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(r.first_in_a_while(a, "no certificate"));
        assert!(!r.first_in_a_while(a, "no certificate"));
        assert!(r.first_in_a_while(a, "plain HTTP"));
        assert!(r.first_in_a_while(b, "no certificate"));
    }
}
