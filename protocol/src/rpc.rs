//! A multiplexed request/response connection over a Unix-domain socket
//! (processes of one node) or TCP (processes of different nodes).
//!
//! # Addresses
//!
//! A process of a single-node cluster is reached at its socket path. In a
//! multi-node cluster it also listens on TCP and gives out both, as
//! `<socket path>|tcp://<ip>:<port>|<node id>` (see [`Endpoint`]): a peer
//! on the same node connects to the socket, any other over TCP.
//!
//! # Authentication
//!
//! A TCP connection starts with a handshake: the client sends `PRSM`, the
//! token's length (`u16`, little-endian) and the cluster token; the server
//! answers one byte, 1 to accept, or 0 followed by a length and a message
//! saying why it refused, and closes. Unix sockets need none: they live in
//! a session directory only their user can open. In a cluster with TLS
//! (see [`crate::tls`]) the handshake runs inside the TLS stream.
//!
//! # Framing
//!
//! Each frame is a little-endian `u32` length followed by a MessagePack
//! [`Frame`]. Either side may send requests; responses carry the id of the
//! request they answer, so many calls can be in flight on one connection.
//!
//! # Ordering
//!
//! Frames are written in the order `send` is called and the reader hands
//! requests to the [`Handler`] in the order they arrive, synchronously, so a
//! handler that queues work (an actor's mailbox) sees each peer's requests in
//! the order the peer sent them.
//!
//! # Disconnection
//!
//! When the socket closes, every call still waiting gets
//! [`Error::Disconnected`] and the handler's `closed` hook runs once.

use crate::error::Error;
use crate::framing::{self, FrameKind};
use crate::guard::{
    accept_failed, log_refusal, AcceptBackoff, Admitted, ConnectionLimits, GuardedListener,
    LogLimiter,
};
use crate::handshake::{client_handshake, cluster_token, server_handshake, StreamKind};
pub use crate::handshake::{connect_bulk, constant_time_eq, set_cluster_token};
use crate::messages::{Call, FrameBound, Request, Response};
use crate::tls;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

pub use crate::messages::MAX_FRAME_BYTES;

/// Frames up to this size are read into a buffer sized by their header at
/// once; a larger one's buffer grows with the bytes that arrive, so that
/// a header announcing a gigabyte costs nothing until the gigabyte comes
/// (and reading it yields to other connections as it goes). 1 MiB: every
/// message but those carrying large inline values.
const EAGER_FRAME_BYTES: usize = 1 << 20;

/// One unit on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub enum Frame {
    /// A request that wants an answer.
    Request {
        /// Correlates the answer.
        id: u64,
        /// The request.
        body: Request,
    },
    /// A request that wants no answer.
    Notify(Request),
    /// An answer.
    Response {
        /// The request answered.
        id: u64,
        /// The answer.
        body: Response,
    },
}

impl Frame {
    /// How large this frame may be.
    fn bound(&self) -> FrameBound {
        match self {
            Frame::Request { body, .. } | Frame::Notify(body) => body.frame_bound(),
            Frame::Response { body, .. } => body.frame_bound(),
        }
    }

    /// The message's name, for errors.
    fn describe(&self) -> String {
        match self {
            Frame::Request { body, .. } | Frame::Notify(body) => {
                let (service, name) = body.wire_name();
                format!("{service}/{name}")
            }
            Frame::Response { body, .. } => format!("response {}", body.wire_name()),
        }
    }
}

/// Serves requests arriving on a connection.
pub trait Handler: Send + Sync + 'static {
    /// Called in arrival order on the connection's reader task. `id` is
    /// `None` for notifications; otherwise answer with
    /// [`Connection::respond`], now or later (spawn anything that waits).
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request);

    /// Called once when the connection closes.
    fn closed(&self, _conn: &Connection) {}
}

