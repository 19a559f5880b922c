//! Starting a process's runtime: a driver joining (or starting) a cluster,
//! and worker mode, what a process started by a raylet does instead of
//! `main`. Both end in [`build`], which puts the components together.
//!
//! The raylet starts workers by re-executing the job's binary with
//! `PRISM_WORKER=1`. A function placed in the ELF `.init_array` section runs
//! before `main` (and before a test harness), sees the variable, and turns
//! the process into a worker: it connects to the raylet, maps the store,
//! serves tasks until the raylet goes away, and exits. So any binary that
//! links `prism` (an example, a `main`, a `cargo test` or `cargo nextest`
//! test executable) serves as its own worker, with no code in `main`.
//! Remote functions and actor classes are found through tables built by the
//! linker (`linkme`), which are complete before any code runs.

use super::actors::ActorSubmitter;
use super::executor::{Executor, Job};
use super::handler::{Components, CoreHandler};
use super::lease_client::RayletLeases;
use super::lessee::Lessee;
use super::lineage::Resubmit;
use super::objects::{Objects, ObjectsParts};
use super::owned_actors::OwnedActors;
use super::peers::Peers;
use super::store::StoreClient;
use super::submitter::TaskSubmitter;
use super::task_counts::TaskCounts;
use super::task_runs::TaskRuns;
use super::{set_current, CoreWorker, Role};
use crate::config::Config;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_gcs::{GcsClient, Token};
use prism_protocol::ids::{JobId, NodeId, WorkerId};
use prism_protocol::messages::{GetClusterResources, RegisterDriver, RegisterWorker};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{self, Connection, Endpoint, Handler};
use prism_protocol::tls::{self, Tls, TlsFiles};
use prism_raylet::{NodeRecord, Raylet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

#[used]
#[link_section = ".init_array"]
static WORKER_ENTRY: extern "C" fn() = worker_entry;

extern "C" fn worker_entry() {
    enter_worker_if_requested();
}

/// Runs the worker and exits, if this process was started as one.
pub(crate) fn enter_worker_if_requested() {
    if std::env::var_os("PRISM_WORKER").is_none() {
        return;
    }
    // Before main, std has not yet ignored SIGPIPE; a write to a closed
    // socket must be an error, not death.
    // SAFETY: setting a signal disposition has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let code = match std::panic::catch_unwind(run) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("prism worker failed: {e}");
            1
        }
        Err(_) => 101,
    };
    std::process::exit(code);
}

/// Lets this worker's allocator keep up to `bytes` of freed memory (see
/// `Config::worker_heap_keep_bytes`); glibc only, a no-op elsewhere.
fn keep_freed_heap(bytes: u64) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if bytes > 0 {
        /// glibc's ceiling for the mmap threshold on 64-bit machines.
        const MAX_MMAP_THRESHOLD: u64 = 32 << 20;
        let trim = bytes.min(i32::MAX as u64) as libc::c_int;
        let mmap = bytes.min(MAX_MMAP_THRESHOLD) as libc::c_int;
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before this process starts any thread of its own.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::Config {
        key: name.to_string(),
        value: String::new(),
        expected: "a value set by the raylet that started this worker".into(),
    })
}

fn env_id(name: &str) -> Result<u128> {
    let v = env(name)?;
    v.parse().map_err(|_| Error::Config {
        key: name.to_string(),
        value: v,
        expected: "an id".into(),
    })
}

fn run() -> Result<()> {
    let worker_id = WorkerId(env_id("PRISM_WORKER_ID")?);
    let session_dir = PathBuf::from(env("PRISM_SESSION_DIR")?);
    let raylet_socket = PathBuf::from(env("PRISM_RAYLET_SOCKET")?);
    let store_path = PathBuf::from(env("PRISM_STORE_PATH")?);
    let node_id = NodeId(env_id("PRISM_NODE_ID")?);
    let job_id = JobId(env_id("PRISM_JOB_ID")?);
    let cluster = match (
        std::env::var("PRISM_NODE_IP"),
        std::env::var("PRISM_AUTH_TOKEN"),
    ) {
        (Ok(node_ip), Ok(token)) => Some(ClusterContext { node_ip, token }),
        _ => None,
    };
    if let Some(files) = TlsFiles::from_env()? {
        tls::set(Some(Tls::load(&files)?));
    }
    crate::logging::init_file_logging(&session_dir, &format!("worker-{}.log", worker_id.0 as u64));
    let config = Arc::new(Config::default().apply_env()?);
    keep_freed_heap(config.worker_heap_keep_bytes);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the worker's runtime", e))?;
    let handle = rt.handle().clone();
    let (jobs_tx, jobs) = std::sync::mpsc::channel::<Job>();
    rt.block_on(async move {
        let handler = CoreHandler::default();
        let raylet = Connection::connect(&raylet_socket, Arc::new(handler.clone())).await?;
        let (address, tcp) = listen(&session_dir, worker_id, node_id, cluster)?;
        let core = build(Startup {
            role: Role::Worker,
            address,
            tcp,
            rt: handle,
            config,
            worker_id,
            node_id,
            job_id,
            session_dir,
            store_path,
            raylet: raylet.clone(),
            handler,
        })?;
        core.executor.set_queue(jobs_tx);
        set_current(Some(core.clone()));
        fetch_cluster_total(&core).await?;
        raylet
            .request(RegisterWorker {
                worker_id,
                address: core.objects.address().clone(),
                pid: std::process::id(),
            })
            .await?;
        tracing::info!(worker = %worker_id, "worker ready");
        Ok::<(), Error>(())
    })?;
    // This thread is now the executor thread; the runtime's threads serve
    // connections. The process ends when the raylet goes away (the
    // handler exits it).
    while let Some(job) = super::spin::recv(&jobs) {
        job();
    }
    drop(rt);
    Ok(())
}

