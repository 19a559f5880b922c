//! What the macros expand to. Not a public API: names here may change in
//! any release.

use crate::codec::{self, Arg};
use crate::generator::ObjectRefGenerator;
use crate::object_ref::ObjectRef;
use crate::options::TaskOptions;
use crate::runtime::{current, Objects, Submission};
use crate::{Error, Result};
use prism_protocol::error::FailureKind;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::TaskSpec;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

pub use crate::actor::create_actor;
pub use crate::codec::Encoded;
pub use crate::runtime::registry::{
    ActorCell, ActorClass, Args, BoxFuture, CallError, CallResult, Invocation, RemoteFunction,
    ACTOR_CLASSES, REMOTE_FUNCTIONS,
};
pub use linkme;

/// Encodes a return value, taking it: a flat buffer (`Vec<u8>`,
/// `Vec<f32>`, ...) goes to the store without an intermediate copy.
pub fn encode_return<T: Serialize + 'static>(value: T) -> CallResult {
    codec::encode_owned(value).map_err(CallError::Runtime)
}

/// Encodes the results of a call that returns several (`num_returns`),
/// first to last, as one result carrying the others.
pub fn encode_returns(results: Vec<CallResult>) -> CallResult {
    let mut results = results.into_iter();
    let Some(first) = results.next() else {
        let reason = "the call returned no values; give it at least one";
        return Err(CallError::Runtime(Error::invalid("num_returns", reason)));
    };
    let mut first = first?;
    first.more = results.collect::<std::result::Result<_, _>>()?;
    Ok(first)
}

/// Turns a returned `Err` into a task failure carrying its message.
pub fn app_error<E: std::fmt::Display>(err: E) -> CallError {
    CallError::App {
        kind: FailureKind::Error,
        message: err.to_string(),
    }
}

/// Downcasts an actor instance.
pub fn actor_ref<A: 'static>(
    instance: &(dyn Any + Send + Sync),
) -> std::result::Result<&A, CallError> {
    instance.downcast_ref::<A>().ok_or_else(wrong_class::<A>)
}

/// Downcasts an actor instance mutably.
pub fn actor_mut<A: 'static>(
    instance: &mut (dyn Any + Send + Sync),
) -> std::result::Result<&mut A, CallError> {
    instance.downcast_mut::<A>().ok_or_else(wrong_class::<A>)
}

fn wrong_class<A>() -> CallError {
    CallError::Runtime(Error::WrongActorInstance {
        expected: std::any::type_name::<A>().to_string(),
    })
}

/// A synchronous `&self` method call (run on a thread that may block).
pub fn call_ref<A, F>(cell: Arc<ActorCell>, f: F) -> Invocation
where
    A: Send + Sync + 'static,
    F: FnOnce(&A) -> CallResult + Send + 'static,
{
    Invocation::Blocking(Box::new(move || {
        let guard = cell.blocking_read();
        f(actor_ref::<A>(&**guard)?)
    }))
}

/// A synchronous `&mut self` method call (run on a thread that may block).
pub fn call_mut<A, F>(cell: Arc<ActorCell>, f: F) -> Invocation
where
    A: Send + Sync + 'static,
    F: FnOnce(&mut A) -> CallResult + Send + 'static,
{
    Invocation::Blocking(Box::new(move || {
        let mut guard = cell.blocking_write();
        f(actor_mut::<A>(&mut **guard)?)
    }))
}

/// Submits a task (used by generated `function::remote`).
pub fn submit_task<R>(
    function: &str,
    options: TaskOptions,
    args: Vec<Result<Arg>>,
) -> Result<ObjectRef<R>> {
    let [r] = submit_task_n::<1>(function, options, args)?;
    Ok(r.retype())
}

/// Submits a task that returns `N` values (`num_returns = N`): one
/// reference per value, first to last.
pub fn submit_task_n<const N: usize>(
    function: &str,
    options: TaskOptions,
    args: Vec<Result<Arg>>,
) -> Result<[ObjectRef<()>; N]> {
    Ok(submit::<N, ()>(function, options, args, false, |_, _| ())?.0)
}

