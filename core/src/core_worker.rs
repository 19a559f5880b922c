//! The per-process runtime: every driver and worker has one `CoreWorker`.
//!
//! It holds the process's connection to its raylet, its mapping of the
//! node's object store, its reference table (ownership), the task
//! submitter and actor clients, and it listens on its own Unix socket for
//! the requests other processes send it: tasks to run (workers), actor
//! calls (actors), and object status and borrower updates (owners).

use crate::codec;
use crate::config::Config;
use crate::refs::{Readiness, RefTable, Release, ValueState};
use crate::submitter::Submitter;
use crate::{Error, Result};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use prism_object_store::Segment;
use prism_protocol::ids::{ActorId, JobId, NodeId, ObjectId, WorkerId};
use prism_protocol::messages::{
    AddBorrower, Address, CreateObject, DeleteObjects, DriverRequest, GetObject, GetObjectStatus,
    ObjectLocation, ObjectRefInfo, ObjectValue, OwnerRequest, ReleaseObject, RemoveBorrower,
    Request, Response, ReturnObject, SealObject, Stream, WorkerBlocked,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{self, Connection, Handler};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

static CURRENT: RwLock<Option<Arc<CoreWorker>>> = RwLock::new(None);

/// The running core worker, if any.
pub(crate) fn current() -> Result<Arc<CoreWorker>> {
    CURRENT.read().clone().ok_or(Error::NotInitialized)
}

pub(crate) fn current_weak() -> Weak<CoreWorker> {
    CURRENT
        .read()
        .as_ref()
        .map(Arc::downgrade)
        .unwrap_or_default()
}

pub(crate) fn set_current(core: Option<Arc<CoreWorker>>) -> Option<Arc<CoreWorker>> {
    std::mem::replace(&mut *CURRENT.write(), core)
}

/// Whether this process is a driver or a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Driver,
    Worker,
}

/// The runtime state of one process.
pub(crate) struct CoreWorker {
    pub(crate) role: Role,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) config: Arc<Config>,
    pub(crate) worker_id: WorkerId,
    pub(crate) node_id: NodeId,
    pub(crate) job_id: JobId,
    pub(crate) session_dir: PathBuf,
    pub(crate) raylet: Connection,
    pub(crate) segment: Segment,
    pub(crate) refs: RefTable,
    pub(crate) submitter: Submitter,
    pub(crate) cluster_total: Mutex<ResourceSet>,
    pub(crate) actor_clients: Mutex<HashMap<ActorId, Arc<crate::actor::ActorClient>>>,
    pub(crate) executor: crate::executor::ExecutorState,
    peers: Mutex<HashMap<Address, Connection>>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Gets and waits in progress (workers tell the raylet when this leaves
    /// or returns to zero).
    waiting: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for CoreWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreWorker")
            .field("role", &self.role)
            .field("worker_id", &self.worker_id)
            .finish()
    }
}

/// Serves requests for a core worker that may not be built yet.
#[derive(Clone, Default)]
pub(crate) struct CoreHandler {
    cell: Arc<OnceLock<Weak<CoreWorker>>>,
    /// Borrows registered over this connection by the borrower itself:
    /// when the connection closes, that process is gone, and so are they.
    borrows_here: Arc<Mutex<HashMap<Address, Vec<ObjectId>>>>,
}

impl CoreHandler {
    pub(crate) fn bind(&self, core: &Arc<CoreWorker>) {
        let _ = self.cell.set(Arc::downgrade(core));
    }

    /// The handler for one more accepted connection.
    fn for_connection(&self) -> CoreHandler {
        CoreHandler {
            cell: self.cell.clone(),
            borrows_here: Default::default(),
        }
    }
}

