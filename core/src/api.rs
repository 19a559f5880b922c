//! The runtime API: starting and stopping, objects, waiting.

use crate::codec::Element;
use crate::config::Config;
use crate::object_ref::ObjectRef;
use crate::runtime::{self, current, CoreWorker, Role};
use crate::view::View;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, JobId, NodeId, ObjectId, TaskId, WorkerId};
use prism_protocol::messages::{
    Call, GetClusterResources, GetNodes, GetStoreStats, NodeInfo, ObjectRefInfo, StoreStats,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::tls::Tls as NodeTls;
use prism_raylet::Raylet;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::{Future, IntoFuture};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What a driver process started, to stop it again.
struct DriverState {
    runtime: tokio::runtime::Runtime,
    raylet: Option<Raylet>,
}

static DRIVER: Mutex<Option<DriverState>> = Mutex::new(None);

/// Connects this program to a cluster, as its driver.
///
/// With no address (neither [`Config::address`] nor `PRISM_ADDRESS`), starts
/// an embedded single-node cluster: a raylet inside this process, a
/// shared-memory object store, and a pool of worker processes (one per CPU)
/// that re-execute this program's binary in worker mode. With an address
/// (a raylet socket, or a session directory), joins that cluster instead.
///
/// Calling it again before [`shutdown`] fails with
/// [`Error::AlreadyInitialized`] unless [`Config::ignore_reinit_error`] is set.
/// A binary in which two remote functions share one `name = "..."` is
/// refused with [`Error::InvalidArgument`] naming it.
///
/// ```no_run
/// prism::init(prism::Config::default())?;
/// // ... tasks, actors, objects ...
/// prism::shutdown();
/// # Ok::<(), prism::Error>(())
/// ```
pub fn init(config: Config) -> Result<()> {
    let mut driver = DRIVER.lock();
    if driver.is_some() || current().is_ok() {
        return if config.ignore_reinit_error {
            Ok(())
        } else {
            Err(Error::AlreadyInitialized)
        };
    }
    let config = Arc::new(config.apply_env()?);
    runtime::registry::check_unique_names()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads.max(1))
        .thread_name("prism-driver")
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the driver's runtime", e))?;
    let handle = runtime.handle().clone();
    let timeout = Duration::from_millis(config.startup_timeout_ms);
    let started = runtime.block_on(async {
        tokio::time::timeout(
            timeout,
            runtime::startup::start_driver(config.clone(), handle),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Error::io(
                "start the cluster",
                format!(
                    "not ready after {} ms (PRISM_STARTUP_TIMEOUT_MS)",
                    timeout.as_millis()
                ),
            ))
        })
    });
    match started {
        Ok((core, raylet)) => {
            runtime::set_current(Some(core));
            *driver = Some(DriverState { runtime, raylet });
            Ok(())
        }
        Err(e) => {
            runtime.shutdown_background();
            Err(e)
        }
    }
}

/// Disconnects from the cluster; an embedded cluster is stopped (its workers
/// killed, its store removed). Safe to call when not initialized. `init`
/// may be called again afterwards.
pub fn shutdown() {
    let core = runtime::set_current(None);
    if let Some(core) = &core {
        core.stop();
    }
    drop(core);
    let state = DRIVER.lock().take();
    if let Some(state) = state {
        if let Some(raylet) = state.raylet {
            raylet.shutdown();
        }
        state.runtime.shutdown_background();
    }
}

/// Whether [`init`] has run (and [`shutdown`] has not).
pub fn is_initialized() -> bool {
    current().is_ok()
}

/// Stores a value in the cluster and returns a reference to it.
///
/// Values up to 100 KiB (`max_direct_call_object_size_bytes`) stay in this
/// process and travel inside messages; larger ones are written once to the
/// node's shared-memory store. Flat buffers (`Vec<f32>`, `Vec<u8>`,
/// `bytes::Bytes`, ...) are copied there as they are, without encoding.
///
/// ```no_run
/// # prism::init(prism::Config::default())?;
/// let r = prism::put(vec![1.0f32; 1_000_000])?;
/// assert_eq!(prism::get(&r)?.len(), 1_000_000);
/// # Ok::<(), prism::Error>(())
/// ```
pub fn put<T: Serialize + Send + Sync + 'static>(value: T) -> Result<ObjectRef<T>> {
    let r = put_ref(&value)?;
    // Freeing a large buffer (unmapping its pages) costs about as much as
    // copying it; do it off the caller's path.
    if crate::codec::raw_parts(&value).is_some_and(|(_, p)| p.len() > 1 << 20) {
        std::thread::spawn(move || drop(value));
    }
    Ok(r)
}

