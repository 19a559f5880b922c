//! The raylet's server: one handler value per connection, serving each
//! request of the raylet's service through its `Serve` implementation
//! (the `RayletServer` trait holds only when every request is served).
//!
//! A connection is a driver or a worker (after its `Register*` request).
//! The handler remembers which, and which objects the peer has pinned, so
//! that a peer that disconnects (or dies) leaves no pins or leases behind.
//! Each request comes with its typed [`Answer`]; requests that wait (a
//! lease, an actor or a group to be ready) keep it, as a [`ReplyTo`] where
//! a component holds answers to several kinds of request, to answer later.

mod placing;
use crate::drivers::DriverEntry;
use crate::membership::MemberNode;
use crate::node::{Job, Node};
use crate::placement::LocalGroups;
use crate::reply::ReplyTo;
use crate::scheduler::{Grantee, LeaseRequest};
use bytes::Bytes;
use parking_lot::Mutex;
use placing::accept_named_actor;
use prism_object_store::{Creator, Pin, Placement};
use prism_protocol::error::{Error, Result};
use prism_protocol::ids::{JobId, ObjectId, WorkerId};
use prism_protocol::messages::{
    ActorPlacement, ActorSpec, BundleRef, Call, CancelLeaseRequests, ClusterResources,
    CommitBundles, CreateActor, CreateObject, CreatePlacementGroup, DeleteObjects, EnvVars,
    ExitActor, GetActor, GetClusterResources, GetNamedActor, GetNodes, GetObject,
    GetPlacementGroup, GetStoreStats, KillActor, KvDelete, KvGet, KvKeys, KvPut, LeaseReply,
    ListPlacementGroups, MoveBundles, NodeInfo, ObjectLocation, Ownership, PrepareBundles,
    PullObject, RegisterDriver, RegisterWorker, Registration, ReleaseObject, RemovePlacementGroup,
    ReportTaskCounts, Request, RequestLease, Response, ReturnLease, SchedulingStrategy, SealObject,
    WorkerBlocked, WorkerExitReason, ACTOR_CHECKPOINT_PREFIX, MAX_LEASE_HOPS,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Handler};
use prism_protocol::serve::{Answer, Serve};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy)]
enum Role {
    Unregistered,
    Driver(JobId),
    Worker(JobId, WorkerId),
    /// A process of another node leasing workers here for its job.
    Lessee(JobId),
    /// The connection closed (a registration finishing later must not
    /// register it).
    Closed,
}

struct ClientHandler {
    node: Arc<Node>,
    conn_id: u64,
    role: Arc<Mutex<Role>>,
    /// Objects this connection's process reads, with their pin counts.
    /// `None` once the connection closed: a pin that a restore finishes
    /// later is dropped at once instead of being left with no one to
    /// release it.
    pins: Arc<Mutex<Option<HashMap<ObjectId, u64>>>>,
    /// The address of the driver or worker on this connection: the task
    /// results it owns are freed when it closes.
    address: Mutex<Option<String>>,
    /// A driver's record in the head's job list (in a cluster).
    driver: Mutex<Option<DriverEntry>>,
}

pub(crate) fn handler(node: &Arc<Node>) -> Arc<dyn Handler> {
    Arc::new(ClientHandler {
        node: node.clone(),
        conn_id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
        role: Arc::new(Mutex::new(Role::Unregistered)),
        pins: Arc::new(Mutex::new(Some(HashMap::new()))),
        address: Mutex::new(None),
        driver: Mutex::new(None),
    })
}

