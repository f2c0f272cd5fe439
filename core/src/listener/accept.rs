//! A tokio listener behind a [`ConnectionGate`]: connections the gate refuses are closed at
//! accept, before a byte is read; the others come out as [`GuardedStream`]s for tonic and axum
//! once the client has sent its first bytes. Until then a connection costs a socket and a small
//! task, not a protocol stack's buffers, so a flood of silent connections stays cheap while the
//! first-request deadline runs.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::gate::ConnectionGate;
use super::stream::{GuardedStream, PeerInfo};

/// A connection and who is on its other end.
type Admitted = (GuardedStream<TcpStream>, PeerInfo);

/// Connections that sent their first bytes and wait for the server to take them.
const READY_QUEUE: usize = 64;

/// A bound TCP listener whose connections pass its gate.
pub struct GatedListener {
    /// The socket, until [`GatedListener::accept`] hands it to its accepting task.
    tcp: Option<TcpListener>,
    local: SocketAddr,
    gate: Arc<ConnectionGate>,
    ready: Option<mpsc::Receiver<Admitted>>,
}

impl GatedListener {
    /// Accepts on `tcp` through `gate`.
    pub fn new(tcp: TcpListener, gate: Arc<ConnectionGate>) -> io::Result<GatedListener> {
        Ok(GatedListener {
            local: tcp.local_addr()?,
            tcp: Some(tcp),
            gate,
            ready: None,
        })
    }