/// [`put`] from a reference: the value is copied into the store (or
/// encoded), and stays the caller's.
///
/// ```no_run
/// # prism::init(prism::Config::default())?;
/// let weights = vec![0.0f32; 10_000_000];
/// let r = prism::put_ref(&weights)?; // one copy into shared memory
/// println!("stored as {}", r.id());
/// # Ok::<(), prism::Error>(())
/// ```
pub fn put_ref<T: Serialize + 'static>(value: &T) -> Result<ObjectRef<T>> {
    let core = current()?;
    let info = core.objects.put_object(value)?;
    Ok(ObjectRef::from_counted(info, &core.objects))
}

/// The async form of [`put`].
pub async fn put_async<T: Serialize + Send + Sync + 'static>(value: T) -> Result<ObjectRef<T>> {
    let core = current()?;
    let info = core.objects.put_object_async(&value).await?;
    Ok(ObjectRef::from_counted(info, &core.objects))
}

async fn get_with(
    core: Arc<CoreWorker>,
    info: ObjectRefInfo,
) -> Result<crate::runtime::store::Loaded> {
    let ready_here = core.objects.refs.is_mine(&info.owner) && core.objects.refs.is_ready(info.id);
    let _waiting = (!ready_here).then(|| core.objects.waiting());
    core.objects.fetch(&info).await
}

/// Waits for an object's value and returns a copy of it.
///
/// A task that failed gives its error here ([`Error::TaskFailed`],
/// [`Error::WorkerDied`], ...).
pub fn get<T: DeserializeOwned + Send + 'static>(r: &ObjectRef<T>) -> Result<T> {
    let core = current()?;
    let r = r.clone();
    core.clone().block_on(async move { get_async(&r).await })
}

/// [`get`] that gives up after `timeout` with [`Error::GetTimeout`].
pub fn get_timeout<T: DeserializeOwned + Send + 'static>(
    r: &ObjectRef<T>,
    timeout: Duration,
) -> Result<T> {
    let core = current()?;
    let r = r.clone();
    core.block_on(async move {
        tokio::time::timeout(timeout, get_async(&r))
            .await
            .unwrap_or(Err(Error::GetTimeout {
                waited_ms: timeout.as_millis() as u64,
                pending: 1,
                total: 1,
            }))
    })
}

/// The async form of [`get`]; `ObjectRef` also implements `IntoFuture`.
pub async fn get_async<T: DeserializeOwned + Send + 'static>(r: &ObjectRef<T>) -> Result<T> {
    let core = current()?;
    let loaded = get_with(core.clone(), r.info().clone()).await?;
    let value = crate::codec::decode::<T>(loaded.bytes())?;
    drop(loaded);
    core.objects.register_borrows().await?;
    Ok(value)
}

/// Gets many objects, in order; fails with the first error.
pub fn get_many<T: DeserializeOwned + Send + 'static>(refs: &[ObjectRef<T>]) -> Result<Vec<T>> {
    get_many_inner(refs, None)
}

/// [`get_many`] with one deadline for all of them.
pub fn get_many_timeout<T: DeserializeOwned + Send + 'static>(
    refs: &[ObjectRef<T>],
    timeout: Duration,
) -> Result<Vec<T>> {
    get_many_inner(refs, Some(timeout))
}

/// The async form of [`get_many`].
pub async fn get_many_async<T: DeserializeOwned + Send + 'static>(
    refs: &[ObjectRef<T>],
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(refs.len());
    for r in refs {
        out.push(get_async(r).await?);
    }
    Ok(out)
}