/// What to do with the answer to a request.
enum Waiter {
    /// Hand it to a waiting future.
    Channel(oneshot::Sender<Response>),
    /// Run this on the reader task (or at close, with `Disconnected`).
    Callback(Box<dyn FnOnce(Result<Response, Error>) + Send>),
}

struct Inner {
    peer: String,
    /// The socket's write side, shared by direct writers and the writer task.
    write_half: Arc<WriteHalf>,
    /// Frames handed to the writer task and not yet fully written; direct
    /// writes happen only when this is zero, under its lock.
    queued: Arc<Mutex<usize>>,
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

/// A cheap, cloneable handle on one open connection.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.inner.peer)
            .finish()
    }
}

fn encode_frame(frame: &Frame) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; 4];
    rmp_serde::encode::write_named(&mut buf, frame).map_err(|e| Error::Protocol {
        message: format!("cannot encode frame: {e}"),
    })?;
    let bytes = buf.len() - 4;
    let bound = frame.bound();
    if bytes > bound.bytes() {
        return Err(Error::FrameTooLarge {
            kind: frame.describe(),
            bytes: bytes as u64,
            limit: bound.bytes() as u64,
        });
    }
    let len = bytes as u32;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    Ok(buf)
}

impl Connection {
    /// Connects to a listening socket and serves the peer's requests with
    /// `handler`.
    pub async fn connect(path: &Path, handler: Arc<dyn Handler>) -> Result<Connection, Error> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| Error::io(format!("connect to {}", path.display()), e))?;
        Ok(Connection::start(
            stream,
            path.display().to_string(),
            handler,
        ))
    }

    /// Connects to `address`: a socket path, or an [`Endpoint`] with a
    /// socket and a TCP address, reached by its socket when its node is
    /// `local_node` and over TCP (with the cluster token) otherwise.
    pub async fn connect_to(
        address: &str,
        local_node: Option<&str>,
        handler: Arc<dyn Handler>,
    ) -> Result<Connection, Error> {
        let endpoint = Endpoint::parse(address);
        let same_node = endpoint.node.is_none() || endpoint.node.as_deref() == local_node;
        match (&endpoint.unix, &endpoint.tcp) {
            (Some(path), None) => Connection::connect(path, handler).await,
            (Some(path), Some(_)) if same_node => Connection::connect(path, handler).await,
            (_, Some(tcp)) => Connection::connect_tcp(tcp, &cluster_token()?, handler).await,
            (None, None) => Err(Error::invalid(
                "address",
                format!("{address:?} names no socket"),
            )),
        }
    }

    /// Connects over TCP to `address` (`ip:port`), presenting `token`.
    pub async fn connect_tcp(
        address: &str,
        token: &str,
        handler: Arc<dyn Handler>,
    ) -> Result<Connection, Error> {
        let mut stream = tls::connect(address).await?;
        client_handshake(&mut stream, address, token, StreamKind::Messages).await?;
        Ok(Connection::start_stream(
            stream,
            format!("tcp://{address}"),
            handler,
            None,
        ))
    }

    /// Starts a connection on a TCP stream between nodes, in TLS or not.
    fn start_stream(
        stream: tls::Stream,
        peer: String,
        handler: Arc<dyn Handler>,
        admitted: Option<Admitted>,
    ) -> Connection {
        match stream {
            tls::Stream::Plain(tcp) => {
                let (read_half, write_half) = tcp.into_split();
                Connection::start_halves(
                    Box::new(read_half),
                    WriteHalf::Tcp(write_half),
                    peer,
                    handler,
                    admitted,
                )
            }
            encrypted => {
                let (read_half, write_half) = tokio::io::split(encrypted);
                Connection::start_halves(
                    Box::new(read_half),
                    WriteHalf::Tls(tokio::sync::Mutex::new(write_half)),
                    peer,
                    handler,
                    admitted,
                )
            }
        }
    }

    /// Wraps an accepted or connected stream and starts its reader and writer.
    pub fn start(stream: UnixStream, peer: String, handler: Arc<dyn Handler>) -> Connection {
        let (read_half, write_half) = stream.into_split();
        Connection::start_halves(
            Box::new(read_half),
            WriteHalf::Unix(write_half),
            peer,
            handler,
            None,
        )
    }

    fn start_halves(
        read_half: Box<dyn AsyncRead + Send + Unpin>,
        write_half: WriteHalf,
        peer: String,
        handler: Arc<dyn Handler>,
        admitted: Option<Admitted>,
    ) -> Connection {
        let write_half = Arc::new(write_half);
        let queued = Arc::new(Mutex::new(0usize));
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Connection {
            inner: Arc::new(Inner {
                peer,
                write_half: write_half.clone(),
                queued: queued.clone(),
                outgoing: tx,
                pending: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                closed: AtomicBool::new(false),
            }),
        };
        // The writer task holds no Connection: when the last one drops, the
        // channel closes, the task ends and the socket's write side closes.
        tokio::spawn(async move {
            // Frames that could not be written at once: write them in
            // order, several per system call, waiting for the socket to
            // drain when it is full.
            while let Some(first) = rx.recv().await {
                let mut batch = first;
                let mut frames = 1;
                while let Ok(more) = rx.try_recv() {
                    batch.extend_from_slice(&more);
                    frames += 1;
                }
                if write_half.write_all(&batch).await.is_err() {
                    return;
                }
                *queued.lock() -= frames;
            }
        });
        let reader_conn = conn.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::with_capacity(64 * 1024, read_half);
            let result = read_loop(&mut reader, &reader_conn, handler.as_ref()).await;
            if let Err(e) = result {
                tracing::debug!(peer = %reader_conn.inner.peer, error = %e, "connection ended");
            }
            reader_conn.mark_closed();
            handler.closed(&reader_conn);
            drop(admitted);
        });
        conn
    }

    /// Gives the connection up (its peer's node died): every call waiting
    /// on it fails with [`Error::Disconnected`] now, and later ones at once.
    pub fn abandon(&self) {
        if !self.is_closed() {
            self.mark_closed();
        }
    }

    fn mark_closed(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let pending: Vec<_> = self.inner.pending.lock().drain().collect();
        // Dropping the senders wakes every waiting call with Disconnected;
        // callbacks are told so.
        for (_, waiter) in pending {
            if let Waiter::Callback(f) = waiter {
                f(Err(self.disconnected()));
            }
        }
    }

    /// Who is on the other side.
    pub fn peer(&self) -> &str {
        &self.inner.peer
    }

    /// How many frames are still waiting to be written to the socket.
    pub fn unsent_frames(&self) -> usize {
        *self.inner.queued.lock()
    }

    /// Whether the socket has closed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Writes a frame from the calling thread when nothing is queued ahead
    /// of it (saving a wake-up of the writer task), else queues it.
    fn send_frame(&self, frame: &Frame) -> Result<(), Error> {
        let buf = encode_frame(frame)?;
        let mut queued = self.inner.queued.lock();
        let rest = if *queued == 0 {
            match self.inner.write_half.try_write(&buf) {
                Ok(n) if n == buf.len() => return Ok(()),
                Ok(n) => buf[n..].to_vec(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => buf,
                Err(_) => return Err(self.disconnected()),
            }
        } else {
            buf
        };
        *queued += 1;
        self.inner
            .outgoing
            .send(rest)
            .map_err(|_| self.disconnected())
    }

    fn disconnected(&self) -> Error {
        Error::Disconnected {
            peer: self.inner.peer.clone(),
        }
    }

    /// Sends a request and waits for its typed reply: the answer's error,
    /// or [`Error::UnexpectedReply`] if the peer answered with something
    /// else.
    pub async fn request<C: Call>(&self, request: C) -> Result<C::Reply, Error> {
        let rx = self.start_call(request.into())?;
        match rx.await {
            Ok(resp) => resp.into_reply::<C>(),
            Err(_) => Err(self.disconnected()),
        }
    }

    /// [`Connection::call_with`] with the typed reply of `C`.
    pub fn request_with<C: Call>(
        &self,
        request: C,
        on_answer: impl FnOnce(Result<C::Reply, Error>) + Send + 'static,
    ) {
        self.call_with(request.into(), move |answer| {
            on_answer(answer.and_then(Response::into_reply::<C>))
        });
    }

    /// Sends a request now and returns the receiver of its answer, so the
    /// caller can order sends synchronously and await later.
    pub fn start_call(&self, request: Request) -> Result<oneshot::Receiver<Response>, Error> {
        if self.is_closed() {
            return Err(self.disconnected());
        }
        let (tx, rx) = oneshot::channel();
        self.send_request(request, Waiter::Channel(tx))?;
        Ok(rx)
    }

    /// Sends a request; `on_answer` runs exactly once: on the connection's
    /// reader task when the answer arrives (with `Response::Error` turned
    /// into `Err`), with [`Error::Disconnected`] if the connection closes
    /// first, or right here with the error if the request cannot be sent.
    /// No task is spawned per call.
    pub fn call_with(
        &self,
        request: Request,
        on_answer: impl FnOnce(Result<Response, Error>) + Send + 'static,
    ) {
        if self.is_closed() {
            on_answer(Err(self.disconnected()));
            return;
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner
            .pending
            .lock()
            .insert(id, Waiter::Callback(Box::new(on_answer)));
        let failed = match self.send_frame(&Frame::Request { id, body: request }) {
            Err(e) => Some(e),
            Ok(()) if self.is_closed() => Some(self.disconnected()),
            Ok(()) => None,
        };
        if let Some(e) = failed {
            // Run it here unless mark_closed already did.
            if let Some(Waiter::Callback(f)) = self.inner.pending.lock().remove(&id) {
                f(Err(e));
            }
        }
    }

    fn send_request(&self, request: Request, waiter: Waiter) -> Result<(), Error> {
        if self.is_closed() {
            return Err(self.disconnected());
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.pending.lock().insert(id, waiter);
        if let Err(e) = self.send_frame(&Frame::Request { id, body: request }) {
            self.inner.pending.lock().remove(&id);
            return Err(e);
        }
        if self.is_closed() && self.inner.pending.lock().remove(&id).is_some() {
            // Closed between the check and the insert, and mark_closed did
            // not see this waiter: fail here.
            return Err(self.disconnected());
        }
        Ok(())
    }

    /// Sends a request that wants no answer.
    pub fn notify(&self, request: impl Into<Request>) -> Result<(), Error> {
        self.send_frame(&Frame::Notify(request.into()))
    }

    /// Answers request `id` (does nothing for notifications, `None`).
    pub fn respond(&self, id: Option<u64>, body: Response) {
        if let Some(id) = id {
            let sent = match self.send_frame(&Frame::Response { id, body }) {
                // The caller hears why instead of waiting for an answer
                // that cannot come.
                Err(e @ Error::FrameTooLarge { .. }) => self.send_frame(&Frame::Response {
                    id,
                    body: Response::Error(e),
                }),
                sent => sent,
            };
            if let Err(e) = sent {
                tracing::debug!(peer = %self.inner.peer, error = %e, "could not send a response");
            }
        }
    }
}

async fn read_loop(
    reader: &mut BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    conn: &Connection,
    handler: &dyn Handler,
) -> Result<(), Error> {
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        reader
            .read_exact(&mut len)
            .await
            .map_err(|e| Error::io("read frame length", e))?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(Error::Protocol {
                message: format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES} byte limit"),
            });
        }
        // The first bytes tell the frame's kind, and so how large it may be.
        let head = len.min(framing::PEEK_BYTES);
        buf.resize(head, 0);
        reader
            .read_exact(&mut buf)
            .await
            .map_err(|e| Error::io("read frame", e))?;
        if len > FrameBound::Control.bytes() {
            match framing::peek(&buf) {
                Some(kind) if len > kind.bound().bytes() => {
                    refuse_oversized(conn, kind, len);
                    skip(reader, len - head).await?;
                    continue;
                }
                Some(_) => {}
                None => {
                    return Err(Error::Protocol {
                        message: format!(
                            "a frame of {len} bytes whose first bytes are no message; \
                             frames over {} bytes must be of a kind that may be that large",
                            FrameBound::Control.bytes()
                        ),
                    })
                }
            }
        }
        read_body(reader, &mut buf, len).await?;
        let frame: Frame = rmp_serde::from_slice(&buf).map_err(|e| Error::Protocol {
            message: format!("cannot decode frame: {e}"),
        })?;
        if buf.capacity() > EAGER_FRAME_BYTES {
            // A large frame's buffer is not kept for the small ones after it.
            buf = Vec::new();
        }
        match frame {
            Frame::Request { id, body } => handler.handle(conn, Some(id), body),
            Frame::Notify(body) => handler.handle(conn, None, body),
            Frame::Response { id, body } => {
                let waiter = conn.inner.pending.lock().remove(&id);
                match waiter {
                    Some(Waiter::Channel(tx)) => {
                        let _ = tx.send(body);
                    }
                    Some(Waiter::Callback(f)) => f(body.into_result()),
                    None => {}
                }
            }
        }
    }
}

