//! Actors from the caller's side: handles, creation, calls, names, kill.
//!
//! # Ordering
//!
//! Each calling process has one [`ActorClient`] per actor: a queue drained
//! by one task that resolves each call's arguments and writes it to the
//! actor's connection in submission order, numbered by a per-caller
//! sequence. The actor runs one caller's calls in that order (with
//! `max_concurrency` 1, one at a time).

use crate::codec::Arg;
use crate::generator::ObjectRefGenerator;
use crate::object_ref::ObjectRef;
use crate::options::ActorOptions;
use crate::runtime::owned_actors::place;
use crate::runtime::{current, Objects, Submission};
use crate::{Error, Result};
use prism_protocol::ids::{ActorId, ObjectId};
use prism_protocol::messages::{ActorSpec, Address, GetNamedActor, KillActor, TaskSpec};
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
    /// Whether its state can be checkpointed (`#[prism::actor(checkpoint)]`).
    const CHECKPOINTABLE: bool = false;
    /// Encodes a state for a checkpoint; `None` if the class cannot.
    #[doc(hidden)]
    fn snapshot(_state: &(dyn std::any::Any + Send + Sync)) -> Option<Result<Vec<u8>, String>> {
        None
    }
    /// Decodes a checkpoint; `None` if the class cannot.
    #[doc(hidden)]
    fn restore(_bytes: &[u8]) -> Option<Result<Box<dyn std::any::Any + Send + Sync>, String>> {
        None
    }
}

/// An untyped reference to an actor; typed handles wrap it.
///
/// A reference to an unnamed, non-detached actor counts as a handle: the
/// actor is stopped once every reference to it, in every process, is
/// dropped (see [`ActorHandle`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActorRef {
    actor_id: ActorId,
    class: String,
    /// The creator's handle object, counted like an object reference;
    /// `None` for actors kept by name or detached, and for references
    /// found by name.
    #[serde(default)]
    handle: Option<ObjectRef<()>>,
    /// Its owner, for an actor that may restart: the process that creates
    /// it again if its node dies, asked by a caller that finds no live
    /// node holding it.
    #[serde(default)]
    owner: Option<Address>,
}

/// Two references are equal when they name the same actor, however they
/// were obtained.
impl PartialEq for ActorRef {
    fn eq(&self, other: &Self) -> bool {
        self.actor_id == other.actor_id
    }
}

impl Eq for ActorRef {}

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
        let [r] = self.call_n::<1>(method, args)?;
        Ok(r.retype())
    }

    /// Calls `method`, which returns `N` values (`num_returns = N`): one
    /// reference per value, first to last (used by generated handle
    /// methods).
    #[doc(hidden)]
    pub fn call_n<const N: usize>(
        &self,
        method: &str,
        args: Vec<Result<Arg>>,
    ) -> Result<[ObjectRef<()>; N]> {
        Ok(self.send_call::<N, ()>(method, args, false, |_, _| ())?.0)
    }

    /// Calls `method`, which streams its values (`num_returns =
    /// "streaming"`; used by generated handle methods).
    #[doc(hidden)]
    pub fn call_stream<T>(
        &self,
        method: &str,
        args: Vec<Result<Arg>>,
    ) -> Result<ObjectRefGenerator<T>> {
        let open = |objects: &Arc<Objects>, refs: &[ObjectRef<()>; 1]| {
            ObjectRefGenerator::open(refs[0].clone(), objects, 0)
        };
        Ok(self.send_call::<1, _>(method, args, true, open)?.1)
    }

    /// Sends a call; `before` runs just before it is handed to the actor's
    /// client (a streaming call's stream opens there).
    fn send_call<const N: usize, R>(
        &self,
        method: &str,
        args: Vec<Result<Arg>>,
        streaming: bool,
        before: impl FnOnce(&Arc<Objects>, &[ObjectRef<()>; N]) -> R,
    ) -> Result<([ObjectRef<()>; N], R)> {
        const { assert!(N >= 1, "a call returns at least one value") };
        let core = current()?;
        let args = args.into_iter().collect::<Result<Vec<_>>>()?;
        let (spec_args, held) = core.objects.prepare_args(args)?;
        let ids: [ObjectId; N] = std::array::from_fn(|_| ObjectId::new());
        let refs = ids.map(|id| {
            let info = core.objects.new_pending_call(id, self.actor_id);
            ObjectRef::from_counted(info, &core.objects)
        });
        if N > 1 {
            core.objects.refs.add_more_returns(ids[0], &ids[1..]);
        }
        let function = format!("{}::{}", self.class, method);
        let caller = core.objects.address().clone();
        let spec = TaskSpec::new(function, spec_args, ids[0], ids[1..].to_vec(), caller)
            .streaming(streaming, 0);
        let made = before(&core.objects, &refs);
        let client = core
            .actors
            .client(self.actor_id, &self.class, self.owner.as_ref());
        // The call keeps the actor alive until it answers, even if every
        // handle is dropped meanwhile.
        let submission =
            Submission::new(spec, held).holding(self.handle.as_ref().map(ObjectRef::keep_alive));
        core.actors.send(&client, submission);
        Ok((refs, made))
    }
}

