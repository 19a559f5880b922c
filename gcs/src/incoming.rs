//! The control store's connections: accepted by a [`GuardedListener`]
//! (limits per peer and in all, backoff on accept errors, refusals logged a
//! line per interval), each closed when quiet (no greeting within the
//! handshake timeout, no request within the idle timeout), as a stream
//! tonic serves.

use prism_protocol::guard::{GuardedListener, QuietTimeout};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// One accepted connection.
#[derive(Debug)]
pub(crate) struct GcsConnection(QuietTimeout<TcpStream>);

impl Connected for GcsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().connect_info()
    }
}

impl AsyncRead for GcsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GcsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

type Accepting = Pin<Box<dyn Future<Output = (GuardedListener, GcsConnection)> + Send>>;

/// The listener's connections, one after another.
pub(crate) struct Incoming {
    accepting: Accepting,
}

impl Incoming {
    pub(crate) fn new(listener: GuardedListener) -> Self {
        Incoming {
            accepting: accept(listener),
        }
    }
}

fn accept(mut listener: GuardedListener) -> Accepting {
    Box::pin(async move {
        let (conn, _peer) = listener.accept().await;
        (listener, GcsConnection(conn))
    })
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<GcsConnection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.accepting.as_mut().poll(cx) {
            Poll::Ready((listener, conn)) => {
                self.accepting = accept(listener);
                Poll::Ready(Some(Ok(conn)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
