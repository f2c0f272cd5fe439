//! TLS for the control plane (rustls): the driver's certificate, the clients' trust anchors,
//! and mutual TLS when the driver is given a CA for client certificates.

use std::path::Path;
use std::sync::{Arc, Once};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{AuthInterceptor, AuthenticatedChannel, Result, Secret, SecurityError, read_file};

/// Makes rustls's ring provider the process default (the only one compiled in), once.
fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The certificates of a PEM file, at least one.
fn certificates(flag: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            SecurityError::Invalid(format!("{flag} {} is not valid PEM: {e}", path.display()))
        })?;
    if certs.is_empty() {
        return Err(SecurityError::Invalid(format!(
            "{flag} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

/// The PEM of a `--tls-ca` file and the certificates it holds (at least one).
fn ca_file(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>)> {
    let pem = read_file("the CA file (--tls-ca)", path)?;
    let certs = certificates("--tls-ca", path, &pem)?;
    Ok((pem, certs))
}

fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        SecurityError::Invalid(format!(
            "--tls-key {} holds no usable PEM private key: {e}",
            path.display()
        ))
    })
}

/// A certificate and its key, read and checked.
#[derive(Clone)]
struct KeyPair {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl KeyPair {
    fn load(cert: &Path, key: &Path) -> Result<KeyPair> {
        let cert_pem = read_file("the certificate file (--tls-cert)", cert)?;
        let key_pem = read_file("the key file (--tls-key)", key)?;
        let chain = certificates("--tls-cert", cert, &cert_pem)?;
        let parsed = private_key(key, &key_pem)?;
        Ok(KeyPair {
            cert_pem,
            key_pem,
            chain,
            key: Arc::new(parsed),
        })
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

/// Both or neither of `--tls-cert` and `--tls-key`.
fn pair(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<KeyPair>> {
    match (cert, key) {
        (Some(c), Some(k)) => KeyPair::load(c, k).map(Some),
        (None, None) => Ok(None),
        (Some(_), None) => Err(SecurityError::Invalid(
            "--tls-cert is given without --tls-key".into(),
        )),
        (None, Some(_)) => Err(SecurityError::Invalid(
            "--tls-key is given without --tls-cert".into(),
        )),
    }
}

/// The driver's TLS settings: one rustls configuration for the control plane (gRPC and Flight,
/// with client certificates required when the driver has a CA for them) and one for the web UI.
#[derive(Clone)]
pub struct ServerTls {
    /// The control plane's configuration (HTTP/2 by ALPN).
    grpc: Arc<rustls::ServerConfig>,
    /// The web UI's configuration (server certificate only: browsers bring no client
    /// certificates).
    ui: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From `--tls-cert`, `--tls-key` and `--tls-ca`: none of them gives `None` (plain TCP);
    /// a CA alone is refused, since the driver then has no certificate to present.
    pub fn from_files(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<ServerTls>> {
        install_provider();
        let Some(pair) = pair(cert, key)? else {
            return match client_ca {
                None => Ok(None),
                Some(_) => Err(SecurityError::Invalid(
                    "--tls-ca on the driver requires --tls-cert and --tls-key".into(),
                )),
            };
        };
        let with_certificate = |builder: rustls::ConfigBuilder<
            rustls::ServerConfig,
            rustls::server::WantsServerCert,
        >| {
            builder
                .with_single_cert(pair.chain.clone(), pair.key.clone_key())
                .map_err(|e| {
                    SecurityError::Invalid(format!(
                        "the --tls-cert and --tls-key files do not make a usable \
                             certificate: {e}"
                    ))
                })
        };
        let grpc = rustls::ServerConfig::builder();
        let mut grpc = with_certificate(match client_ca {
            Some(path) => grpc.with_client_cert_verifier(client_verifier(path)?),
            None => grpc.with_no_client_auth(),
        })?;
        grpc.alpn_protocols = vec![b"h2".to_vec()];
        let ui = with_certificate(rustls::ServerConfig::builder().with_no_client_auth())?;
        Ok(Some(ServerTls {
            grpc: Arc::new(grpc),
            ui: Arc::new(ui),
        }))
    }

    /// The control plane's rustls configuration (gRPC and Flight over HTTP/2).
    pub fn grpc(&self) -> Arc<rustls::ServerConfig> {
        self.grpc.clone()
    }

    /// The web UI's rustls configuration.
    pub fn http(&self) -> Arc<rustls::ServerConfig> {
        self.ui.clone()
    }
}

/// A verifier of client certificates signed by the CAs of the `--tls-ca` file at `path`.
fn client_verifier(path: &Path) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let (_, certs) = ca_file(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| {
            SecurityError::Invalid(format!(
                "--tls-ca {} holds a certificate that cannot be a trust anchor: {e}",
                path.display()
            ))
        })?;
    }
    rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| {
            SecurityError::Invalid(format!(
                "--tls-ca {} cannot verify client certificates: {e}",
                path.display()
            ))
        })
}

/// A client's TLS settings: whom to trust, and its own certificate for mutual TLS.
#[derive(Clone, Default)]
pub struct ClientTls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<KeyPair>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// From `--tls-ca`, `--tls-cert` and `--tls-key`; none of them gives `None`.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<ClientTls>> {
        install_provider();
        let identity = pair(cert, key)?;
        let ca_pem = ca.map(ca_file).transpose()?.map(|(pem, _)| pem);
        Ok((ca_pem.is_some() || identity.is_some()).then_some(ClientTls { ca_pem, identity }))
    }

    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        match &self.identity {
            Some(pair) => config.identity(pair.identity()),
            None => config,
        }
    }
}