fn get_many_inner<T: DeserializeOwned + Send + 'static>(
    refs: &[ObjectRef<T>],
    timeout: Option<Duration>,
) -> Result<Vec<T>> {
    let core = current()?;
    let refs: Vec<ObjectRef<T>> = refs.to_vec();
    core.block_on(async move {
        let total = refs.len();
        let all = get_many_async(&refs);
        match timeout {
            None => all.await,
            Some(t) => match tokio::time::timeout(t, all).await {
                Ok(r) => r,
                Err(_) => {
                    let core = current()?;
                    let pending = refs
                        .iter()
                        .filter(|r| {
                            !(core.objects.refs.is_mine(r.owner())
                                && core.objects.refs.is_ready(r.id()))
                        })
                        .count();
                    Err(Error::GetTimeout {
                        waited_ms: t.as_millis() as u64,
                        pending,
                        total,
                    })
                }
            },
        }
    })
}

/// Reads a buffer object in place: on the same node, the returned
/// [`View`] points into shared memory (no copy) and keeps the object pinned
/// until dropped.
pub fn get_view<E: Element>(r: &ObjectRef<Vec<E>>) -> Result<View<E>> {
    let core = current()?;
    let info = r.info().clone();
    let c = core.clone();
    let loaded = core.block_on(async move { get_with(c, info).await })?;
    crate::runtime::registry::make_view::<E>(loaded)
}

/// Cancels the task or actor call that makes `r`, as Ray's `ray.cancel`
/// does.
///
/// A task:
/// - still waiting for its arguments or for a worker never runs;
/// - sent to a worker that has not started it never runs;
/// - running cannot be interrupted: it runs to its end and its result is
///   dropped. With `force`, its worker process is stopped instead; other
///   tasks sent to that worker are retried, as after any worker death.
///
/// Then `get` on `r` fails with [`Error::TaskCancelled`], and the task is
/// not retried.
///
/// An actor call that has not started (queued in this process, or at the
/// actor behind other calls) never runs, and `get` fails with
/// [`Error::TaskCancelled`]; the actor's later calls run as before. A call
/// of an async method that started is stopped where it waits (its future
/// is dropped, releasing the actor), and `get` fails the same way, as Ray
/// cancels a running coroutine. A synchronous method's call that started
/// runs to its end and keeps its result: stopping it would stop the
/// actor's process, which [`kill`](crate::kill) does. So `force` is
/// [`Error::InvalidArgument`] for an actor call, as in Ray.
///
/// A task or call that already finished keeps its result, and an object
/// made by [`put`] is left as it is. Only the process that submitted the
/// task may cancel it ([`Error::InvalidArgument`] otherwise).
///
/// ```no_run
/// #[prism::remote]
/// fn slow() -> u32 {
///     std::thread::sleep(std::time::Duration::from_secs(60));
///     1
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let r = slow::remote()?;
///     prism::cancel(&r, true)?;
///     assert!(matches!(prism::get(&r), Err(prism::Error::TaskCancelled { .. })));
///     Ok(())
/// }
/// ```
pub fn cancel<T>(r: &ObjectRef<T>, force: bool) -> Result<()> {
    let core = current()?;
    if !core.objects.refs.is_mine(r.owner()) {
        return Err(Error::invalid(
            "cancel",
            format!(
                "object {} was made by the process at {}: only the process that submitted a \
                 task can cancel it",
                r.id(),
                r.owner()
            ),
        ));
    }
    // Any result of a call that returns several names the call by its first.
    let (call, actor) = core.objects.refs.made_by(r.id());
    if actor.is_none() || !force {
        // A streaming call paused by its backpressure waits for answers
        // this process holds back: they go now, saying the stream ended.
        core.objects.streams.cancelled(call);
    }
    match actor {
        Some(actor) if force => Err(Error::invalid(
            "cancel",
            format!(
                "object {} is the result of a call of actor {actor}: an actor call cannot be \
                 cancelled with force (its process runs the actor's other calls too); cancel \
                 it without force, or stop the actor with prism::kill",
                r.id()
            ),
        )),
        Some(actor) => {
            core.actors.cancel(actor, call, r.id());
            Ok(())
        }
        None => {
            core.tasks.cancel(call, r.id(), force);
            Ok(())
        }
    }
}

/// What [`wait`] returns: `(ready, not_ready)`.
pub type WaitResult<T> = (Vec<ObjectRef<T>>, Vec<ObjectRef<T>>);

