//! A connection under its gate's deadlines: reads and writes fail once the client has not
//! completed its first request in time, once it has been idle too long, or once the gate
//! closed it to make room.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::gate::{Connection, ConnectionHandle};

/// A stream (a TCP connection, under TLS or not) whose reads and writes obey its
/// [`Connection`]'s deadlines.
pub struct GuardedStream<S> {
    /// Declared first so that it is dropped first: once a client sees its connection closed,
    /// the connection's place at the gate is free.
    connection: Connection,
    inner: S,
    /// Fires at (or before) the deadline that applies; reset lazily when it fires early.
    timer: Pin<Box<Sleep>>,
}

impl<S> GuardedStream<S> {
    /// `inner` under `connection`'s deadlines.
    pub fn new(inner: S, connection: Connection) -> GuardedStream<S> {
        let (due, _) = connection.deadline();
        GuardedStream {
            inner,
            timer: Box::pin(tokio::time::sleep_until(due.into())),
            connection,
        }
    }

    /// The connection's place at its gate.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Fails once the connection must close; otherwise arranges to be woken when it must.
    fn guard(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.connection.state().waker.register(cx.waker());
        if self.connection.is_evicted() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection",
            ));
        }
        loop {
            let (due, reason) = self.connection.deadline();
            if std::time::Instant::now() >= due {
                self.connection.close_for(reason);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("closed by the listener ({})", reason.label()),
                ));
            }
            let due = tokio::time::Instant::from_std(due);
            // Activity only postpones the deadline, so the timer is moved only when it
            // fires early, or when the first request makes an earlier idle deadline apply.
            if due < self.timer.deadline() {
                self.timer.as_mut().reset(due);
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(()) => self.timer.as_mut().reset(due),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.guard(cx)?;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.connection.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.guard(cx)?;
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.connection.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.guard(cx)?;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.connection.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Who is on the other end of a guarded connection: in the extensions of every request that
/// tonic serves on one (as `PeerInfo`, or `TlsConnectInfo<PeerInfo>` under TLS; see
/// [`peer_of`]).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The client's address.
    pub addr: SocketAddr,
    connection: ConnectionHandle,
}

impl PeerInfo {
    /// The peer of `connection`.
    pub fn of(connection: &Connection) -> PeerInfo {
        PeerInfo {
            addr: connection.peer(),
            connection: connection.handle(),
        }
    }

    /// Marks the connection's first request done (see [`ConnectionHandle::establish`]).
    pub fn establish(&self) {
        self.connection.establish();
    }
}

impl GuardedStream<tokio::net::TcpStream> {
    /// Waits until the client has sent bytes (or closed its side), or fails when the
    /// connection must close. Nothing is consumed: the bytes are only peeked at, since tokio
    /// assumes an accepted socket readable until a read finds it empty.
    pub async fn readable(&mut self) -> io::Result<()> {
        let mut byte = [0u8; 1];
        std::future::poll_fn(|cx| {
            self.guard(cx)?;
            let mut peeked = ReadBuf::new(&mut byte);
            self.inner.poll_peek(cx, &mut peeked).map_ok(|_| ())
        })
        .await
    }
}

impl tonic::transport::server::Connected for GuardedStream<tokio::net::TcpStream> {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        PeerInfo::of(&self.connection)
    }
}

/// The guarded connection a tonic request came on, over plain TCP or TLS.
pub fn peer_of<T>(req: &tonic::Request<T>) -> Option<&PeerInfo> {
    use tonic::transport::server::TlsConnectInfo;
    req.extensions().get::<PeerInfo>().or_else(|| {
        req.extensions()
            .get::<TlsConnectInfo<PeerInfo>>()
            .map(TlsConnectInfo::get_ref)
    })
}
