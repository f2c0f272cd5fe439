//! The driver's check of the cluster's shared secret on every control-plane call (see
//! `ringflow_core::security`): a call without a valid token is refused with
//! `Unauthenticated`, a sentence the caller shows, and a warning in the driver's log naming
//! the caller's address.
//!
//! An accepted call also completes its connection's first request: until then the connection
//! may be closed at the first-request deadline, or to make room for a new one
//! ([`ringflow_core::listener`]), so that connections that never prove the secret cannot
//! hold the control plane's places.

use std::sync::Arc;
use std::time::SystemTime;

use ringflow_core::listener::peer_of;
use ringflow_core::security::{AUTH_HEADER, Secret, TokenVerifier};
use tonic::{Request, Status};

/// A tonic interceptor for one service; without a secret it lets everything through.
#[derive(Clone)]
pub(crate) struct AuthCheck {
    verifier: Option<Arc<TokenVerifier>>,
    /// Who the service is for, in the log ("an executor", "a client", ...).
    service: &'static str,
}

impl AuthCheck {
    /// Checks for `service`'s calls with the (shared) `verifier`.
    pub(crate) fn new(verifier: Option<Arc<TokenVerifier>>, service: &'static str) -> AuthCheck {
        AuthCheck { verifier, service }
    }

    /// One verifier for all services, so that a token is accepted once across them.
    pub(crate) fn verifier(secret: Option<&Secret>) -> Option<Arc<TokenVerifier>> {
        secret.map(|s| Arc::new(TokenVerifier::new(s.clone())))
    }
}

impl tonic::service::Interceptor for AuthCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(verifier) = &self.verifier else {
            established(&req);
            return Ok(req);
        };
        let token = req
            .metadata()
            .get(AUTH_HEADER)
            .and_then(|v| v.to_str().ok());
        match verifier.verify(token, SystemTime::now()) {
            Ok(()) => {
                established(&req);
                Ok(req)
            }
            Err(refusal) => {
                let peer = peer_of(&req)
                    .map_or_else(|| "an unknown address".to_string(), |p| p.addr.to_string());
                tracing::warn!("refused {} call from {peer}: {refusal}", self.service);
                Err(Status::unauthenticated(refusal.to_string()))
            }
        }
    }
}

/// Marks the connection `req` came on as past its first request.
fn established(req: &Request<()>) {
    if let Some(peer) = peer_of(req) {
        peer.establish();
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use ringflow_core::listener::{ConnectionGate, ListenerKind, ListenerLimits, PeerInfo};
    use tonic::service::Interceptor;

    use super::*;

    #[test]
    fn only_an_authenticated_call_completes_its_connections_first_request() {
        let secret = Secret::new(b"the cluster's shared secret", "test").unwrap();
        let mut check = AuthCheck::new(AuthCheck::verifier(Some(&secret)), "a client");
        let gate = ConnectionGate::new(ListenerKind::ControlPlane, ListenerLimits::CONTROL_PLANE);
        let call = |connection: &ringflow_core::listener::Connection, token: Option<String>| {
            let mut req = Request::new(());
            req.extensions_mut().insert(PeerInfo::of(connection));
            if let Some(t) = token {
                req.metadata_mut().insert(AUTH_HEADER, t.parse().unwrap());
            }
            req
        };
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let refused = gate.admit(peer).unwrap();
        let wrong = Secret::new(b"another cluster's secret", "test").unwrap();
        for token in [None, Some(wrong.token(SystemTime::now()))] {
            let status = check.call(call(&refused, token)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        assert!(!refused.is_established());
        let admitted = gate.admit(peer).unwrap();
        check
            .call(call(&admitted, Some(secret.token(SystemTime::now()))))
            .unwrap();
        assert!(admitted.is_established());
    }
}
