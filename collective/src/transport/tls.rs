//! TLS on the TCP links between ranks on different hosts.
//!
//! A group given [`GroupTls`] runs mutual TLS on every TCP link between
//! ranks of different hosts: the rank that connects (the higher one)
//! checks that the peer's certificate names the peer's address, the rank
//! that accepts checks that the peer's is signed by the CA it trusts, and
//! the group's hello travels inside. Links between ranks of one host are
//! not encrypted, as a node's Unix sockets are not.
//!
//! After the handshake a link is non-blocking like a plain one: a write
//! hands rustls at most what its buffer takes and sends what it can; a read
//! takes decrypted bytes, reading and decrypting more records from the
//! socket when none are left. Bytes that rustls holds (records not yet
//! sent, plaintext not yet read) are what [`TcpMesh`](super::tcp::TcpMesh)
//! looks at before it sleeps on its sockets.

use crate::error::{CollectiveError, Result};
use crate::rendezvous::remaining;
use rustls::pki_types::ServerName;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The TLS a group's ranks speak on their TCP links between hosts: the
/// configurations of both sides of a mutual TLS connection (each rank
/// connects to some peers and accepts others).
///
/// In a Prism cluster started with `--tls-cert`, `--tls-key` and
/// `--tls-ca`, the Trainer's groups take the node's own (see `prism-train`).
///
/// ```no_run
/// use prism_collective::{GroupOptions, GroupTls};
/// // This host's certificate and key, and the CA that signed every host's.
/// let read = |path: &str| std::fs::read(path);
/// let tls = GroupTls::from_pem(&read("node.pem")?, &read("node.key")?, &read("ca.pem")?)?;
/// let options = GroupOptions::new(1, 4, "10.0.0.1:29500").tls(tls);
/// assert_eq!(options.rank(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct GroupTls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for GroupTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupTls { .. }")
    }
}

impl GroupTls {
    /// TLS from a client and a server configuration. Both should present
    /// this host's certificate and trust the CA that signed every other
    /// host's: the server's must ask for client certificates for the links
    /// to be mutually authenticated.
    pub fn new(client: Arc<rustls::ClientConfig>, server: Arc<rustls::ServerConfig>) -> GroupTls {
        GroupTls { client, server }
    }

    /// TLS from PEM text: this host's certificate chain and private key,
    /// and the CA that signed every host's certificate (each host's must
    /// name the address its rank is reached at). Both sides present the
    /// certificate, and the accepting side asks the connecting one for a
    /// certificate the CA signed.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::TlsConfig`] naming what could not be used: no
    /// certificate, no key, a key that does not match, or no CA.
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<GroupTls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &'static str, detail: String| CollectiveError::TlsConfig { what, detail };
        let certs = |pem: &[u8], what: &'static str| -> Result<Vec<CertificateDer<'static>>> {
            let all = CertificateDer::pem_slice_iter(pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(what, e.to_string()))?;
            if all.is_empty() {
                return Err(bad(what, "no PEM certificate".into()));
            }
            Ok(all)
        };
        let chain = certs(cert, "the certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| bad("the private key", e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca, "the CA")? {
            roots.add(c).map_err(|e| bad("the CA", e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad("the CA", e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_client_cert_verifier(verifier)
                    .with_single_cert(chain.clone(), key.clone_key())
            })
            .map_err(|e| bad("the certificate and key", e.to_string()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_root_certificates(roots)
                    .with_client_auth_cert(chain, key)
            })
            .map_err(|e| bad("the certificate and key", e.to_string()))?;
        Ok(GroupTls::new(Arc::new(client), Arc::new(server)))
    }

    /// Connects TLS over `stream` as a client, checking that the peer's
    /// certificate names `ip`, within `deadline`.
    pub(crate) fn connect(
        &self,
        stream: &TcpStream,
        ip: IpAddr,
        peer: usize,
        deadline: Instant,
    ) -> Result<rustls::Connection> {
        let conn = rustls::ClientConnection::new(self.client.clone(), ServerName::from(ip))
            .map_err(|e| refused(peer, e.to_string()))?;
        let mut conn = rustls::Connection::from(conn);
        handshake(&mut conn, stream, peer, deadline)?;
        Ok(conn)
    }

    /// Accepts TLS over `stream` as a server, within `deadline`.
    pub(crate) fn accept(
        &self,
        stream: &TcpStream,
        deadline: Instant,
    ) -> Result<rustls::Connection> {
        let conn = rustls::ServerConnection::new(self.server.clone())
            .map_err(|e| refused(usize::MAX, e.to_string()))?;
        let mut conn = rustls::Connection::from(conn);
        handshake(&mut conn, stream, usize::MAX, deadline)?;
        Ok(conn)
    }
}

fn refused(peer: usize, why: String) -> CollectiveError {
    CollectiveError::Tls {
        peer: (peer != usize::MAX).then_some(peer),
        detail: why,
    }
}

/// Drives a handshake on a blocking socket to its end.
fn handshake(
    conn: &mut rustls::Connection,
    stream: &TcpStream,
    peer: usize,
    deadline: Instant,
) -> Result<()> {
    let mut io = stream;
    while conn.is_handshaking() || conn.wants_write() {
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(refused(peer, "no TLS handshake before the deadline".into()));
        }
        stream
            .set_read_timeout(Some(left))
            .and_then(|_| stream.set_write_timeout(Some(left)))
            .map_err(|e| CollectiveError::io(Some(peer), "configuring a TLS link", e))?;
        conn.complete_io(&mut io).map_err(|e| {
            refused(
                peer,
                format!(
                    "{e} (every host's certificate must be signed by the CA the group \
                     trusts and name the host's address)"
                ),
            )
        })?;
    }
    Ok(())
}