impl Handler for CoreHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        if let Request::Driver(DriverRequest::WorkerOutput(out)) = &request {
            print_worker_output(&out.label, out.stream, &out.lines);
            return;
        }
        let Some(core) = self.cell.get().and_then(Weak::upgrade) else {
            conn.respond(
                id,
                Response::Error(Error::NotServed {
                    service: "this process (not ready, or shutting down)".into(),
                    request: format!("{request:?}"),
                }),
            );
            return;
        };
        if let Request::Owner(OwnerRequest::AddBorrower(AddBorrower {
            ids,
            borrower,
            from_borrower: true,
        })) = &request
        {
            self.borrows_here
                .lock()
                .entry(borrower.clone())
                .or_default()
                .extend(ids.iter().copied());
        }
        core.handle_request(conn, id, request);
    }

    fn closed(&self, conn: &Connection) {
        if let Some(core) = self.cell.get().and_then(Weak::upgrade) {
            let ended: Vec<(Address, Vec<ObjectId>)> = self.borrows_here.lock().drain().collect();
            for (borrower, ids) in ended {
                let releases = core.refs.remove_borrower(&ids, &borrower);
                core.apply_releases(releases);
            }
            if core.role == Role::Worker && conn.peer() == core.raylet.peer() {
                // Our raylet is gone: a worker has nothing left to do.
                crate::worker::raylet_gone();
            }
        }
    }
}

fn print_worker_output(label: &str, stream: Stream, lines: &[String]) {
    use std::io::Write;
    match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            for line in lines {
                let _ = writeln!(out, "({label}) {line}");
            }
        }
        Stream::Stderr => {
            let mut out = std::io::stderr().lock();
            for line in lines {
                let _ = writeln!(out, "({label}) {line}");
            }
        }
    }
}

/// What connecting produced, before the core worker exists.
pub(crate) struct Startup {
    pub(crate) role: Role,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) config: Arc<Config>,
    pub(crate) worker_id: WorkerId,
    pub(crate) node_id: NodeId,
    pub(crate) job_id: JobId,
    pub(crate) session_dir: PathBuf,
    pub(crate) store_path: PathBuf,
    pub(crate) raylet: Connection,
    pub(crate) handler: CoreHandler,
}

impl CoreWorker {
    /// Builds the core worker and starts listening on its socket.
    pub(crate) fn build(s: Startup) -> Result<Arc<CoreWorker>> {
        let address = socket_path(&s.session_dir, s.worker_id);
        let segment = Segment::open(&s.store_path)?;
        let core = Arc::new(CoreWorker {
            role: s.role,
            rt: s.rt,
            worker_id: s.worker_id,
            node_id: s.node_id,
            job_id: s.job_id,
            session_dir: s.session_dir,
            raylet: s.raylet,
            segment,
            refs: RefTable::new(address.display().to_string()),
            submitter: Submitter::default(),
            cluster_total: Mutex::new(ResourceSet::new()),
            actor_clients: Mutex::new(HashMap::new()),
            executor: Default::default(),
            peers: Mutex::new(HashMap::new()),
            listener: Mutex::new(None),
            waiting: Default::default(),
            config: s.config,
        });
        s.handler.bind(&core);
        let handler = s.handler.clone();
        let listener = {
            let _guard = core.rt.enter();
            rpc::serve(&address, move || {
                Arc::new(handler.for_connection()) as Arc<dyn Handler>
            })?
        };
        *core.listener.lock() = Some(listener);
        Ok(core)
    }

    /// This process's address (its socket path).
    pub(crate) fn address(&self) -> &Address {
        self.refs.me()
    }

    /// Stops listening (shutdown).
    pub(crate) fn stop_listening(&self) {
        if let Some(l) = self.listener.lock().take() {
            l.abort();
        }
        let _ = std::fs::remove_file(self.address());
    }

