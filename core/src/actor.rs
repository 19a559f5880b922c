//! Actors from the caller's side: handles, creation, calls, names, kill.
//!
//! # Ordering
//!
//! Each calling process has one [`ActorClient`] per actor: a queue drained
//! by one task that resolves each call's arguments and writes it to the
//! actor's connection in submission order, numbered by a per-caller
//! sequence. The actor runs one caller's calls in that order (with
//! `max_concurrency` 1, one at a time).

use crate::core_worker::{current, CoreWorker};
use crate::object_ref::{Arg, ObjectRef};
use crate::options::ActorOptions;
use crate::refs::ValueState;
use crate::submitter::Submission;
use crate::{Error, Result};
use prism_protocol::ids::{ActorId, ObjectId, TaskId};
use prism_protocol::messages::{
    ActorCall, ActorSpec, ActorState, CreateActor, GetActor, GetNamedActor, KillActor, TaskSpec,
};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;

/// Implemented by `#[prism::actor]` for an actor's struct.
pub trait Actor: Send + Sync + 'static {
    /// The registered class name.
    const CLASS: &'static str;
    /// The typed handle whose methods call the actor.
    type Handle: From<ActorRef> + Clone;
    /// Options declared on the struct's attribute.
    fn default_options() -> ActorOptions;
}

/// An untyped reference to an actor; typed handles wrap it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorRef {
    actor_id: ActorId,
    class: String,
}

impl ActorRef {
    /// The actor's id.
    pub fn id(&self) -> ActorId {
        self.actor_id
    }

    /// The actor's class name.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// Calls `method` (used by generated handle methods).
    #[doc(hidden)]
    pub fn call<R>(&self, method: &str, args: Vec<Result<Arg>>) -> Result<ObjectRef<R>> {
        let core = current()?;
        let args = args.into_iter().collect::<Result<Vec<_>>>()?;
        let (spec_args, held) = core.prepare_args(args)?;
        let return_id = ObjectId::new();
        let r = core.new_pending(return_id);
        let spec = TaskSpec {
            task_id: TaskId::new(),
            function: format!("{}::{}", self.class, method),
            args: spec_args,
            return_id,
            caller: core.address().clone(),
        };
        let client = core.actor_client(self);
        core.send_actor_call(&client, Submission { spec, held });
        Ok(r)
    }
}

/// A typed handle to an actor. It derefs to the generated handle type whose
/// methods call the actor, can be cloned, and can be passed to tasks and
/// other actors, or returned from them.
pub struct ActorHandle<A: Actor> {
    handle: A::Handle,
    raw: ActorRef,
    _class: PhantomData<fn() -> A>,
}

impl<A: Actor> ActorHandle<A> {
    /// Wraps an untyped reference.
    pub fn from_ref(raw: ActorRef) -> Self {
        ActorHandle {
            handle: A::Handle::from(raw.clone()),
            raw,
            _class: PhantomData,
        }
    }

    /// The untyped reference.
    pub fn actor_ref(&self) -> &ActorRef {
        &self.raw
    }

    /// The actor's id.
    pub fn id(&self) -> ActorId {
        self.raw.actor_id
    }
}

impl<A: Actor> Clone for ActorHandle<A> {
    fn clone(&self) -> Self {
        ActorHandle::from_ref(self.raw.clone())
    }
}

impl<A: Actor> std::fmt::Debug for ActorHandle<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActorHandle<{}>({})", self.raw.class, self.raw.actor_id)
    }
}

impl<A: Actor> std::ops::Deref for ActorHandle<A> {
    type Target = A::Handle;
    fn deref(&self) -> &A::Handle {
        &self.handle
    }
}

impl<A: Actor> Serialize for ActorHandle<A> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de, A: Actor> Deserialize<'de> for ActorHandle<A> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(ActorHandle::from_ref(ActorRef::deserialize(d)?))
    }
}

