//! The cluster's shared secret: read from a file or the environment, never printed.

use std::path::Path;
use std::sync::Arc;

use super::{Result, SecurityError, constant_time_eq, read_file};
use crate::data::flight::hex;

/// The environment variable that may hold the secret itself.
pub const SECRET_ENV: &str = "RINGFLOW_SECRET";

/// The shortest secret accepted, in bytes (e.g. `openssl rand -hex 32` gives 64).
pub const MIN_SECRET_LEN: usize = 16;

/// The shared secret of a cluster. Its `Debug` output is redacted, and it compares in constant
/// time.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        constant_time_eq(&self.0, &other.0)
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A secret from its value, with surrounding whitespace (a file's final newline) removed;
    /// `origin` names where it came from in the error for one that is too short.
    pub fn new(value: &[u8], origin: &str) -> Result<Secret> {
        let value = value.trim_ascii();
        if value.len() < MIN_SECRET_LEN {
            return Err(SecurityError::Invalid(format!(
                "the secret in {origin} is {} bytes long; it must have at least {MIN_SECRET_LEN} \
                 (make one with `openssl rand -hex 32`)",
                value.len()
            )));
        }
        Ok(Secret(value.into()))
    }

    /// Reads a secret file.
    pub fn from_file(path: &Path) -> Result<Secret> {
        let bytes = read_file("the secret file", path)?;
        Secret::new(&bytes, &format!("{}", path.display()))
    }

    /// The secret from `--secret-file` when given, else from [`SECRET_ENV`] when set and not
    /// empty, else none.
    pub fn resolve(file: Option<&Path>) -> Result<Option<Secret>> {
        if let Some(path) = file {
            return Secret::from_file(path).map(Some);
        }
        match std::env::var_os(SECRET_ENV) {
            Some(v) if !v.is_empty() => {
                Secret::new(v.as_encoded_bytes(), &format!("${SECRET_ENV}")).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// A fresh random secret (64 hexadecimal characters), e.g. for the executors that an
    /// embedded driver starts itself.
    pub fn generate() -> Secret {
        let mut raw = [0u8; 32];
        rand::fill(&mut raw);
        Secret(hex(&raw).as_bytes().into())
    }

    /// The secret's bytes (to hand it to a child process).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Whether `presented` is this secret, compared in constant time (for a secret sent as
    /// an HTTP bearer token to the web UI's write actions).
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(presented.trim_ascii(), &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_secret_loses_its_newline_and_short_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("secret");
        std::fs::write(&good, "0123456789abcdef0123\n").unwrap();
        let s = Secret::from_file(&good).unwrap();
        assert_eq!(s.expose(), b"0123456789abcdef0123");
        assert!(s.matches(b"0123456789abcdef0123"));
        assert!(!s.matches(b"0123456789abcdef0124"));
        assert!(!s.matches(b"0123456789abcdef012"));
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");

        let short = dir.path().join("short");
        std::fs::write(&short, "hunter2\n").unwrap();
        let err = Secret::from_file(&short).unwrap_err().to_string();
        assert!(err.contains(&short.display().to_string()), "{err}");
        assert!(err.contains("at least 16"), "{err}");

        let missing = dir.path().join("missing");
        let err = Secret::from_file(&missing).unwrap_err().to_string();
        assert!(err.starts_with("cannot read the secret file "), "{err}");
    }

    #[test]
    fn generated_secrets_differ_and_are_long_enough() {
        let (a, b) = (Secret::generate(), Secret::generate());
        assert_ne!(a, b);
        assert!(Secret::new(a.expose(), "test").is_ok());
    }
}