/// Submits a streaming task (`num_returns = "streaming"`): its values'
/// references arrive through the generator as they are made.
pub fn submit_stream<T>(
    function: &str,
    options: TaskOptions,
    args: Vec<Result<Arg>>,
) -> Result<ObjectRefGenerator<T>> {
    let limit = options.stream_backpressure()?;
    let open = |objects: &Arc<Objects>, refs: &[ObjectRef<()>; 1]| {
        ObjectRefGenerator::open(refs[0].clone(), objects, limit)
    };
    Ok(submit::<1, _>(function, options, args, true, open)?.1)
}

/// Submits a task; `before` runs just before it is handed to the
/// submitter (a streaming task's stream opens there, before the task can
/// send a value).
fn submit<const N: usize, R>(
    function: &str,
    options: TaskOptions,
    args: Vec<Result<Arg>>,
    streaming: bool,
    before: impl FnOnce(&Arc<Objects>, &[ObjectRef<()>; N]) -> R,
) -> Result<([ObjectRef<()>; N], R)> {
    const { assert!(N >= 1, "a call returns at least one value") };
    let core = current()?;
    let shape = options.scheduling_key()?;
    let (max_retries, retry_exceptions, retry_matching) = options.retry_policy()?;
    let stream_backpressure = options.stream_backpressure()?;
    if shape.bundle.is_none() {
        core.check_feasible(&shape.shape)?;
    }
    let args = args.into_iter().collect::<Result<Vec<_>>>()?;
    let (spec_args, held) = core.objects.prepare_args(args)?;
    let ids: [ObjectId; N] = std::array::from_fn(|_| ObjectId::new());
    let refs = ids.map(|id| ObjectRef::from_counted(core.objects.new_pending(id), &core.objects));
    if N > 1 {
        core.objects.refs.add_more_returns(ids[0], &ids[1..]);
    }
    let caller = core.objects.address().clone();
    let spec = TaskSpec::new(
        function.into(),
        spec_args,
        ids[0],
        ids[1..].to_vec(),
        caller,
    )
    .streaming(streaming, stream_backpressure);
    let made = before(&core.objects, &refs);
    core.tasks.submit(
        shape,
        Submission::new(spec, held).retries(max_retries, retry_exceptions, retry_matching),
    );
    Ok((refs, made))
}

/// Sends the values of a streaming call (`num_returns = "streaming"`) to
/// its caller as the iterator makes them; the call's result is their
/// number. An `Err` item ends the call with that error.
pub fn stream_items(items: impl Iterator<Item = CallResult>) -> CallResult {
    crate::runtime::streams::emit_all(items)
}

/// A type the caller of a streaming function can decode: its values.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a value of a streaming function or method: its values are \
               decoded in the caller's process",
    label = "make the iterator yield owned values (String rather than &str, u64 rather than &u64)"
)]
pub trait StreamValue: serde::de::DeserializeOwned {}

impl<T: serde::de::DeserializeOwned> StreamValue for T {}

/// Checks at compile time that `T` can be a streamed value.
pub fn stream_value<T: StreamValue>() {}

/// Gives a reference its value type (for the results of `num_returns`).
pub fn retype<T>(r: ObjectRef<()>) -> ObjectRef<T> {
    r.retype()
}

/// Enters worker mode if this process was started as a worker (used by
/// `#[prism::main]`; the same check also runs before `main`).
pub fn enter_worker_mode_if_requested() {
    crate::runtime::startup::enter_worker_if_requested();
}

/// Encodes an actor's state for a checkpoint.
pub fn encode_state<A: Serialize + 'static>(
    state: &(dyn Any + Send + Sync),
) -> std::result::Result<Vec<u8>, String> {
    let state = state
        .downcast_ref::<A>()
        .ok_or_else(|| "the actor's state is not of its class".to_string())?;
    rmp_serde::to_vec_named(state).map_err(|e| format!("cannot encode the actor's state: {e}"))
}

/// Decodes an actor's state from a checkpoint.
pub fn decode_state<A: serde::de::DeserializeOwned + Send + Sync + 'static>(
    bytes: &[u8],
) -> std::result::Result<Box<dyn Any + Send + Sync>, String> {
    let state: A = rmp_serde::from_slice(bytes)
        .map_err(|e| format!("cannot decode the actor's checkpoint: {e}"))?;
    Ok(Box::new(state))
}
