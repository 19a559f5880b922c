//! Bulk streams: how a raylet copies an object out of another node's
//! store.
//!
//! A bulk stream is a TCP connection opened with [`crate::rpc::connect_bulk`]
//! (the cluster token is checked as for message connections). On it the
//! puller asks for byte ranges of sealed objects, one at a time, and the
//! holder answers each with the bytes themselves, unframed: they go from
//! the holder's shared memory to the socket and from the socket into the
//! puller's shared memory, with no copy in between.
//!
//! ```text
//! request:  object id (16 bytes LE) | offset (u64 LE) | len (u64 LE)
//!           | puller's node id length (u16 LE) | puller's node id
//! answer:   0 then `len` bytes          the range
//!           1 | length (u16 LE) | text  why it cannot be read
//! ```

use crate::ids::ObjectId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One range of an object, asked for on a bulk stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRequest {
    /// The object.
    pub id: ObjectId,
    /// Where the range starts.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The node pulling it (its copy is freed with the object).
    pub puller: String,
}

impl ChunkRequest {
    /// Sends the request.
    pub async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        let node = self.puller.as_bytes();
        let node_len = u16::try_from(node.len()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "node id too long")
        })?;
        let mut head = Vec::with_capacity(34 + node.len());
        head.extend_from_slice(&self.id.0.to_le_bytes());
        head.extend_from_slice(&self.offset.to_le_bytes());
        head.extend_from_slice(&self.len.to_le_bytes());
        head.extend_from_slice(&node_len.to_le_bytes());
        head.extend_from_slice(node);
        w.write_all(&head).await?;
        // A TLS stream may hold the last bytes until flushed.
        w.flush().await
    }

    /// Reads the next request; `None` when the puller closed the stream.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<ChunkRequest>> {
        let mut head = [0u8; 34];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&head[..16]);
        let mut node = vec![0u8; u16::from_le_bytes([head[32], head[33]]) as usize];
        r.read_exact(&mut node).await?;
        Ok(Some(ChunkRequest {
            id: ObjectId(u128::from_le_bytes(id)),
            offset: u64_at(16),
            len: u64_at(24),
            puller: String::from_utf8_lossy(&node).into_owned(),
        }))
    }
}

/// Says the range follows (the holder then writes its bytes, and flushes
/// the stream: over TLS the last bytes may wait for it).
pub async fn accept<W: AsyncWrite + Unpin>(w: &mut W) -> std::io::Result<()> {
    w.write_all(&[0]).await
}

/// Says why the range cannot be read.
pub async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, why: &str) -> std::io::Result<()> {
    let why = &why.as_bytes()[..why.len().min(u16::MAX as usize)];
    let mut out = vec![1u8];
    out.extend_from_slice(&(why.len() as u16).to_le_bytes());
    out.extend_from_slice(why);
    w.write_all(&out).await?;
    w.flush().await
}

/// Reads the holder's verdict on a request: `Ok` when the bytes follow,
/// `Err(Ok(why))` when it refused, `Err(Err(io))` when the stream broke.
pub async fn verdict<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<(), Result<String, std::io::Error>> {
    let mut first = [0u8; 1];
    r.read_exact(&mut first).await.map_err(Err)?;
    if first[0] == 0 {
        return Ok(());
    }
    let mut len = [0u8; 2];
    r.read_exact(&mut len).await.map_err(Err)?;
    let mut why = vec![0u8; u16::from_le_bytes(len) as usize];
    r.read_exact(&mut why).await.map_err(Err)?;
    Err(Ok(String::from_utf8_lossy(&why).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_and_verdicts_read_back_what_was_written() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let request = ChunkRequest {
            id: ObjectId::new(),
            offset: 7,
            len: 1 << 40,
            puller: "node-00ff".into(),
        };
        request.write(&mut a).await.unwrap();
        assert_eq!(ChunkRequest::read(&mut b).await.unwrap(), Some(request));
        accept(&mut a).await.unwrap();
        assert!(verdict(&mut b).await.is_ok());
        refuse(&mut a, "gone").await.unwrap();
        match verdict(&mut b).await {
            Err(Ok(why)) => assert_eq!(why, "gone"),
            other => panic!("unexpected {other:?}"),
        }
        drop(a);
        assert_eq!(ChunkRequest::read(&mut b).await.unwrap(), None);
    }
}
