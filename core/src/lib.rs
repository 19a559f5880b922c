//! Prism: remote tasks, stateful actors and a shared-memory object store
//! for Rust programs, on one machine or many.
//!
//! # A tour
//!
//! ```no_run
//! use std::time::Duration;
//!
//! #[prism::remote]
//! fn add(a: i64, b: i64) -> i64 {
//!     a + b
//! }
//!
//! #[prism::remote]
//! fn sum(values: prism::View<f32>) -> f64 {
//!     values.iter().map(|v| *v as f64).sum()
//! }
//!
//! #[prism::actor]
//! struct Counter {
//!     n: i64,
//! }
//!
//! #[prism::actor]
//! impl Counter {
//!     fn new(start: i64) -> Self {
//!         Counter { n: start }
//!     }
//!     fn incr(&mut self, by: i64) -> i64 {
//!         self.n += by;
//!         self.n
//!     }
//! }
//!
//! #[prism::main]
//! fn main() -> prism::Result<()> {
//!     prism::init(prism::Config::default())?; // an embedded single-node cluster
//!     let r = add::remote(1, 2)?; // ObjectRef<i64>
//!     assert_eq!(prism::get(&r)?, 3);
//!     let big = prism::put(vec![1.0f32; 25_000_000])?; // 100 MB, stored once
//!     let s = sum::remote(&big)?; // the worker reads it in place
//!     assert_eq!(prism::get(&s)?, 25_000_000.0);
//!     let c = Counter::remote(0)?; // an actor in its own process
//!     assert_eq!(prism::get(&c.incr(5)?)?, 5);
//!     let refs: Vec<_> = (0..20).map(|i| add::remote(i, i)).collect::<prism::Result<_>>()?;
//!     let (ready, pending) = prism::wait(&refs, 10, Some(Duration::from_secs(1)))?;
//!     println!("{} ready, {} pending", ready.len(), pending.len());
//!     Ok(())
//! }
//! ```
//!
//! # Tasks
//!
//! `#[prism::remote]` on a function (sync or `async`) registers it under a
//! stable name (`module::path::name`, or `name = "..."`) and generates a
//! module of the same name with `remote(args...)` and
//! `remote_with(TaskOptions, args...)`. Each argument may be the value
//! itself or an [`ObjectRef`] to it; a reference arrives as its value.
//! Options on the attribute (`num_cpus`, `num_gpus`, `resource("name",
//! amount)`, `max_retries`, `retry_exceptions`) set the defaults; the options given to `remote_with` override
//! them field by field ([`TaskOptions::or`]), as Ray's `.options()` does. A function may return `T` or `Result<T, E>` with
//! `E: Display`; an `Err` or a panic reaches the caller as
//! [`Error::TaskFailed`]. `num_returns = N` on the attribute (not an
//! option of `remote_with`: it shapes the types) gives one `ObjectRef`
//! per value of a returned tuple (see "Several results" below).
//!
//! # Actors
//!
//! `#[prism::actor]` on a struct and on its `impl` block makes `Type::remote(
//! constructor args)` start the actor in its own worker process (the
//! constructor is the associated function `new`), and returns an
//! [`ActorHandle`] whose methods (`&self`, `&mut self`, sync or `async`)
//! return `ObjectRef`s. Options on the struct's attribute (`name`,
//! `namespace`, `max_concurrency`, `max_restarts`, `max_task_retries`,
//! `num_cpus`, `num_gpus`, `resource("name", amount)`) are
//! defaults; `Type::remote_with(ActorOptions, ...)` overrides them. An
//! actor with `async` methods (and `max_concurrency` unset) is an async
//! actor, as in Ray: while one of
//! its async calls awaits, its later calls start (see
//! [`ActorOptions::max_concurrency`]). A call holds the actor's lock while
//! it runs, across awaits too, so a `&mut self` call waits for every call
//! in flight and the calls behind it wait for it: keep state that a waiting
//! call and a later call share behind `&self`. Named
//! actors are found with [`get_actor`]; [`kill`] ends one. An
//! [`ActorPool`] spreads calls over several actors of one class.
//!
//! # Several results
//!
//! `num_returns = N` on a remote function, or `#[method(num_returns = N)]`
//! on an actor method (Ray's `num_returns`), stores each value of the
//! returned `N`-tuple as an object of its own, and the call returns one
//! `ObjectRef` per value: each is read, passed on, waited on and freed on
//! its own, and cancelling any of them cancels the call. An `Err` or a
//! panic fails all of them.
//!
//! ```no_run
//! #[prism::remote(num_returns = 2)]
//! fn split(values: Vec<i64>) -> (Vec<i64>, Vec<i64>) {
//!     values.into_iter().partition(|v| v % 2 == 0)
//! }
//!
//! #[prism::actor]
//! struct Stats;
//!
//! #[prism::actor]
//! impl Stats {
//!     fn new() -> Self {
//!         Stats
//!     }
//!     #[method(num_returns = 2)]
//!     fn min_max(&self, values: Vec<i64>) -> Result<(i64, i64), String> {
//!         let min = values.iter().min().ok_or("no values")?;
//!         let max = values.iter().max().ok_or("no values")?;
//!         Ok((*min, *max))
//!     }
//! }
//!
//! #[prism::main]
//! fn main() -> prism::Result<()> {
//!     prism::init(prism::Config::default())?;
//!     let (even, odd) = split::remote(vec![1, 2, 3, 4])?;
//!     assert_eq!(prism::get(&odd)?, vec![1, 3]);
//!     let stats = Stats::remote()?;
//!     let (min, max) = stats.min_max(&even)?; // a ref passes for its value
//!     assert_eq!((prism::get(&min)?, prism::get(&max)?), (2, 4));
//!     Ok(())
//! }
//! ```
//!
//! # Streaming results
//!
//! `num_returns = "streaming"` (Ray's generators) on a synchronous remote
//! function or actor method returning an iterator (`impl Iterator<Item =
//! T>`, a boxed one, or a named type such as `Vec<T>`, or a `Result` of
//! one) stores each item as its own object as soon as the iterator makes
//! it. The call returns an [`ObjectRefGenerator`], an iterator of the
//! items' references in order, so the caller works on the first items
//! while the function makes the next. Items written as `Result<T, E>`
//! end the stream with their `Err`, after the items before it. The
//! function does not wait for the caller to read an item before it makes
//! the next: items not read yet wait, stored, in the caller's generator
//! (as Ray's generators), unless
//! [`TaskOptions::generator_backpressure`] bounds them.
//!
//! ```no_run
//! #[prism::remote(num_returns = "streaming")]
//! fn chunks(total: usize, size: usize) -> impl Iterator<Item = Vec<u8>> {
//!     (0..total).step_by(size).map(move |at| vec![7u8; size.min(total - at)])
//! }
//!
//! #[prism::main]
//! fn main() -> prism::Result<()> {
//!     prism::init(prism::Config::default())?;
//!     let mut bytes = 0;
//!     for chunk in chunks::remote(10 << 20, 1 << 20)? {
//!         bytes += prism::get(&chunk?)?.len(); // while the next is made
//!     }
//!     assert_eq!(bytes, 10 << 20);
//!     Ok(())
//! }
//! ```
//!
//! # Objects
//!
//! [`put`] stores a value; [`get`], [`get_many`] and their `_timeout`
//! forms read; `.await` on an `ObjectRef` reads without blocking; [`wait`]
//! splits refs into ready and not ready. Large flat buffers are read in
//! place through [`View`]. Objects are freed when no reference remains.
//!
//! # The cluster
//!
//! [`init`] with no address starts an embedded cluster in this process:
//! a raylet, a shared-memory store, and one worker process per CPU running
//! this same binary (see the `worker` module notes in `docs/architecture.md`).
//! Worker output is printed with a `(pid=…)` or `(Class pid=…)` prefix and
//! kept in the session's `logs/`.
//!
//! # Blocking calls and async code
//!
//! The blocking forms (`get`, `get_many`, `wait`, `put`) may be called from
//! any thread, including inside synchronous remote functions and actor
//! methods (a task waiting in `get` lends its CPUs back, so nested tasks can
//! run). Inside `async` functions and methods, use the async forms
//! (`.await` on an `ObjectRef`, [`get_async`], [`wait_async`],
//! [`put_async`]): a blocking call there occupies one of the process's
//! runtime threads until it returns.
//!
//! # Errors
//!
//! Every fallible call returns [`Result`]; [`Error`] says what went wrong
//! with the ids and values involved.
#![warn(missing_docs, missing_debug_implementations)]
#![doc(test(attr(deny(warnings))))]

