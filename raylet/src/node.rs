//! The node's state and the lease scheduler.
//!
//! All scheduling state sits behind one lock (`Node::state`); every change
//! that could let a waiting lease through ends with [`Node::schedule`]. The
//! store has its own lock so object traffic never waits on scheduling.
//!
//! A lease is granted when the shape fits in the free resources *and* an
//! idle worker of the requesting job with the right GPU devices exists. If
//! only the worker is missing, one is started (bounded per job); the
//! request stays queued until it registers.

use crate::placement::PlacementGroup;
use crate::resources::{Allocation, NodeResources};
use crate::RayletConfig;
use parking_lot::Mutex;
use prism_object_store::{ObjectTable, Segment};
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, NodeId, PlacementGroupId, WorkerId};
use prism_protocol::messages::{ActorInfo, BundleRef, Registration, Response};
use prism_protocol::resources::{ResourceSet, CPU};
use prism_protocol::rpc::Connection;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

/// A driver and the binary its workers run.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) executable: PathBuf,
    pub(crate) cwd: PathBuf,
    pub(crate) driver: Connection,
    pub(crate) log_to_driver: bool,
    /// Worker processes that failed to start (or exited before they
    /// registered) since one last registered.
    pub(crate) start_failures: u32,
}

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerUse {
    Starting,
    Idle,
    Leased(LeaseId),
    Actor(ActorId),
}

#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) job: JobId,
    pub(crate) pid: u32,
    pub(crate) gpu_ids: Vec<u32>,
    pub(crate) conn: Option<Connection>,
    pub(crate) address: Option<String>,
    pub(crate) usage: WorkerUse,
    pub(crate) label: Arc<Mutex<String>>,
    /// Waiting in `get` for other tasks' results.
    pub(crate) blocked: bool,
    /// When it last became idle.
    pub(crate) idle_since: std::time::Instant,
}

impl Worker {
    pub(crate) fn set_idle(&mut self) {
        self.usage = WorkerUse::Idle;
        self.idle_since = std::time::Instant::now();
    }
}

/// Who a lease is for.
#[derive(Debug)]
pub(crate) enum LeaseFor {
    /// A submitter waiting on request `request` of connection `conn`.
    Client {
        conn: Connection,
        conn_id: u64,
        request: Option<u64>,
    },
    /// An actor's lifetime.
    Actor(ActorId),
}

#[derive(Debug)]
pub(crate) struct PendingLease {
    pub(crate) shape: ResourceSet,
    pub(crate) job: JobId,
    pub(crate) lease_for: LeaseFor,
    /// The placement-group bundle to draw from instead of the node.
    pub(crate) bundle: Option<BundleRef>,
}

#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) worker: WorkerId,
    pub(crate) allocation: Allocation,
    /// The connection that holds it (None for actors).
    pub(crate) holder: Option<u64>,
    /// Its CPUs are lent back while its worker is blocked.
    pub(crate) lent: Option<ResourceSet>,
    /// The bundle (group, index) it was drawn from.
    pub(crate) bundle: Option<(PlacementGroupId, usize)>,
}

#[derive(Debug)]
pub(crate) struct ActorEntry {
    pub(crate) info: ActorInfo,
    pub(crate) name: Option<(String, String)>,
    pub(crate) worker: Option<WorkerId>,
    pub(crate) waiters: Vec<(Connection, Option<u64>)>,
    /// The spec, until handed to the actor's worker.
    pub(crate) spec: Option<prism_protocol::messages::ActorSpec>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) resources: NodeResources,
    pub(crate) jobs: HashMap<JobId, Job>,
    pub(crate) workers: HashMap<WorkerId, Worker>,
    pub(crate) pending: VecDeque<PendingLease>,
    pub(crate) leases: HashMap<LeaseId, Lease>,
    pub(crate) actors: HashMap<ActorId, ActorEntry>,
    pub(crate) named_actors: HashMap<(String, String), ActorId>,
    pub(crate) placement_groups: HashMap<PlacementGroupId, PlacementGroup>,
    /// Groups removed and forgotten, still answered as `Removed`.
    pub(crate) removed_groups: crate::placement::RemovedGroups,
    /// Groups waiting for resources, in arrival order.
    pub(crate) pending_groups: VecDeque<PlacementGroupId>,
    pub(crate) shutting_down: bool,
}

