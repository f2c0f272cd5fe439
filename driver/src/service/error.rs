//! Why a driver cannot start serving: [`StartError`]. A leaf: the driver's start and its
//! error type use it.
//!
//! Each sentence ends with what the operating system said, which is therefore not also the
//! error's source: the command line prints an error's sources after its sentence, and would
//! print it twice.

use std::net::SocketAddr;

/// Why the driver's control plane or web UI cannot be served; each message is a sentence
/// naming the address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The control-plane address cannot be bound.
    #[error("cannot listen on {bind}: {cause}")]
    Listen {
        /// The address asked for.
        bind: SocketAddr,
        /// What the operating system said.
        cause: std::io::Error,
    },
    /// The control plane's bound address cannot be read.
    #[error("cannot read the bound address: {0}")]
    BoundAddress(std::io::Error),
    /// The control plane's TLS listener cannot be set up.
    #[error("cannot set up the driver's TLS: {0}")]
    Tls(std::io::Error),
    /// Neither the web UI's address nor, where asked, a free port after it can be bound.
    #[error("cannot serve the web UI on {ui}: {cause}")]
    Ui {
        /// The address asked for.
        ui: SocketAddr,
        /// What the operating system said.
        cause: std::io::Error,
    },
    /// The web UI's bound address cannot be read.
    #[error("cannot read the web UI's bound address: {0}")]
    UiBoundAddress(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sentences read as they always have, and end with what the operating system said.
    #[test]
    fn start_failures_read_as_sentences() {
        let bind: SocketAddr = "0.0.0.0:7077".parse().unwrap();
        let cause = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let e = StartError::Listen { bind, cause };
        assert_eq!(
            e.to_string(),
            "cannot listen on 0.0.0.0:7077: address in use"
        );
        assert!(std::error::Error::source(&e).is_none());
        let cause = std::io::Error::other("no such device");
        let e = StartError::Ui { ui: bind, cause };
        assert_eq!(
            e.to_string(),
            "cannot serve the web UI on 0.0.0.0:7077: no such device"
        );
        let e = StartError::UiBoundAddress(std::io::Error::other("gone"));
        assert_eq!(
            e.to_string(),
            "cannot read the web UI's bound address: gone"
        );
    }
}
