//! Calling actors from this process: one [`ActorClient`] per actor, which
//! finds the actor, then writes its calls to the actor's connection in
//! submission order.
//!
//! # Ordering
//!
//! A call is written to the actor's connection at once, from the calling
//! thread, when nothing is queued ahead of it; otherwise one drain task per
//! actor resolves each queued call's arguments and writes it, in order.
//! Calls are numbered by a per-caller sequence, and the actor runs one
//! caller's calls in that order (with `max_concurrency` 1, one at a time).

use super::objects::{Objects, Submission};
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, ObjectId, WorkerId};
use prism_protocol::messages::{ActorCall, ActorState, GetActor};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;

/// The actor clients of one process.
#[derive(Debug)]
pub(crate) struct ActorSubmitter {
    rt: tokio::runtime::Handle,
    worker_id: WorkerId,
    raylet: Connection,
    objects: Arc<Objects>,
    clients: Mutex<HashMap<ActorId, Arc<ActorClient>>>,
}

/// The calling side of one actor in this process.
///
/// A call is written to the actor's connection at once, from the calling
/// thread, when the actor's address is known, its arguments are ready and
/// no earlier call is still waiting; otherwise it joins the backlog, which
/// one drain task sends in order. Either way calls leave in submission
/// order under the state lock, numbered by `seq`.
pub(crate) struct ActorClient {
    actor_id: ActorId,
    class: String,
    state: Mutex<ClientState>,
}

impl std::fmt::Debug for ActorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActorClient({} {})", self.class, self.actor_id)
    }
}

#[derive(Default)]
struct ClientState {
    /// The actor's connection, once it is alive.
    conn: Option<Connection>,
    /// Why calls fail, once it is known to be dead.
    dead: Option<Error>,
    seq: u64,
    backlog: std::collections::VecDeque<Submission>,
    draining: bool,
    /// Constructor arguments, released once the actor is up.
    ctor_held: Vec<ObjectId>,
}

impl ActorSubmitter {
    pub(crate) fn new(
        rt: tokio::runtime::Handle,
        worker_id: WorkerId,
        raylet: Connection,
        objects: Arc<Objects>,
    ) -> Self {
        ActorSubmitter {
            rt,
            worker_id,
            raylet,
            objects,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// This process's client of an actor, made on first use.
    pub(crate) fn client(self: &Arc<Self>, actor_id: ActorId, class: &str) -> Arc<ActorClient> {
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(&actor_id) {
            return c.clone();
        }
        let client = Arc::new(ActorClient {
            actor_id,
            class: class.to_string(),
            state: Mutex::new(ClientState {
                draining: true,
                ..Default::default()
            }),
        });
        clients.insert(actor_id, client.clone());
        // The drain task first learns where the actor is (or why it died).
        let this = self.clone();
        let c = client.clone();
        self.rt.spawn(async move { this.drain(c).await });
        client
    }

    /// Releases an actor's constructor arguments once it is up (or dead).
    pub(crate) fn release_after_start(&self, client: &ActorClient, held: Vec<ObjectId>) {
        let mut state = client.state.lock();
        if state.conn.is_some() || state.dead.is_some() {
            drop(state);
            self.objects.release_held(&held);
        } else {
            state.ctor_held.extend(held);
        }
    }

    /// Sends a call now if nothing is ahead of it, else queues it.
    pub(crate) fn send(self: &Arc<Self>, client: &Arc<ActorClient>, mut submission: Submission) {
        let mut state = client.state.lock();
        if let Some(e) = state.dead.clone() {
            drop(state);
            self.objects.finish_task(&submission, Err(e));
            return;
        }
        let ready_now = !state.draining && state.conn.is_some();
        if ready_now {
            match self.objects.resolve_args_now(&mut submission.spec.args) {
                Ok(true) => {
                    self.write_actor_call(client, &mut state, submission);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    drop(state);
                    self.objects.finish_task(&submission, Err(e));
                    return;
                }
            }
        }
        state.backlog.push_back(submission);
        if !state.draining {
            state.draining = true;
            let this = self.clone();
            let c = client.clone();
            self.rt.spawn(async move { this.drain(c).await });
        }
    }

    /// Writes one call to the actor's connection (under the state lock, so
    /// calls leave in order); its answer is handled on the reader task.
    fn write_actor_call(
        self: &Arc<Self>,
        client: &Arc<ActorClient>,
        state: &mut ClientState,
        submission: Submission,
    ) {
        let Some(conn) = state.conn.clone() else {
            return;
        };
        let seq = state.seq;
        state.seq += 1;
        let request = ActorCall {
            actor_id: client.actor_id,
            caller: self.worker_id,
            seq,
            spec: submission.spec.clone(),
        };
        let this = self.clone();
        let client = client.clone();
        conn.request_with(request, move |outcome| match outcome {
            Ok(ret) => this.objects.finish_task(&submission, Ok(ret)),
            Err(Error::Disconnected { .. }) => {
                // Ask the control store why, off the reader task.
                let t = this.clone();
                this.rt.spawn(async move {
                    let e = t.why_actor_died(&client).await;
                    t.objects.finish_task(&submission, Err(e));
                });
            }
            Err(e) => this.objects.finish_task(&submission, Err(e)),
        });
    }

    /// Sends the backlog in order, resolving arguments as needed; on first
    /// run, also finds the actor.
    async fn drain(self: Arc<Self>, client: Arc<ActorClient>) {
        let needs_lookup = {
            let state = client.state.lock();
            state.conn.is_none() && state.dead.is_none()
        };
        if needs_lookup {
            let found = match self.actor_state(client.actor_id, true).await {
                Ok(ActorState::Alive { address, .. }) => self.objects.peers.get(&address).await,
                Ok(ActorState::Dead(e)) => Err(e),
                Ok(ActorState::Pending) => Err(Error::Protocol {
                    message: "the control store answered a waiting lookup with a pending actor"
                        .into(),
                }),
                Err(e) => Err(e),
            };
            let held = {
                let mut state = client.state.lock();
                match found {
                    Ok(conn) => state.conn = Some(conn),
                    Err(e) => state.dead = Some(e),
                }
                std::mem::take(&mut state.ctor_held)
            };
            self.objects.release_held(&held);
        }
        loop {
            let next = {
                let mut state = client.state.lock();
                match state.backlog.pop_front() {
                    Some(s) => s,
                    None => {
                        state.draining = false;
                        return;
                    }
                }
            };
            let mut submission = next;
            let dead = client.state.lock().dead.clone();
            if let Some(e) = dead {
                self.objects.finish_task(&submission, Err(e));
                continue;
            }
            match self
                .objects
                .resolve_args(std::mem::take(&mut submission.spec.args))
                .await
            {
                Ok(args) => submission.spec.args = args,
                Err(e) => {
                    self.objects.finish_task(&submission, Err(e));
                    continue;
                }
            }
            let mut state = client.state.lock();
            self.write_actor_call(&client, &mut state, submission);
        }
    }

    async fn actor_state(&self, actor_id: ActorId, wait: bool) -> Result<ActorState> {
        let info = self.raylet.request(GetActor { actor_id, wait }).await?;
        Ok(info.state)
    }

    async fn why_actor_died(&self, actor: &ActorClient) -> Error {
        // The raylet may not have seen the exit yet; ask a few times.
        for _ in 0..20 {
            if let Ok(ActorState::Dead(e)) = self.actor_state(actor.actor_id, false).await {
                return e;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Error::ActorDied {
            actor_id: actor.actor_id,
            class: actor.class.clone(),
            reason: "the connection to the actor's process closed".into(),
        }
    }
}