/// One node: its store, its scheduler, its workers and (on the head) the
/// actor table.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) node_id: NodeId,
    pub(crate) config: RayletConfig,
    pub(crate) socket: PathBuf,
    pub(crate) segment: Segment,
    pub(crate) store: Mutex<ObjectTable>,
    pub(crate) state: Mutex<State>,
    /// The control store's key-value table.
    pub(crate) kv: Mutex<HashMap<String, bytes::Bytes>>,
}

impl Node {
    pub(crate) fn new(config: RayletConfig, socket: PathBuf) -> Result<Arc<Node>, Error> {
        let node_id = NodeId::new();
        let segment =
            Segment::create(&format!("prism-store-{node_id}"), config.object_store_bytes)?;
        Ok(Arc::new(Node {
            node_id,
            store: Mutex::new(ObjectTable::new(config.object_store_bytes)),
            state: Mutex::new(State {
                resources: NodeResources::new(config.resources.clone()),
                jobs: HashMap::new(),
                workers: HashMap::new(),
                pending: VecDeque::new(),
                leases: HashMap::new(),
                actors: HashMap::new(),
                named_actors: HashMap::new(),
                placement_groups: HashMap::new(),
                removed_groups: crate::placement::RemovedGroups::new(
                    config.removed_placement_groups_kept,
                ),
                pending_groups: VecDeque::new(),
                shutting_down: false,
            }),
            kv: Mutex::new(HashMap::new()),
            segment,
            socket,
            config,
        }))
    }

    pub(crate) fn registration(&self, job_id: JobId) -> Registration {
        Registration {
            node_id: self.node_id,
            job_id,
            store_path: self.segment.path().to_path_buf(),
            store_capacity: self.config.object_store_bytes,
            session_dir: self.config.session_dir.clone(),
        }
    }

    /// Queues a lease request, failing at once if no node could ever fit it.
    pub(crate) fn request_lease(self: &Arc<Self>, pending: PendingLease) -> Result<(), Error> {
        let mut state = self.state.lock();
        state.check_lease_feasible(&pending.shape, pending.bundle)?;
        state.pending.push_back(pending);
        self.schedule(&mut state);
        Ok(())
    }

    /// Grants every queued lease that can run now, in arrival order, and
    /// starts workers where only a worker is missing.
    pub(crate) fn schedule(self: &Arc<Self>, state: &mut State) {
        if state.shutting_down {
            return;
        }
        tracing::trace!(pending = state.pending.len(), available = %state.resources.available(), "schedule");
        self.schedule_groups(state);
        let mut still_pending = VecDeque::new();
        // Workers being started, per (job, devices), not yet promised to a request.
        let mut spare_starting: HashMap<(JobId, Vec<u32>), usize> = HashMap::new();
        for w in state.workers.values() {
            if w.usage == WorkerUse::Starting {
                *spare_starting
                    .entry((w.job, w.gpu_ids.clone()))
                    .or_default() += 1;
            }
        }
        while let Some(pending) = state.pending.pop_front() {
            if !state.jobs.contains_key(&pending.job) {
                continue; // its driver is gone
            }
            let (allocation, bundle) = match state.allocate(&pending.shape, pending.bundle) {
                Ok(Some(taken)) => taken,
                Ok(None) => {
                    still_pending.push_back(pending);
                    continue;
                }
                Err(e) => {
                    self.refuse(state, pending, e);
                    continue;
                }
            };
            let gpu_ids = allocation.gpu_ids();
            let idle = state
                .workers
                .iter()
                .find(|(_, w)| {
                    w.usage == WorkerUse::Idle && w.job == pending.job && w.gpu_ids == gpu_ids
                })
                .map(|(id, _)| *id);
            match idle {
                Some(worker_id) => self.grant(state, pending, worker_id, allocation, bundle),
                None => {
                    state.release_to(bundle, &allocation);
                    let key = (pending.job, gpu_ids.clone());
                    let spare = spare_starting.entry(key).or_default();
                    if *spare > 0 {
                        *spare -= 1;
                    } else if self.task_workers_of(state, pending.job)
                        < self.config.max_workers_per_job
                        || matches!(pending.lease_for, LeaseFor::Actor(_))
                    {
                        self.start_worker(state, pending.job, gpu_ids);
                    }
                    still_pending.push_back(pending);
                }
            }
        }
        state.pending = still_pending;
    }

    fn task_workers_of(&self, state: &State, job: JobId) -> usize {
        state
            .workers
            .values()
            .filter(|w| w.job == job && !w.blocked && !matches!(w.usage, WorkerUse::Actor(_)))
            .count()
    }

