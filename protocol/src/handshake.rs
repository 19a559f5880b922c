//! The greeting that opens every TCP connection between a cluster's
//! processes: a magic naming what the connection carries (framed messages
//! or a bulk stream), then the cluster token, checked in constant time
//! and answered with a verdict (and, when refused, why). Also this
//! process's own token, presented on the connections it opens.

use crate::error::Error;
use crate::tls;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const HANDSHAKE_MAGIC: &[u8; 4] = b"PRSM";
/// Opens a bulk stream instead of a message connection.
const BULK_MAGIC: &[u8; 4] = b"PRSB";
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a TCP connection carries once its token was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// Framed messages ([`Connection`]).
    Messages,
    /// Raw object bytes ([`crate::transfer`]).
    Bulk,
}

pub(crate) async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    address: &str,
    token: &str,
    kind: StreamKind,
) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::io(format!("greet {address}"), e);
    let exchange = async {
        let mut hello = match kind {
            StreamKind::Messages => HANDSHAKE_MAGIC.to_vec(),
            StreamKind::Bulk => BULK_MAGIC.to_vec(),
        };
        hello.extend_from_slice(&(token.len() as u16).to_le_bytes());
        hello.extend_from_slice(token.as_bytes());
        stream.write_all(&hello).await.map_err(io)?;
        stream.flush().await.map_err(io)?;
        let mut verdict = [0u8; 1];
        stream.read_exact(&mut verdict).await.map_err(io)?;
        if verdict[0] == 1 {
            return Ok(());
        }
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.map_err(io)?;
        let mut why = vec![0u8; u16::from_le_bytes(len) as usize];
        stream.read_exact(&mut why).await.map_err(io)?;
        Err(Error::ConnectionRefused {
            peer: address.to_string(),
            reason: String::from_utf8_lossy(&why).into_owned(),
        })
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(Error::io(
                format!("greet {address}"),
                "no answer within 5 s",
            ))
        })
}

pub(crate) async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
    serves_bulk: bool,
) -> Result<StreamKind, String> {
    let exchange = async {
        let mut head = [0u8; 6];
        stream
            .read_exact(&mut head)
            .await
            .map_err(|e| e.to_string())?;
        let kind = match &head[..4] {
            m if m == HANDSHAKE_MAGIC => StreamKind::Messages,
            m if m == BULK_MAGIC => StreamKind::Bulk,
            _ => return Err("it does not speak Prism's protocol".to_string()),
        };
        let mut presented = vec![0u8; u16::from_le_bytes([head[4], head[5]]) as usize];
        stream
            .read_exact(&mut presented)
            .await
            .map_err(|e| e.to_string())?;
        let (why, logged) = if !constant_time_eq(presented.as_slice(), token.as_bytes()) {
            (
                "a wrong cluster token was given; pass the token that `prism start --head` \
                 printed, with --token-file or PRISM_AUTH_TOKEN",
                "a wrong cluster token",
            )
        } else if kind == StreamKind::Bulk && !serves_bulk {
            (
                "this process serves no object transfers; pull objects from a raylet",
                "a bulk stream to a process that serves none",
            )
        } else {
            stream.write_all(&[1]).await.map_err(|e| e.to_string())?;
            stream.flush().await.map_err(|e| e.to_string())?;
            return Ok(kind);
        };
        let mut refusal = vec![0u8];
        refusal.extend_from_slice(&(why.len() as u16).to_le_bytes());
        refusal.extend_from_slice(why.as_bytes());
        let _ = stream.write_all(&refusal).await;
        let _ = stream.flush().await;
        Err(logged.to_string())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err("no greeting within 5 s".to_string()))
}

/// Opens a bulk stream to the process listening at `address` (`ip:port`),
/// presenting this process's cluster token (see [`crate::transfer`]).
pub async fn connect_bulk(address: &str) -> Result<tls::Stream, Error> {
    let token = cluster_token()?;
    let mut stream = tls::connect(address).await?;
    client_handshake(&mut stream, address, &token, StreamKind::Bulk).await?;
    Ok(stream)
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

static CLUSTER_TOKEN: Mutex<Option<String>> = Mutex::new(None);

/// Sets the token this process presents on TCP connections to other nodes.
pub fn set_cluster_token(token: Option<String>) {
    *CLUSTER_TOKEN.lock() = token;
}

pub(crate) fn cluster_token() -> Result<String, Error> {
    CLUSTER_TOKEN.lock().clone().ok_or(Error::NoClusterToken)
}
