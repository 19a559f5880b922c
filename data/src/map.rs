//! [`Dataset::map_batches`]: a user function over every batch, as Prism
//! tasks.
//!
//! # How the function travels
//!
//! The user's `fn(Batch) -> Result<Batch, E>` goes to the worker as a
//! [`PortableFn`] serialized to text, next to a second `PortableFn`: the
//! [`trampoline`] monomorphized for `E`, which knows the function's type,
//! resolves it, calls it, and turns an `Err` into its `Display`. The task
//! [`map_batch`] itself is one non-generic function, registered once.
//!
//! The task returns a [`Outcome`] rather than a `Result`, so that a user
//! error comes back as data ([`DataError::MapFn`]) and is told apart from a
//! task that could not run ([`DataError::Task`]).

use super::batch::Batch;
use super::dataset::Dataset;
use super::error::{DataError, Result};
use super::rows;
use prism::portable::{PortableFn, PortableFnError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Display;

/// The type of a batch function given to [`Dataset::map_batches`].
pub type BatchFn<E> = fn(Batch) -> std::result::Result<Batch, E>;

/// The type of [`trampoline`] for every `E` (and of the row-level
/// trampolines of [`LazyDataset::map`](super::LazyDataset::map) and
/// [`LazyDataset::filter`](super::LazyDataset::filter)).
pub(crate) type Trampoline = fn(String, Batch) -> Outcome;

/// What a batch's task produced.
#[derive(Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// The function's output.
    Done(Batch),
    /// The function returned `Err`; its `Display`.
    Failed(String),
    /// The function could not be resolved in the worker.
    NotPortable {
        /// The sender's executable.
        sent: String,
        /// The worker's.
        here: String,
    },
}

impl From<PortableFnError> for Outcome {
    fn from(e: PortableFnError) -> Self {
        match e {
            PortableFnError::OtherExecutable { sent, here } => Outcome::NotPortable { sent, here },
            other => Outcome::Failed(other.to_string()),
        }
    }
}

/// Resolves the user's function from its token (`user`, JSON) and runs it.
fn trampoline<E: Display + 'static>(user: String, batch: Batch) -> Outcome {
    let token: PortableFn<BatchFn<E>> = match serde_json::from_str(&user) {
        Ok(t) => t,
        Err(e) => return Outcome::Failed(format!("malformed function token: {e}")),
    };
    // SAFETY: the token was made by PortableFn::new in map_batches.
    match unsafe { token.resolve() } {
        Ok(f) => match f(batch) {
            Ok(out) => Outcome::Done(out),
            Err(e) => Outcome::Failed(e.to_string()),
        },
        Err(e) => e.into(),
    }
}

/// The user's row function `F` (from its JSON token) and the batch's rows
/// as `T`s: what both row-level trampolines start with.
fn resolve_rows<F: prism::portable::FnPtr, T: DeserializeOwned>(
    user: &str,
    batch: &Batch,
) -> std::result::Result<(F, Vec<T>), Outcome> {
    let token: PortableFn<F> = serde_json::from_str(user)
        .map_err(|e| Outcome::Failed(format!("malformed function token: {e}")))?;
    // SAFETY: the token was made by PortableFn::new in row_map_stage or
    // filter_stage, for this function type (resolve checks the type).
    let f = unsafe { token.resolve() }.map_err(Outcome::from)?;
    let rows = rows::rows_of(batch, 0).map_err(|e| Outcome::Failed(e.to_string()))?;
    Ok((f, rows))
}

/// Resolves a row function `fn(T) -> U` and maps every row of the batch.
fn row_map_trampoline<T: DeserializeOwned + 'static, U: Serialize + 'static>(
    user: String,
    batch: Batch,
) -> Outcome {
    let (f, rows) = match resolve_rows::<fn(T) -> U, T>(&user, &batch) {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    if rows.is_empty() {
        return Outcome::Done(Batch::default());
    }
    match rows::batch_from_items(rows.into_iter().map(f)) {
        Ok(out) => Outcome::Done(out),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Resolves a predicate `fn(T) -> bool` and keeps the rows it accepts.
fn filter_trampoline<T: DeserializeOwned + 'static>(user: String, batch: Batch) -> Outcome {
    let (f, rows) = match resolve_rows::<fn(T) -> bool, T>(&user, &batch) {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    let keep: Vec<usize> = rows
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| f(r).then_some(i))
        .collect();
    Outcome::Done(batch.gather(&keep))
}

fn token<F: prism::portable::FnPtr>(f: F) -> String {
    serde_json::to_string(&PortableFn::new(f)).expect("a function token serializes to JSON")
}

/// A function applied to each block inside its task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockFn {
    /// `MapBatches`, `Map`, `Filter`.
    pub(crate) name: String,
    pub(crate) run: PortableFn<Trampoline>,
    /// The user's function, as its JSON token.
    pub(crate) user: String,
    /// Rows per call; `None` calls it once per block.
    pub(crate) batch_size: Option<usize>,
    /// Whether the stage keeps the row count (`map_batches` may not).
    pub(crate) keeps_rows: bool,
    /// CPUs its task needs, if not the pipeline's `num_cpus_per_task`.
    pub(crate) num_cpus: Option<f64>,
}

/// A `map_batches` step of a lazy pipeline.
pub(crate) fn batch_stage<E: Display + 'static>(
    f: BatchFn<E>,
    batch_size: Option<usize>,
) -> BlockFn {
    BlockFn {
        name: "MapBatches".into(),
        run: PortableFn::new(trampoline::<E> as Trampoline),
        user: token(f),
        batch_size,
        keeps_rows: false,
        num_cpus: None,
    }
}

