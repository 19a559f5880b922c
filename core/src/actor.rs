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
use prism_protocol::messages::{ActorSpec, ActorState, Request, Response, TaskSpec};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;
use tokio::sync::mpsc;

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
        core.actor_client(self).send(Submission { spec, held });
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
    core.check_feasible(&options.resources)?;
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
        c.raylet.call(Request::CreateActor(spec)).await.map(|_| ())
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
    client.release_after_start(held);
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
        match c
            .raylet
            .call(Request::GetNamedActor {
                name: name_owned,
                namespace: ns,
            })
            .await?
        {
            Response::Actor(info) => Ok(info),
            other => Err(other.unexpected("GetNamedActor")),
        }
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
    core.block_on(async move {
        c.raylet
            .call(Request::KillActor { actor_id })
            .await
            .map(|_| ())
    })
}

enum ClientMessage {
    Call(Submission),
    ReleaseAfterStart(Vec<ObjectId>),
}

/// The calling side of one actor in this process.
pub(crate) struct ActorClient {
    tx: mpsc::UnboundedSender<ClientMessage>,
}

impl ActorClient {
    fn send(&self, submission: Submission) {
        let _ = self.tx.send(ClientMessage::Call(submission));
    }

    fn release_after_start(&self, held: Vec<ObjectId>) {
        let _ = self.tx.send(ClientMessage::ReleaseAfterStart(held));
    }
}

impl CoreWorker {
    pub(crate) fn actor_client(self: &Arc<Self>, actor: &ActorRef) -> Arc<ActorClient> {
        let mut clients = self.actor_clients.lock();
        if let Some(c) = clients.get(&actor.actor_id) {
            return c.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let client = Arc::new(ActorClient { tx });
        clients.insert(actor.actor_id, client.clone());
        let core = self.clone();
        let actor = actor.clone();
        self.rt
            .spawn(async move { core.drive_actor_client(actor, rx).await });
        client
    }

    async fn actor_state(&self, actor_id: ActorId, wait: bool) -> Result<ActorState> {
        match self
            .raylet
            .call(Request::GetActor { actor_id, wait })
            .await?
        {
            Response::Actor(info) => Ok(info.state),
            other => Err(other.unexpected("GetActor")),
        }
    }

    async fn drive_actor_client(
        self: Arc<Self>,
        actor: ActorRef,
        mut rx: mpsc::UnboundedReceiver<ClientMessage>,
    ) {
        let connection = match self.actor_state(actor.actor_id, true).await {
            Ok(ActorState::Alive { address, .. }) => self.peer(&address).await,
            Ok(ActorState::Dead(e)) => Err(e),
            Ok(ActorState::Pending) => Err(Error::Protocol {
                message: "the control store answered a waiting lookup with a pending actor".into(),
            }),
            Err(e) => Err(e),
        };
        let mut seq = 0u64;
        while let Some(message) = rx.recv().await {
            let mut submission = match message {
                ClientMessage::ReleaseAfterStart(held) => {
                    let releases = self.refs.remove_submitted(&held);
                    self.apply_releases(releases);
                    continue;
                }
                ClientMessage::Call(s) => s,
            };
            let conn = match &connection {
                Ok(conn) => conn.clone(),
                Err(e) => {
                    self.finish_task(&submission, Err(e.clone()));
                    continue;
                }
            };
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
            let pending = conn.start_call(Request::ActorCall {
                actor_id: actor.actor_id,
                caller: self.worker_id,
                seq,
                spec: submission.spec.clone(),
            });
            seq += 1;
            let core = self.clone();
            let actor = actor.clone();
            self.rt.spawn(async move {
                let outcome = match pending {
                    Ok(rx) => match rx.await {
                        Ok(resp) => resp.into_result(),
                        Err(_) => Err(Error::Disconnected {
                            peer: actor.class.clone(),
                        }),
                    },
                    Err(e) => Err(e),
                };
                let result = match outcome {
                    Ok(Response::Object(ret)) => Ok(ret),
                    Ok(other) => Err(other.unexpected("ActorCall")),
                    Err(Error::Disconnected { .. }) => Err(core.why_actor_died(&actor).await),
                    Err(e) => Err(e),
                };
                core.finish_task(&submission, result);
            });
        }
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
