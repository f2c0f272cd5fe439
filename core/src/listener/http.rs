//! Serving HTTP (axum) on guarded connections: a connection's first request is done once a
//! request reaches the router (any request, even one for a path it does not know).

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use tower_service::Service;

use super::gate::Connection;
use super::stream::{GuardedStream, PeerInfo};

/// An IO type that runs on a guarded connection.
pub trait Guarded {
    /// The connection's place at its gate.
    fn connection(&self) -> &Connection;
}

impl<S> Guarded for GuardedStream<S> {
    fn connection(&self) -> &Connection {
        GuardedStream::connection(self)
    }
}

impl<S> Guarded for tokio_rustls::server::TlsStream<GuardedStream<S>> {
    fn connection(&self) -> &Connection {
        self.get_ref().0.connection()
    }
}

/// Makes, for each connection, the router's service that marks the connection's first
/// request done at every request.
#[derive(Clone)]
struct MarkRequests {
    router: Router,
}

impl<L> Service<IncomingStream<'_, L>> for MarkRequests
where
    L: Listener,
    L::Io: Guarded,
{
    type Response = Marked;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Marked, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, incoming: IncomingStream<'_, L>) -> Self::Future {
        std::future::ready(Ok(Marked {
            router: self.router.clone(),
            peer: PeerInfo::of(incoming.io().connection()),
        }))
    }
}

/// The router of one connection.
#[derive(Clone)]
struct Marked {
    router: Router,
    peer: PeerInfo,
}

impl Service<Request> for Marked {
    type Response = Response;
    type Error = Infallible;
    type Future = <Router as Service<Request>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.peer.establish();
        self.router.call(request)
    }
}

/// Serves `router` on the guarded connections of `listener` until `shutdown` resolves.
pub async fn serve_http<L>(
    listener: L,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener,
    L::Io: Guarded,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, MarkRequests { router })
        .with_graceful_shutdown(shutdown)
        .await
}