impl Handler for ClientHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        match request {
            Request::Raylet(request) => request.dispatch(self, conn, id),
            other => conn.respond(
                id,
                Response::Error(Error::NotServed {
                    service: "the raylet".into(),
                    request: format!("{other:?}"),
                }),
            ),
        }
    }

    fn closed(&self, _conn: &Connection) {
        let address = self.address.lock().take();
        let pins: Vec<(ObjectId, u64)> = self
            .pins
            .lock()
            .take()
            .map(|held| held.into_iter().collect())
            .unwrap_or_default();
        self.node
            .store
            .client_gone(self.creator(), address.as_deref(), pins);
        // What it owned on other nodes goes too: tell them.
        if let (Some(address), Some(m)) = (address, self.node.membership.get()) {
            m.owner_exited(address);
        }
        let holder = self.conn_id;
        self.node.tasks.reporter_gone(holder);
        self.node.verbs().client_gone(holder);
        let role = std::mem::replace(&mut *self.role.lock(), Role::Closed);
        match role {
            Role::Driver(job) => {
                self.node.end_job(job);
                let entry = self.driver.lock().take();
                if let (Some(entry), Some(m)) = (entry, self.node.membership.get()) {
                    entry.ended(m);
                }
            }
            Role::Lessee(job) => self.node.lessee_gone(job),
            _ => {}
        }
    }
}

impl ClientHandler {
    /// This connection as the creator of the objects it writes.
    fn creator(&self) -> Creator {
        Creator(self.conn_id)
    }

    fn job(&self) -> Result<JobId, Error> {
        match *self.role.lock() {
            Role::Driver(j) | Role::Worker(j, _) | Role::Lessee(j) => Ok(j),
            Role::Unregistered | Role::Closed => Err(Error::NotRegistered),
        }
    }