/// Waits until `num_returns` of `refs` are ready or `timeout` passes, and
/// returns `(ready, not_ready)`, each in the order of `refs`, as Ray does:
/// `ready` holds at most `num_returns` refs (the first ready ones), the
/// others are in `not_ready`, ready or not.
///
/// `num_returns` larger than `refs.len()`, or duplicate refs, are
/// [`Error::InvalidArgument`]. A failed task counts as ready (its `get`
/// gives the error).
pub fn wait<T: 'static>(
    refs: &[ObjectRef<T>],
    num_returns: usize,
    timeout: Option<Duration>,
) -> Result<WaitResult<T>> {
    check_wait_args(refs, num_returns)?;
    let core = current()?;
    // Enough already ready here: answer without the runtime.
    let infos = refs.iter().map(|r| r.info());
    if let Some(ready) = core.objects.refs.ready_now(infos, num_returns) {
        return Ok(split_ready(refs, &ready));
    }
    let infos: Vec<ObjectRefInfo> = refs.iter().map(|r| r.info().clone()).collect();
    let c = core.clone();
    let ready =
        core.block_on(async move { Ok(wait_infos(c, infos, num_returns, timeout).await) })?;
    Ok(split_ready(refs, &ready))
}

fn check_wait_args<T>(refs: &[ObjectRef<T>], num_returns: usize) -> Result<()> {
    if num_returns > refs.len() {
        return Err(Error::invalid(
            "num_returns",
            format!("{num_returns} is more than the {} refs given", refs.len()),
        ));
    }
    // Sorted rather than hashed: ids minted by one process ascend, and
    // refs mostly come in the order they were made, which sorting finds
    // in one pass (a wait loop calls this once per ready ref).
    let mut ids: Vec<ObjectId> = refs.iter().map(|r| r.id()).collect();
    ids.sort_unstable();
    if let Some(dup) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(
            "refs",
            format!("{} appears more than once", dup[0]),
        ));
    }
    Ok(())
}

/// As in Ray: at most `num_returns` refs are reported ready (`ready` marks
/// exactly those), the rest stay in the second list, in input order.
fn split_ready<T>(refs: &[ObjectRef<T>], ready: &[bool]) -> WaitResult<T> {
    let (mut yes, mut no) = (Vec::new(), Vec::with_capacity(refs.len()));
    for (r, is_ready) in refs.iter().zip(ready) {
        if *is_ready {
            yes.push(r.clone());
        } else {
            no.push(r.clone());
        }
    }
    (yes, no)
}

/// The async form of [`wait`].
pub async fn wait_async<T>(
    refs: &[ObjectRef<T>],
    num_returns: usize,
    timeout: Option<Duration>,
) -> Result<WaitResult<T>> {
    check_wait_args(refs, num_returns)?;
    let core = current()?;
    let infos: Vec<ObjectRefInfo> = refs.iter().map(|r| r.info().clone()).collect();
    let ready = wait_infos(core, infos, num_returns, timeout).await;
    Ok(split_ready(refs, &ready))
}

/// Waits on refs already checked: which are ready, `num_returns` of them
/// at most (the first in order).
async fn wait_infos(
    core: Arc<CoreWorker>,
    infos: Vec<ObjectRefInfo>,
    num_returns: usize,
    timeout: Option<Duration>,
) -> Vec<bool> {
    let _waiting = core.objects.waiting();
    let mut ready = wait_ready(core.clone(), infos, num_returns, timeout).await;
    let mut count = 0;
    for flag in ready.iter_mut() {
        if *flag {
            count += 1;
            *flag = count <= num_returns;
        }
    }
    ready
}