/// A typed handle to an actor. It derefs to the generated handle type whose
/// methods call the actor, can be cloned, and can be passed to tasks and
/// other actors, or returned from them.
///
/// # Lifetime
///
/// An actor without a name and not `detached` lives while a handle to it
/// does, in any process: once the last one is dropped (and its calls
/// have answered), the actor is stopped and its resources freed, as in
/// Ray. Handles passed to tasks and actors, or stored in objects, count.
/// A named actor can be found again by name, so it lives until its
/// creator exits or it is killed, whatever becomes of its handles (Ray
/// would collect it); a detached one lives until it is killed.
///
/// ```no_run
/// #[prism::actor]
/// struct Cache;
///
/// #[prism::actor]
/// impl Cache {
///     fn new() -> Self {
///         Cache
///     }
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let cache = Cache::remote()?;
///     let copy = cache.clone();
///     drop(cache);
///     // `copy` still holds it; dropping it stops the actor.
///     drop(copy);
///     Ok(())
/// }
/// ```
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
    async_methods: bool,
    args: Vec<Result<Arg>>,
) -> Result<ActorHandle<A>> {
    let core = current()?;
    let args = args.into_iter().collect::<Result<Vec<_>>>()?;
    let get_if_exists = options.wants_existing();
    let options = options.into_wire(&core.config.namespace, async_methods)?;
    let named = options.name.clone().map(|n| (n, options.namespace.clone()));
    let counted = options.name.is_none() && !options.detached;
    let checkpoints = options.checkpoint_every > 0 || options.checkpoint_interval_ms > 0;
    if checkpoints && !A::CHECKPOINTABLE {
        return Err(Error::invalid(
            "checkpoint_every",
            format!(
                "actor {} cannot be checkpointed: mark its struct #[prism::actor(checkpoint)] \
                 and derive Serialize and Deserialize for it",
                A::CLASS
            ),
        ));
    }
    if checkpoints && options.max_concurrency != 1 {
        return Err(Error::invalid(
            "checkpoint_every",
            "checkpoints need max_concurrency 1: a state is saved between two calls",
        ));
    }
    let may_restart = options.max_restarts != 0;
    if options.placement.is_none() {
        core.check_feasible(&options.resources)?;
    }
    let (spec_args, held) = core.objects.prepare_args(args)?;
    let actor_id = ActorId::new();
    let spec = ActorSpec {
        actor_id,
        class: A::CLASS.to_string(),
        args: spec_args,
        options,
        owner: core.objects.address().clone(),
        job: core.job_id,
        restarts: 0,
    };
    let c = core.clone();
    let placed = core
        .block_on(async move {
            // Resolve constructor arguments before the raylet sees the actor.
            let mut spec = spec;
            spec.args = c.objects.resolve_args(spec.args).await?;
            // Sent to another node (as a lessee of this job, so that it ends
            // with the job as here), it is kept to be created again if that
            // node dies.
            if let Some(node) = place(&c.raylet, &c.lessee, spec.clone()).await? {
                c.owned_actors.placed(&spec, &node);
            }
            Ok(())
        })
        .inspect_err(|_| core.objects.release_held(&held));
    match (placed, named) {
        (Err(Error::ActorNameTaken { .. }), Some((name, namespace))) if get_if_exists => {
            return get_actor_in::<A>(&name, &namespace);
        }
        (placed, _) => placed?,
    }
    // Kept by name or detached: not counted. Otherwise the handles count.
    let handle = counted
        .then(|| ObjectRef::from_counted(core.objects.new_actor_handle(actor_id), &core.objects));
    let raw = ActorRef {
        actor_id,
        class: A::CLASS.to_string(),
        handle,
        owner: may_restart.then(|| core.objects.address().clone()),
    };
    // The constructor's arguments are released once the actor is up, or
    // for one that may restart (and so construct again), once it is dead.
    let client = core
        .actors
        .client(raw.actor_id, &raw.class, raw.owner.as_ref());
    core.actors.release_after_start(&client, held, may_restart);
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
        handle: None,
        owner: (info.max_restarts != 0).then_some(info.owner),
    }))
}

