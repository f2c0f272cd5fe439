//! The options shared by every command that serves or reaches a driver: the cluster's secret
//! and the control plane's TLS files (see `ringflow_core::security`).

use std::path::PathBuf;

use clap::Args;
use ringflow_core::security::{ClientSecurity, ClientTls, Secret, ServerTls};

#[derive(Args, Clone, Debug, Default)]
pub struct SecurityArgs {
    /// File holding the cluster's shared secret, at least 16 characters (or set
    /// RINGFLOW_SECRET to the secret itself). A driver with one refuses executors and clients
    /// without it.
    #[arg(long, env = "RINGFLOW_SECRET_FILE", value_name = "PATH")]
    secret_file: Option<PathBuf>,

    /// PEM certificate chain: the driver's TLS certificate, or a client's for mutual TLS.
    #[arg(long, value_name = "PEM")]
    tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM")]
    tls_key: Option<PathBuf>,

    /// PEM CA certificates. Clients trust the driver's certificate if one of these signed it
    /// (without it: the system's roots); a driver given one requires client certificates
    /// signed by it (mutual TLS).
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<PathBuf>,
}

impl SecurityArgs {
    fn secret(&self) -> anyhow::Result<Option<Secret>> {
        Ok(Secret::resolve(self.secret_file.as_deref())?)
    }

    /// How a client reaches the driver.
    pub fn client(&self) -> anyhow::Result<ClientSecurity> {
        Ok(ClientSecurity {
            secret: self.secret()?,
            tls: ClientTls::from_files(
                self.tls_ca.as_deref(),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
            )?,
        })
    }

    /// What a driver requires: its secret and its TLS.
    pub fn server(&self) -> anyhow::Result<(Option<Secret>, Option<ServerTls>)> {
        let tls = ServerTls::from_files(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_ca.as_deref(),
        )?;
        Ok((self.secret()?, tls))
    }
}