/// Creates an actor (used by generated `Class::remote`).
#[doc(hidden)]
pub fn create_actor<A: Actor>(
    options: ActorOptions,
    args: Vec<Result<Arg>>,
) -> Result<ActorHandle<A>> {
    let core = current()?;
    let args = args.into_iter().collect::<Result<Vec<_>>>()?;
    let options = options.into_wire(&core.config.namespace)?;
    if options.placement.is_none() {
        core.check_feasible(&options.resources)?;
    }
    let (spec_args, held) = core.prepare_args(args)?;
    let actor_id = ActorId::new();
    let spec = ActorSpec {
        actor_id,
        class: A::CLASS.to_string(),
        args: spec_args,
        options,
        owner: core.address().clone(),
        job: core.job_id,
    };
    let c = core.clone();
    core.block_on(async move {
        // Resolve constructor arguments before the raylet sees the actor.
        let mut spec = spec;
        spec.args = c.resolve_args(spec.args).await?;
        c.raylet.request(CreateActor { spec }).await
    })
    .inspect_err(|_| {
        let releases = core.refs.remove_submitted(&held);
        core.apply_releases(releases);
    })?;
    let raw = ActorRef {
        actor_id,
        class: A::CLASS.to_string(),
    };
    // The constructor's arguments are released once the actor is up.
    let client = core.actor_client(&raw);
    client.release_after_start(&core, held);
    Ok(ActorHandle::from_ref(raw))
}

/// Finds a named actor in the current namespace.
pub fn get_actor<A: Actor>(name: &str) -> Result<ActorHandle<A>> {
    let core = current()?;
    let namespace = core.config.namespace.clone();
    get_actor_in::<A>(name, &namespace)
}

/// Finds a named actor in `namespace`.
pub fn get_actor_in<A: Actor>(name: &str, namespace: &str) -> Result<ActorHandle<A>> {
    let core = current()?;
    let c = core.clone();
    let (name_owned, ns) = (name.to_string(), namespace.to_string());
    let info = core.block_on(async move {
        c.raylet
            .request(GetNamedActor {
                name: name_owned,
                namespace: ns,
            })
            .await
    })?;
    if info.class != A::CLASS {
        return Err(Error::ActorClassMismatch {
            name: name.to_string(),
            expected: A::CLASS.to_string(),
            actual: info.class,
        });
    }
    Ok(ActorHandle::from_ref(ActorRef {
        actor_id: info.actor_id,
        class: info.class,
    }))
}

/// Kills an actor's process at once; calls in flight and later calls fail
/// with [`Error::ActorDied`], and its name becomes free.
pub fn kill<A: Actor>(actor: &ActorHandle<A>) -> Result<()> {
    let core = current()?;
    let c = core.clone();
    let actor_id = actor.id();
    core.block_on(async move { c.raylet.request(KillActor { actor_id }).await })
}

/// The calling side of one actor in this process.
///
/// A call is written to the actor's connection at once, from the calling
/// thread, when the actor's address is known, its arguments are ready and
/// no earlier call is still waiting; otherwise it joins the backlog, which
/// one drain task sends in order. Either way calls leave in submission
/// order under the state lock, numbered by `seq`.
pub(crate) struct ActorClient {
    actor: ActorRef,
    state: parking_lot::Mutex<ClientState>,
}

#[derive(Default)]
struct ClientState {
    /// The actor's connection, once it is alive.
    conn: Option<prism_protocol::rpc::Connection>,
    /// Why calls fail, once it is known to be dead.
    dead: Option<Error>,
    seq: u64,
    backlog: std::collections::VecDeque<Submission>,
    draining: bool,
    /// Constructor arguments, released once the actor is up.
    ctor_held: Vec<ObjectId>,
}

