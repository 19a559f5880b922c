//! The raylet's request handlers, one handler value per connection.
//!
//! A connection is a driver or a worker (after its `Register*` request).
//! The handler remembers which, and which objects the peer has pinned, so
//! that a peer that disconnects (or dies) leaves no pins or leases behind.

use crate::node::{Job, LeaseFor, Node, PendingLease};
use parking_lot::Mutex;
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, ObjectId, WorkerId};
use prism_protocol::messages::{Request, Response};
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

impl ClientHandler {
    fn job(&self) -> Result<JobId, Error> {
        match *self.role.lock() {
            Role::Driver(j) | Role::Worker(j, _) => Ok(j),
            Role::Unregistered => Err(Error::Protocol {
                message: "register with the raylet before using it".into(),
            }),
        }
    }

    /// Handles everything that answers at once.
    fn handle_now(&self, conn: &Connection, request: Request) -> Result<Response, Error> {
        let node = &self.node;
        match request {
            Request::RegisterDriver {
                address: _,
                pid,
                executable,
                cwd,
                log_to_driver,
            } => {
                let job_id = JobId::new();
                *self.role.lock() = Role::Driver(job_id);
                tracing::info!(job = %job_id, pid, executable = %executable.display(), "driver registered");
                node.register_job(
                    job_id,
                    Job {
                        executable,
                        cwd,
                        driver: conn.clone(),
                        log_to_driver,
                        start_failures: 0,
                    },
                );
                Ok(Response::Registered(node.registration(job_id)))
            }
            Request::RegisterWorker {
                worker_id,
                address,
                pid,
            } => {
                let job = node.register_worker(worker_id, address, pid, conn.clone())?;
                *self.role.lock() = Role::Worker(job, worker_id);
                Ok(Response::Registered(node.registration(job)))
            }
            Request::ReturnLease { lease_id } => {
                node.return_lease(lease_id);
                Ok(Response::Ok)
            }
            Request::CreateObject { id, size } => {
                let placement = node.store.lock().create(id, size)?;
                Ok(Response::ObjectLocation {
                    offset: placement.offset,
                    size: placement.size,
                })
            }
            Request::SealObject { id } => {
                node.store.lock().seal(id)?;
                Ok(Response::Ok)
            }
            Request::GetObject { id } => {
                let placement = node.store.lock().pin(id)?;
                *self.pins.lock().entry(id).or_default() += 1;
                Ok(Response::ObjectLocation {
                    offset: placement.offset,
                    size: placement.size,
                })
            }
            Request::ReleaseObject { id } => {
                let mut pins = self.pins.lock();
                if let Some(n) = pins.get_mut(&id) {
                    *n -= 1;
                    if *n == 0 {
                        pins.remove(&id);
                    }
                    node.store.lock().unpin(id);
                }
                Ok(Response::Ok)
            }
            Request::DeleteObjects { ids } => {
                let mut store = node.store.lock();
                for id in ids {
                    store.delete(id);
                }
                Ok(Response::Ok)
            }
            Request::GetStoreStats => Ok(Response::StoreStats(node.store.lock().stats())),
            Request::WorkerBlocked { blocked } => {
                if let Role::Worker(_, worker_id) = *self.role.lock() {
                    node.set_blocked(worker_id, blocked);
                }
                Ok(Response::Ok)
            }
            Request::CreateActor(spec) => {
                node.create_actor(self.job()?, spec)?;
                Ok(Response::Ok)
            }
            Request::GetNamedActor { name, namespace } => {
                Ok(Response::Actor(node.get_named_actor(&name, &namespace)?))
            }
            Request::KillActor { actor_id } => {
                node.kill_actor(actor_id)?;
                Ok(Response::Ok)
            }
            Request::GetClusterResources => {
                let state = node.state.lock();
                Ok(Response::ClusterResources {
                    total: state.resources.total().clone(),
                    available: state.resources.available(),
                })
            }
            Request::CreatePlacementGroup(spec) => {
                node.create_placement_group(self.job()?, spec)?;
                Ok(Response::Ok)
            }
            Request::RemovePlacementGroup { id } => {
                node.remove_placement_group(id);
                Ok(Response::Ok)
            }
            Request::KvPut {
                key,
                value,
                overwrite,
            } => {
                let mut kv = node.kv.lock();
                let fresh = !kv.contains_key(&key);
                if fresh || overwrite {
                    kv.insert(key, value);
                }
                Ok(Response::KvChanged(fresh))
            }
            Request::KvGet { key } => Ok(Response::KvValue(node.kv.lock().get(&key).cloned())),
            Request::KvDelete { key } => {
                Ok(Response::KvChanged(node.kv.lock().remove(&key).is_some()))
            }
            Request::KvKeys { prefix } => {
                let mut keys: Vec<String> = node
                    .kv
                    .lock()
                    .keys()
                    .filter(|k| k.starts_with(&prefix))
                    .cloned()
                    .collect();
                keys.sort();
                Ok(Response::KvKeys(keys))
            }
            other => Err(Error::Protocol {
                message: format!("the raylet does not serve {other:?}"),
            }),
        }
    }
}

impl Handler for ClientHandler {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        match request {
            // Answered later, when a worker or the actor is ready.
            Request::RequestLease { shape, bundle } => {
                let queued = self.job().and_then(|job| {
                    self.node.request_lease(PendingLease {
                        shape,
                        job,
                        bundle,
                        lease_for: LeaseFor::Client {
                            conn: conn.clone(),
                            conn_id: self.conn_id,
                            request: id,
                        },
                    })
                });
                if let Err(e) = queued {
                    conn.respond(id, Response::Error(e));
                }
            }
            Request::GetActor { actor_id, wait } => self.node.get_actor(actor_id, wait, conn, id),
            Request::GetPlacementGroup { id: group, wait_ms } => {
                self.node.get_placement_group(group, wait_ms, conn, id)
            }
            other => {
                let response = self.handle_now(conn, other).unwrap_or_else(Response::Error);
                conn.respond(id, response);
            }
        }
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
        self.node.client_gone(self.conn_id);
        if let Role::Driver(job) = *self.role.lock() {
            self.node.end_job(job);
        }
    }
}