    fn handle_request_lease(
        &self,
        shape: ResourceSet,
        bundle: Option<BundleRef>,
        strategy: SchedulingStrategy,
        env: EnvVars,
        hops: u32,
        reply: ReplyTo,
    ) {
        if let Some(e) = crate::faults::injected("lease_grant") {
            return reply.send(Response::Error(e));
        }
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return reply.send(Response::Error(e)),
        };
        // A local client's request may go to another node (a request from
        // another node goes on only from its queue here, and bundles stay
        // on their node).
        let local = !matches!(*self.role.lock(), Role::Lessee(_));
        // A bundle of a group over several nodes is leased on its node; one
        // this node holds is queued here at once.
        let elsewhere = |b: &BundleRef| {
            local
                && self.node.membership.get().is_some()
                && self.node.verbs().bundle_node(*b) != Some(None)
        };
        if let Some(b) = bundle.filter(elsewhere) {
            let (node, holder) = (self.node.clone(), self.conn_id);
            tokio::spawn(async move {
                match node.groups().route_bundle(b).await {
                    Ok(Some((raylet, node_id))) => {
                        reply.send(Response::Lease(LeaseReply::Spillback { raylet, node_id }))
                    }
                    Ok(None) => node
                        .verbs()
                        .request_lease(kept_here(shape, job, env, bundle, holder, reply)),
                    Err(e) => reply.send(Response::Error(e)),
                }
            });
            return;
        }
        let mut wait_for_node_until = None;
        if local && bundle.is_none() {
            match self.node.place(&shape, strategy) {
                Ok(None) => {}
                Ok(Some((raylet, node_id))) => {
                    return reply.send(Response::Lease(LeaseReply::Spillback { raylet, node_id }))
                }
                // No live node holds it; in a cluster that may grow, it
                // waits for one (as demand the autoscaler sees).
                Err(Error::Infeasible { .. })
                    if !self.node.config.infeasible_wait.is_zero()
                        && self.node.membership.get().is_some()
                        && !matches!(strategy, SchedulingStrategy::NodeAffinity { .. }) =>
                {
                    wait_for_node_until =
                        Some(std::time::Instant::now() + self.node.config.infeasible_wait);
                }
                // A node this one has not heard of yet (it joined since the
                // last heartbeat's answer) is looked for with a fresh view
                // before the request fails.
                Err(Error::AffinityNodeNotAlive { .. }) if self.node.membership.get().is_some() => {
                    let (node, holder) = (self.node.clone(), self.conn_id);
                    tokio::spawn(async move {
                        if let Some(m) = node.membership.get() {
                            m.fresh_view().await;
                        }
                        match node.place(&shape, strategy) {
                            Ok(Some((raylet, node_id))) => reply
                                .send(Response::Lease(LeaseReply::Spillback { raylet, node_id })),
                            Ok(None) => node
                                .verbs()
                                .request_lease(kept_here(shape, job, env, bundle, holder, reply)),
                            Err(e) => reply.send(Response::Error(e)),
                        }
                    });
                    return;
                }
                Err(e) => return reply.send(Response::Error(e)),
            }
        }
        // Another node's request, sent here, may go on again while it
        // waits here and a node has room (a view that lagged sent it).
        let may_spill = (local || hops < MAX_LEASE_HOPS)
            && bundle.is_none()
            && self.node.membership.get().is_some()
            && !matches!(strategy, SchedulingStrategy::NodeAffinity { .. });
        let request = LeaseRequest {
            shape,
            job,
            env,
            bundle,
            grantee: Grantee::Client {
                holder: self.conn_id,
                reply,
            },
            may_spill,
            asked_at: std::time::Instant::now(),
            wait_for_node_until,
        };
        self.node.verbs().request_lease(request);
    }

    /// A process of another node will lease workers here: answered once
    /// this node has the job's program (fetched from that process if need
    /// be, which may take a while).
    fn handle_register_lessee(&self, r: RegisterDriver, answer: Answer<RegisterDriver>) {
        let (node, role, conn) = (self.node.clone(), self.role.clone(), answer.conn().clone());
        tokio::spawn(async move {
            let registered = async {
                let RegisterDriver {
                    pid,
                    executable,
                    cwd,
                    log_to_driver,
                    namespace,
                    job_id,
                    program,
                    env_vars,
                    ..
                } = r;
                let job_id = job_id.ok_or(Error::NotRegistered)?;
                // Until the program is here, work is on its way to this
                // node that shows nowhere else: it counts as demand of no
                // resources, so that an autoscaler does not take the node
                // for idle meanwhile.
                let fetching = node.awaiting.enter(ResourceSet::new());
                let executable = (node.programs)
                    .program_file(executable, program, &conn)
                    .await?;
                drop(fetching);
                // The driver's folder may not exist on this machine.
                let cwd = if cwd.is_dir() {
                    cwd
                } else {
                    node.config.session_dir.clone()
                };
                let mut role = role.lock();
                if matches!(*role, Role::Closed) {
                    return Err(Error::Disconnected {
                        peer: conn.peer().to_string(),
                    });
                }
                node.add_lessee(
                    job_id,
                    Job {
                        executable,
                        cwd,
                        driver: conn.clone(),
                        log_to_driver,
                        namespace,
                        env_vars,
                    },
                );
                *role = Role::Lessee(job_id);
                tracing::info!(job = %job_id, pid, "a process of another node leases workers here");
                Ok(node.registration(job_id))
            };
            answer.send(registered.await);
        });
    }

    fn handle_register_driver(&self, conn: &Connection, r: RegisterDriver) -> Result<Registration> {
        let RegisterDriver {
            address: r_address,
            pid,
            executable,
            cwd,
            log_to_driver,
            namespace,
            env_vars,
            submission_id,
            ..
        } = r;
        let job_id = JobId::new();
        *self.role.lock() = Role::Driver(job_id);
        *self.address.lock() = Some(r_address);
        tracing::info!(job = %job_id, pid, executable = %executable.display(), "driver registered");
        self.node.register_job(
            job_id,
            Job {
                executable,
                cwd,
                driver: conn.clone(),
                log_to_driver,
                namespace,
                env_vars,
            },
        );
        if let Some(m) = self.node.membership.get() {
            *self.driver.lock() = Some(DriverEntry::started(m, job_id, pid, submission_id));
        }
        Ok(self.node.registration(job_id))
    }

    fn handle_register_worker(&self, conn: &Connection, r: RegisterWorker) -> Result<Registration> {
        let worker_id = r.worker_id;
        *self.address.lock() = Some(r.address.clone());
        let job = self
            .node
            .register_worker(worker_id, r.address, r.pid, conn)?;
        *self.role.lock() = Role::Worker(job, worker_id);
        Ok(self.node.registration(job))
    }

    fn handle_create_object(
        &self,
        id: ObjectId,
        size: u64,
        owner: Ownership,
        answer: Answer<CreateObject>,
    ) {
        let creator = self.creator();
        let placement = match self.node.store.try_create(id, size, creator, Some(&owner)) {
            Err(Error::ObjectStoreFull { .. }) if self.node.store.spill_config.enabled => {
                return self.create_later(id, size, owner, answer);
            }
            // A copy an earlier attempt left is in use or still written.
            Err(_) if self.node.store.lock().busy(id, creator) => {
                return self.create_later(id, size, owner, answer)
            }
            other => other,
        };
        answer.send(placement.map(location));
    }

    /// Answers a create once spilling made room, or once the copy it
    /// replaces is no longer in use.
    fn create_later(
        &self,
        id: ObjectId,
        size: u64,
        owner: Ownership,
        answer: Answer<CreateObject>,
    ) {
        let (node, creator) = (self.node.clone(), self.creator());
        tokio::spawn(async move {
            let created = node
                .store
                .create_object(id, size, creator, Some(&owner))
                .await;
            answer.send(created.map(location));
        });
    }

    /// Pins the object for this connection until it releases it or closes.
    fn handle_get_object(&self, id: ObjectId, answer: Answer<GetObject>) {
        let now = self.node.store.lock().pin(id);
        let placement = match now {
            Ok(Pin::Pinned(p)) => Ok(p),
            Ok(Pin::OnDisk | Pin::Restoring) => {
                let (node, pins) = (self.node.clone(), self.pins.clone());
                tokio::spawn(async move {
                    let pinned = node.store.pin_object(id).await;
                    if pinned.is_ok() && !hold_pin(&pins, id) {
                        // Its reader left while it was restored.
                        node.store.lock().unpin(id);
                        return;
                    }
                    answer.send(pinned.map(location));
                });
                return;
            }
            Err(e) => Err(e),
        };
        if placement.is_ok() && !hold_pin(&self.pins, id) {
            self.node.store.lock().unpin(id);
            return;
        }
        answer.send(placement.map(location));
    }

    fn handle_release_object(&self, id: ObjectId) {
        let mut pins = self.pins.lock();
        let Some(held) = pins.as_mut() else {
            return;
        };
        if let Some(n) = held.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                held.remove(&id);
            }
            self.node.store.lock().unpin(id);
        }
    }

    /// Whether this client's requests about actors this node does not
    /// hold are asked of the other nodes: yes for this node's drivers and
    /// workers and for lessees, never for another raylet asking (it asks
    /// the others itself).
    fn asks_others(&self) -> bool {
        !matches!(*self.role.lock(), Role::Unregistered | Role::Closed)
    }

    /// Takes an actor here, or (for a local client, by the actor's
    /// strategy or its placement-group bundle) names the node that should.
    /// In a cluster, a named actor's name is claimed in the head's
    /// directory by the node that takes it.
    fn handle_create_actor(&self, spec: ActorSpec, answer: Answer<CreateActor>) {
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return answer.send(Err(e)),
        };
        let local = !matches!(*self.role.lock(), Role::Lessee(_));
        let lessee = (!local).then(|| answer.conn().clone());
        let cluster = self.node.membership.get().is_some();
        let bundle = spec.options.placement.filter(|_| local && cluster);
        let named = cluster && spec.options.name.is_some();
        // In a cluster that may grow, an actor no live node holds waits.
        let may_wait = cluster && !self.node.config.infeasible_wait.is_zero();
        let affinity = matches!(
            spec.options.strategy,
            SchedulingStrategy::NodeAffinity { soft: false, .. }
        );
        // Pinned to a node, it may need a fresh view of the cluster.
        let pinned = affinity && cluster;
        if bundle.is_none() && !named && !may_wait && !pinned {
            return answer.send(self.node.accept_actor(job, spec, lessee));
        }
        let node = self.node.clone();
        tokio::spawn(async move {
            let routed = match bundle {
                Some(b) => node.groups().route_bundle(b).await,
                None => Ok(None),
            };
            let placed = match routed {
                Ok(Some((raylet, node_id))) => Ok(ActorPlacement::Elsewhere { raylet, node_id }),
                Ok(None) => accept_named_actor(&node, job, spec, lessee).await,
                Err(e) => Err(e),
            };
            answer.send(placed);
        });
    }

    /// Finds a named actor here, or in a cluster through the head's
    /// directory of names, on the node that holds it.
    fn handle_get_named_actor(&self, request: GetNamedActor, answer: Answer<GetNamedActor>) {
        let here = self.node.get_named_actor(&request.name, &request.namespace);
        match (here, self.node.membership.get()) {
            (Err(e), Some(_)) if self.asks_others() => {
                let node = self.node.clone();
                tokio::spawn(async move {
                    let found = node.names.find(request).await;
                    answer.send(found.and_then(|f| f.ok_or(e)));
                });
            }
            (here, _) => answer.send(here),
        }
    }

    /// An actor's state, from this node when it holds the actor; in a
    /// cluster, from the node the caller names when that node holds it,
    /// and otherwise from whichever other node holds it (every one is
    /// asked).
    fn handle_get_actor(&self, request: GetActor, answer: Answer<GetActor>) {
        let asks_others = self.asks_others();
        let GetActor {
            actor_id,
            wait,
            node_id,
        } = request;
        let named = match (self.node.membership.get(), node_id) {
            (Some(m), Some(n)) if asks_others && self.node.actor_info(actor_id).is_none() => {
                (m.raylet_of(&n).is_some()).then(|| {
                    m.ask_node(
                        &n,
                        GetActor {
                            actor_id,
                            wait,
                            node_id: None,
                        },
                    )
                })
            }
            _ => None,
        };
        let Some(asking) = named else {
            return (self.node).get_actor(actor_id, wait, asks_others, answer.into());
        };
        let node = self.node.clone();
        tokio::spawn(async move {
            match asking.await {
                Ok(info) => answer.send(Ok(info)),
                Err(e) => {
                    tracing::debug!(actor = %actor_id, error = %e, "the node named for an actor does not hold it; asking every node");
                    node.get_actor(actor_id, wait, true, answer.into())
                }
            }
        });
    }

    /// Kills an actor here, or in a cluster on the node that holds it: the
    /// node the caller names, when it is alive and holds the actor, and
    /// otherwise whichever other node holds it (every one is asked).
    fn handle_kill_actor(&self, request: KillActor, answer: Answer<KillActor>) {
        let here = self
            .node
            .kill_actor(request.actor_id, request.no_restart, request.out_of_scope);
        match (here, self.node.membership.get()) {
            (Err(e), Some(m)) if self.asks_others() => {
                let named = (request.node_id.as_deref())
                    .filter(|n| m.raylet_of(n).is_some())
                    .map(|n| m.ask_node(n, request.clone()));
                let node = self.node.clone();
                tokio::spawn(async move {
                    if let Some(asking) = named {
                        match asking.await {
                            Ok(()) => return answer.send(Ok(())),
                            Err(e) => {
                                tracing::debug!(actor = %request.actor_id, error = %e, "the node named for an actor does not hold it; asking every node")
                            }
                        }
                    }
                    let Some(m) = node.membership.get() else {
                        return answer.send(Err(e));
                    };
                    answer.send(m.ask_others(request).await.ok_or(e))
                });
            }
            (here, _) => answer.send(here),
        }
    }

    fn handle_get_cluster_resources(&self) -> Result<ClusterResources> {
        if let Some((total, available)) = self
            .node
            .membership
            .get()
            .and_then(|m| m.cluster_resources())
        {
            return Ok(ClusterResources { total, available });
        }
        let (total, available) = self.node.verbs().resources();
        Ok(ClusterResources { total, available })
    }
}