/// Caches the cluster's total resources for feasibility checks.
async fn fetch_cluster_total(core: &Arc<CoreWorker>) -> Result<()> {
    let resources = core.raylet.request(GetClusterResources {}).await?;
    *core.cluster_total.lock() = resources.total;
    Ok(())
}

/// Connects a driver: to the raylet at `config.address`, or to a raylet
/// started here (an embedded single-node cluster), which is returned.
pub(crate) async fn start_driver(
    config: Arc<Config>,
    handle: tokio::runtime::Handle,
) -> Result<(Arc<CoreWorker>, Option<Raylet>)> {
    let (socket, raylet, cluster) = match &config.address {
        Some(address) => {
            let (socket, cluster) = local_raylet_socket(&config, address).await?;
            (socket, None, cluster)
        }
        None => {
            let raylet = start_raylet(&config).await?;
            (raylet.socket_path().to_path_buf(), Some(raylet), None)
        }
    };
    let handler = CoreHandler::default();
    let conn = Connection::connect(&socket, Arc::new(handler.clone()))
        .await
        .map_err(|e| match &config.address {
            Some(a) => Error::io(format!("join the cluster at {a} (is it running?)"), e),
            None => e,
        })?;
    let worker_id = WorkerId::new();
    let session_guess = socket
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let executable =
        std::env::current_exe().map_err(|e| Error::io("find this program's executable", e))?;
    let cwd = std::env::current_dir().map_err(|e| Error::io("read the working directory", e))?;
    let (address, tcp) = match cluster {
        Some((node_id, cluster)) => listen(&session_guess, worker_id, node_id, Some(cluster))?,
        None => (
            socket_path(&session_guess, worker_id).display().to_string(),
            None,
        ),
    };
    let registration = conn
        .request(RegisterDriver {
            address: address.clone(),
            pid: std::process::id(),
            executable,
            cwd,
            log_to_driver: config.log_to_driver,
            namespace: config.namespace.clone(),
            job_id: None,
            program: None,
            env_vars: config.job_env_vars_checked()?,
            submission_id: std::env::var("PRISM_JOB_SUBMISSION_ID").ok(),
        })
        .await?;
    let infeasible_waits = registration.infeasible_waits;
    let core = build(Startup {
        role: Role::Driver,
        address,
        tcp,
        rt: handle,
        config,
        worker_id,
        node_id: registration.node_id,
        job_id: registration.job_id,
        session_dir: registration.session_dir,
        store_path: registration.store_path,
        raylet: conn,
        handler,
    })?;
    core.infeasible_waits
        .store(infeasible_waits, std::sync::atomic::Ordering::Relaxed);
    fetch_cluster_total(&core).await?;
    Ok((core, raylet))
}

/// Starts the embedded raylet of a driver with no address, in a fresh
/// session directory.
async fn start_raylet(config: &Config) -> Result<Raylet> {
    let session_dir = crate::logging::new_session_dir(&config.temp_dir, config.sessions_kept)?;
    crate::logging::init_file_logging(&session_dir, &format!("driver-{}.log", std::process::id()));
    Raylet::start(config.raylet_config(session_dir)?).await
}

