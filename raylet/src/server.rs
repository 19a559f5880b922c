//! The raylet's server: one handler value per connection, and one
//! `handle_<message>` function per request.
//!
//! A connection is a driver or a worker (after its `Register*` request).
//! The handler remembers which, and which objects the peer has pinned, so
//! that a peer that disconnects (or dies) leaves no pins or leases behind.
//! Requests that wait (a lease, an actor or a group to be ready) are given
//! a [`ReplyTo`] to answer later; the rest are answered at once.

use crate::drivers::DriverEntry;
use crate::node::{Job, Node};
use crate::reply::ReplyTo;
use crate::scheduler::{Grantee, LeaseRequest};
use bytes::Bytes;
use parking_lot::Mutex;
use prism_object_store::{Creator, Pin, Placement};
use prism_protocol::error::{Error, Result};
use prism_protocol::ids::{JobId, LeaseId, ObjectId, PlacementGroupId, WorkerId};
use prism_protocol::messages::{
    ActorPlacement, ActorSpec, BundleRef, ClusterResources, EnvVars, GetActor, GetNamedActor,
    GetPlacementGroup, KillActor, LeaseReply, ObjectLocation, Ownership, PlacementGroupSpec,
    RayletRequest, RegisterDriver, RegisterWorker, Registration, Reply, Request, RequestLease,
    Response, SchedulingStrategy, ACTOR_CHECKPOINT_PREFIX,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Handler};
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
        let reply = ReplyTo::new(conn, id);
        let request = match request {
            Request::Raylet(request) => request,
            other => {
                return reply.send(Response::Error(Error::NotServed {
                    service: "the raylet".into(),
                    request: format!("{other:?}"),
                }))
            }
        };
        use RayletRequest as R;
        let answer = match request {
            // Answered later, when a worker, the actor or the group is ready.
            R::RequestLease(RequestLease {
                shape,
                bundle,
                strategy,
                env_vars,
            }) => return self.handle_request_lease(shape, bundle, strategy, env_vars, reply),
            R::GetActor(GetActor { actor_id, wait }) => {
                return self
                    .node
                    .get_actor(actor_id, wait, self.asks_others(), reply)
            }
            R::GetPlacementGroup(GetPlacementGroup { id: group, wait_ms }) => {
                return self
                    .node
                    .get_placement_group(group, wait_ms, self.asks_others(), reply)
            }
            R::GetNodes(_) => return self.node.get_nodes(reply),
            R::ListPlacementGroups(r) => {
                return self
                    .node
                    .list_groups(r.everywhere && self.asks_others(), reply)
            }
            // Answered now.
            R::RegisterDriver(r) if r.job_id.is_some() => {
                return self.handle_register_lessee(conn, r, reply)
            }
            R::RegisterDriver(r) => answer(self.handle_register_driver(conn, r)),
            R::RegisterWorker(r) => answer(self.handle_register_worker(conn, r)),
            R::ReturnLease(r) => answer(self.handle_return_lease(r.lease_id, r.unreachable)),
            R::CancelLeaseRequests(r) => {
                answer(self.handle_cancel_lease_requests(r.shape, r.bundle, r.env_vars))
            }
            R::WorkerBlocked(r) => answer(self.handle_worker_blocked(r.blocked)),
            // Answered now, or once spilling made room or a restore ended.
            R::CreateObject(r) => return self.handle_create_object(r.id, r.size, r.owner, reply),
            R::GetObject(r) => return self.handle_get_object(r.id, reply),
            R::SealObject(r) => answer(match crate::faults::injected("object_seal") {
                Some(e) => Err(e),
                None => self.node.store.seal(r.id, self.creator()),
            }),
            R::ReleaseObject(r) => answer(self.handle_release_object(r.id)),
            R::DeleteObjects(r) => answer(self.handle_delete_objects(r.ids, r.node)),
            R::PullObject(r) => return self.node.pull_object(r.id, r.node, r.size, r.owner, reply),
            R::OwnerExited(r) => answer({
                self.node.store.owner_exited(&r.address);
                Ok(())
            }),
            R::GetStoreStats(_) => answer(Ok(self.node.store.stats(self.node.transfers.bytes()))),
            R::ReportTaskCounts(r) => answer({
                (self.node.task_totals).add(r.counts, &r.latencies, r.retries, r.rebuilt);
                if let Some(now) = r.pending {
                    self.node.tasks.set_pending(self.conn_id, now);
                }
                (self.node.tasks).add(r.events, r.dropped, &r.worker_id, r.runs, r.running);
                Ok(())
            }),
            R::CreateActor(r) => return self.handle_create_actor(r.spec, conn, reply),
            R::GetNamedActor(r) => return self.handle_get_named_actor(r, reply),
            R::WorkerExitReason(r) => answer(Ok(self.node.worker_exit_reason(r.worker_id))),
            R::KillActor(r) => return self.handle_kill_actor(r, reply),
            R::ExitActor(r) => answer(self.node.exit_actor(r.actor_id)),
            R::GetClusterResources(_) => answer(self.handle_get_cluster_resources()),
            R::CreatePlacementGroup(r) => answer(self.handle_create_placement_group(r.spec)),
            R::RemovePlacementGroup(r) => answer(self.handle_remove_placement_group(r.id)),
            R::PrepareBundles(r) => answer(self.node.control(|c| {
                let here = self.node.node_id.to_string();
                c.scheduler.prepare_shard(r.job, r.spec, r.nodes, &here)
            })),
            R::CommitBundles(r) => answer(self.node.control(|c| c.scheduler.commit_shard(r.id))),
            R::MoveBundles(r) => answer(self.node.control(|c| {
                let here = self.node.node_id.to_string();
                c.scheduler.move_bundles(r.job, r.spec, r.nodes, &here)
            })),
            // In a cluster the table is the head's.
            R::KvPut(r) => {
                let fault = if r.key.starts_with(ACTOR_CHECKPOINT_PREFIX) {
                    crate::faults::injected("checkpoint_commit")
                } else {
                    None
                };
                match (fault, self.node.membership.get()) {
                    (Some(e), _) => answer::<bool>(Err(e)),
                    (None, Some(m)) => {
                        let mut gcs = m.gcs();
                        return answer_later(reply, async move {
                            gcs.kv_put(r.key, r.value.to_vec(), r.overwrite).await
                        });
                    }
                    (None, None) => {
                        answer(Ok(self.node.kv.lock().put(r.key, r.value, r.overwrite)))
                    }
                }
            }
            R::KvGet(r) => match self.node.membership.get() {
                Some(m) => {
                    let mut gcs = m.gcs();
                    return answer_later(reply, async move {
                        gcs.kv_get(r.key).await.map(|v| v.map(Bytes::from))
                    });
                }
                None => answer(Ok(self.node.kv.lock().get(&r.key))),
            },
            R::KvDelete(r) => match self.node.membership.get() {
                Some(m) => {
                    let mut gcs = m.gcs();
                    return answer_later(reply, async move { gcs.kv_delete(r.key).await });
                }
                None => answer(Ok(self.node.kv.lock().delete(&r.key))),
            },
            R::KvKeys(r) => match self.node.membership.get() {
                Some(m) => {
                    let mut gcs = m.gcs();
                    return answer_later(reply, async move { gcs.kv_keys(r.prefix).await });
                }
                None => answer(Ok(self.node.kv.lock().keys(&r.prefix))),
            },
        };
        reply.send(answer);
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
            let telling = m.ask_all(prism_protocol::messages::OwnerExited { address });
            tokio::spawn(telling);
        }
        let holder = self.conn_id;
        self.node.tasks.reporter_gone(holder);
        self.node.control(|c| {
            c.lease_holders.remove(&holder);
            c.scheduler.client_gone(holder)
        });
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
        reply: ReplyTo,
    ) {
        if let Some(e) = crate::faults::injected("lease_grant") {
            return reply.send(Response::Error(e));
        }
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return reply.send(Response::Error(e)),
        };
        // A local client's request may go to another node (once: a request
        // from another node is never sent on again, and group bundles stay
        // on their node).
        let local = !matches!(*self.role.lock(), Role::Lessee(_));
        // A bundle of a group over several nodes is leased on its node; one
        // this node holds is queued here at once.
        let elsewhere = |b: &BundleRef| {
            local
                && self.node.membership.get().is_some()
                && self.node.control(|c| c.scheduler.bundle_node(*b)) != Some(None)
        };
        if let Some(b) = bundle.filter(elsewhere) {
            let (node, holder) = (self.node.clone(), self.conn_id);
            tokio::spawn(async move {
                match node.route_bundle(b).await {
                    Ok(Some((raylet, node_id))) => {
                        reply.send(Response::Lease(LeaseReply::Spillback { raylet, node_id }))
                    }
                    Ok(None) => {
                        let request = LeaseRequest {
                            shape,
                            job,
                            env,
                            bundle,
                            grantee: Grantee::Client { holder, reply },
                            may_spill: false,
                            asked_at: std::time::Instant::now(),
                        };
                        node.control(|c| c.scheduler.request_lease(request));
                    }
                    Err(e) => reply.send(Response::Error(e)),
                }
            });
            return;
        }
        if local && bundle.is_none() {
            match self.node.place(&shape, strategy) {
                Ok(None) => {}
                Ok(Some((raylet, node_id))) => {
                    return reply.send(Response::Lease(LeaseReply::Spillback { raylet, node_id }))
                }
                Err(e) => return reply.send(Response::Error(e)),
            }
        }
        let may_spill = local
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
        };
        self.node.control(|c| c.scheduler.request_lease(request));
    }

    /// A process of another node will lease workers here: answered once
    /// this node has the job's program (fetched from that process if need
    /// be, which may take a while).
    fn handle_register_lessee(&self, conn: &Connection, r: RegisterDriver, reply: ReplyTo) {
        let (node, role, conn) = (self.node.clone(), self.role.clone(), conn.clone());
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
                let executable = node.program_file(executable, program, &conn).await?;
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
            reply.send(answer(registered.await));
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

    fn handle_return_lease(&self, lease: LeaseId, unreachable: bool) -> Result<()> {
        self.node
            .control(|c| c.scheduler.return_lease(lease, unreachable));
        Ok(())
    }

    fn handle_cancel_lease_requests(
        &self,
        shape: ResourceSet,
        bundle: Option<BundleRef>,
        env: EnvVars,
    ) -> Result<()> {
        let withdrawn = self.node.control(|c| {
            c.scheduler
                .cancel_requests(self.conn_id, &shape, bundle, &env)
        });
        for reply in withdrawn {
            reply.send(Response::Lease(LeaseReply::Cancelled));
        }
        Ok(())
    }

    fn handle_worker_blocked(&self, blocked: bool) -> Result<()> {
        if let Role::Worker(_, worker) = *self.role.lock() {
            tracing::debug!(%worker, blocked, "worker blocked state");
            self.node
                .control(|c| c.scheduler.set_blocked(worker, blocked));
        }
        Ok(())
    }

    fn handle_create_object(&self, id: ObjectId, size: u64, owner: Ownership, reply: ReplyTo) {
        let creator = self.creator();
        let placement = match self.node.store.try_create(id, size, creator, Some(&owner)) {
            Err(Error::ObjectStoreFull { .. }) if self.node.store.spill_config.enabled => {
                return self.create_later(id, size, owner, reply);
            }
            // A copy an earlier attempt left is in use or still written.
            Err(_) if self.node.store.lock().busy(id, creator) => {
                return self.create_later(id, size, owner, reply)
            }
            other => other,
        };
        reply.send(Response::from_result(placement.map(location)));
    }

    /// Answers a create once spilling made room, or once the copy it
    /// replaces is no longer in use.
    fn create_later(&self, id: ObjectId, size: u64, owner: Ownership, reply: ReplyTo) {
        let (node, creator) = (self.node.clone(), self.creator());
        tokio::spawn(async move {
            let created = node
                .store
                .create_object(id, size, creator, Some(&owner))
                .await;
            reply.send(Response::from_result(created.map(location)));
        });
    }

    /// Pins the object for this connection until it releases it or closes.
    fn handle_get_object(&self, id: ObjectId, reply: ReplyTo) {
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
                    reply.send(Response::from_result(pinned.map(location)));
                });
                return;
            }
            Err(e) => Err(e),
        };
        if placement.is_ok() && !hold_pin(&self.pins, id) {
            self.node.store.lock().unpin(id);
            return;
        }
        reply.send(Response::from_result(placement.map(location)));
    }

    fn handle_release_object(&self, id: ObjectId) -> Result<()> {
        let mut pins = self.pins.lock();
        let Some(held) = pins.as_mut() else {
            return Ok(());
        };
        if let Some(n) = held.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                held.remove(&id);
            }
            self.node.store.lock().unpin(id);
        }
        Ok(())
    }

    fn handle_delete_objects(&self, ids: Vec<ObjectId>, holder: Option<String>) -> Result<()> {
        self.node.free_objects(ids, holder);
        Ok(())
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
    fn handle_create_actor(&self, spec: ActorSpec, conn: &Connection, reply: ReplyTo) {
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return reply.send(Response::Error(e)),
        };
        let local = !matches!(*self.role.lock(), Role::Lessee(_));
        let lessee = (!local).then(|| conn.clone());
        let cluster = self.node.membership.get().is_some();
        let bundle = spec.options.placement.filter(|_| local && cluster);
        let named = cluster && spec.options.name.is_some();
        if bundle.is_none() && !named {
            return reply.send_result(self.node.accept_actor(job, spec, lessee));
        }
        let node = self.node.clone();
        tokio::spawn(async move {
            let routed = match bundle {
                Some(b) => node.route_bundle(b).await,
                None => Ok(None),
            };
            let placed = match routed {
                Ok(Some((raylet, node_id))) => Ok(ActorPlacement::Elsewhere { raylet, node_id }),
                Ok(None) => node.accept_named_actor(job, spec, lessee).await,
                Err(e) => Err(e),
            };
            reply.send_result(placed);
        });
    }

    /// Finds a named actor here, or in a cluster through the head's
    /// directory of names, on the node that holds it.
    fn handle_get_named_actor(&self, request: GetNamedActor, reply: ReplyTo) {
        let here = self.node.get_named_actor(&request.name, &request.namespace);
        match (here, self.node.membership.get()) {
            (Err(e), Some(_)) if self.asks_others() => {
                let node = self.node.clone();
                tokio::spawn(async move {
                    let found = node.find_named_actor(request).await;
                    reply.send_result(found.and_then(|f| f.ok_or(e)));
                });
            }
            (here, _) => reply.send_result(here),
        }
    }

    /// Kills an actor here, or in a cluster on the node that holds it.
    fn handle_kill_actor(&self, request: KillActor, reply: ReplyTo) {
        let here = self
            .node
            .kill_actor(request.actor_id, request.no_restart, request.out_of_scope);
        match (here, self.node.membership.get()) {
            (Err(e), Some(m)) if self.asks_others() => {
                let asking = m.ask_others(request);
                tokio::spawn(async move { reply.send_result(asking.await.ok_or(e)) });
            }
            (here, _) => reply.send_result(here),
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
        self.node.control(|c| {
            let resources = c.scheduler.resources();
            Ok(ClusterResources {
                total: resources.total().clone(),
                available: resources.available(),
            })
        })
    }

    fn handle_create_placement_group(&self, spec: PlacementGroupSpec) -> Result<()> {
        let job = self.job()?;
        self.node.create_group(job, spec)
    }

    fn handle_remove_placement_group(&self, id: PlacementGroupId) -> Result<()> {
        self.node.remove_group(id, self.asks_others());
        Ok(())
    }
}

/// Counts a pin for the connection whose pins these are; false if it has
/// closed (the caller unpins).
fn hold_pin(pins: &Mutex<Option<HashMap<ObjectId, u64>>>, id: ObjectId) -> bool {
    match pins.lock().as_mut() {
        Some(held) => {
            *held.entry(id).or_default() += 1;
            true
        }
        None => false,
    }
}

fn answer<T: Reply>(result: Result<T>) -> Response {
    Response::from_result(result)
}

/// Answers `reply` once a call to the head's control store returns.
fn answer_later<T: Reply + Send + 'static>(
    reply: ReplyTo,
    call: impl std::future::Future<Output = std::result::Result<T, prism_gcs::GcsError>>
        + Send
        + 'static,
) {
    tokio::spawn(async move { reply.send_result(call.await.map_err(Error::from)) });
}

fn location(p: Placement) -> ObjectLocation {
    ObjectLocation {
        offset: p.offset,
        size: p.size,
    }
}
