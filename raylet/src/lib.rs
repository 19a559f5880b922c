//! The raylet: one per node.
//!
//! It owns the node's shared-memory object store and its worker pool,
//! accounts for the node's resources, grants worker leases, and (on the head
//! node) keeps the control store: the actor table and its names. Drivers and
//! workers talk to it over one Unix socket, `sockets/raylet.sock` in the
//! session directory; tasks themselves never pass through it.
//!
//! ```no_run
//! # async fn demo(config: prism_raylet::RayletConfig) -> prism_protocol::Result<()> {
//! use prism_raylet::Raylet;
//! // `config` comes from `prism::Config::raylet_config`, the table of tunables.
//! let raylet = Raylet::start(config).await?;
//! println!("raylet listening on {}", raylet.socket_path().display());
//! raylet.shutdown();
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations)]

mod actors;
mod awaiting;
mod config;
mod detached;
mod drivers;
mod faults;
mod gpus;
mod launcher;
mod membership;
mod memory;
mod metrics;
mod names;
mod node;
mod placement;
mod programs;
mod record;
mod reply;
mod resources;
mod scheduler;
mod server;
mod spill;
mod store;
mod task_table;
mod transfer;

pub use config::RayletConfig;
pub use membership::ClusterLink;
pub use memory::MemoryMonitorConfig;
pub use prism_gcs::Token;
pub use record::{start_ticks, NodeRecord};
pub use resources::{Allocation, NodeResources};
pub use spill::SpillConfig;

use launcher::ProcessLauncher;
use node::Node;
use prism_object_store::Segment;
use prism_protocol::ids::NodeId;
use prism_protocol::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A running raylet. Dropping it does not stop it; call [`Raylet::shutdown`].
#[derive(Debug)]
pub struct Raylet {
    node: Arc<Node>,
    server: tokio::task::JoinHandle<()>,
    socket: PathBuf,
}

impl Raylet {
    /// Creates the session directories and the store, and starts serving.
    /// Must be called inside a tokio runtime.
    pub async fn start(config: RayletConfig) -> Result<Raylet, Error> {
        let sockets = config.session_dir.join("sockets");
        let logs = config.session_dir.join("logs");
        for dir in [&sockets, &logs] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }
        faults::configure()?;
        config.spill.prepare()?;
        config.memory_monitor.check()?;
        let socket = sockets.join("raylet.sock");
        let node_id = NodeId::new();
        let segment =
            Segment::create(&format!("prism-store-{node_id}"), config.object_store_bytes)?;
        let launcher = Arc::new(ProcessLauncher {
            node_id,
            raylet_socket: socket.clone(),
            session_dir: config.session_dir.clone(),
            store_path: segment.path().to_path_buf(),
            cluster: config
                .cluster
                .as_ref()
                .map(|c| (c.node_ip.clone(), c.token.reveal().to_string())),
        });
        let node = Node::new(config, node_id, segment, launcher);
        warm_store(&node);
        let serving = node.clone();
        let server = prism_protocol::rpc::serve(&socket, move || server::handler(&serving))?;
        let reaping = Arc::downgrade(&node);
        let period = node
            .config
            .idle_worker_reap_period
            .max(std::time::Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                match reaping.upgrade() {
                    Some(node) => node.reap_idle_workers(),
                    None => return,
                }
            }
        });
        node.start_memory_monitor();
        if let Some(link) = node.config.cluster.clone() {
            // This process reaches other nodes' raylets with the token.
            prism_protocol::rpc::set_cluster_token(Some(link.token.reveal().to_string()));
            let joined = async {
                // Other nodes' processes lease workers here over TCP.
                let bind: std::net::SocketAddr =
                    format!("{}:0", link.node_ip).parse().map_err(|_| {
                        Error::invalid(
                            "node_ip",
                            format!("{:?} is not an IP address", link.node_ip),
                        )
                    })?;
                let serving = node.clone();
                let serving_bulk = Arc::downgrade(&node);
                let (tcp, bound) = prism_protocol::rpc::serve_tcp(
                    bind,
                    link.token.reveal().to_string(),
                    move || server::handler(&serving),
                    // Other nodes' raylets pull objects of this store.
                    Some(Arc::new(move |stream| {
                        if let Some(node) = serving_bulk.upgrade() {
                            node.transfers.serve_bulk(stream);
                        }
                    })),
                )
                .await?;
                let address = prism_protocol::rpc::Endpoint::format(
                    &socket,
                    bound,
                    &node.node_id.to_string(),
                );
                match membership::Membership::join(&node, &link, address).await {
                    Ok(m) => Ok((m, tcp)),
                    Err(e) => {
                        tcp.abort();
                        Err(e)
                    }
                }
            };
            match joined.await {
                Ok((m, tcp)) => {
                    let _ = node.membership.set(m);
                    node.tcp_server.lock().replace(tcp);
                    // A head started again is home to the groups its
                    // earlier self placed, and creates again the detached
                    // actors that ran on it.
                    node.groups().adopt_orphan_groups();
                    node.restart_orphaned_detached();
                }
                Err(e) => {
                    server.abort();
                    node.kill_all_workers();
                    let _ = std::fs::remove_file(&socket);
                    return Err(e);
                }
            }
        }
        tracing::info!(socket = %socket.display(), node = %node.node_id, "raylet started");
        Ok(Raylet {
            node,
            server,
            socket,
        })
    }

    /// The socket drivers and workers connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The node's id.
    pub fn node_id(&self) -> NodeId {
        self.node.node_id
    }

    /// The cluster's id, when this raylet joined one.
    pub fn cluster_id(&self) -> Option<&str> {
        self.node.membership.get().map(|m| m.cluster_id())
    }

    /// What the node shows of itself (metrics, its tables), read anew on
    /// each call.
    pub fn view(&self) -> NodeView {
        NodeView {
            node: self.node.clone(),
        }
    }

    /// Waits until the cluster's head gives this node up (it missed its
    /// heartbeats), and returns why; never returns for a raylet that is not
    /// part of a cluster.
    pub async fn lost(&self) -> String {
        match self.node.membership.get() {
            Some(m) => m.lost().await,
            None => std::future::pending().await,
        }
    }

    /// Tells the head that this node leaves, before [`Raylet::shutdown`].
    pub async fn leave_cluster(&self, reason: &str) {
        if let Some(m) = self.node.membership.get() {
            m.leave(reason).await;
        }
    }

    /// Kills every worker, stops serving and removes the store segment.
    pub fn shutdown(self) {
        self.server.abort();
        if let Some(tcp) = self.node.tcp_server.lock().take() {
            tcp.abort();
        }
        self.node.kill_all_workers();
        self.node.store.spill_config.remove_all();
        let _ = std::fs::remove_file(&self.socket);
        // What a session needs only while it runs: its sockets and the
        // program copies fetched for other nodes' drivers (tens of MB
        // each). Its logs stay (`sessions_kept`).
        let session = &self.node.config.session_dir;
        for transient in ["sockets", "programs"] {
            let _ = std::fs::remove_dir_all(session.join(transient));
        }
        tracing::info!("raylet stopped");
    }
}

