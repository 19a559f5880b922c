//! The actor table: creation, names, lookups and deaths.
//!
//! Creation is asynchronous, as in Ray: `CreateActor` is answered once the
//! request is accepted (name free, resources feasible); the actor's worker
//! runs the constructor later and callers wait for the outcome with
//! `GetActor { wait: true }`.

use crate::node::{ActorEntry, LeaseFor, Node, PendingLease, State};
use crate::workers::kill_pid;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, WorkerId};
use prism_protocol::messages::{ActorInfo, ActorSpec, ActorState, Request, Response};
use prism_protocol::rpc::Connection;
use std::sync::Arc;

impl Node {
    pub(crate) fn create_actor(self: &Arc<Self>, job: JobId, spec: ActorSpec) -> Result<(), Error> {
        let mut state = self.state.lock();
        state.check_lease_feasible(&spec.options.resources, spec.options.placement)?;
        let name = spec
            .options
            .name
            .clone()
            .map(|n| (spec.options.namespace.clone(), n));
        if let Some((namespace, name)) = &name {
            if state
                .named_actors
                .contains_key(&(namespace.clone(), name.clone()))
            {
                return Err(Error::ActorNameTaken {
                    name: name.clone(),
                    namespace: namespace.clone(),
                });
            }
            state
                .named_actors
                .insert((namespace.clone(), name.clone()), spec.actor_id);
        }
        state.actors.insert(
            spec.actor_id,
            ActorEntry {
                info: ActorInfo {
                    actor_id: spec.actor_id,
                    class: spec.class.clone(),
                    state: ActorState::Pending,
                },
                name,
                worker: None,
                waiters: Vec::new(),
                spec: Some(spec.clone()),
            },
        );
        state.pending.push_back(PendingLease {
            shape: spec.options.resources.clone(),
            job,
            lease_for: LeaseFor::Actor(spec.actor_id),
            bundle: spec.options.placement,
        });
        self.schedule(&mut state);
        Ok(())
    }

    /// A worker was leased for an actor: tell it to run the constructor.
    pub(crate) fn start_actor_on(
        self: &Arc<Self>,
        state: &mut State,
        actor_id: ActorId,
        worker_id: WorkerId,
    ) {
        let Some(entry) = state.actors.get_mut(&actor_id) else {
            return;
        };
        entry.worker = Some(worker_id);
        let Some(spec) = entry.spec.take() else {
            return;
        };
        let Some(worker) = state.workers.get(&worker_id) else {
            return;
        };
        // The class's own name, without its module path, as Ray prints it.
        let class = spec.class.rsplit("::").next().unwrap_or(&spec.class);
        *worker.label.lock() = format!("{class} pid={}", worker.pid);
        let (Some(conn), Some(address)) = (worker.conn.clone(), worker.address.clone()) else {
            return;
        };
        let pid = worker.pid;
        let node = self.clone();
        tokio::spawn(async move {
            let outcome = conn.call(Request::BecomeActor(spec)).await;
            let mut state = node.state.lock();
            let new_state = match outcome {
                Ok(_) => ActorState::Alive {
                    address,
                    worker: worker_id,
                    pid,
                },
                Err(e) => ActorState::Dead(e),
            };
            if let Some(entry) = state.actors.get_mut(&actor_id) {
                if matches!(entry.info.state, ActorState::Pending) {
                    entry.info.state = new_state;
                    wake_waiters(entry);
                }
            }
        });
    }

    /// Marks an actor dead (its process exited or it was killed).
    pub(crate) fn actor_died(&self, state: &mut State, actor_id: ActorId, reason: String) {
        let Some(entry) = state.actors.get_mut(&actor_id) else {
            return;
        };
        if !matches!(entry.info.state, ActorState::Dead(_)) {
            entry.info.state = ActorState::Dead(Error::ActorDied {
                actor_id,
                class: entry.info.class.clone(),
                reason,
            });
        }
        wake_waiters(entry);
        if let Some(key) = entry.name.take() {
            state.named_actors.remove(&key);
        }
    }

    pub(crate) fn get_actor(
        &self,
        actor_id: ActorId,
        wait: bool,
        conn: &Connection,
        request: Option<u64>,
    ) {
        let mut state = self.state.lock();
        match state.actors.get_mut(&actor_id) {
            None => conn.respond(
                request,
                Response::Error(Error::ActorDied {
                    actor_id,
                    class: "?".into(),
                    reason: "no such actor in the control store".into(),
                }),
            ),
            Some(entry) => {
                if wait && matches!(entry.info.state, ActorState::Pending) {
                    entry.waiters.push((conn.clone(), request));
                } else {
                    conn.respond(request, Response::Actor(entry.info.clone()));
                }
            }
        }
    }

    pub(crate) fn get_named_actor(&self, name: &str, namespace: &str) -> Result<ActorInfo, Error> {
        let state = self.state.lock();
        state
            .named_actors
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|id| state.actors.get(id))
            .map(|e| e.info.clone())
            .ok_or_else(|| Error::ActorNotFound {
                name: name.to_string(),
                namespace: namespace.to_string(),
            })
    }

    pub(crate) fn kill_actor(self: &Arc<Self>, actor_id: ActorId) -> Result<(), Error> {
        let mut state = self.state.lock();
        let Some(entry) = state.actors.get(&actor_id) else {
            return Err(Error::ActorDied {
                actor_id,
                class: "?".into(),
                reason: "no such actor in the control store".into(),
            });
        };
        let pid = entry
            .worker
            .and_then(|w| state.workers.get(&w))
            .map(|w| w.pid);
        let pending = entry.worker.is_none();
        self.actor_died(&mut state, actor_id, "killed by prism::kill".into());
        if pending {
            state
                .pending
                .retain(|p| !matches!(p.lease_for, LeaseFor::Actor(a) if a == actor_id));
        }
        drop(state);
        if let Some(pid) = pid {
            kill_pid(pid);
        }
        Ok(())
    }
}

fn wake_waiters(entry: &mut ActorEntry) {
    for (conn, request) in entry.waiters.drain(..) {
        conn.respond(request, Response::Actor(entry.info.clone()));
    }
}