// Answered later, when a worker, the actor or the group is ready.

impl Serve<RequestLease> for ClientHandler {
    fn serve(&self, r: RequestLease, answer: Answer<RequestLease>) {
        let (shape, bundle, strategy, env) = (r.shape, r.bundle, r.strategy, r.env_vars);
        self.handle_request_lease(shape, bundle, strategy, env, r.hops, answer.into())
    }
}

impl Serve<GetActor> for ClientHandler {
    fn serve(&self, r: GetActor, answer: Answer<GetActor>) {
        self.handle_get_actor(r, answer)
    }
}

impl Serve<GetPlacementGroup> for ClientHandler {
    fn serve(&self, r: GetPlacementGroup, answer: Answer<GetPlacementGroup>) {
        let asks_others = self.asks_others();
        self.node
            .groups()
            .get_placement_group(r.id, r.wait_ms, asks_others, answer.into())
    }
}

/// Every node of the cluster (from the head), or this node alone when it
/// is not part of one.
impl Serve<GetNodes> for ClientHandler {
    fn serve(&self, _: GetNodes, answer: Answer<GetNodes>) {
        let node = self.node.clone();
        tokio::spawn(async move {
            answer.send(match node.membership.get() {
                Some(m) => m.nodes().await,
                None => Ok(vec![local_node(&node)]),
            });
        });
    }
}

