//! The function registry: every `#[prism::remote]` function and
//! `#[prism::actor]` class of the binary, found by name, and what a call
//! is made of (its arguments, how it runs, how it failed).
//!
//! The tables are built by the linker (`linkme` distributed slices), so they
//! are complete before any code runs, including a worker entered before
//! `main`. The macros reach them through `prism::__private`.

use super::store::Loaded;
use crate::codec::{self, Element, Encoded};
use crate::view::View;
use crate::{Error, Result};
use prism_protocol::error::FailureKind;
use prism_protocol::ids::TaskId;
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How a call failed on the executing side.
#[derive(Debug)]
pub enum CallError {
    /// The user's code panicked or returned `Err`.
    App {
        /// Which.
        kind: FailureKind,
        /// Its message.
        message: String,
    },
    /// Prism could not run it (bad argument bytes, ...).
    Runtime(Error),
}

/// What a remote function or method produces.
pub type CallResult = std::result::Result<Encoded, CallError>;

/// A remote function, registered at link time.
#[derive(Debug)]
pub struct RemoteFunction {
    /// Its stable name.
    pub name: &'static str,
    /// Builds the call from resolved arguments.
    pub invoke: fn(Args) -> Invocation,
}

/// The instance of an actor, shared by its concurrent calls.
pub type ActorCell = tokio::sync::RwLock<Box<dyn Any + Send + Sync>>;

/// An actor class, registered at link time.
#[derive(Debug)]
pub struct ActorClass {
    /// Its stable name.
    pub name: &'static str,
    /// Runs the constructor (on a blocking thread).
    pub construct: fn(Args) -> std::result::Result<Box<dyn Any + Send + Sync>, CallError>,
    /// Builds a method call; `None` for an unknown method.
    pub dispatch: fn(Arc<ActorCell>, &str, Args) -> Option<Invocation>,
    /// Encodes a state for a checkpoint; `None` if the class cannot.
    pub snapshot: Snapshot,
    /// Decodes a checkpoint; `None` if the class cannot.
    pub restore: Restore,
}

/// An actor state, type-erased.
pub type State = Box<dyn Any + Send + Sync>;

/// Encodes an actor's state for a checkpoint (`None`: the class cannot).
pub type Snapshot = fn(&(dyn Any + Send + Sync)) -> Option<std::result::Result<Vec<u8>, String>>;

/// Decodes an actor's checkpoint (`None`: the class cannot).
pub type Restore = fn(&[u8]) -> Option<std::result::Result<State, String>>;

/// Every `#[prism::remote]` function in the binary.
#[linkme::distributed_slice]
pub static REMOTE_FUNCTIONS: [RemoteFunction];

/// Every `#[prism::actor]` class in the binary.
#[linkme::distributed_slice]
pub static ACTOR_CLASSES: [ActorClass];

/// Refuses a binary in which two remote functions, or two actor classes,
/// share a name (`#[prism::remote(name = "...")]` given twice): a call
/// would run whichever one the index kept.
pub(crate) fn check_unique_names() -> Result<()> {
    fn repeated<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        let mut seen = std::collections::HashSet::new();
        let mut twice: Vec<&str> = names.filter(|n| !seen.insert(*n)).collect();
        twice.sort_unstable();
        twice.dedup();
        twice
    }
    let functions = repeated(REMOTE_FUNCTIONS.iter().map(|f| f.name));
    if !functions.is_empty() {
        return Err(Error::invalid(
            "#[prism::remote(name = ...)]",
            format!(
                "more than one remote function in this binary is named {}: give each its own \
                 name (or drop `name = ...` to use its module path)",
                functions.join(", ")
            ),
        ));
    }
    let classes = repeated(ACTOR_CLASSES.iter().map(|c| c.name));
    if !classes.is_empty() {
        return Err(Error::invalid(
            "#[prism::actor]",
            format!(
                "more than one actor class in this binary is named {}",
                classes.join(", ")
            ),
        ));
    }
    Ok(())
}

pub(crate) fn find_function(name: &str) -> Option<&'static RemoteFunction> {
    static INDEX: OnceLock<HashMap<&'static str, &'static RemoteFunction>> = OnceLock::new();
    INDEX
        .get_or_init(|| REMOTE_FUNCTIONS.iter().map(|f| (f.name, f)).collect())
        .get(name)
        .copied()
}

pub(crate) fn find_class(name: &str) -> Option<&'static ActorClass> {
    static INDEX: OnceLock<HashMap<&'static str, &'static ActorClass>> = OnceLock::new();
    INDEX
        .get_or_init(|| ACTOR_CLASSES.iter().map(|c| (c.name, c)).collect())
        .get(name)
        .copied()
}

