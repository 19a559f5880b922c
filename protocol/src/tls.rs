//! TLS between nodes: mutual, against the cluster's own certificate
//! authority.
//!
//! A cluster started with `--tls-cert`, `--tls-key` and `--tls-ca` (or
//! `PRISM_TLS_CERT`, `PRISM_TLS_KEY`, `PRISM_TLS_CA`) speaks TLS on every
//! TCP connection between its processes: each side presents its node's
//! certificate and checks the other's against the CA, and a client checks
//! that the server's certificate names the address it dialled (an IP
//! subject alternative name, as each node's certificate carries its
//! `--node-ip-address`). The cluster token is still checked, inside the
//! encrypted stream. Unix sockets between processes of one node stay as
//! they are.
//!
//! A process turns TLS on once, with [`set`]; [`connect`] and [`accept`]
//! then wrap every TCP stream.
//!
//! ```no_run
//! use prism_protocol::tls::{self, TlsFiles};
//!
//! let files = TlsFiles {
//!     cert: "/etc/prism/node.pem".into(),
//!     key: "/etc/prism/node.key".into(),
//!     ca: "/etc/prism/ca.pem".into(),
//! };
//! tls::set(Some(tls::Tls::load(&files)?));
//! # Ok::<(), prism_protocol::Error>(())
//! ```

use crate::error::Error;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The PEM files of a node's TLS identity and of the cluster's CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM), naming its IP address.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificate(s) every node's certificate is signed by (PEM).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The three files from `PRISM_TLS_CERT`, `PRISM_TLS_KEY` and
    /// `PRISM_TLS_CA`: `None` when none is set.
    ///
    /// # Errors
    ///
    /// Some but not all of them are set.
    pub fn from_env() -> Result<Option<TlsFiles>, Error> {
        let get = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        TlsFiles::from_parts(
            get("PRISM_TLS_CERT").map(PathBuf::from),
            get("PRISM_TLS_KEY").map(PathBuf::from),
            get("PRISM_TLS_CA").map(PathBuf::from),
        )
    }

    /// The files when all three are given, `None` when none is.
    ///
    /// # Errors
    ///
    /// Some but not all of them are given: the error names the missing.
    pub fn from_parts(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, Error> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--tls-cert (PRISM_TLS_CERT)"),
                    (key.is_none(), "--tls-key (PRISM_TLS_KEY)"),
                    (ca.is_none(), "--tls-ca (PRISM_TLS_CA)"),
                ]
                .into_iter()
                .filter(|(gone, _)| *gone)
                .map(|(_, name)| name)
                .collect();
                Err(Error::invalid(
                    "tls",
                    format!(
                        "TLS needs a certificate, its key and the CA together; {} missing",
                        missing.join(" and ")
                    ),
                ))
            }
        }
    }
}

/// A loaded TLS identity: what a process presents and what it trusts.
#[derive(Clone)]
pub struct Tls {
    files: TlsFiles,
    client_config: Arc<rustls::ClientConfig>,
    server_config: Arc<rustls::ServerConfig>,
    client: tokio_rustls::TlsConnector,
    server: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Reads and checks the files.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds no certificate or key, or a key
    /// that does not match the certificate; the error names the file.
    pub fn load(files: &TlsFiles) -> Result<Tls, Error> {
        let bad = |what: &str, path: &PathBuf, e: String| {
            Error::invalid("tls", format!("{what} {}: {e}", path.display()))
        };
        let certs = read_certs(&files.cert).map_err(|e| bad("the certificate", &files.cert, e))?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| bad("the private key", &files.key, e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certs(&files.ca).map_err(|e| bad("the CA", &files.ca, e))? {
            roots
                .add(ca)
                .map_err(|e| bad("the CA", &files.ca, e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad("the CA", &files.ca, e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_client_cert_verifier(clients)
                    .with_single_cert(certs.clone(), key.clone_key())
            })
            .map_err(|e| bad("the certificate and key", &files.cert, e.to_string()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_root_certificates(roots)
                    .with_client_auth_cert(certs, key)
            })
            .map_err(|e| bad("the certificate and key", &files.cert, e.to_string()))?;
        let (client, server) = (Arc::new(client), Arc::new(server));
        Ok(Tls {
            files: files.clone(),
            client_config: client.clone(),
            server_config: server.clone(),
            client: tokio_rustls::TlsConnector::from(client),
            server: tokio_rustls::TlsAcceptor::from(server),
        })
    }

    /// The files it was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The client side: this node's certificate, trusting the CA.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client_config.clone()
    }

    /// The server side: this node's certificate, asking every client for
    /// one the CA signed.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config.clone()
    }
}

fn read_certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

static TLS: Mutex<Option<Tls>> = Mutex::new(None);

/// How long a client's TLS handshake may take.
const HANDSHAKE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Turns TLS on (or off) for this process's TCP connections to and from
/// other nodes.
pub fn set(tls: Option<Tls>) {
    *TLS.lock() = tls;
}

/// The TLS this process speaks, if any.
pub fn current() -> Option<Tls> {
    TLS.lock().clone()
}

/// A TCP stream between nodes, in TLS or not.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Stream {
    /// Plain TCP (a cluster without TLS).
    Plain(TcpStream),
    /// This side connected.
    Client(tokio_rustls::client::TlsStream<TcpStream>),
    /// This side accepted.
    Server(tokio_rustls::server::TlsStream<TcpStream>),
}

impl Stream {
    /// Whether it is encrypted.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Stream::Plain(_))
    }
}

/// Connects to `address` (`host:port`), in TLS when this process has it.
///
/// # Errors
///
/// The connection or the TLS handshake failed; the error says which, and
/// for a refused handshake what to check.
pub async fn connect(address: &str) -> Result<Stream, Error> {
    let tcp = TcpStream::connect(address)
        .await
        .map_err(|e| Error::io(format!("connect to {address}"), e))?;
    let _ = tcp.set_nodelay(true);
    let Some(tls) = current() else {
        return Ok(Stream::Plain(tcp));
    };
    let host = address
        .rsplit_once(':')
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
        .unwrap_or(address);
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        Error::invalid(
            "address",
            format!("{host:?} is not an IP address or host name a certificate can name: {e}"),
        )
    })?;
    let handshake = tokio::time::timeout(HANDSHAKE_LIMIT, tls.client.connect(name, tcp))
        .await
        .map_err(|_| Error::TlsFailed {
            peer: address.to_string(),
            reason: format!(
                "no handshake within {HANDSHAKE_LIMIT:?} (is the process there alive, and does \
                 it speak TLS?)"
            ),
        })?;
    handshake.map(Stream::Client).map_err(|e| Error::TlsFailed {
        peer: address.to_string(),
        reason: format!(
            "{e} (every node's certificate must be signed by the CA given with --tls-ca and \
             name the node's IP address; does {address} run with TLS?)"
        ),
    })
}

/// Takes an accepted TCP stream, in TLS when this process has it.
///
/// # Errors
///
/// The peer's TLS handshake failed (no certificate, one the CA did not
/// sign, or plain TCP to a TLS cluster); the error says so.
pub async fn accept(tcp: TcpStream) -> Result<Stream, String> {
    let _ = tcp.set_nodelay(true);
    let Some(tls) = current() else {
        return Ok(Stream::Plain(tcp));
    };
    tls.server
        .accept(tcp)
        .await
        .map(Stream::Server)
        .map_err(|e| format!("its TLS handshake failed: {e}"))
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Client(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Client(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Client(s) => s.is_write_vectored(),
            Stream::Server(s) => s.is_write_vectored(),
        }
    }
}