impl Serve<ListPlacementGroups> for ClientHandler {
    fn serve(&self, r: ListPlacementGroups, answer: Answer<ListPlacementGroups>) {
        let everywhere = r.everywhere && self.asks_others();
        self.node.groups().list_groups(everywhere, answer)
    }
}

// Registrations.

impl Serve<RegisterDriver> for ClientHandler {
    fn serve(&self, r: RegisterDriver, answer: Answer<RegisterDriver>) {
        if r.job_id.is_some() {
            return self.handle_register_lessee(r, answer);
        }
        let registered = self.handle_register_driver(answer.conn(), r);
        answer.send(registered)
    }
}

impl Serve<RegisterWorker> for ClientHandler {
    fn serve(&self, r: RegisterWorker, answer: Answer<RegisterWorker>) {
        let registered = self.handle_register_worker(answer.conn(), r);
        answer.send(registered)
    }
}

// Leases and workers, answered now.

impl Serve<ReturnLease> for ClientHandler {
    fn serve(&self, r: ReturnLease, answer: Answer<ReturnLease>) {
        (self.node.verbs()).return_lease(r.lease_id, r.unreachable);
        answer.send(Ok(()))
    }
}

impl Serve<CancelLeaseRequests> for ClientHandler {
    fn serve(&self, r: CancelLeaseRequests, answer: Answer<CancelLeaseRequests>) {
        let withdrawn =
            (self.node.verbs()).cancel_requests(self.conn_id, &r.shape, r.bundle, &r.env_vars);
        for reply in withdrawn {
            reply.send(Response::Lease(LeaseReply::Cancelled));
        }
        answer.send(Ok(()))
    }
}