    /// Runs `fut` to completion from synchronous code.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        block_on(&self.rt, fut)
    }

    /// A connection to another core worker, made once and reused.
    pub(crate) async fn peer(&self, address: &str) -> Result<Connection> {
        if let Some(c) = self.peers.lock().get(address) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn =
            Connection::connect(Path::new(address), Arc::new(CoreHandler::default())).await?;
        self.peers.lock().insert(address.to_string(), conn.clone());
        Ok(conn)
    }

    /// Carries out what a reference count reaching zero requires.
    pub(crate) fn apply_releases(self: &Arc<Self>, releases: Vec<Release>) {
        if releases.is_empty() {
            return;
        }
        let mut deletes = Vec::new();
        let mut ends: HashMap<Address, Vec<ObjectId>> = HashMap::new();
        for r in releases {
            match r {
                Release::DeleteFromStore(id) => deletes.push(id),
                Release::EndBorrow { owner, id } => ends.entry(owner).or_default().push(id),
            }
        }
        if !deletes.is_empty() {
            let _ = self.raylet.notify(DeleteObjects { ids: deletes });
        }
        for (owner, ids) in ends {
            let borrower = self.address().clone();
            let core = self.clone();
            let send = async move {
                if let Ok(conn) = core.peer(&owner).await {
                    let _ = conn.notify(RemoveBorrower { ids, borrower });
                }
            };
            self.rt.spawn(send);
        }
    }

    pub(crate) fn drop_local_ref(self: &Arc<Self>, id: ObjectId) {
        let releases = self.refs.remove_local(id);
        self.apply_releases(releases);
    }

    /// Tells owners about references this process deserialized.
    pub(crate) async fn register_borrows(self: &Arc<Self>) -> Result<()> {
        let pending = self.refs.take_unregistered();
        if pending.is_empty() {
            return Ok(());
        }
        let mut by_owner: HashMap<Address, Vec<ObjectRefInfo>> = HashMap::new();
        for info in pending {
            by_owner.entry(info.owner.clone()).or_default().push(info);
        }
        for (owner, infos) in by_owner {
            let ids = infos.iter().map(|i| i.id).collect();
            let conn = self.peer(&owner).await?;
            conn.request(AddBorrower {
                ids,
                borrower: self.address().clone(),
                from_borrower: true,
            })
            .await?;
            let late = self.refs.registered(&infos);
            self.apply_releases(late);
        }
        Ok(())
    }

    /// Registers `borrower` for `refs` with their owners (before handing a
    /// value that contains them to `borrower`).
    pub(crate) async fn lend(
        self: &Arc<Self>,
        refs: &[ObjectRefInfo],
        borrower: &Address,
    ) -> Result<()> {
        let mut by_owner: HashMap<&Address, Vec<ObjectId>> = HashMap::new();
        for r in refs {
            if &r.owner != borrower {
                by_owner.entry(&r.owner).or_default().push(r.id);
            }
        }
        for (owner, ids) in by_owner {
            if self.refs.is_mine(owner) {
                self.refs.add_borrower(&ids, borrower);
            } else {
                self.peer(owner)
                    .await?
                    .request(AddBorrower {
                        ids,
                        borrower: borrower.clone(),
                        from_borrower: false,
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// Waits for an object's value, wherever it is.
    pub(crate) async fn fetch(self: &Arc<Self>, info: &ObjectRefInfo) -> Result<Loaded> {
        let value = if self.refs.is_mine(&info.owner) {
            self.wait_owned(info.id).await?.0
        } else {
            let conn = self.peer(&info.owner).await.map_err(|_| Error::OwnerDied {
                object_id: info.id,
                owner: info.owner.clone(),
            })?;
            match conn.request(GetObjectStatus { id: info.id }).await {
                Ok(ret) => ret.value,
                Err(Error::Disconnected { .. }) => {
                    return Err(Error::OwnerDied {
                        object_id: info.id,
                        owner: info.owner.clone(),
                    })
                }
                Err(e) => return Err(e),
            }
        };
        self.load(info.id, value).await
    }

    /// Waits until an owned object is ready.
    pub(crate) async fn wait_owned(
        &self,
        id: ObjectId,
    ) -> Result<(ObjectValue, Vec<ObjectRefInfo>)> {
        loop {
            match self.refs.readiness(id) {
                Readiness::Ready(v, contains) => return Ok((v, contains)),
                Readiness::Failed(e) => return Err(e),
                Readiness::Wait(rx) => {
                    let _ = rx.await;
                }
            }
        }
    }

    /// Turns an object value into bytes to decode (pinning store objects).
    pub(crate) async fn load(self: &Arc<Self>, id: ObjectId, value: ObjectValue) -> Result<Loaded> {
        match value {
            ObjectValue::Inline(bytes) => Ok(Loaded::Inline(bytes)),
            ObjectValue::InStore { .. } => {
                let ObjectLocation { offset, size } = self.raylet.request(GetObject { id }).await?;
                let ptr = self.segment.ptr(offset, size)?;
                self.segment.prefault(offset, size);
                Ok(Loaded::Stored {
                    ptr,
                    len: size as usize,
                    pin: PinGuard {
                        core: Arc::downgrade(self),
                        id,
                    },
                })
            }
        }
    }

    /// Stores an encoded value as a new owned object (inline or in the store).
    pub(crate) async fn store_value(
        self: &Arc<Self>,
        id: ObjectId,
        encoded: codec::Encoded,
    ) -> Result<ObjectValue> {
        if encoded.bytes.len() as u64 <= self.config.max_direct_call_object_size_bytes {
            return Ok(ObjectValue::Inline(Bytes::from(encoded.bytes)));
        }
        self.write_to_store(id, &[&encoded.bytes]).await
    }

    async fn create_in_store(raylet: Connection, id: ObjectId, size: u64) -> Result<u64> {
        Ok(raylet.request(CreateObject { id, size }).await?.offset)
    }

    fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<()> {
        let mut at = offset;
        for p in parts {
            self.segment.write(at, p)?;
            at += p.len() as u64;
        }
        Ok(())
    }

    /// Writes `parts` back to back as object `id` in the store, and seals it.
    pub(crate) async fn write_to_store(
        &self,
        id: ObjectId,
        parts: &[&[u8]],
    ) -> Result<ObjectValue> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let offset = Self::create_in_store(self.raylet.clone(), id, size).await?;
        self.write_parts(offset, parts)?;
        self.raylet.request(SealObject { id }).await?;
        Ok(ObjectValue::InStore { size })
    }

    /// [`CoreWorker::write_to_store`] from synchronous code: the copy runs
    /// on the calling thread, only the two store requests go through the
    /// runtime.
    pub(crate) fn write_to_store_blocking(
        &self,
        id: ObjectId,
        parts: &[&[u8]],
    ) -> Result<ObjectValue> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let offset = self.block_on(Self::create_in_store(self.raylet.clone(), id, size))?;
        self.write_parts(offset, parts)?;
        let raylet = self.raylet.clone();
        self.block_on(async move { raylet.request(SealObject { id }).await })?;
        Ok(ObjectValue::InStore { size })
    }

    /// Decides how a value is stored: inline, or as store parts (a raw
    /// buffer is not copied here; it is written straight into the store).
    fn plan_put<'a, T: serde::Serialize + 'static>(&self, value: &'a T) -> Result<PutPlan<'a>> {
        let threshold = self.config.max_direct_call_object_size_bytes as usize;
        Ok(match codec::raw_parts(value) {
            Some((tag, payload)) if payload.len() + codec::RAW_HEADER_BYTES > threshold => {
                PutPlan::Raw(codec::raw_header(tag, payload.len()), payload)
            }
            _ => {
                let encoded = codec::encode(value)?;
                if encoded.bytes.len() <= threshold {
                    PutPlan::Inline(Bytes::from(encoded.bytes), encoded.contained)
                } else {
                    PutPlan::Encoded(encoded.bytes, encoded.contained)
                }
            }
        })
    }

    fn record_put(
        &self,
        id: ObjectId,
        stored: ObjectValue,
        contains: Vec<ObjectRefInfo>,
    ) -> ObjectRefInfo {
        self.refs.add_owned(id, ValueState::Ready(stored), contains);
        ObjectRefInfo {
            id,
            owner: self.address().clone(),
        }
    }

    /// Creates an owned object from a value and returns its reference.
    pub(crate) fn put_object<T: serde::Serialize + 'static>(
        self: &Arc<Self>,
        value: &T,
    ) -> Result<ObjectRefInfo> {
        let id = ObjectId::new();
        let (stored, contains) = match self.plan_put(value)? {
            PutPlan::Inline(bytes, contains) => (ObjectValue::Inline(bytes), contains),
            PutPlan::Raw(header, payload) => (
                self.write_to_store_blocking(id, &[&header, payload])?,
                Vec::new(),
            ),
            PutPlan::Encoded(bytes, contains) => {
                (self.write_to_store_blocking(id, &[&bytes])?, contains)
            }
        };
        Ok(self.record_put(id, stored, contains))
    }

    /// The async form of [`CoreWorker::put_object`].
    pub(crate) async fn put_object_async<T: serde::Serialize + 'static>(
        self: &Arc<Self>,
        value: &T,
    ) -> Result<ObjectRefInfo> {
        let id = ObjectId::new();
        let (stored, contains) = match self.plan_put(value)? {
            PutPlan::Inline(bytes, contains) => (ObjectValue::Inline(bytes), contains),
            PutPlan::Raw(header, payload) => (
                self.write_to_store(id, &[&header, payload]).await?,
                Vec::new(),
            ),
            PutPlan::Encoded(bytes, contains) => {
                (self.write_to_store(id, &[&bytes]).await?, contains)
            }
        };
        Ok(self.record_put(id, stored, contains))
    }

    /// Dispatches a request from another process.
    fn handle_request(self: &Arc<Self>, conn: &Connection, id: Option<u64>, request: Request) {
        let request = match request {
            Request::Owner(request) => request,
            Request::Executor(request) => return crate::executor::handle(self, conn, id, request),
            other => {
                let error = Error::NotServed {
                    service: "a core worker".into(),
                    request: format!("{other:?}"),
                };
                return conn.respond(id, Response::Error(error));
            }
        };
        match request {
            OwnerRequest::GetObjectStatus(GetObjectStatus { id: object_id }) => {
                let core = self.clone();
                let conn = conn.clone();
                self.rt.spawn(async move {
                    let response = match core.wait_owned(object_id).await {
                        Ok((value, contained)) => {
                            Response::Object(ReturnObject { value, contained })
                        }
                        Err(e) => Response::Error(e),
                    };
                    conn.respond(id, response);
                });
            }
            OwnerRequest::AddBorrower(AddBorrower { ids, borrower, .. }) => {
                self.refs.add_borrower(&ids, &borrower);
                conn.respond(id, Response::Ok);
            }
            OwnerRequest::RemoveBorrower(RemoveBorrower { ids, borrower }) => {
                let releases = self.refs.remove_borrower(&ids, &borrower);
                self.apply_releases(releases);
                conn.respond(id, Response::Ok);
            }
        }
    }
}

/// How a put stores its value.
enum PutPlan<'a> {
    /// Small: kept by the owner, with the references inside it.
    Inline(Bytes, Vec<ObjectRefInfo>),
    /// A large flat buffer: its header and memory image.
    Raw([u8; codec::RAW_HEADER_BYTES], &'a [u8]),
    /// A large encoded value, with the references inside it.
    Encoded(Vec<u8>, Vec<ObjectRefInfo>),
}

/// The socket a core worker listens on.
pub(crate) fn socket_path(session_dir: &Path, worker_id: WorkerId) -> PathBuf {
    session_dir
        .join("sockets")
        .join(format!("core-{:016x}.sock", worker_id.0 as u64))
}

/// Bytes of an object ready to decode.
pub(crate) enum Loaded {
    /// Carried in a message.
    Inline(Bytes),
    /// In the shared segment, pinned while this lives.
    Stored {
        ptr: *mut u8,
        len: usize,
        pin: PinGuard,
    },
}

// The pointer is into the shared segment, valid while pinned.
unsafe impl Send for Loaded {}

impl Loaded {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Loaded::Inline(b) => b,
            // Pinned, sealed, in bounds (checked by Segment::ptr).
            Loaded::Stored { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

/// Marks this worker as waiting for objects while it lives: a worker that
/// waits lends its task's CPUs back to the raylet, so the tasks it waits for
/// can be scheduled even when every CPU is leased (nested `get`s).
pub(crate) struct WaitGuard {
    core: Option<Arc<CoreWorker>>,
}

impl CoreWorker {
    /// A guard for a get or wait that may block.
    pub(crate) fn waiting(self: &Arc<Self>) -> WaitGuard {
        if self.role != Role::Worker {
            return WaitGuard { core: None };
        }
        if self
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            let _ = self.raylet.notify(WorkerBlocked { blocked: true });
        }
        WaitGuard {
            core: Some(self.clone()),
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Some(core) = &self.core {
            if core
                .waiting
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
                == 1
            {
                let _ = core.raylet.notify(WorkerBlocked { blocked: false });
            }
        }
    }
}

/// Keeps a store object pinned; unpins on drop.
pub(crate) struct PinGuard {
    core: Weak<CoreWorker>,
    id: ObjectId,
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(core) = self.core.upgrade() {
            let _ = core.raylet.notify(ReleaseObject { id: self.id });
        }
    }
}

/// Runs a future to completion from synchronous code, on `rt`.
pub(crate) fn block_on<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return rt.block_on(fut);
    }
    // Inside a runtime thread (a blocking task, or misuse from async code):
    // run it on the runtime and wait for the answer on this thread.
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(Error::Disconnected {
            peer: "the prism runtime (it shut down while a call was waiting)".into(),
        })
    })
}