/// Reads the rest of a frame body of `len` bytes into `buf`, which holds
/// its first bytes: at once up to [`EAGER_FRAME_BYTES`], growing with the
/// bytes that arrive beyond.
async fn read_body(
    reader: &mut BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    buf: &mut Vec<u8>,
    len: usize,
) -> Result<(), Error> {
    let head = buf.len();
    if len <= EAGER_FRAME_BYTES {
        buf.resize(len, 0);
        reader
            .read_exact(&mut buf[head..])
            .await
            .map_err(|e| Error::io("read frame", e))?;
        return Ok(());
    }
    let got = (&mut *reader)
        .take((len - head) as u64)
        .read_to_end(buf)
        .await
        .map_err(|e| Error::io("read frame", e))?;
    if head + got < len {
        return Err(Error::io(
            "read frame",
            format!(
                "the peer closed the connection {} bytes into a frame of {len}",
                head + got
            ),
        ));
    }
    Ok(())
}

/// Reads and drops `bytes` bytes: the rest of a frame refused unread.
async fn skip(
    reader: &mut BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    bytes: usize,
) -> Result<(), Error> {
    let skipped = tokio::io::copy(
        &mut (&mut *reader).take(bytes as u64),
        &mut tokio::io::sink(),
    )
    .await
    .map_err(|e| Error::io("skip an oversized frame", e))?;
    if skipped < bytes as u64 {
        return Err(Error::io(
            "skip an oversized frame",
            format!("the peer closed the connection {skipped} bytes into the {bytes} skipped"),
        ));
    }
    Ok(())
}

