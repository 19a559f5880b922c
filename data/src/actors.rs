//! [`LazyDataset::map_batches_with_actors`]: a pipeline step run by a pool
//! of actors, for preprocessing with state that is costly to make (a loaded
//! model, a tokenizer, a connection): each actor makes it once, in its
//! constructor, and then maps many blocks.

use super::batch::Batch;
use super::error::{positive, Result};
use super::pipeline::{LazyDataset, Step};
use super::wire::{self, Decoded};
use prism::portable::PortableFn;
use prism::View;
use serde::{Deserialize, Serialize};
use std::fmt::Display;
use std::sync::Mutex;

/// What an error from a [`BatchMapper`] may be: anything `?` turns into it.
pub type MapperError = Box<dyn std::error::Error + Send + Sync>;

/// Preprocessing with state, for [`LazyDataset::map_batches_with_actors`]:
/// made once per actor, then called with one batch after another.
///
/// ```
/// use prism_data::{Batch, BatchMapper, Column, MapperError};
///
/// struct Scale {
///     factor: f64, // say, read from a model file in `load`
/// }
///
/// impl BatchMapper for Scale {
///     fn call(&mut self, batch: Batch) -> Result<Batch, MapperError> {
///         let x: Vec<f64> = batch.i64("id")?.iter().map(|v| *v as f64 * self.factor).collect();
///         Ok(batch.with_column("x", Column::F64(x))?)
///     }
/// }
///
/// fn load() -> Result<Scale, String> {
///     Ok(Scale { factor: 0.5 })
/// }
/// # let _ = load;
/// ```
pub trait BatchMapper: Send + 'static {
    /// Maps one batch. An `Err` fails the pipeline with
    /// [`DataError::Stage`](super::DataError::Stage), naming the block.
    fn call(&mut self, batch: Batch) -> std::result::Result<Batch, MapperError>;
}

/// Makes a mapper from the user's constructor token (JSON), type-erased.
type Make = fn(String) -> std::result::Result<Box<dyn BatchMapper>, String>;

fn make_mapper<M: BatchMapper, E: Display + 'static>(
    user: String,
) -> std::result::Result<Box<dyn BatchMapper>, String> {
    let token: PortableFn<fn() -> std::result::Result<M, E>> =
        serde_json::from_str(&user).map_err(|e| format!("malformed constructor token: {e}"))?;
    // SAFETY: the token was made by PortableFn::new in
    // map_batches_with_actors, for this function type (resolve checks it).
    let f = unsafe { token.resolve() }.map_err(|e| e.to_string())?;
    f().map(|m| Box::new(m) as Box<dyn BatchMapper>)
        .map_err(|e| e.to_string())
}

/// A step run by a pool of actors.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ActorStep {
    pub(crate) name: String,
    make: PortableFn<Make>,
    user: String,
    pub(crate) pool_size: usize,
    batch_size: usize,
    pub(crate) num_cpus: f64,
}

impl ActorStep {
    /// Starts the pool's actors.
    pub(crate) fn start(&self) -> prism::Result<Vec<prism::ActorHandle<MapperActor>>> {
        let options = prism::ActorOptions::new().num_cpus(self.num_cpus);
        (0..self.pool_size)
            .map(|_| {
                MapperActor::remote_with(
                    options.clone(),
                    self.make.clone(),
                    self.user.clone(),
                    self.batch_size,
                    self.name.clone(),
                )
            })
            .collect()
    }
}

/// One actor of a pool: the user's mapper, or why it could not be made.
#[prism::actor]
pub(crate) struct MapperActor {
    /// In a mutex only because actors are `Sync`.
    mapper: Mutex<std::result::Result<Box<dyn BatchMapper>, String>>,
    batch_size: usize,
    name: String,
}

#[prism::actor]
impl MapperActor {
    fn new(make: PortableFn<Make>, user: String, batch_size: usize, name: String) -> Self {
        // SAFETY: the token was made by PortableFn::new in
        // map_batches_with_actors (resolve checks the executable and type).
        let mapper = match unsafe { make.resolve() } {
            Ok(make) => make(user),
            Err(e) => Err(e.to_string()),
        };
        let mapper = mapper.map_err(|e| format!("the mapper's constructor failed: {e}"));
        MapperActor {
            mapper: Mutex::new(mapper),
            batch_size,
            name,
        }
    }

    /// Maps one block (read in place) in batches of the step's size.
    fn map(&mut self, block: View<u8>) -> Vec<u8> {
        let batch = match wire::decode(&block) {
            Ok(Decoded::Block(b)) => b,
            Ok(_) => return wire::encode_failed("input", "the input block is a failure record"),
            Err(e) => return wire::encode_failed("input", &e.to_string()),
        };
        let mapper = match self.mapper.get_mut() {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return wire::encode_failed(&self.name, e),
            Err(_) => return wire::encode_failed(&self.name, "an earlier call panicked"),
        };
        let mut outputs = Vec::new();
        let rows = batch.num_rows();
        let size = self.batch_size.max(1);
        let mut start = 0;
        while start < rows || (rows == 0 && outputs.is_empty()) {
            let end = (start + size).min(rows);
            let part = if start == 0 && end == rows {
                batch.clone()
            } else {
                batch.slice(start..end)
            };
            match mapper.call(part) {
                Ok(out) => outputs.push(out),
                Err(e) => return wire::encode_failed(&self.name, &e.to_string()),
            }
            if rows == 0 {
                break;
            }
            start = end;
        }
        if let Err(e) = super::batch::check_schemas(&outputs) {
            return wire::encode_failed(&self.name, &e.to_string());
        }
        wire::encode_many(&outputs)
    }
}

impl LazyDataset {
    /// Applies a stateful mapper to every block, in batches of up to
    /// `batch_size` rows, on a pool of `pool_size` actors (Ray's
    /// `map_batches` with a callable class and an actor pool). Each actor
    /// runs `make` once, in its own worker process, then maps the blocks it
    /// is given; blocks go to the actors in turn and come back in order.
    /// The actors are stopped when the run ends.
    ///
    /// `make` is a `fn` item (workers run this same executable). Each actor
    /// asks for `num_cpus` CPUs (0 is allowed).
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for a `pool_size` or `batch_size` of 0, or a negative `num_cpus`.
    /// When the pipeline runs: [`DataError::Stage`](super::DataError::Stage)
    /// for a constructor that fails or a mapper that returns `Err` or
    /// panics.
    pub fn map_batches_with_actors<M: BatchMapper, E: Display + 'static>(
        &self,
        make: fn() -> std::result::Result<M, E>,
        pool_size: usize,
        batch_size: usize,
        num_cpus: f64,
    ) -> Result<LazyDataset> {
        positive("pool_size", pool_size)?;
        positive("batch_size", batch_size)?;
        if !(num_cpus >= 0.0 && num_cpus.is_finite()) {
            return Err(super::DataError::InvalidArgument {
                argument: "num_cpus",
                value: num_cpus.to_string(),
                reason: "must be a finite number of CPUs, 0 or more",
            });
        }
        let user = serde_json::to_string(&PortableFn::new(make))
            .expect("a function token serializes to JSON");
        let step = ActorStep {
            name: format!("MapBatches(actors x{pool_size})"),
            make: PortableFn::new(make_mapper::<M, E> as Make),
            user,
            pool_size,
            batch_size,
            num_cpus,
        };
        let mut next = self.clone();
        next.steps.push(Step::Actors(step));
        Ok(next)
    }
}