async fn wait_ready(
    core: Arc<CoreWorker>,
    infos: Vec<ObjectRefInfo>,
    num_returns: usize,
    timeout: Option<Duration>,
) -> Vec<bool> {
    let mut ready = vec![false; infos.len()];
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Objects owned here: checked under one lock, and those still pending
    // tell this wait their index when they are done.
    let (owned, borrowed): (Vec<_>, Vec<_>) = infos
        .into_iter()
        .enumerate()
        .partition(|(_, info)| core.objects.refs.is_mine(&info.owner));
    let owned: Vec<(usize, ObjectId)> = owned.into_iter().map(|(i, info)| (i, info.id)).collect();
    let mut count = core.objects.refs.ready_or_tell(&owned, &mut ready, &tx);
    if count >= num_returns {
        return ready;
    }
    // Objects owned elsewhere: one fetch each.
    let mut waiting = tokio::task::JoinSet::new();
    for (i, info) in borrowed {
        let core = core.clone();
        let tx = tx.clone();
        waiting.spawn(async move {
            let _ = core.objects.fetch(&info).await;
            let _ = tx.send(i);
        });
    }
    drop(tx);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    while count < num_returns {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, rx.recv()).await {
                Ok(n) => n,
                Err(_) => break,
            },
            None => rx.recv().await,
        };
        match next {
            Some(i) if !ready[i] => {
                ready[i] = true;
                count += 1;
            }
            Some(_) => {}
            None => break,
        }
    }
    // Anything else that finished meanwhile counts too.
    while let Ok(i) = rx.try_recv() {
        ready[i] = true;
    }
    waiting.abort_all();
    ready
}

/// Failures this process recovered from by trying again, since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryStats {
    /// Task attempts made again after a worker died (or, with
    /// `retry_exceptions`, after the task's own error).
    pub task_retries: u64,
    /// Actor calls sent again to a restarted actor (`max_task_retries`).
    pub actor_call_retries: u64,
    /// Objects this process owns that were lost with their node and made
    /// again by running their task again (lineage reconstruction).
    pub objects_rebuilt: u64,
}

/// What this process (a driver, or a worker for the tasks it submits)
/// retried since it started.
///
/// ```
/// // A process that retried nothing yet.
/// assert_eq!(prism::retry_stats(), prism::RetryStats::default());
/// ```
pub fn retry_stats() -> RetryStats {
    let (task_retries, actor_call_retries) = crate::runtime::submission::retries();
    RetryStats {
        task_retries,
        actor_call_retries,
        objects_rebuilt: crate::runtime::submission::rebuilt(),
    }
}

/// Usage of this node's object store.
pub fn object_store_stats() -> Result<StoreStats> {
    let core = current()?;
    let c = core.clone();
    core.block_on(async move { c.raylet.request(GetStoreStats {}).await })
}

/// The TLS this process speaks with other nodes: `Some` in a cluster whose
/// nodes were started with `--tls-cert`, `--tls-key` and `--tls-ca` (or
/// their `PRISM_TLS_*` settings), `None` otherwise. Links that a program
/// opens between nodes itself can take its rustls configurations, as the
/// Trainer's collective groups do.
///
/// ```
/// if let Some(tls) = prism::node_tls() {
///     let (_client, _server) = (tls.client_config(), tls.server_config());
/// }
/// ```
pub fn node_tls() -> Option<NodeTls> {
    prism_protocol::tls::current()
}

/// The cluster's total resources and what is free now.
pub fn cluster_resources() -> Result<(ResourceSet, ResourceSet)> {
    let resources = raylet_request(GetClusterResources {})?;
    Ok((resources.total, resources.available))
}

/// What is free in the cluster now (Ray's `ray.available_resources()`);
/// [`cluster_resources`] gives the totals too.
///
/// ```no_run
/// prism::init(prism::Config::default().num_cpus(2))?;
/// let free = prism::available_resources()?.to_f64_map();
/// println!("{} CPUs free", free.get("CPU").copied().unwrap_or(0.0));
/// # Ok::<(), prism::Error>(())
/// ```
pub fn available_resources() -> Result<ResourceSet> {
    Ok(raylet_request(GetClusterResources {})?.available)
}

/// Every node of the cluster, alive or dead, with its address and
/// resources (Ray's `ray.nodes()`). In an embedded single-node cluster,
/// the one node.
///
/// ```no_run
/// prism::init(prism::Config::default())?;
/// for node in prism::nodes()? {
///     let state = if node.alive { "ALIVE" } else { "DEAD" };
///     println!("{} {} {state} {:?}", node.node_id, node.node_ip, node.total);
/// }
/// # Ok::<(), prism::Error>(())
/// ```
pub fn nodes() -> Result<Vec<NodeInfo>> {
    raylet_request(GetNodes {})
}