/// Refuses a frame larger than its kind may be, whose rest is then
/// skipped unread: a request is answered with [`Error::FrameTooLarge`], the call an answer
/// was for fails with it, and a notification is logged (a line per
/// interval at most).
fn refuse_oversized(conn: &Connection, kind: FrameKind, len: usize) {
    let error = Error::FrameTooLarge {
        kind: kind.describe(),
        bytes: len as u64,
        limit: kind.bound().bytes() as u64,
    };
    match kind {
        FrameKind::Request { id, .. } => conn.respond(Some(id), Response::Error(error)),
        FrameKind::Response { id, .. } => {
            let waiter = conn.inner.pending.lock().remove(&id);
            match waiter {
                Some(Waiter::Channel(tx)) => {
                    let _ = tx.send(Response::Error(error));
                }
                Some(Waiter::Callback(f)) => f(Err(error)),
                None => {}
            }
        }
        FrameKind::Notify { .. } => {
            if let Some(held_back) = OVERSIZED_NOTICES.allow() {
                tracing::warn!(
                    peer = %conn.inner.peer,
                    %error,
                    refusals_not_logged = held_back,
                    "skipped an oversized notification"
                );
            }
        }
    }
}

/// Oversized notifications are logged a line per 10 s at most.
static OVERSIZED_NOTICES: LogLimiter = LogLimiter::new(std::time::Duration::from_secs(10));