    fn grant(
        self: &Arc<Self>,
        state: &mut State,
        pending: PendingLease,
        worker_id: WorkerId,
        allocation: Allocation,
        bundle: Option<(PlacementGroupId, usize)>,
    ) {
        let lease_id = LeaseId::new();
        let Some(worker) = state.workers.get_mut(&worker_id) else {
            state.release_to(bundle, &allocation);
            return;
        };
        match pending.lease_for {
            LeaseFor::Client {
                conn,
                conn_id,
                request,
            } => {
                worker.usage = WorkerUse::Leased(lease_id);
                let response = Response::Lease {
                    lease_id,
                    worker_id,
                    address: worker.address.clone().unwrap_or_default(),
                    pid: worker.pid,
                };
                state.leases.insert(
                    lease_id,
                    Lease {
                        worker: worker_id,
                        allocation,
                        holder: Some(conn_id),
                        lent: None,
                        bundle,
                    },
                );
                conn.respond(request, response);
            }
            LeaseFor::Actor(actor_id) => {
                worker.usage = WorkerUse::Actor(actor_id);
                state.leases.insert(
                    lease_id,
                    Lease {
                        worker: worker_id,
                        allocation,
                        holder: None,
                        lent: None,
                        bundle,
                    },
                );
                self.start_actor_on(state, actor_id, worker_id);
            }
        }
    }

    /// A leased worker comes back to the pool.
    pub(crate) fn return_lease(self: &Arc<Self>, lease_id: LeaseId) {
        let mut state = self.state.lock();
        if let Some(lease) = state.leases.remove(&lease_id) {
            release_lease(&mut state, &lease);
            if let Some(w) = state.workers.get_mut(&lease.worker) {
                if w.usage == WorkerUse::Leased(lease_id) {
                    w.set_idle();
                }
            }
            self.schedule(&mut state);
        }
    }

    /// A client connection closed: its leases and queued requests go.
    pub(crate) fn client_gone(self: &Arc<Self>, conn_id: u64) {
        let mut state = self.state.lock();
        let held: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, l)| l.holder == Some(conn_id))
            .map(|(id, _)| *id)
            .collect();
        for lease_id in held {
            if let Some(lease) = state.leases.remove(&lease_id) {
                release_lease(&mut state, &lease);
                if let Some(w) = state.workers.get_mut(&lease.worker) {
                    w.set_idle();
                }
            }
        }
        state.pending.retain(|p| match &p.lease_for {
            LeaseFor::Client { conn_id: c, .. } => *c != conn_id,
            LeaseFor::Actor(_) => true,
        });
        self.schedule(&mut state);
    }
}

impl Node {
    /// A leased worker started or stopped waiting for objects: its CPUs are
    /// lent to other tasks meanwhile, so nested `get`s cannot deadlock a
    /// full node.
    pub(crate) fn set_blocked(self: &Arc<Self>, worker_id: WorkerId, blocked: bool) {
        let mut state = self.state.lock();
        let State {
            workers,
            leases,
            resources,
            ..
        } = &mut *state;
        let Some(worker) = workers.get_mut(&worker_id) else {
            return;
        };
        tracing::debug!(worker = %worker_id, blocked, usage = ?worker.usage, "worker blocked state");
        worker.blocked = blocked;
        let WorkerUse::Leased(lease_id) = worker.usage else {
            return;
        };
        let Some(lease) = leases.get_mut(&lease_id) else {
            return;
        };
        // A blocked worker's CPUs go to the node even when its lease came
        // from a bundle: the tasks it waits for are not in its group.
        match (blocked, lease.lent.take()) {
            (true, None) => {
                let mut cpu = ResourceSet::new();
                cpu.set(CPU, lease.allocation.shape.get(CPU));
                resources.lend(&cpu);
                lease.lent = Some(cpu);
            }
            (false, Some(cpu)) => resources.take_back(&cpu),
            (_, still) => lease.lent = still,
        }
        self.schedule(&mut state);
    }
}

/// Returns a lease's resources, taking back first what its worker lent.
pub(crate) fn release_lease(state: &mut State, lease: &Lease) {
    // Lent CPUs went to the node (the tasks a blocked worker waits for are
    // not in its group), so they come back from the node.
    if let Some(cpu) = &lease.lent {
        state.resources.take_back(cpu);
    }
    state.release_to(lease.bundle, &lease.allocation);
    if let Some((group, _)) = lease.bundle {
        state.forget_if_done(group);
    }
}