/// How a call runs.
pub enum Invocation {
    /// Synchronous code, run on a blocking thread.
    Blocking(Box<dyn FnOnce() -> CallResult + Send + 'static>),
    /// An async function, run on the worker's runtime.
    Async(BoxFuture<CallResult>),
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Invocation::Blocking(_) => "Invocation::Blocking",
            Invocation::Async(_) => "Invocation::Async",
        })
    }
}

/// A call's arguments, fetched and ready to decode.
pub struct Args {
    items: Vec<Option<Loaded>>,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Args({})", self.items.len())
    }
}

impl Args {
    pub(crate) fn new(items: Vec<Loaded>) -> Args {
        Args {
            items: items.into_iter().map(Some).collect(),
        }
    }

    /// Decodes argument `i` as a `T` (once).
    pub fn take<T: DeserializeOwned + 'static>(
        &mut self,
        i: usize,
    ) -> std::result::Result<T, CallError> {
        let loaded = self
            .items
            .get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| {
                CallError::Runtime(Error::invalid(
                    format!("argument {i}"),
                    "missing: the caller passed fewer arguments than the function takes",
                ))
            })?;
        match try_view::<T>(loaded) {
            Ok(view) => view.map_err(CallError::Runtime),
            Err(loaded) => codec::decode::<T>(loaded.bytes()).map_err(CallError::Runtime),
        }
    }
}

macro_rules! view_types {
    ($($e:ty),*) => {
        /// Builds a `View` if `T` is one; otherwise hands the bytes back.
        fn try_view<T: 'static>(loaded: Loaded) -> std::result::Result<Result<T>, Loaded> {
            let id = TypeId::of::<T>();
            $(
                if id == TypeId::of::<View<$e>>() {
                    return Ok(make_view::<$e>(loaded).map(|v| {
                        match (Box::new(v) as Box<dyn Any>).downcast::<T>() {
                            Ok(t) => *t,
                            Err(_) => unreachable!("type ids matched"),
                        }
                    }));
                }
            )*
            Err(loaded)
        }
    };
}
view_types!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// A view of an object: in place if it is in the store, else a copy.
pub(crate) fn make_view<E: Element>(loaded: Loaded) -> Result<View<E>> {
    let not_a_buffer = || Error::Serialization {
        type_name: std::any::type_name::<View<E>>().to_string(),
        message: "the object is not a flat buffer of this element type".into(),
    };
    match loaded {
        Loaded::Inline(bytes) => View::from_inline(&bytes),
        Loaded::Stored { ptr, len, pin } => {
            // Pinned and in bounds while `pin` lives; it moves into the view.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            match codec::raw_payload(bytes) {
                Some((tag, payload)) if tag == E::TAG => {
                    Ok(View::shared(payload.as_ptr(), payload.len(), pin))
                }
                _ => Err(not_a_buffer()),
            }
        }
    }
}

/// The failure for a task that panicked (as a tokio task).
pub(crate) fn panic_error(e: tokio::task::JoinError) -> CallError {
    if !e.is_panic() {
        return CallError::Runtime(Error::CallAborted);
    }
    panic_payload_error(e.into_panic())
}

/// The failure for a caught panic payload.
pub(crate) fn panic_payload_error(payload: Box<dyn Any + Send>) -> CallError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into());
    CallError::App {
        kind: FailureKind::Panic,
        message,
    }
}

thread_local! {
    /// The task or actor call this thread runs now
    /// ([`crate::RuntimeContext::task_id`]).
    static CURRENT_TASK: std::cell::Cell<Option<TaskId>> = const { std::cell::Cell::new(None) };
}

/// The task or actor call running on this thread, if any.
pub(crate) fn current_task() -> Option<TaskId> {
    CURRENT_TASK.with(|c| c.get())
}

/// Marks this thread as running `task` until dropped, then restores what
/// was there (a nested blocking `get` may run nothing else here, but the
/// restore keeps that true if it ever does).
pub(crate) struct RunningTask(Option<TaskId>);

impl RunningTask {
    pub(crate) fn enter(task: TaskId) -> Self {
        RunningTask(CURRENT_TASK.with(|c| c.replace(Some(task))))
    }
}

impl Drop for RunningTask {
    fn drop(&mut self) {
        CURRENT_TASK.with(|c| c.set(self.0));
    }
}

/// Runs a call's future as task `.1`, turning a panic while polling it
/// into a `CallError` (so an async call needs no extra task just to catch
/// panics). The task is marked on each poll, whichever thread polls.
pub(crate) struct CatchUnwind(pub(crate) BoxFuture<CallResult>, pub(crate) TaskId);

impl Future for CatchUnwind {
    type Output = CallResult;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<CallResult> {
        let _running = RunningTask::enter(self.1);
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => std::task::Poll::Ready(Err(panic_payload_error(payload))),
        }
    }
}