/// Accepts connections on `path` until the returned task is aborted,
/// serving each with a handler made for it by `make_handler` (so per-peer
/// state, such as a reader's pins, lives in the handler).
pub fn serve(
    path: &Path,
    make_handler: impl Fn() -> Arc<dyn Handler> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .map_err(|e| Error::io(format!("listen on {}", path.display()), e))?;
    let name = listener_name(path);
    Ok(tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    Connection::start(stream, "peer".to_string(), make_handler());
                }
                Err(e) => accept_failed(&e, &mut backoff, &name).await,
            }
        }
    }))
}

/// Serves a bulk stream (see [`crate::transfer`]) accepted by a TCP
/// listener, after its token was checked.
pub type BulkHandler = Arc<dyn Fn(tls::Stream) + Send + Sync>;

/// Accepts TCP connections on `address` until the returned task is
/// aborted; a connection that does not present `token` is refused (and
/// logged) before any request is read. Message connections are served by
/// a handler from `make_handler`; bulk streams by `bulk` (refused when it
/// is `None`). Returns the address bound (port 0 picks a free one).
pub async fn serve_tcp(
    address: std::net::SocketAddr,
    token: String,
    make_handler: impl Fn() -> Arc<dyn Handler> + Send + Sync + 'static,
    bulk: Option<BulkHandler>,
) -> Result<(tokio::task::JoinHandle<()>, std::net::SocketAddr), Error> {
    let listener = std::net::TcpListener::bind(address)
        .map_err(|e| Error::io(format!("listen on {address}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io("read the listening address", e))?;
    Ok((serve_on(listener, token, make_handler, bulk)?, bound))
}

/// [`serve_tcp`] on a listener bound before (so its address could be
/// given out first), for message connections only. Must be called inside
/// a tokio runtime.
pub fn serve_tcp_listener(
    listener: std::net::TcpListener,
    token: String,
    make_handler: impl Fn() -> Arc<dyn Handler> + Send + Sync + 'static,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    serve_on(listener, token, make_handler, None)
}

fn serve_on(
    listener: std::net::TcpListener,
    token: String,
    make_handler: impl Fn() -> Arc<dyn Handler> + Send + Sync + 'static,
    bulk: Option<BulkHandler>,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("set up the TCP listener", e))?;
    let listener =
        TcpListener::from_std(listener).map_err(|e| Error::io("set up the TCP listener", e))?;
    let mut listener = GuardedListener::new(
        listener,
        ConnectionLimits::from_env_or_default(),
        "the cluster port",
    );
    let handshake_timeout = listener.limits().handshake_timeout();
    let token = Arc::new(token);
    let make_handler = Arc::new(make_handler);
    Ok(tokio::spawn(async move {
        loop {
            let (tcp, peer, admitted) = listener.accept_counted().await;
            let (token, make_handler) = (token.clone(), make_handler.clone());
            let bulk = bulk.clone();
            tokio::spawn(async move {
                let greeted = async {
                    let mut stream = tls::accept(tcp).await.map_err(|e| e.to_string())?;
                    let kind = server_handshake(&mut stream, &token, bulk.is_some()).await?;
                    Ok::<_, String>((stream, kind))
                };
                let refused = |why: &str| log_refusal("the cluster port", &peer, why);
                let (stream, kind) = match tokio::time::timeout(handshake_timeout, greeted).await {
                    Ok(Ok(greeted)) => greeted,
                    Ok(Err(e)) => return refused(&e),
                    Err(_) => return refused(&format!("no greeting within {handshake_timeout:?}")),
                };
                match (kind, bulk) {
                    (StreamKind::Messages, _) => {
                        // Counted until the connection closes.
                        Connection::start_stream(
                            stream,
                            format!("tcp://{peer}"),
                            make_handler(),
                            Some(admitted),
                        );
                    }
                    (StreamKind::Bulk, Some(serve)) => serve(stream),
                    (StreamKind::Bulk, None) => {}
                }
            });
        }
    }))
}

fn listener_name(path: &Path) -> String {
    path.display().to_string()
}

/// Whether a connection is to a process on another node (over TCP).
pub fn is_remote(conn: &Connection) -> bool {
    conn.peer().starts_with("tcp://")
}

/// The write side of a socket: plain ones are written from the calling
/// thread when they have room; a TLS stream only by the writer task.
enum WriteHalf {
    Unix(tokio::net::unix::OwnedWriteHalf),
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Tls(tokio::sync::Mutex<tokio::io::WriteHalf<tls::Stream>>),
}

impl WriteHalf {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            WriteHalf::Unix(w) => w.try_write(buf),
            WriteHalf::Tcp(w) => w.try_write(buf),
            WriteHalf::Tls(_) => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }

    async fn writable(&self) -> std::io::Result<()> {
        match self {
            WriteHalf::Unix(w) => w.writable().await,
            WriteHalf::Tcp(w) => w.writable().await,
            WriteHalf::Tls(_) => Ok(()),
        }
    }

    async fn write_all(&self, buf: &[u8]) -> std::io::Result<()> {
        if let WriteHalf::Tls(w) = self {
            let mut w = w.lock().await;
            w.write_all(buf).await?;
            return w.flush().await;
        }
        let mut written = 0;
        while written < buf.len() {
            match self.try_write(&buf[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Where a process listens: its socket, and in a multi-node cluster its
/// TCP address and node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// The Unix socket, for peers on the same node.
    pub unix: Option<PathBuf>,
    /// `ip:port`, for peers on other nodes.
    pub tcp: Option<String>,
    /// The node it runs on.
    pub node: Option<String>,
}

impl Endpoint {
    /// Reads `<path>`, `tcp://<ip:port>` or `<path>|tcp://<ip:port>|<node>`.
    pub fn parse(address: &str) -> Endpoint {
        let mut endpoint = Endpoint::default();
        for (i, part) in address.split('|').enumerate() {
            if let Some(tcp) = part.strip_prefix("tcp://") {
                endpoint.tcp = Some(tcp.to_string());
            } else if i == 0 && !part.is_empty() {
                endpoint.unix = Some(PathBuf::from(part));
            } else if i == 2 && !part.is_empty() {
                endpoint.node = Some(part.to_string());
            }
        }
        endpoint
    }

    /// The address string of a socket, a TCP address and a node.
    pub fn format(unix: &Path, tcp: std::net::SocketAddr, node: &str) -> String {
        format!("{}|tcp://{tcp}|{node}", unix.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ObjectId;
    use crate::messages::{
        GetObject, GetObjectStatus, ObjectLocation, ObjectValue, OwnerRequest, RayletRequest,
        ReturnObject, SealObject,
    };

    struct Echo;
    impl Handler for Echo {
        fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
            let body = match request {
                Request::Raylet(RayletRequest::GetObject(_)) => {
                    Response::ObjectLocation(ObjectLocation { offset: 1, size: 2 })
                }
                // A reply far larger than a socket buffer: written in parts.
                Request::Owner(OwnerRequest::GetObjectStatus(_)) => {
                    Response::Object(ReturnObject {
                        value: ObjectValue::Inline(bytes::Bytes::from(vec![7u8; 8 << 20])),
                        contained: Vec::new(),
                        more: Vec::new(),
                    })
                }
                _ => Response::Ok,
            };
            conn.respond(id, body);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_are_answered_over_a_real_socket_and_fail_after_close() {
        let dir = std::env::temp_dir().join(format!("prism-rpc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let server = serve(&path, || Arc::new(Echo)).unwrap();
        let conn = Connection::connect(&path, Arc::new(Echo)).await.unwrap();
        for _ in 0..100 {
            let at = conn
                .request(GetObject {
                    id: ObjectId::new(),
                })
                .await
                .unwrap();
            assert_eq!(at, ObjectLocation { offset: 1, size: 2 });
        }
        // A reply of the wrong type is an error naming the request.
        let err = conn
            .request(SealObject {
                id: ObjectId::new(),
            })
            .await;
        assert!(err.is_ok(), "SealObject is answered with Ok");
        let wrong = Response::Ok.into_reply::<GetObject>().unwrap_err();
        assert!(wrong.to_string().contains("GetObject"), "{wrong}");
        // Several large answers in flight at once arrive whole and in one piece each.
        let calls: Vec<_> = (0..4)
            .map(|_| {
                conn.start_call(
                    GetObjectStatus {
                        id: ObjectId::new(),
                        lost_at: None,
                    }
                    .into(),
                )
                .unwrap()
            })
            .collect();
        for rx in calls {
            match rx
                .await
                .unwrap()
                .into_reply::<GetObjectStatus>()
                .unwrap()
                .value
            {
                ObjectValue::Inline(b) => {
                    assert_eq!(b.len(), 8 << 20);
                    assert!(b.iter().all(|x| *x == 7));
                }
                other => panic!("unexpected value {other:?}"),
            }
        }
        server.abort();
        drop(server);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tcp_connections_need_the_token_and_carry_large_answers() {
        let (server, bound) = serve_tcp(
            "127.0.0.1:0".parse().unwrap(),
            "secret".into(),
            || Arc::new(Echo),
            None,
        )
        .await
        .unwrap();
        let address = bound.to_string();
        let conn = Connection::connect_tcp(&address, "secret", Arc::new(Echo))
            .await
            .unwrap();
        let at = conn
            .request(GetObject {
                id: ObjectId::new(),
            })
            .await
            .unwrap();
        assert_eq!(at, ObjectLocation { offset: 1, size: 2 });
        let big = conn
            .request(GetObjectStatus {
                id: ObjectId::new(),
                lost_at: None,
            })
            .await
            .unwrap();
        match big.value {
            ObjectValue::Inline(b) => assert_eq!(b.len(), 8 << 20),
            other => panic!("{other:?}"),
        }
        let err = Connection::connect_tcp(&address, "guess", Arc::new(Echo))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused this connection"), "{err}");
        assert!(err.to_string().contains("PRISM_AUTH_TOKEN"), "{err}");
        server.abort();
    }

    #[test]
    fn endpoints_read_back_what_format_wrote() {
        let e = Endpoint::parse(&Endpoint::format(
            Path::new("/s/core.sock"),
            "10.0.0.2:4000".parse().unwrap(),
            "node-1",
        ));
        assert_eq!(e.unix.as_deref(), Some(Path::new("/s/core.sock")));
        assert_eq!(e.tcp.as_deref(), Some("10.0.0.2:4000"));
        assert_eq!(e.node.as_deref(), Some("node-1"));
        let plain = Endpoint::parse("/s/raylet.sock");
        assert_eq!(plain.unix.as_deref(), Some(Path::new("/s/raylet.sock")));
        assert!(plain.tcp.is_none() && plain.node.is_none());
        assert_eq!(
            Endpoint::parse("tcp://1.2.3.4:5").tcp.as_deref(),
            Some("1.2.3.4:5")
        );
    }
}