/// What a running raylet shows of itself: its metrics and the rows of its
/// tables, read anew on each call (cheap to clone; after
/// [`Raylet::shutdown`] it answers from what is left).
#[derive(Debug, Clone)]
pub struct NodeView {
    node: Arc<Node>,
}

/// The kinds of rows a node lists (`prism list <kind>`).
pub const NODE_ROW_KINDS: &[&str] = &["actors", "workers", "objects", "placement_groups", "tasks"];

/// Rows of one kind from one node.
#[derive(Debug, Clone, Default)]
pub struct NodeRows {
    /// At most the limit asked for, each a JSON object with Ray's field
    /// names where Ray has them.
    pub rows: Vec<serde_json::Value>,
    /// How many the node has in all.
    pub total: usize,
    /// Ended tasks not kept (tasks only): the oldest are dropped first.
    pub dropped: u64,
}

impl NodeView {
    /// Whether the node is fit to serve, for a health probe (Ray's
    /// `/api/local_raylet_healthz`): its head has not given it up, and its
    /// scheduler answers. `Err` says why not.
    ///
    /// ```no_run
    /// # async fn f(raylet: prism_raylet::Raylet) {
    /// match raylet.view().health() {
    ///     Ok(()) => println!("success"),
    ///     Err(why) => println!("unhealthy: {why}"),
    /// }
    /// # }
    /// ```
    pub fn health(&self) -> Result<(), String> {
        if let Some(cause) = self.node.membership.get().and_then(|m| m.given_up()) {
            return Err(format!("the head gave this node up: {cause}"));
        }
        // A scheduler whose lock is held for good never gets here: the
        // probe times out, as it should.
        self.node.verbs().resources();
        Ok(())
    }

    /// The node's rows of `kind` (one of [`NODE_ROW_KINDS`]), at most
    /// `limit`; `None` for another kind.
    pub fn rows(&self, kind: &str, limit: usize) -> Option<NodeRows> {
        let node = &self.node;
        let mut dropped = 0;
        let (rows, total) = match kind {
            "actors" => node.verbs().actor_rows(limit),
            "workers" => node.verbs().worker_rows(limit),
            "placement_groups" => {
                let all = node.verbs().group_rows();
                let total = all.len();
                (all.into_iter().take(limit).collect(), total)
            }
            "objects" => {
                let (objects, total) = node.store.lock().summaries(limit);
                let rows = objects
                    .into_iter()
                    .map(|o| {
                        serde_json::json!({
                            "object_id": o.id.to_string(),
                            "object_size": o.size,
                            "sealed": o.sealed,
                            "pins": o.pins,
                            "location": o.location,
                            "owner": o.owner,
                            "reference_type": if o.owned_by_creator { "PUT" } else { "TASK_RETURN" },
                        })
                    })
                    .collect();
                (rows, total)
            }
            "tasks" => {
                let (rows, total, not_kept) = node.tasks.rows(limit);
                dropped = not_kept;
                (rows, total)
            }
            _ => return None,
        };
        Some(NodeRows {
            rows,
            total,
            dropped,
        })
    }