/// Writes all of `data` through TLS on a blocking socket.
pub(crate) fn write_all(
    conn: &mut rustls::Connection,
    stream: &TcpStream,
    data: &[u8],
) -> std::io::Result<()> {
    conn.writer().write_all(data)?;
    let mut io = stream;
    while conn.wants_write() {
        conn.write_tls(&mut io)?;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes through TLS on a blocking socket whose
/// read timeout bounds each wait.
pub(crate) fn read_exact(
    conn: &mut rustls::Connection,
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let mut got = 0;
    let mut io = stream;
    while got < buf.len() {
        match conn.reader().read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = remaining(deadline);
                if left.is_zero() {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                if conn.read_tls(&mut io)? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                conn.process_new_packets()
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a non-blocking read or write through TLS moved.
pub(crate) enum Moved {
    Bytes(usize),
    /// The socket has nothing (or no room) now.
    Nothing,
    /// The peer closed the link.
    Closed,
}

/// Sends what rustls holds, without blocking; whether all of it went.
pub(crate) fn flush(conn: &mut rustls::Connection, stream: &TcpStream) -> std::io::Result<bool> {
    let mut io = stream;
    while conn.wants_write() {
        match conn.write_tls(&mut io) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes a prefix of `data` without blocking: only once earlier records
/// have left, so rustls never holds more than one buffer's worth.
pub(crate) fn try_write(
    conn: &mut rustls::Connection,
    stream: &TcpStream,
    data: &[u8],
) -> std::io::Result<Moved> {
    if !flush(conn, stream)? {
        return Ok(Moved::Nothing);
    }
    let n = conn.writer().write(data)?;
    flush(conn, stream)?;
    Ok(if n == 0 {
        Moved::Nothing
    } else {
        Moved::Bytes(n)
    })
}

/// Reads decrypted bytes into `dst` without blocking.
pub(crate) fn try_read(
    conn: &mut rustls::Connection,
    stream: &TcpStream,
    dst: &mut [u8],
) -> std::io::Result<Moved> {
    let mut io = stream;
    loop {
        match conn.reader().read(dst) {
            Ok(0) => return Ok(Moved::Closed),
            Ok(n) => return Ok(Moved::Bytes(n)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Moved::Closed),
            Err(e) => return Err(e),
        }
        match conn.read_tls(&mut io) {
            Ok(0) => return Ok(Moved::Closed),
            Ok(_) => {
                conn.process_new_packets()
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                // A record may have asked for an answer (a key update).
                flush(conn, stream)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Moved::Nothing),
            Err(e) => return Err(e),
        }
    }
}

/// Whether decrypted bytes wait to be read (so a poll on the socket would
/// wait for nothing).
pub(crate) fn readable(conn: &mut rustls::Connection) -> bool {
    conn.process_new_packets()
        .map(|state| state.plaintext_bytes_to_read() > 0 || state.peer_has_closed())
        .unwrap_or(true)
}
