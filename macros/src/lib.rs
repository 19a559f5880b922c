//! The attributes of Prism: `#[remote]`, `#[actor]` and `#[main]`.
//!
//! Use them through the `prism` crate (`#[prism::remote]`, ...); they
//! expand to code that names `::prism`.
//!
//! This file holds the entry points; each attribute's expansion is in a
//! module of its own (`remote`, `actor` and `actor_impl`, `main_attr`),
//! over the leaves they share: `options` (the attributes' arguments),
//! `params` and `returns` (a signature's parameters and results) and
//! `types` (what is read from a type).

use proc_macro::TokenStream;

mod actor;
mod actor_impl;
mod main_attr;
mod options;
mod params;
mod remote;
mod returns;
mod types;

/// Makes a function callable as a task: `name::remote(args...)`.
///
/// Options: `name = "stable.name"`, `num_cpus = 2`, `num_gpus = 0.5`,
/// `resource("custom", 1.0)` (repeatable), `max_retries = 5` (-1: no
/// limit), `retry_exceptions = true` (as `TaskOptions`' methods of the
/// same names), and `num_returns = N`: the function returns an `N`-tuple
/// (or a `Result` of one), each value is stored as its own object, and
/// `remote` returns a tuple of `N` `ObjectRef`s. `num_returns =
/// "streaming"` takes a synchronous function returning an iterator
/// (`impl Iterator<Item = T>`, `Box<dyn Iterator<Item = T> + Send>`, a
/// named type such as `Vec<T>`, or a `Result` of one): each item is
/// stored as its own object as it is made, and `remote` returns a
/// `prism::ObjectRefGenerator<T>`. An item written as `Result<T, E>` ends
/// the stream with its `Err`.
#[proc_macro_attribute]
pub fn remote(attr: TokenStream, item: TokenStream) -> TokenStream {
    remote::expand(attr.into(), item.into()).into()
}

/// Makes a struct an actor class (on the struct) and its methods remote
/// (on its `impl` block).
///
/// On the struct, options set creation defaults: `name = "..."`,
/// `namespace = "..."`, `max_concurrency = 4`, `max_restarts = 3`,
/// `max_task_retries = 1`, `checkpoint` (its state can be checkpointed: the
/// struct must derive `Serialize` and `Deserialize`), `num_cpus = 1`,
/// `num_gpus = 1`, `resource("custom", 1.0)`. On the `impl` block, the
/// associated function `new` is the constructor, and every method taking
/// `&self` or `&mut self` can be called remotely through the handle. A
/// method marked `#[local]` stays a plain method (for helpers that take
/// borrowed arguments, say), and other associated functions are left as
/// they are. A method marked `#[method(num_returns = N)]` returns an
/// `N`-tuple whose values are stored as objects of their own: its handle
/// method returns a tuple of `N` `ObjectRef`s. A synchronous method marked
/// `#[method(num_returns = "streaming")]` returns an iterator (which may
/// borrow the actor) whose items are stored one by one as they are made:
/// its handle method returns a `prism::ObjectRefGenerator<T>`.
///
/// ```ignore
/// #[prism::actor]
/// impl Stats {
///     fn new() -> Self { Stats { seen: Vec::new() } }
///     fn add(&mut self, x: f64) -> f64 { self.seen.push(x); self.mean(&self.seen) }
///     #[local]
///     fn mean(&self, xs: &[f64]) -> f64 { xs.iter().sum::<f64>() / xs.len() as f64 }
/// }
/// ```
#[proc_macro_attribute]
pub fn actor(attr: TokenStream, item: TokenStream) -> TokenStream {
    actor::expand(attr.into(), item.into()).into()
}

/// Wraps `main`: the process serves as a worker when started as one, and
/// the cluster is shut down when `main` returns. An `Err` that `main`
/// returns is printed as `error: ` and its `Display` on stderr, and the
/// process exits with code 1.
#[proc_macro_attribute]
pub fn main(attr: TokenStream, item: TokenStream) -> TokenStream {
    main_attr::expand(attr.into(), item.into()).into()
}
