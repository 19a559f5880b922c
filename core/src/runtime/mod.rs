//! The per-process runtime: every driver and worker has one [`CoreWorker`],
//! a composition of components that each own their state.
//!
//! ```text
//!  CoreWorker (this file): ids, the raylet connection, the components
//!  ├── tasks: TaskSubmitter       submitter.rs   leases per shape, pushes tasks
//!  │     └── leases: LeaseClient  lease_client.rs  its raylets and leased
//!  │                                             workers (a fake in its tests)
//!  ├── actors: ActorSubmitter     actors.rs      one ordered client per actor
//!  ├── executor: Executor         executor.rs    runs tasks and actor calls here
//!  │     └── its parts            executor/      hosting.rs (an actor's calls),
//!  │                                             lifecycle.rs, streaming.rs, state.rs
//!  ├── objects: Objects           objects.rs     owned values, references, fetching
//!  │     ├── refs: RefTable       refs.rs        counts, borrowers, readiness
//!  │     ├── store: StoreClient   store.rs       the mapped segment, pins
//!  │     ├── peers: Peers         peers.rs       connections to other processes
//!  │     ├── lineage              lineage.rs     how owned objects were made
//!  │     └── streams: Streams     streams.rs     streaming calls' values
//!  ├── owned_actors: OwnedActors  owned_actors.rs  actors created on other nodes
//!  └── lessee: Lessee             lessee.rs      registrations with other raylets
//!  handler.rs    serves incoming requests, each to the component that owns it
//!  registry.rs   the binary's remote functions and actor classes
//!  startup.rs    a driver joining or starting a cluster; a worker's entry;
//!                builds the components, each with what it uses
//!  leaves        submission.rs (a call and its retry policy), local_ref.rs
//!                (a counted handle), blocking.rs, spin.rs, pending.rs
//! ```
//!
//! Components reach each other only downward in this picture, and the
//! crate's layers (docs/architecture.md) are checked by the
//! `prism-structure` test. Where a lower component must call a higher
//! one, it is handed an interface: `Objects` reruns lineage through
//! [`lineage::Resubmit`] (the task submitter), a streaming call sends its
//! values through [`streams::ItemSender`] (the executor), and a local
//! handle reports its drop through [`local_ref::RefOwner`] (`Objects`).
//! The public API (the crate's root modules) reaches the runtime through
//! [`current`].

pub(crate) mod actors;
mod blocking;
pub(crate) mod executor;
pub(crate) mod handler;
pub(crate) mod lease_client;
pub(crate) mod lessee;
pub(crate) mod lineage;
pub(crate) mod local_ref;
pub(crate) mod objects;
pub(crate) mod owned_actors;
pub(crate) mod peers;
mod pending;
pub(crate) mod refs;
pub(crate) mod registry;
pub(crate) mod spin;
pub(crate) mod stacks;
pub(crate) mod startup;
pub(crate) mod store;
pub(crate) mod streams;
pub(crate) mod submission;
pub(crate) mod submitter;
pub(crate) mod task_counts;
pub(crate) mod task_runs;

pub(crate) use blocking::block_on;
pub(crate) use objects::Objects;
pub(crate) use submission::Submission;

use crate::config::Config;
use crate::{Error, Result};
use parking_lot::{Mutex, RwLock};
use prism_protocol::ids::{JobId, NodeId, WorkerId};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::Connection;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

static CURRENT: RwLock<Option<Arc<CoreWorker>>> = RwLock::new(None);

/// The running core worker, if any.
pub(crate) fn current() -> Result<Arc<CoreWorker>> {
    CURRENT.read().clone().ok_or(Error::NotInitialized)
}

/// The running core worker's objects, weakly (for references decoded
/// while it may be going away).
pub(crate) fn current_objects() -> Weak<Objects> {
    CURRENT
        .read()
        .as_ref()
        .map(|core| Arc::downgrade(&core.objects))
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

/// The runtime of one process; see the module docs.
#[derive(Debug)]
pub(crate) struct CoreWorker {
    pub(crate) role: Role,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) config: Arc<Config>,
    pub(crate) worker_id: WorkerId,
    pub(crate) node_id: NodeId,
    pub(crate) job_id: JobId,
    pub(crate) session_dir: PathBuf,
    pub(crate) raylet: Connection,
    pub(crate) objects: Arc<Objects>,
    pub(crate) tasks: Arc<submitter::TaskSubmitter>,
    pub(crate) actors: Arc<actors::ActorSubmitter>,
    pub(crate) executor: Arc<executor::Executor>,
    /// This job's registrations with other nodes' raylets.
    pub(crate) lessee: Arc<lessee::Lessee>,
    /// The actors this process created on other nodes.
    pub(crate) owned_actors: Arc<owned_actors::OwnedActors>,
    /// Tasks this process owned that ended, not reported yet.
    pub(crate) task_counts: Arc<task_counts::TaskCounts>,
    /// What this process runs and ran, not reported yet.
    pub(crate) task_runs: Arc<task_runs::TaskRuns>,
    /// The cluster's total resources, for feasibility checks.
    pub(crate) cluster_total: Mutex<ResourceSet>,
    /// The node holds requests no live node can run until one can (see
    /// [`CoreWorker::check_feasible`]).
    pub(crate) infeasible_waits: std::sync::atomic::AtomicBool,
    listeners: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl CoreWorker {
    /// Runs `fut` to completion from synchronous code.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        block_on(&self.rt, fut)
    }

    /// Fails at once if no node could ever run `shape`; in a cluster that
    /// may grow (its node said so as this process registered), the raylet
    /// holds such a request until a node that can run it joins, so it is
    /// not refused here.
    pub(crate) fn check_feasible(&self, shape: &ResourceSet) -> Result<()> {
        if self
            .infeasible_waits
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        let total = self.cluster_total.lock();
        if !total.contains(shape) {
            return Err(Error::Infeasible {
                shape: shape.to_string(),
                total: total.to_string(),
            });
        }
        Ok(())
    }

    /// Returns idle leases and stops listening (shutdown).
    pub(crate) fn stop(&self) {
        self.tasks.return_all_leases();
        // The last counts, so that a driver's tasks are all counted.
        let (counts, runs) = (self.task_counts.clone(), self.task_runs.clone());
        let raylet = self.raylet.clone();
        let _ = self.block_on(async move {
            let sent = counts.report(&runs, &raylet, true);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), sent).await;
            Ok(())
        });
        for l in self.listeners.lock().drain(..) {
            l.abort();
        }
        if let Some(path) = prism_protocol::rpc::Endpoint::parse(self.objects.address()).unix {
            let _ = std::fs::remove_file(path);
        }
    }
}