impl Serve<WorkerBlocked> for ClientHandler {
    fn serve(&self, r: WorkerBlocked, answer: Answer<WorkerBlocked>) {
        if let Role::Worker(_, worker) = *self.role.lock() {
            tracing::debug!(%worker, blocked = r.blocked, "worker blocked state");
            self.node.verbs().set_blocked(worker, r.blocked);
        }
        answer.send(Ok(()))
    }
}

impl Serve<ReportTaskCounts> for ClientHandler {
    fn serve(&self, r: ReportTaskCounts, answer: Answer<ReportTaskCounts>) {
        (self.node.task_totals).add(r.counts, &r.latencies, r.retries, r.rebuilt);
        if let Some(now) = r.pending {
            self.node.tasks.set_pending(self.conn_id, now);
        }
        (self.node.tasks).add(r.events, r.dropped, &r.worker_id, r.runs, r.running);
        answer.send(Ok(()))
    }
}

// The object store: answered now, or once spilling made room or a
// restore ended.

impl Serve<CreateObject> for ClientHandler {
    fn serve(&self, r: CreateObject, answer: Answer<CreateObject>) {
        self.handle_create_object(r.id, r.size, r.owner, answer)
    }
}

impl Serve<GetObject> for ClientHandler {
    fn serve(&self, r: GetObject, answer: Answer<GetObject>) {
        self.handle_get_object(r.id, answer)
    }
}