impl ActorClient {
    fn release_after_start(&self, core: &Arc<CoreWorker>, held: Vec<ObjectId>) {
        let mut state = self.state.lock();
        if state.conn.is_some() || state.dead.is_some() {
            drop(state);
            let releases = core.refs.remove_submitted(&held);
            core.apply_releases(releases);
        } else {
            state.ctor_held.extend(held);
        }
    }
}

impl CoreWorker {
    pub(crate) fn actor_client(self: &Arc<Self>, actor: &ActorRef) -> Arc<ActorClient> {
        let mut clients = self.actor_clients.lock();
        if let Some(c) = clients.get(&actor.actor_id) {
            return c.clone();
        }
        let client = Arc::new(ActorClient {
            actor: actor.clone(),
            state: parking_lot::Mutex::new(ClientState {
                draining: true,
                ..Default::default()
            }),
        });
        clients.insert(actor.actor_id, client.clone());
        // The drain task first learns where the actor is (or why it died).
        let core = self.clone();
        let c = client.clone();
        self.rt
            .spawn(async move { core.drain_actor_calls(c).await });
        client
    }

    /// Sends a call now if nothing is ahead of it, else queues it.
    fn send_actor_call(self: &Arc<Self>, client: &Arc<ActorClient>, mut submission: Submission) {
        let mut state = client.state.lock();
        if let Some(e) = state.dead.clone() {
            drop(state);
            self.finish_task(&submission, Err(e));
            return;
        }
        let ready_now = !state.draining && state.conn.is_some();
        if ready_now {
            match self.resolve_args_now(&mut submission.spec.args) {
                Ok(true) => {
                    self.write_actor_call(client, &mut state, submission);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    drop(state);
                    self.finish_task(&submission, Err(e));
                    return;
                }
            }
        }
        state.backlog.push_back(submission);
        if !state.draining {
            state.draining = true;
            let core = self.clone();
            let c = client.clone();
            self.rt
                .spawn(async move { core.drain_actor_calls(c).await });
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
            actor_id: client.actor.actor_id,
            caller: self.worker_id,
            seq,
            spec: submission.spec.clone(),
        };
        let core = self.clone();
        let actor = client.actor.clone();
        conn.request_with(request, move |outcome| match outcome {
            Ok(ret) => core.finish_task(&submission, Ok(ret)),
            Err(Error::Disconnected { .. }) => {
                // Ask the control store why, off the reader task.
                let c = core.clone();
                core.rt.spawn(async move {
                    let e = c.why_actor_died(&actor).await;
                    c.finish_task(&submission, Err(e));
                });
            }
            Err(e) => core.finish_task(&submission, Err(e)),
        });
    }

    /// Sends the backlog in order, resolving arguments as needed; on first
    /// run, also finds the actor.
    async fn drain_actor_calls(self: Arc<Self>, client: Arc<ActorClient>) {
        let needs_lookup = {
            let state = client.state.lock();
            state.conn.is_none() && state.dead.is_none()
        };
        if needs_lookup {
            let found = match self.actor_state(client.actor.actor_id, true).await {
                Ok(ActorState::Alive { address, .. }) => self.peer(&address).await,
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
            let releases = self.refs.remove_submitted(&held);
            self.apply_releases(releases);
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
                self.finish_task(&submission, Err(e));
                continue;
            }
            match self
                .resolve_args(std::mem::take(&mut submission.spec.args))
                .await
            {
                Ok(args) => submission.spec.args = args,
                Err(e) => {
                    self.finish_task(&submission, Err(e));
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

    async fn why_actor_died(&self, actor: &ActorRef) -> Error {
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

    /// A pending owned object with one handle, returned to the caller.
    pub(crate) fn new_pending<R>(self: &Arc<Self>, id: ObjectId) -> ObjectRef<R> {
        self.refs.add_owned(id, ValueState::Pending, Vec::new());
        ObjectRef::from_counted(
            prism_protocol::messages::ObjectRefInfo {
                id,
                owner: self.address().clone(),
            },
            self,
        )
    }
}
