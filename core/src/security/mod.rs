//! Who may use a driver, and how the control plane is encrypted.
//!
//! Two independent layers, both optional and both off by default (like Spark's):
//!
//! - **A shared secret** ([`Secret`]) known to the driver and to everyone allowed to use it
//!   (`--secret-file PATH` or `RINGFLOW_SECRET`). With one set, the driver refuses every
//!   control-plane call (executor registration and heartbeats, job submission, status, cancel,
//!   the Flight partitions) that does not carry a valid [`token`](Secret::token). The secret
//!   itself never crosses the network: each call carries a fresh HMAC-SHA256 over a timestamp
//!   and a random nonce, which the driver's [`TokenVerifier`] accepts once, within five minutes
//!   of its own clock.
//! - **TLS** ([`ServerTls`], [`ClientTls`]; rustls): `--tls-cert`/`--tls-key` give the driver
//!   its certificate, clients trust it through `--tls-ca` (or the system's roots), and a driver
//!   given `--tls-ca` also requires client certificates signed by it (mutual TLS).
//!
//! The data plane between executors (the ring) has its own per-job secret, handed out by the
//! driver with each task; see the executor's `collective::handshake`.

mod secret;
mod tls;
mod token;

pub use secret::{MIN_SECRET_LEN, SECRET_ENV, Secret};
pub use tls::{
    ClientSecurity, ClientTls, ServerTls, error_chain, is_certificate_error, status_line,
};
pub use token::{
    AUTH_HEADER, AuthInterceptor, AuthenticatedChannel, MAX_CLOCK_SKEW, Refusal, TokenVerifier,
};

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Whether `a` and `b` are equal, in time that depends on neither their contents nor their
/// lengths: both are hashed (SHA-256) and the digests compared in constant time. Every
/// comparison of a secret (shared secrets, job secrets, Flight tickets) goes through it, so a
/// caller cannot learn a secret byte by byte from how long a refusal takes.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.as_slice().ct_eq(b.as_slice()).into()
}

/// A secret or a TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Io {
        /// What the file was meant to hold (e.g. "the secret file").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file or value with unusable content.
    #[error("{0}")]
    Invalid(String),
}

/// This module's results.
pub type Result<T, E = SecurityError> = std::result::Result<T, E>;

/// The bytes of `path`, which holds `what` (named in the error).
fn read_file(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| SecurityError::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!constant_time_eq(b"0123456789abcdef", b""));
        let (a, b) = (Secret::generate(), Secret::generate());
        assert_eq!(a, a.clone());
        assert_ne!(a, b);
    }
}