/// A `map` step of a lazy pipeline.
pub(crate) fn row_map_stage<T, U>(f: fn(T) -> U) -> BlockFn
where
    T: DeserializeOwned + 'static,
    U: Serialize + 'static,
{
    BlockFn {
        name: "Map".into(),
        run: PortableFn::new(row_map_trampoline::<T, U> as Trampoline),
        user: token(f),
        batch_size: None,
        keeps_rows: true,
        num_cpus: None,
    }
}

/// A `filter` step of a lazy pipeline.
pub(crate) fn filter_stage<T: DeserializeOwned + 'static>(f: fn(T) -> bool) -> BlockFn {
    BlockFn {
        name: "Filter".into(),
        run: PortableFn::new(filter_trampoline::<T> as Trampoline),
        user: token(f),
        batch_size: None,
        keeps_rows: false,
        num_cpus: None,
    }
}

/// The task run for each batch.
#[prism::remote]
fn map_batch(trampoline: PortableFn<Trampoline>, user: String, batch: Batch) -> Outcome {
    // SAFETY: the token was made by PortableFn::new in map_batches.
    match unsafe { trampoline.resolve() } {
        Ok(run) => run(user, batch),
        Err(e) => e.into(),
    }
}

impl Dataset {
    /// Applies `f` to every batch of `batch_size` rows (the last may be
    /// shorter), each call a Prism task, all running in parallel on the
    /// cluster; the result has one block per batch, in order.
    ///
    /// `f` is a `fn` item (or a closure that captures nothing): it runs in
    /// worker processes, which run this same executable (see
    /// [`prism::portable`]). It may change the rows, their number and the
    /// columns; every output must have the same schema.
    ///
    /// Unlike Ray Data, this runs now, not when the result is consumed.
    ///
    /// # Errors
    ///
    /// - [`DataError::NotInitialized`] without a cluster: call
    ///   `prism::init` first.
    /// - [`DataError::MapFn`] when `f` returns `Err` (the first batch, in
    ///   order, that failed).
    /// - [`DataError::Task`] when a task panicked or could not run.
    /// - [`DataError::SchemaMismatch`] when outputs differ in schema.
    /// - [`DataError::InvalidArgument`] for `batch_size = 0`.
    ///
    /// ```no_run
    /// use prism_data::{Batch, Column, DataError, Dataset};
    ///
    /// fn square(batch: Batch) -> Result<Batch, DataError> {
    ///     let squares = batch.i64("id")?.iter().map(|x| x * x).collect();
    ///     batch.with_column("square", Column::I64(squares))
    /// }
    ///
    /// prism::init(prism::Config::default()).expect("a local cluster");
    /// let squared = Dataset::range(1000).map_batches(square, 100)?;
    /// assert_eq!(squared.take_batch(4).i64("square")?, [0, 1, 4, 9]);
    /// # Ok::<(), DataError>(())
    /// ```
    pub fn map_batches<E: Display + 'static>(
        &self,
        f: BatchFn<E>,
        batch_size: usize,
    ) -> Result<Dataset> {
        let batches = self.iter_batches(batch_size, false)?;
        if !prism::is_initialized() {
            return Err(DataError::NotInitialized);
        }
        let trampoline = PortableFn::new(trampoline::<E> as Trampoline);
        let user = token(f);
        let refs = batches
            .enumerate()
            .map(|(batch_index, batch)| {
                map_batch::remote(trampoline.clone(), user.clone(), batch).map_err(|source| {
                    DataError::Task {
                        batch_index,
                        source,
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut blocks = Vec::with_capacity(refs.len());
        for (batch_index, r) in refs.iter().enumerate() {
            let outcome = prism::get(r).map_err(|source| DataError::Task {
                batch_index,
                source,
            })?;
            match outcome {
                Outcome::Done(batch) => blocks.push(batch),
                Outcome::Failed(message) => {
                    return Err(DataError::MapFn {
                        batch_index,
                        message,
                    })
                }
                Outcome::NotPortable { sent, here } => {
                    return Err(DataError::NotPortable {
                        batch_index,
                        source: PortableFnError::OtherExecutable { sent, here },
                    })
                }
            }
        }
        Dataset::from_batches(blocks)
    }
}