impl Serve<SealObject> for ClientHandler {
    fn serve(&self, r: SealObject, answer: Answer<SealObject>) {
        answer.send(match crate::faults::injected("object_seal") {
            Some(e) => Err(e),
            None => self.node.store.seal(r.id, self.creator()),
        })
    }
}

impl Serve<ReleaseObject> for ClientHandler {
    fn serve(&self, r: ReleaseObject, answer: Answer<ReleaseObject>) {
        self.handle_release_object(r.id);
        answer.send(Ok(()))
    }
}

impl Serve<DeleteObjects> for ClientHandler {
    fn serve(&self, r: DeleteObjects, answer: Answer<DeleteObjects>) {
        self.node.transfers.free_objects(r.ids, r.node);
        answer.send(Ok(()))
    }
}

impl Serve<PullObject> for ClientHandler {
    fn serve(&self, r: PullObject, answer: Answer<PullObject>) {
        (self.node.transfers).pull_object(r.id, r.node, r.size, r.owner, answer.into())
    }
}

impl Serve<GetStoreStats> for ClientHandler {
    fn serve(&self, _: GetStoreStats, answer: Answer<GetStoreStats>) {
        answer.send(Ok(self.node.store.stats(self.node.transfers.bytes())))
    }
}

// Actors.

impl Serve<CreateActor> for ClientHandler {
    fn serve(&self, r: CreateActor, answer: Answer<CreateActor>) {
        self.handle_create_actor(r.spec, answer)
    }
}

impl Serve<GetNamedActor> for ClientHandler {
    fn serve(&self, r: GetNamedActor, answer: Answer<GetNamedActor>) {
        self.handle_get_named_actor(r, answer)
    }
}

impl Serve<WorkerExitReason> for ClientHandler {
    fn serve(&self, r: WorkerExitReason, answer: Answer<WorkerExitReason>) {
        answer.send(Ok(self.node.worker_exit_reason(r.worker_id)))
    }
}

impl Serve<KillActor> for ClientHandler {
    fn serve(&self, r: KillActor, answer: Answer<KillActor>) {
        self.handle_kill_actor(r, answer)
    }
}

impl Serve<ExitActor> for ClientHandler {
    fn serve(&self, r: ExitActor, answer: Answer<ExitActor>) {
        answer.send(self.node.exit_actor(r.actor_id))
    }
}

// Resources and placement groups.

impl Serve<GetClusterResources> for ClientHandler {
    fn serve(&self, _: GetClusterResources, answer: Answer<GetClusterResources>) {
        answer.send(self.handle_get_cluster_resources())
    }
}

impl Serve<CreatePlacementGroup> for ClientHandler {
    fn serve(&self, r: CreatePlacementGroup, answer: Answer<CreatePlacementGroup>) {
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return answer.send(Err(e)),
        };
        let retry = self.node.membership.get().map(|_| r.spec.clone());
        match (self.node.groups().create_group(job, r.spec), retry) {
            // No live nodes this one knows of hold it: nodes that joined
            // since the last heartbeat's answer may, so it is tried again
            // with a fresh view before it fails.
            (Err(Error::Infeasible { .. }), Some(spec)) => {
                let node = self.node.clone();
                tokio::spawn(async move {
                    if let Some(m) = node.membership.get() {
                        m.fresh_view().await;
                    }
                    answer.send(node.groups().create_group(job, spec));
                });
            }
            (created, _) => answer.send(created),
        }
    }
}

impl Serve<RemovePlacementGroup> for ClientHandler {
    fn serve(&self, r: RemovePlacementGroup, answer: Answer<RemovePlacementGroup>) {
        self.node.groups().remove_group(r.id, self.asks_others());
        answer.send(Ok(()))
    }
}

impl Serve<PrepareBundles> for ClientHandler {
    fn serve(&self, r: PrepareBundles, answer: Answer<PrepareBundles>) {
        answer.send(self.node.verbs().prepare_shard(r.job, r.spec, r.nodes))
    }
}

impl Serve<CommitBundles> for ClientHandler {
    fn serve(&self, r: CommitBundles, answer: Answer<CommitBundles>) {
        answer.send(self.node.verbs().commit_shard(r.id))
    }
}