    /// The gate (for its figures).
    pub fn gate(&self) -> &Arc<ConnectionGate> {
        &self.gate
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next admitted connection, as soon as it is admitted (for a server that runs its
    /// own handshakes, such as TLS). Refused ones are closed on the way; errors of the
    /// listening socket (out of file descriptors, say) are waited out.
    pub async fn accept_admitted(&mut self) -> Admitted {
        match &self.tcp {
            Some(tcp) => admit(tcp, &self.gate).await,
            // The socket went to the task behind `accept`, which a listener uses instead.
            None => std::future::pending().await,
        }
    }

    /// The next admitted connection whose client has sent its first bytes. The first call
    /// starts a task that accepts and waits for each connection's first bytes, under its
    /// deadlines, beside the others; it ends when this listener is dropped.
    pub async fn accept(&mut self) -> Admitted {
        if self.ready.is_none()
            && let Some(tcp) = self.tcp.take()
        {
            let (tx, rx) = mpsc::channel(READY_QUEUE);
            tokio::spawn(hand_over_when_readable(tcp, self.gate.clone(), tx));
            self.ready = Some(rx);
        }
        match self.ready.as_mut() {
            Some(ready) => match ready.recv().await {
                Some(admitted) => admitted,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// The admitted connections as the stream of IO that tonic serves.
    pub fn into_incoming(
        self,
    ) -> impl futures::Stream<Item = io::Result<GuardedStream<TcpStream>>> + Send + 'static {
        futures::stream::unfold(self, |mut listener| async move {
            let (stream, _) = listener.accept().await;
            Some((Ok(stream), listener))
        })
    }
}

/// Accepts on `tcp` until `ready` is closed, handing over each admitted connection once it
/// has bytes to read (one that fails its deadlines first is dropped, and so closed).
async fn hand_over_when_readable(
    tcp: TcpListener,
    gate: Arc<ConnectionGate>,
    ready: mpsc::Sender<Admitted>,
) {
    loop {
        let (mut stream, peer) = tokio::select! {
            admitted = admit(&tcp, &gate) => admitted,
            _ = ready.closed() => return,
        };
        let ready = ready.clone();
        tokio::spawn(async move {
            if stream.readable().await.is_ok() {
                let _ = ready.send((stream, peer)).await;
            }
        });
    }
}

/// The next connection on `tcp` that `gate` admits.
async fn admit(tcp: &TcpListener, gate: &Arc<ConnectionGate>) -> Admitted {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_failed(gate, e).await;
                continue;
            }
        };
        // A refused connection is dropped, and so closed, right here.
        if let Some(connection) = gate.admit(peer) {
            let info = PeerInfo::of(&connection);
            return (GuardedStream::new(stream, connection), info);
        }
    }
}

/// Waits out an error of the listening socket: none for a connection that failed before it
/// was accepted, a second for the others (such as running out of file descriptors), which
/// retrying at once would only repeat.
async fn accept_failed(gate: &ConnectionGate, e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::debug!(
        "the {} could not accept a connection: {e}",
        gate.kind().name()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for GatedListener {
    type Io = GuardedStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, peer) = GatedListener::accept(self).await;
        (stream, peer.addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::{ListenerKind, ListenerLimits, RefusalReason, serve_http};
    use super::*;

    const LIMITS: ListenerLimits = ListenerLimits {
        max_connections: 2,
        first_request: Duration::from_millis(400),
        idle: Duration::from_millis(1500),
    };

    async fn listener(kind: ListenerKind, limits: ListenerLimits) -> GatedListener {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        GatedListener::new(tcp, ConnectionGate::new(kind, limits)).unwrap()
    }

    /// Serves `l` with an echo server whose first byte from a client completes its first
    /// request.
    fn echo(mut l: GatedListener) {
        tokio::spawn(async move {
            loop {
                let (mut stream, peer) = l.accept().await;
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        peer.establish();
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    fn refused(gate: &ConnectionGate, reason: RefusalReason) -> u64 {
        let stats = gate.stats();
        stats.refused.iter().find(|(r, _)| *r == reason).unwrap().1
    }

    /// Reads until the server closes the connection (at most 10 s); returns what came.
    async fn read_to_close(client: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let read = client.read_to_end(&mut got);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the server closes the connection")
            .ok();
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_silent_client_is_cut_at_the_first_request_deadline() {
        let l = listener(ListenerKind::ControlPlane, LIMITS).await;
        let (addr, gate) = (l.local_addr(), l.gate().clone());
        echo(l);
        let start = Instant::now();
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert_eq!(read_to_close(&mut client).await, "");
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(refused(&gate, RefusalReason::FirstRequestTimeout), 1);
        assert_eq!(gate.stats().open, 0);
    }

    #[tokio::test]
    async fn a_connection_is_handed_over_only_once_its_client_speaks() {
        let mut l = listener(ListenerKind::ControlPlane, LIMITS).await;
        let mut client = TcpStream::connect(l.local_addr()).await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(silent.is_err(), "a silent connection was handed over");
        client.write_all(b"x").await.unwrap();
        let (mut stream, _) = tokio::time::timeout(Duration::from_secs(10), l.accept())
            .await
            .expect("handed over once it spoke");
        let mut buf = [0u8; 1];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"x");
    }

    #[tokio::test]
    async fn an_established_connection_lives_while_it_talks_then_idles_out() {
        let l = listener(ListenerKind::ControlPlane, LIMITS).await;
        let (addr, gate) = (l.local_addr(), l.gate().clone());
        echo(l);
        let mut client = TcpStream::connect(addr).await.unwrap();
        // Past the first-request deadline and for longer than the idle timeout, bytes keep
        // flowing.
        let mut buf = [0u8; 1];
        for _ in 0..7 {
            client.write_all(b"x").await.unwrap();
            client.read_exact(&mut buf).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(read_to_close(&mut client).await, "");
        assert_eq!(refused(&gate, RefusalReason::IdleTimeout), 1);
        assert_eq!(refused(&gate, RefusalReason::FirstRequestTimeout), 0);
    }

    #[tokio::test]
    async fn a_full_listener_closes_its_oldest_silent_connection_at_once() {
        let slow = ListenerLimits {
            first_request: Duration::from_secs(30),
            ..LIMITS
        };
        let l = listener(ListenerKind::Ui, slow).await;
        let (addr, gate) = (l.local_addr(), l.gate().clone());
        echo(l);
        let mut first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        // Closed long before its 30 s deadline, to make room for the third.
        assert_eq!(read_to_close(&mut first).await, "");
        assert_eq!(refused(&gate, RefusalReason::Evicted), 1);
        // The newest one still gets served.
        let mut buf = [0u8; 2];
        third.write_all(b"hi").await.unwrap();
        third.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
    }

    #[tokio::test]
    async fn any_http_request_completes_the_first_request() {
        let l = listener(ListenerKind::Health, LIMITS).await;
        let (addr, gate) = (l.local_addr(), l.gate().clone());
        let router = axum::Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
        tokio::spawn(serve_http(l, router, std::future::pending()));
        let mut client = TcpStream::connect(addr).await.unwrap();
        // A path the router does not know counts as a request too.
        let mut buf = vec![0u8; 1024];
        client
            .write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let n = client.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 404"));
        tokio::time::sleep(Duration::from_millis(600)).await;
        client
            .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let reply = read_to_close(&mut client).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert_eq!(refused(&gate, RefusalReason::FirstRequestTimeout), 0);
        // A client that sends half a request is cut at the deadline.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /ok HTTP/1.1\r\n").await.unwrap();
        assert_eq!(read_to_close(&mut slow).await, "");
        assert_eq!(refused(&gate, RefusalReason::FirstRequestTimeout), 1);
    }
}