// The public API, above the runtime.
mod actor;
mod api;
mod generator;
pub mod kv;
mod object_ref;
mod options;
mod placement;
mod pool;
mod resources;
mod view;
// The per-process runtime and its components.
mod runtime;
// Leaves: encoding, configuration, logging, portable functions.
mod codec;
mod config;
mod logging;
pub mod portable;

#[doc(hidden)]
pub mod private;

#[doc(hidden)]
pub use private as __private;

pub use actor::{
    checkpoint_actor, exit_actor, get_actor, get_actor_in, kill, kill_allow_restart, Actor,
    ActorHandle, ActorRef,
};
pub use api::{
    available_resources, cancel, cluster_resources, get, get_async, get_many, get_many_async,
    get_many_timeout, get_timeout, get_view, init, is_initialized, node_tls, nodes,
    object_store_stats, put, put_async, put_ref, retry_stats, runtime_context, shutdown, wait,
    wait_async, RetryStats, RuntimeContext, WaitResult,
};
pub use codec::Arg;
pub use codec::Element;
pub use config::Config;
pub use generator::ObjectRefGenerator;
pub use object_ref::{IntoArg, ObjectRef};
pub use options::{ActorOptions, RuntimeEnv, TaskOptions, ASYNC_ACTOR_CONCURRENCY};
pub use placement::{
    get_placement_group, list_placement_groups, named_placement_group, placement_group,
    remove_placement_group, Bundle, PlacementGroup, PlacementStrategy,
};
pub use pool::ActorPool;
pub use prism_macros::{actor, main, remote};
pub use prism_protocol::error::{Error, FailureKind, Result};
pub use prism_protocol::ids::{
    ActorId, JobId, NodeId, ObjectId, PlacementGroupId, TaskId, WorkerId,
};
pub use prism_protocol::messages::NodeInfo;
pub use prism_protocol::messages::PlacementGroupState;
pub use prism_protocol::messages::SchedulingStrategy;
pub use prism_protocol::messages::StoreStats;
pub use prism_protocol::resources::{Quantity, ResourceSet};
pub use prism_protocol::tls::Tls as NodeTls;
pub use view::View;