impl CoreWorker {
    /// Fails at once if no node could ever run `shape`.
    pub(crate) fn check_feasible(&self, shape: &ResourceSet) -> Result<()> {
        let total = self.cluster_total.lock();
        if !total.contains(shape) {
            return Err(Error::Infeasible {
                shape: shape.to_string(),
                total: total.to_string(),
            });
        }
        Ok(())
    }

    /// Turns call arguments into wire arguments. Large values are put in the
    /// store first; every object the call refers to (directly or nested in
    /// a value) gains a `submitted` count, returned as `held`, that the
    /// caller drops when the call answers.
    pub(crate) fn prepare_args(
        self: &Arc<Self>,
        args: Vec<crate::object_ref::Arg>,
    ) -> Result<(Vec<prism_protocol::messages::ArgSpec>, Vec<ObjectId>)> {
        use crate::object_ref::Arg;
        use prism_protocol::messages::ArgSpec;
        let threshold = self.config.max_direct_call_object_size_bytes as usize;
        let mut specs = Vec::with_capacity(args.len());
        let mut held = Vec::new();
        let mut large = Vec::new();
        let mut keep_alive = Vec::new();
        for arg in args {
            match arg {
                Arg::Ref(info) => {
                    held.push(info.id);
                    specs.push(ArgSpec::Ref(info));
                }
                Arg::Value(encoded) if encoded.bytes.len() > threshold => {
                    let id = ObjectId::new();
                    let core = self.clone();
                    let contained = encoded.contained;
                    keep_alive.extend(encoded.keep_alive);
                    let bytes = encoded.bytes;
                    let value =
                        self.block_on(async move { core.write_to_store(id, &[&bytes]).await })?;
                    // Owned with one count, which the task takes over from
                    // the (never created) handle.
                    self.refs.add_owned(id, ValueState::Ready(value), contained);
                    large.push(id);
                    specs.push(ArgSpec::Ref(ObjectRefInfo {
                        id,
                        owner: self.address().clone(),
                    }));
                }
                Arg::Value(encoded) => {
                    held.extend(encoded.contained.iter().map(|c| c.id));
                    keep_alive.extend(encoded.keep_alive);
                    specs.push(ArgSpec::Value(Bytes::from(encoded.bytes)));
                }
            }
        }
        self.refs.add_submitted(&held);
        for id in large {
            self.refs.add_submitted(&[id]);
            let _ = self.refs.remove_local(id);
            held.push(id);
        }
        drop(keep_alive);
        Ok((specs, held))
    }
}