impl Serve<MoveBundles> for ClientHandler {
    fn serve(&self, r: MoveBundles, answer: Answer<MoveBundles>) {
        answer.send(self.node.verbs().move_bundles(r.job, r.spec, r.nodes))
    }
}

// The key-value table: in a cluster, the head's.

impl Serve<KvPut> for ClientHandler {
    fn serve(&self, r: KvPut, answer: Answer<KvPut>) {
        if r.key.starts_with(ACTOR_CHECKPOINT_PREFIX) {
            if let Some(e) = crate::faults::injected("checkpoint_commit") {
                return answer.send(Err(e));
            }
        }
        match self.node.membership.get() {
            Some(m) => {
                let mut gcs = m.gcs();
                answer_later(answer, async move {
                    gcs.kv_put(r.key, r.value.to_vec(), r.overwrite).await
                })
            }
            None => answer.send(Ok(self.node.kv.lock().put(r.key, r.value, r.overwrite))),
        }
    }
}

impl Serve<KvGet> for ClientHandler {
    fn serve(&self, r: KvGet, answer: Answer<KvGet>) {
        match self.node.membership.get() {
            Some(m) => {
                let mut gcs = m.gcs();
                answer_later(answer, async move {
                    gcs.kv_get(r.key).await.map(|v| v.map(Bytes::from))
                })
            }
            None => answer.send(Ok(self.node.kv.lock().get(&r.key))),
        }
    }
}

impl Serve<KvDelete> for ClientHandler {
    fn serve(&self, r: KvDelete, answer: Answer<KvDelete>) {
        match self.node.membership.get() {
            Some(m) => {
                let mut gcs = m.gcs();
                answer_later(answer, async move { gcs.kv_delete(r.key).await })
            }
            None => answer.send(Ok(self.node.kv.lock().delete(&r.key))),
        }
    }
}

impl Serve<KvKeys> for ClientHandler {
    fn serve(&self, r: KvKeys, answer: Answer<KvKeys>) {
        match self.node.membership.get() {
            Some(m) => {
                let mut gcs = m.gcs();
                answer_later(answer, async move { gcs.kv_keys(r.prefix).await })
            }
            None => answer.send(Ok(self.node.kv.lock().keys(&r.prefix))),
        }
    }
}

/// Counts a pin for the connection whose pins these are; false if it has
/// closed (the caller unpins).
/// A client's lease request queued here for good: never sent on to
/// another node, never waiting for one to join.
fn kept_here(
    shape: ResourceSet,
    job: JobId,
    env: EnvVars,
    bundle: Option<BundleRef>,
    holder: u64,
    reply: ReplyTo,
) -> LeaseRequest<ReplyTo> {
    LeaseRequest {
        shape,
        job,
        env,
        bundle,
        grantee: Grantee::Client { holder, reply },
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
    }
}

fn hold_pin(pins: &Mutex<Option<HashMap<ObjectId, u64>>>, id: ObjectId) -> bool {
    match pins.lock().as_mut() {
        Some(held) => {
            *held.entry(id).or_default() += 1;
            true
        }
        None => false,
    }
}

/// The local node alone, for a raylet that is not part of a cluster.
fn local_node(node: &Arc<Node>) -> NodeInfo {
    let (total, available) = node.resources();
    NodeInfo {
        node_id: node.node_id.to_string(),
        node_ip: "127.0.0.1".into(),
        hostname: crate::membership::hostname(),
        is_head: true,
        alive: true,
        death_cause: String::new(),
        total,
        available,
    }
}

/// The node's own actors, as its names component reads them.
/// Sends `answer` once a call to the head's control store returns.
fn answer_later<C: Call + 'static>(
    answer: Answer<C>,
    call: impl std::future::Future<Output = std::result::Result<C::Reply, prism_gcs::GcsError>>
        + Send
        + 'static,
) where
    C::Reply: Send,
{
    tokio::spawn(async move { answer.send(call.await.map_err(Error::from)) });
}

fn location(p: Placement) -> ObjectLocation {
    ObjectLocation {
        offset: p.offset,
        size: p.size,
    }
}
