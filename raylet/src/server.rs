//! The raylet's server: one handler value per connection, and one
//! `handle_<message>` function per request.
//!
//! A connection is a driver or a worker (after its `Register*` request).
//! The handler remembers which, and which objects the peer has pinned, so
//! that a peer that disconnects (or dies) leaves no pins or leases behind.
//! Requests that wait (a lease, an actor or a group to be ready) are given
//! a [`Reply`] to answer later; the rest are answered at once.

use crate::node::{Job, Node, Reply};
use crate::scheduler::{Grantee, LeaseRequest};
use bytes::Bytes;
use parking_lot::Mutex;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, ObjectId, PlacementGroupId, WorkerId};
use prism_protocol::messages::{ActorSpec, BundleRef, PlacementGroupSpec, Request, Response};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Handler};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy)]
enum Role {
    Unregistered,
    Driver(JobId),
    Worker(JobId, WorkerId),
}

struct ClientHandler {
    node: Arc<Node>,
    conn_id: u64,
    role: Mutex<Role>,
    pins: Mutex<HashMap<ObjectId, u64>>,
}

pub(crate) fn handler(node: &Arc<Node>) -> Arc<dyn Handler> {
    Arc::new(ClientHandler {
        node: node.clone(),
        conn_id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
        role: Mutex::new(Role::Unregistered),
        pins: Mutex::new(HashMap::new()),
    })
}

type Answer = Result<Response, Error>;

impl Handler for ClientHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        let reply = Reply::new(conn, id);
        let answer = match request {
            // Answered later, when a worker, the actor or the group is ready.
            Request::RequestLease { shape, bundle } => {
                return self.handle_request_lease(shape, bundle, reply)
            }
            Request::GetActor { actor_id, wait } => {
                return self.node.get_actor(actor_id, wait, reply)
            }
            Request::GetPlacementGroup { id: group, wait_ms } => {
                return self.node.get_placement_group(group, wait_ms, reply)
            }
            // Answered now.
            Request::RegisterDriver {
                address: _,
                pid,
                executable,
                cwd,
                log_to_driver,
            } => self.handle_register_driver(conn, pid, executable, cwd, log_to_driver),
            Request::RegisterWorker {
                worker_id,
                address,
                pid,
            } => self.handle_register_worker(conn, worker_id, address, pid),
            Request::ReturnLease { lease_id } => self.handle_return_lease(lease_id),
            Request::WorkerBlocked { blocked } => self.handle_worker_blocked(blocked),
            Request::CreateObject { id, size } => self.handle_create_object(id, size),
            Request::SealObject { id } => self.handle_seal_object(id),
            Request::GetObject { id } => self.handle_get_object(id),
            Request::ReleaseObject { id } => self.handle_release_object(id),
            Request::DeleteObjects { ids } => self.handle_delete_objects(ids),
            Request::GetStoreStats => Ok(Response::StoreStats(self.node.store.lock().stats())),
            Request::CreateActor(spec) => self.handle_create_actor(spec),
            Request::GetNamedActor { name, namespace } => self
                .node
                .get_named_actor(&name, &namespace)
                .map(Response::Actor),
            Request::KillActor { actor_id } => self.handle_kill_actor(actor_id),
            Request::GetClusterResources => self.handle_get_cluster_resources(),
            Request::CreatePlacementGroup(spec) => self.handle_create_placement_group(spec),
            Request::RemovePlacementGroup { id } => self.handle_remove_placement_group(id),
            Request::KvPut {
                key,
                value,
                overwrite,
            } => self.handle_kv_put(key, value, overwrite),
            Request::KvGet { key } => Ok(Response::KvValue(self.node.kv.lock().get(&key))),
            Request::KvDelete { key } => Ok(Response::KvChanged(self.node.kv.lock().delete(&key))),
            Request::KvKeys { prefix } => Ok(Response::KvKeys(self.node.kv.lock().keys(&prefix))),
            other => Err(Error::Protocol {
                message: format!("the raylet does not serve {other:?}"),
            }),
        };
        reply.send(answer.unwrap_or_else(Response::Error));
    }

    fn closed(&self, _conn: &Connection) {
        let pins: Vec<(ObjectId, u64)> = self.pins.lock().drain().collect();
        {
            let mut store = self.node.store.lock();
            for (id, n) in pins {
                for _ in 0..n {
                    store.unpin(id);
                }
            }
        }
        let holder = self.conn_id;
        self.node.control(|c| c.scheduler.client_gone(holder));
        if let Role::Driver(job) = *self.role.lock() {
            self.node.end_job(job);
        }
    }
}

