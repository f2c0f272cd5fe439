//! The driver's check of the cluster's shared secret on every control-plane call (see
//! `ringflow_proto::security`): a call without a valid token is refused with
//! `Unauthenticated`, a sentence the caller shows, and a warning in the driver's log naming
//! the caller's address.

use std::sync::Arc;
use std::time::SystemTime;

use ringflow_proto::security::{AUTH_HEADER, Secret, TokenVerifier};
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
            return Ok(req);
        };
        let token = req
            .metadata()
            .get(AUTH_HEADER)
            .and_then(|v| v.to_str().ok());
        match verifier.verify(token, SystemTime::now()) {
            Ok(()) => Ok(req),
            Err(refusal) => {
                let peer = req
                    .remote_addr()
                    .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
                tracing::warn!("refused {} call from {peer}: {refusal}", self.service);
                Err(Status::unauthenticated(refusal.to_string()))
            }
        }
    }
}