/// Sends one request to this process's raylet and waits for the answer.
pub(crate) fn raylet_request<C: Call + Send + 'static>(request: C) -> Result<C::Reply>
where
    C::Reply: Send,
{
    let core = current()?;
    let c = core.clone();
    core.block_on(async move { c.raylet.request(request).await })
}

/// Facts about the running process's place in the cluster.
#[derive(Debug, Clone)]
pub struct RuntimeContext {
    /// This process's worker id.
    pub worker_id: WorkerId,
    /// Its job.
    pub job_id: JobId,
    /// The task or actor call running on this thread (Ray's
    /// `get_task_id`); `None` in the driver and outside a call. Seen from
    /// the call's own thread: a thread or tokio task the call spawns is
    /// not inside it.
    pub task_id: Option<TaskId>,
    /// The actor this process hosts (Ray's `get_actor_id`); `None` in the
    /// driver and in task workers.
    pub actor_id: Option<ActorId>,
    /// The namespace named actors are created and found in: the driver's
    /// `Config::namespace`, which its tasks and actors share (Ray's
    /// `namespace`).
    pub namespace: String,
    /// The node it runs on.
    pub node_id: NodeId,
    /// The session directory (logs are under `logs/`).
    pub session_dir: PathBuf,
    /// Objects this process owns now.
    pub num_owned_objects: usize,
    /// GPU ids visible to this process (`CUDA_VISIBLE_DEVICES`).
    pub gpu_ids: Vec<u32>,
    /// Whether this process is a worker (rather than the driver).
    pub is_worker: bool,
    /// The address other nodes reach this node at, in a multi-node
    /// cluster (Ray's `get_node_ip_address`); `None` in an embedded
    /// single-node cluster.
    pub node_ip: Option<String>,
    /// Whether the actor this process hosts was restarted: its process
    /// died (or its node) and this is a new one (Ray's
    /// `was_current_actor_reconstructed`). False in the driver, in task
    /// workers and for an actor's first process.
    pub was_current_actor_restarted: bool,
    /// How many times the hosted actor was restarted before this process.
    pub actor_restarts: u32,
}

/// Where this code runs: worker id, job, the task or actor call running on
/// this thread, the hosted actor, the namespace, session and GPUs (Ray's
/// `get_runtime_context()`).
///
/// ```no_run
/// #[prism::remote]
/// fn whoami() -> (bool, String) {
///     let here = prism::runtime_context().expect("inside a worker");
///     (here.task_id.is_some(), here.namespace)
/// }
///
/// # fn main() -> prism::Result<()> {
/// prism::init(prism::Config::default().namespace("team-a"))?;
/// let driver = prism::runtime_context()?;
/// assert!(driver.task_id.is_none() && !driver.is_worker);
/// // Tasks run in the driver's namespace: names it gives, they find.
/// assert_eq!(prism::get(&whoami::remote()?)?, (true, "team-a".to_string()));
/// # Ok(())
/// # }
/// ```
pub fn runtime_context() -> Result<RuntimeContext> {
    let core = current()?;
    let gpu_ids = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_default();
    Ok(RuntimeContext {
        worker_id: core.worker_id,
        job_id: core.job_id,
        task_id: runtime::registry::current_task(),
        actor_id: core.executor.actor_id(),
        namespace: core.config.namespace.clone(),
        node_id: core.node_id,
        session_dir: core.session_dir.clone(),
        num_owned_objects: core.objects.refs.num_owned(),
        gpu_ids,
        is_worker: core.role == Role::Worker,
        node_ip: prism_protocol::rpc::Endpoint::parse(core.objects.address())
            .tcp
            .and_then(|tcp| tcp.rsplit_once(':').map(|(ip, _)| ip.to_string())),
        was_current_actor_restarted: core.executor.actor_restarts() > 0,
        actor_restarts: core.executor.actor_restarts(),
    })
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for ObjectRef<T> {
    type Output = Result<T>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { get_async(&self).await })
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for &ObjectRef<T> {
    type Output = Result<T>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        let r = self.clone();
        Box::pin(async move { get_async(&r).await })
    }
}
