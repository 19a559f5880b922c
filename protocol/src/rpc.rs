//! A multiplexed request/response connection over a Unix-domain socket.
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
use crate::messages::{Call, Request, Response};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// The largest frame accepted, to stop a corrupt length from allocating
/// without bound.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

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
    write_half: Arc<tokio::net::unix::OwnedWriteHalf>,
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
    let len = (buf.len() - 4) as u32;
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

    /// Wraps an accepted or connected stream and starts its reader and writer.
    pub fn start(stream: UnixStream, peer: String, handler: Arc<dyn Handler>) -> Connection {
        let (read_half, write_half) = stream.into_split();
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
                let mut written = 0;
                while written < batch.len() {
                    match write_half.try_write(&batch[written..]) {
                        Ok(n) => written += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if write_half.writable().await.is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
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
        });
        conn
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
            if let Err(e) = self.send_frame(&Frame::Response { id, body }) {
                tracing::debug!(peer = %self.inner.peer, error = %e, "could not send a response");
            }
        }
    }
}

async fn read_loop(
    reader: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
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
        buf.resize(len, 0);
        reader
            .read_exact(&mut buf)
            .await
            .map_err(|e| Error::io("read frame", e))?;
        let frame: Frame = rmp_serde::from_slice(&buf).map_err(|e| Error::Protocol {
            message: format!("cannot decode frame: {e}"),
        })?;
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
    Ok(tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    Connection::start(stream, "peer".to_string(), make_handler());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }))
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
}