/// How a client (an executor, the CLI) reaches a driver: the secret it proves, the TLS it
/// speaks.
#[derive(Clone, Debug, Default)]
pub struct ClientSecurity {
    /// The cluster's shared secret, if the driver requires one.
    pub secret: Option<Secret>,
    /// TLS settings; an `https://` URL without them trusts the system's roots.
    pub tls: Option<ClientTls>,
}

impl ClientSecurity {
    /// A client that proves `secret` over plain TCP (to a driver embedded in this process).
    pub fn with_secret(secret: Secret) -> ClientSecurity {
        ClientSecurity {
            secret: Some(secret),
            tls: None,
        }
    }

    /// An endpoint for the driver at `url`, with TLS when the URL is `https://`.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint> {
        let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| {
            SecurityError::Invalid(format!("the driver URL {url:?} is not a URL: {e}"))
        })?;
        let https = url.starts_with("https://");
        match (&self.tls, https) {
            (Some(_), false) => Err(SecurityError::Invalid(format!(
                "TLS options (--tls-ca, --tls-cert) are given but the driver URL {url} is not \
                 https://"
            ))),
            (None, false) => Ok(endpoint),
            (tls, true) => {
                install_provider();
                let config = tls.clone().unwrap_or_default().config();
                endpoint.tls_config(config).map_err(|e| {
                    SecurityError::Invalid(format!(
                        "cannot set up TLS for {url}: {}",
                        error_chain(&e)
                    ))
                })
            }
        }
    }

    /// `channel` with the secret's token added to every call.
    pub fn authenticated(&self, channel: Channel) -> AuthenticatedChannel {
        InterceptedService::new(channel, AuthInterceptor(self.secret.clone()))
    }
}

/// An error and its sources as one line, without the repetitions that wrapped transport
/// errors carry ("transport error: invalid peer certificate: X: invalid peer certificate: X").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line
}

/// A failed call's message with the transport error behind it (TLS failures say what happened
/// only there), as one line, with a hint where the cause suggests a TLS mismatch.
pub fn status_line(s: &tonic::Status) -> String {
    let mut line = cause_line(s);
    // Under TLS 1.3 a server that requires a client certificate checks it after the client's
    // handshake has finished, so the client sees either the server's alert or, when the
    // connection is already gone, only a closed or broken connection.
    let closed = [
        "h2 protocol error",
        "connection closed",
        "connection was not ready",
        "broken pipe",
        "reset by peer",
    ];
    if closed.iter().any(|c| line.contains(c)) {
        line.push_str(
            " (the driver closed the connection: if it serves TLS, use an https:// URL; if it \
             requires client certificates, pass --tls-cert and --tls-key; if it holds as many \
             connections as its --max-connections allows, retry or raise that bound)",
        );
    } else if line.contains("CertificateRequired") {
        line.push_str(" (the driver requires a client certificate: pass --tls-cert and --tls-key)");
    }
    line
}

/// A failed call's message and the transport error behind it, without hints.
fn cause_line(s: &tonic::Status) -> String {
    let mut line = s.message().to_string();
    if let Some(source) = std::error::Error::source(s) {
        let more = error_chain(source);
        if more.starts_with(&line) {
            line = more;
        } else if !line.contains(&more) {
            line = format!("{line}: {more}");
        }
    }
    line
}

/// Whether a failed call failed on TLS certificates, which retrying cannot fix. A closed
/// connection is not one: a restarting driver closes connections too.
pub fn is_certificate_error(s: &tonic::Status) -> bool {
    let line = cause_line(s);
    line.contains("certificate") || line.contains("Certificate")
}