/// Kills an actor's process at once, for good, whatever its
/// `max_restarts` (Ray's `ray.kill`): calls in flight and later calls fail
/// with [`Error::ActorDied`], and its name becomes free.
pub fn kill<A: Actor>(actor: &ActorHandle<A>) -> Result<()> {
    kill_actor(actor.id(), true)
}

/// Kills an actor's process at once, as a crash would (Ray's `ray.kill`
/// with `no_restart=False`): with restarts left it is restarted, its calls
/// in flight retried within `max_task_retries`; without, it dies as with
/// [`kill`].
///
/// ```no_run
/// #[prism::actor(max_restarts = 1)]
/// struct Session {
///     calls: u32,
/// }
///
/// #[prism::actor]
/// impl Session {
///     fn new() -> Self {
///         Session { calls: 0 }
///     }
///     fn call(&mut self) -> u32 {
///         self.calls += 1;
///         self.calls
///     }
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let session = Session::remote()?;
///     prism::get(&session.call()?)?;
///     prism::kill_allow_restart(&session)?;
///     // The restarted actor ran its constructor again.
///     assert_eq!(prism::get(&session.call()?)?, 1);
///     Ok(())
/// }
/// ```
pub fn kill_allow_restart<A: Actor>(actor: &ActorHandle<A>) -> Result<()> {
    kill_actor(actor.id(), false)
}

fn kill_actor(actor_id: ActorId, no_restart: bool) -> Result<()> {
    let core = current()?;
    // Where it runs, if this process knows: the kill goes there.
    let node_id = core.actors.actor_node(actor_id);
    if no_restart {
        // First: its node may be dying, and this kill must not be undone
        // by creating it again elsewhere.
        core.owned_actors.ended(actor_id);
    }
    let c = core.clone();
    core.block_on(async move {
        c.raylet
            .request(KillActor {
                actor_id,
                no_restart,
                out_of_scope: false,
                node_id,
            })
            .await
    })
    .inspect_err(|_| {
        if no_restart {
            core.owned_actors.kill_failed(actor_id);
        }
    })?;
    core.actors.killed(actor_id);
    Ok(())
}

/// Ends the calling actor once the method that calls it returns (Ray's
/// `ray.actor.exit_actor`): that method's result still reaches its caller,
/// the actor is not restarted whatever its `max_restarts`, its name becomes
/// free, and every later call fails with [`Error::ActorDied`] saying it
/// exited. Calls already queued behind the method are not run. An error if
/// this process hosts no actor.
///
/// ```no_run
/// #[prism::actor]
/// struct Job {
///     done: bool,
/// }
///
/// #[prism::actor]
/// impl Job {
///     fn new() -> Self {
///         Job { done: false }
///     }
///     fn finish(&mut self) -> prism::Result<String> {
///         self.done = true;
///         prism::exit_actor()?;
///         Ok("finished".to_string())
///     }
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let job = Job::remote()?;
///     assert_eq!(prism::get(&job.finish()?)?, "finished");
///     Ok(())
/// }
/// ```
pub fn exit_actor() -> Result<()> {
    current()?.executor.request_exit()
}

/// Saves the calling actor's state once the running method returns (the
/// actor must be `#[prism::actor(checkpoint)]` and created with
/// `checkpoint_every` or `checkpoint_interval`). The state is also saved
/// on those schedules; each save replaces the last, in the node's
/// key-value table, before the call that triggered it answers.
///
/// When a checkpointed actor's process dies and it restarts, it resumes
/// from its latest checkpoint instead of running its constructor:
///
/// - every call that answered before the checkpoint is in the state;
/// - calls that answered after it are lost: their callers have their
///   results, but their effects on the state are gone;
/// - the call that was running when the process died, and the calls
///   queued behind it, run again on the restored state (within
///   `max_task_retries` for the one that may have been running).
///
/// ```no_run
/// use serde::{Deserialize, Serialize};
///
/// #[prism::actor(checkpoint, max_restarts = -1)]
/// #[derive(Serialize, Deserialize)]
/// struct Ledger {
///     entries: Vec<u64>,
/// }
///
/// #[prism::actor]
/// impl Ledger {
///     fn new() -> Self {
///         Ledger { entries: Vec::new() }
///     }
///     fn commit(&mut self, x: u64) -> prism::Result<usize> {
///         self.entries.push(x);
///         prism::checkpoint_actor()?;
///         Ok(self.entries.len())
///     }
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let options = prism::ActorOptions::new().checkpoint_every(100);
///     let ledger = Ledger::remote_with(options)?;
///     assert_eq!(prism::get(&ledger.commit(7)?)?, 1);
///     Ok(())
/// }
/// ```
pub fn checkpoint_actor() -> Result<()> {
    current()?.executor.request_checkpoint()
}