    /// Every thread's stack of each worker process of this node (only
    /// the one with `pid`, if given), all asked at once: one JSON object
    /// per worker (`pid`, `worker_id`, `actor_id`, `running`, `threads`
    /// with their frames), or its `error`.
    pub async fn stacks(&self, pid: Option<u32>) -> Vec<serde_json::Value> {
        let asks: Vec<_> = self
            .node
            .worker_conns(pid)
            .into_iter()
            .map(|(worker, pid, conn)| {
                tokio::spawn(async move {
                    let asked = conn.request(prism_protocol::messages::DumpStacks {});
                    let answer =
                        match tokio::time::timeout(std::time::Duration::from_secs(10), asked).await
                        {
                            Ok(Ok(bytes)) => serde_json::from_slice::<serde_json::Value>(&bytes)
                                .map_err(|e| format!("its answer is not JSON: {e}")),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err("it did not answer within 10 s".into()),
                        };
                    let mut value =
                        answer.unwrap_or_else(|e| serde_json::json!({ "pid": pid, "error": e }));
                    value["worker_id"] = serde_json::json!(worker.to_string());
                    value
                })
            })
            .collect();
        let mut out = Vec::with_capacity(asks.len());
        for ask in asks {
            if let Ok(value) = ask.await {
                out.push(value);
            }
        }
        out
    }

    /// The node's session log folder (workers' and drivers' logs).
    pub fn logs_dir(&self) -> PathBuf {
        self.node.config.session_dir.join("logs")
    }

    /// Exact counts of the tasks that ended here (as their owners
    /// reported them), by function and state, first attempts and retries
    /// together, with those running here now (`RUNNING`); and how many
    /// ended tasks are no longer kept as rows.
    pub fn task_counts(&self) -> (Vec<serde_json::Value>, u64) {
        let mut counts: std::collections::BTreeMap<(String, &'static str), u64> =
            std::collections::BTreeMap::new();
        for ((name, outcome, _), count) in self.node.task_totals.snapshot() {
            *counts.entry((name, outcome.ray_state())).or_insert(0) += count;
        }
        for (name, count) in self.node.tasks.running_counts() {
            *counts.entry((name, "RUNNING")).or_insert(0) += count;
        }
        for (name, count) in self.node.tasks.pending_counts() {
            *counts.entry((name, "PENDING_NODE_ASSIGNMENT")).or_insert(0) += count;
        }
        let rows = counts
            .into_iter()
            .map(|((name, state), count)| {
                serde_json::json!({ "name": name, "state": state, "count": count })
            })
            .collect();
        (rows, self.node.tasks.dropped())
    }

    /// The node's metrics in Prometheus's text format (see
    /// [`prism_protocol::exposition`]): tasks, actors, workers, resources,
    /// the object store and the machine.
    pub fn metrics(&self) -> String {
        let node = &self.node;
        let tables = node.verbs().metric_tables();
        // nvidia-smi runs only where the node offers GPUs.
        let gpus = if tables.total.get("GPU").is_zero() {
            Vec::new()
        } else {
            gpus::sample().unwrap_or_else(|e| {
                tracing::debug!(error = %e, "no GPU metrics");
                Vec::new()
            })
        };
        let tables = metrics::Tables {
            running_tasks: node.tasks.running_counts(),
            pending_tasks: node.tasks.pending_counts(),
            gpus,
            ..tables
        };
        let store = node.store.stats(node.transfers.bytes());
        let session = match node.membership.get().map(|m| m.cluster_id()) {
            Some(id) => id.to_string(),
            None => node
                .config
                .session_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let ip = node
            .config
            .cluster
            .as_ref()
            .map(|c| c.node_ip.as_str())
            .unwrap_or("127.0.0.1");
        metrics::render(&session, ip, &tables, &store, &node.task_totals, &node.cpu)
    }
}

/// Allocates the store's first `object_store_warm_bytes` on a thread of its
/// own, at the lowest priority and once start-up is done (forking the
/// first workers, answering the driver), so that `init` does not wait for
/// it.
fn warm_store(node: &Arc<Node>) {
    let bytes = node.config.object_store_warm_bytes;
    if bytes == 0 {
        return;
    }
    let node = node.clone();
    let started = std::thread::Builder::new()
        .name("prism-store-warm".into())
        .spawn(move || {
            // SAFETY: setpriority on this thread's own id; no memory is passed.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, 19);
            }
            // After start-up: `init` returns in a few milliseconds.
            std::thread::sleep(std::time::Duration::from_millis(30));
            if let Err(e) = node.store.segment.allocate_ahead(bytes) {
                tracing::warn!(error = %e, "the store's first pages were not allocated ahead");
            }
        });
    if let Err(e) = started {
        tracing::warn!(error = %e, "no thread to allocate the store's first pages ahead");
    }
}