/// The raylet socket a driver joining `address` connects to: a socket path
/// or session directory as given, or, for a head's `HOST:PORT`, the raylet
/// that `prism start` runs on this machine for that cluster.
async fn local_raylet_socket(
    config: &Config,
    address: &str,
) -> Result<(PathBuf, Option<(NodeId, ClusterContext)>)> {
    let path = PathBuf::from(address);
    if address.contains('/') || !address.contains(':') {
        let socket = if path.is_dir() {
            path.join("sockets").join("raylet.sock")
        } else {
            path
        };
        return Ok((socket, None));
    }
    let records = NodeRecord::list(&config.temp_dir);
    // TLS as the environment says, else as this machine's node of that
    // cluster speaks it.
    let tls = match TlsFiles::from_env()? {
        Some(files) => Some(files),
        None => records
            .iter()
            .find(|r| r.head == address)
            .or_else(|| records.first())
            .and_then(|r| r.tls.clone()),
    };
    if let Some(files) = tls {
        tls::set(Some(Tls::load(&files)?));
    }
    let token = || {
        let given = std::env::var("PRISM_AUTH_TOKEN").ok();
        Token::find(given.as_deref(), &config.temp_dir).map_err(Error::from)
    };
    let joined = |r: &NodeRecord, token: Token| {
        let node = NodeId::parse(&r.node_id).ok_or_else(|| Error::BadNodeRecord {
            pid: r.pid,
            reason: "names no node id".into(),
        })?;
        let cluster = ClusterContext {
            node_ip: r.node_ip.clone(),
            token: token.reveal().to_string(),
        };
        Ok::<_, Error>((r.socket.clone(), Some((node, cluster))))
    };
    if let Some(r) = records.iter().find(|r| r.head == address) {
        return joined(r, token()?);
    }
    let no_node = || Error::NoLocalNode {
        address: address.to_string(),
        looked_in: NodeRecord::dir(&config.temp_dir).display().to_string(),
    };
    if records.is_empty() {
        return Err(no_node());
    }
    // The head may be named another way here (another of its addresses):
    // ask it for its cluster id and match the records by that.
    let token = token()?;
    let mut head = GcsClient::connect(address, &token)
        .await
        .map_err(Error::from)?;
    let cluster = head.cluster_info().await.map_err(Error::from)?.cluster_id;
    match records.iter().find(|r| r.cluster_id == cluster) {
        Some(r) => joined(r, token),
        None => Err(no_node()),
    }
}

/// What a process of a multi-node cluster needs to be reached from other
/// nodes.
#[derive(Debug, Clone)]
pub(crate) struct ClusterContext {
    /// This node's address.
    pub(crate) node_ip: String,
    /// The cluster token, presented to and asked of other nodes.
    pub(crate) token: String,
}