impl ClientHandler {
    fn job(&self) -> Result<JobId, Error> {
        match *self.role.lock() {
            Role::Driver(j) | Role::Worker(j, _) => Ok(j),
            Role::Unregistered => Err(Error::Protocol {
                message: "register with the raylet before using it".into(),
            }),
        }
    }

    fn handle_request_lease(&self, shape: ResourceSet, bundle: Option<BundleRef>, reply: Reply) {
        let job = match self.job() {
            Ok(job) => job,
            Err(e) => return reply.send(Response::Error(e)),
        };
        let request = LeaseRequest {
            shape,
            job,
            bundle,
            grantee: Grantee::Client {
                holder: self.conn_id,
                reply,
            },
        };
        self.node.control(|c| c.scheduler.request_lease(request));
    }

    fn handle_register_driver(
        &self,
        conn: &Connection,
        pid: u32,
        executable: PathBuf,
        cwd: PathBuf,
        log_to_driver: bool,
    ) -> Answer {
        let job_id = JobId::new();
        *self.role.lock() = Role::Driver(job_id);
        tracing::info!(job = %job_id, pid, executable = %executable.display(), "driver registered");
        self.node.register_job(
            job_id,
            Job {
                executable,
                cwd,
                driver: conn.clone(),
                log_to_driver,
            },
        );
        Ok(Response::Registered(self.node.registration(job_id)))
    }

    fn handle_register_worker(
        &self,
        conn: &Connection,
        worker_id: WorkerId,
        address: String,
        pid: u32,
    ) -> Answer {
        let job = self.node.register_worker(worker_id, address, pid, conn)?;
        *self.role.lock() = Role::Worker(job, worker_id);
        Ok(Response::Registered(self.node.registration(job)))
    }

    fn handle_return_lease(&self, lease: LeaseId) -> Answer {
        self.node.control(|c| c.scheduler.return_lease(lease));
        Ok(Response::Ok)
    }

    fn handle_worker_blocked(&self, blocked: bool) -> Answer {
        if let Role::Worker(_, worker) = *self.role.lock() {
            tracing::debug!(%worker, blocked, "worker blocked state");
            self.node
                .control(|c| c.scheduler.set_blocked(worker, blocked));
        }
        Ok(Response::Ok)
    }

    fn handle_create_object(&self, id: ObjectId, size: u64) -> Answer {
        let placement = self.node.store.lock().create(id, size)?;
        Ok(Response::ObjectLocation {
            offset: placement.offset,
            size: placement.size,
        })
    }

    fn handle_seal_object(&self, id: ObjectId) -> Answer {
        self.node.store.lock().seal(id)?;
        Ok(Response::Ok)
    }

    /// Pins the object for this connection until it releases it or closes.
    fn handle_get_object(&self, id: ObjectId) -> Answer {
        let placement = self.node.store.lock().pin(id)?;
        *self.pins.lock().entry(id).or_default() += 1;
        Ok(Response::ObjectLocation {
            offset: placement.offset,
            size: placement.size,
        })
    }

    fn handle_release_object(&self, id: ObjectId) -> Answer {
        let mut pins = self.pins.lock();
        if let Some(n) = pins.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&id);
            }
            self.node.store.lock().unpin(id);
        }
        Ok(Response::Ok)
    }

    fn handle_delete_objects(&self, ids: Vec<ObjectId>) -> Answer {
        let mut store = self.node.store.lock();
        for id in ids {
            store.delete(id);
        }
        Ok(Response::Ok)
    }

    fn handle_create_actor(&self, spec: ActorSpec) -> Answer {
        self.node.create_actor(self.job()?, spec)?;
        Ok(Response::Ok)
    }

    fn handle_kill_actor(&self, actor: ActorId) -> Answer {
        self.node.kill_actor(actor)?;
        Ok(Response::Ok)
    }

    fn handle_get_cluster_resources(&self) -> Answer {
        self.node.control(|c| {
            let resources = c.scheduler.resources();
            Ok(Response::ClusterResources {
                total: resources.total().clone(),
                available: resources.available(),
            })
        })
    }

    fn handle_create_placement_group(&self, spec: PlacementGroupSpec) -> Answer {
        let job = self.job()?;
        self.node.control(|c| c.scheduler.create_group(job, spec))?;
        Ok(Response::Ok)
    }

    fn handle_remove_placement_group(&self, id: PlacementGroupId) -> Answer {
        self.node.control(|c| c.scheduler.remove_group(id));
        Ok(Response::Ok)
    }

    fn handle_kv_put(&self, key: String, value: Bytes, overwrite: bool) -> Answer {
        Ok(Response::KvChanged(
            self.node.kv.lock().put(key, value, overwrite),
        ))
    }
}