/// The address this process gives out: its socket, and in a multi-node
/// cluster also a TCP port on the node's address (bound here, served once
/// the runtime is built).
fn listen(
    session_dir: &Path,
    worker_id: WorkerId,
    node_id: NodeId,
    cluster: Option<ClusterContext>,
) -> Result<(String, Option<(std::net::TcpListener, String)>)> {
    let unix = socket_path(session_dir, worker_id);
    let Some(cluster) = cluster else {
        return Ok((unix.display().to_string(), None));
    };
    let listener = std::net::TcpListener::bind((cluster.node_ip.as_str(), 0))
        .map_err(|e| Error::io(format!("listen on {}", cluster.node_ip), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io("read the listening address", e))?;
    rpc::set_cluster_token(Some(cluster.token.clone()));
    Ok((
        Endpoint::format(&unix, bound, &node_id.to_string()),
        Some((listener, cluster.token)),
    ))
}

/// The socket a core worker listens on.
fn socket_path(session_dir: &Path, worker_id: WorkerId) -> PathBuf {
    session_dir
        .join("sockets")
        // Both halves of the id: its low half is a per-process counter, so
        // two drivers joining one session at once had the same name. (Folded
        // into 16 digits to keep the path within a socket path's limit.)
        .join(format!(
            "core-{:016x}.sock",
            (worker_id.0 >> 64) as u64 ^ worker_id.0 as u64
        ))
}

/// What connecting produced, before the runtime exists.
struct Startup {
    role: Role,
    /// The address given out (see [`listen`]).
    address: String,
    /// The TCP listener of a multi-node cluster, and the token it asks for.
    tcp: Option<(std::net::TcpListener, String)>,
    rt: tokio::runtime::Handle,
    config: Arc<Config>,
    worker_id: WorkerId,
    node_id: NodeId,
    job_id: JobId,
    session_dir: PathBuf,
    store_path: PathBuf,
    raylet: Connection,
    handler: CoreHandler,
}

/// Puts the components together and starts listening on this process's
/// socket.
fn build(s: Startup) -> Result<Arc<CoreWorker>> {
    super::spin::set(
        std::time::Duration::from_micros(s.config.spin_wait_us),
        s.config.spin_max_load_percent,
    );
    let address = s.address.clone();
    let unix = socket_path(&s.session_dir, s.worker_id);
    let store = StoreClient::open(
        s.raylet.clone(),
        &s.store_path,
        rpc::Endpoint::parse(&address).node,
    )?;
    // Connections this process opens serve it too, once it is bound: a
    // raylet of another node tells this process over its lessee
    // connection when an actor it created there ends (`ActorEnded`).
    let outgoing = s.handler.clone();
    let peers = Arc::new(Peers::new(
        s.node_id.to_string(),
        Box::new(move || Arc::new(outgoing.for_connection()) as Arc<dyn Handler>),
    ));
    let lessee = Arc::new(Lessee::new(
        peers.clone(),
        address.clone(),
        s.job_id,
        s.config.log_to_driver,
        s.config.namespace.clone(),
        s.config.job_env_vars_checked()?,
    ));
    let owned_actors = Arc::new(OwnedActors::new(
        s.rt.clone(),
        s.raylet.clone(),
        lessee.clone(),
    ));
    let report_every = s.config.task_events_report_interval_ms;
    let task_runs = Arc::new(TaskRuns::new(
        s.job_id.to_string(),
        s.worker_id.to_string(),
        report_every > 0 && s.role == Role::Worker,
    ));
    // The task submitter is built around the objects it submits for, and
    // they are handed it (as what runs lineage again, and where the task
    // counts read the waiting tasks) as they are made: nothing is wired
    // after construction.
    let tasks = Arc::new_cyclic(|me: &Weak<TaskSubmitter>| {
        let queues = me.clone();
        let task_counts = Arc::new(TaskCounts::new(
            s.job_id.to_string(),
            report_every > 0,
            Box::new(move |limit| {
                queues
                    .upgrade()
                    .map(|t| t.queued(limit))
                    .unwrap_or_default()
            }),
        ));
        let resubmit: Weak<dyn Resubmit> = me.clone();
        let objects = Arc::new(Objects::new(
            s.rt.clone(),
            s.config.clone(),
            s.role == Role::Worker,
            s.raylet.clone(),
            address,
            ObjectsParts {
                store,
                peers,
                owned_actors: owned_actors.clone(),
                task_counts,
                resubmit,
            },
        ));
        let leases = RayletLeases::new(s.raylet.clone(), lessee.clone(), objects.peers.clone());
        TaskSubmitter::new(s.rt.clone(), s.config.clone(), objects, leases)
    });
    let objects = tasks.objects().clone();
    let task_counts = objects.task_counts().clone();
    // Nothing to report when recording is off.
    let reporting = (report_every > 0).then(|| {
        task_counts.start_reporting(
            &s.rt,
            s.raylet.clone(),
            std::time::Duration::from_millis(report_every),
            task_runs.clone(),
        )
    });
    let actors = Arc::new(ActorSubmitter::new(
        s.rt.clone(),
        s.worker_id,
        s.raylet.clone(),
        objects.clone(),
        owned_actors.clone(),
    ));
    let executor = Arc::new(Executor::new(
        s.rt.clone(),
        s.config.clone(),
        s.worker_id,
        objects.clone(),
        s.raylet.clone(),
        task_runs.clone(),
    ));
    let raylet_peer = (s.role == Role::Worker).then(|| s.raylet.peer().to_string());
    let components = Components {
        objects: objects.clone(),
        executor: executor.clone(),
        tasks: tasks.clone(),
        owned_actors: owned_actors.clone(),
    };
    s.handler.bind(&components, raylet_peer);
    let handler = s.handler.clone();
    let listeners = {
        let _guard = s.rt.enter();
        let local = handler.clone();
        let mut listeners = vec![rpc::serve(&unix, move || {
            Arc::new(local.for_connection()) as Arc<dyn Handler>
        })?];
        if let Some((tcp, token)) = s.tcp {
            let remote = handler.clone();
            listeners.push(rpc::serve_tcp_listener(tcp, token, move || {
                Arc::new(remote.for_connection()) as Arc<dyn Handler>
            })?);
        }
        listeners.extend(reporting);
        listeners
    };
    Ok(Arc::new(CoreWorker {
        role: s.role,
        rt: s.rt,
        config: s.config,
        worker_id: s.worker_id,
        node_id: s.node_id,
        job_id: s.job_id,
        session_dir: s.session_dir,
        raylet: s.raylet,
        objects,
        tasks,
        actors,
        executor,
        lessee,
        owned_actors,
        task_counts,
        task_runs,
        cluster_total: Mutex::new(ResourceSet::new()),
        infeasible_waits: Default::default(),
        listeners: Mutex::new(listeners),
    }))
}
