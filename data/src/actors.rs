//! [`LazyDataset::map_batches_with_actors`]: a pipeline step run by a pool
//! of actors, for preprocessing with state that is costly to make (a loaded
//! model, a tokenizer, a connection): each actor makes it once, in its
//! constructor, and then maps many blocks. The method itself is in the
//! `pipeline` module, next to the other steps; this one runs the pool.
//!
//! [`LazyDataset::map_batches_with_actors`]: super::LazyDataset::map_batches_with_actors

use super::batch::Batch;
use super::wire::{self, Decoded};
use prism::portable::PortableFn;
use prism::View;
use serde::{Deserialize, Serialize};
use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an actor of a range pool may go without a block before it is
/// stopped (while the pool has more than its `min`).
pub const POOL_IDLE: Duration = Duration::from_secs(1);

/// What an error from a [`BatchMapper`] may be: anything `?` turns into it.
pub type MapperError = Box<dyn std::error::Error + Send + Sync>;

/// Preprocessing with state, for
/// [`LazyDataset::map_batches_with_actors`](super::LazyDataset::map_batches_with_actors):
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
pub(crate) type Make = fn(String) -> std::result::Result<Box<dyn BatchMapper>, String>;

pub(crate) fn make_mapper<M: BatchMapper, E: Display + 'static>(
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

/// The size of an actor pool (Ray's `concurrency`): a fixed number of
/// actors (`5.into()`), or a range (`(1, 4).into()`) that starts at `min`
/// and grows while every actor is busy, blocks are waiting and the cluster
/// has a CPU free for one more, up to `max`. A range pool also shrinks: an
/// actor left without a block for [`POOL_IDLE`] is stopped (its CPU freed)
/// while more than `min` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSize {
    /// Actors started with the run.
    pub min: usize,
    /// The most actors the pool grows to.
    pub max: usize,
}

impl From<usize> for PoolSize {
    fn from(n: usize) -> PoolSize {
        PoolSize { min: n, max: n }
    }
}

impl From<(usize, usize)> for PoolSize {
    fn from((min, max): (usize, usize)) -> PoolSize {
        PoolSize { min, max }
    }
}

/// A step run by a pool of actors.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ActorStep {
    pub(crate) name: String,
    pub(crate) make: PortableFn<Make>,
    pub(crate) user: String,
    pub(crate) pool: PoolSize,
    pub(crate) batch_size: usize,
    pub(crate) num_cpus: f64,
}

impl ActorStep {
    fn start_one(&self) -> prism::Result<prism::ActorHandle<MapperActor>> {
        MapperActor::remote_with(
            prism::ActorOptions::new().num_cpus(self.num_cpus),
            self.make.clone(),
            self.user.clone(),
            self.batch_size,
            self.name.clone(),
        )
    }

    /// Starts the pool with its first `min` actors.
    pub(crate) fn start(&self) -> prism::Result<ActorPool> {
        let actors = (0..self.pool.min)
            .map(|_| self.start_one())
            .collect::<prism::Result<Vec<_>>>()?;
        let now = Instant::now();
        Ok(ActorPool {
            busy: vec![Vec::new(); actors.len()],
            last_active: vec![now; actors.len()],
            actors,
            step: self.clone(),
            stopped_idle: 0,
        })
    }
}

/// A running pool: its actors, the calls each has not finished, and when
/// each was last seen busy (sent a block, or found with calls out).
pub(crate) struct ActorPool {
    actors: Vec<prism::ActorHandle<MapperActor>>,
    busy: Vec<Vec<prism::ObjectRef<Vec<u8>>>>,
    last_active: Vec<Instant>,
    step: ActorStep,
    /// Actors stopped for being idle.
    pub(crate) stopped_idle: usize,
}

impl ActorPool {
    /// The number of actors running.
    pub(crate) fn len(&self) -> usize {
        self.actors.len()
    }

    /// Maps `block` on the actor with the fewest unfinished calls (the
    /// first free one), starting another actor first when every one is
    /// busy and the pool may grow into a free CPU.
    pub(crate) fn map(
        &mut self,
        block: &prism::ObjectRef<Vec<u8>>,
    ) -> prism::Result<prism::ObjectRef<Vec<u8>>> {
        let now = Instant::now();
        for (calls, active) in self.busy.iter_mut().zip(&mut self.last_active) {
            if !calls.is_empty() {
                let n = calls.len();
                let (_, pending) = prism::wait(calls, n, Some(Duration::ZERO))?;
                *calls = pending;
                // Still busy, or done since the last look: either way it
                // counts as busy until now, so a slow mapper that just
                // finished is not taken for an idle one.
                *active = now;
            }
        }
        self.stop_idle(now);
        let (mut pick, load) = self
            .busy
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.len()))
            .min_by_key(|&(_, n)| n)
            .unwrap_or((0, usize::MAX));
        // Grow only when every actor is busy and the pool may; only then ask
        // the raylet for free CPUs (an actor of 0 CPUs needs none free).
        let may_grow = load > 0 && self.actors.len() < self.step.pool.max;
        if may_grow && (self.step.num_cpus == 0.0 || self.cpu_free()) {
            self.actors.push(self.step.start_one()?);
            self.busy.push(Vec::new());
            self.last_active.push(now);
            pick = self.actors.len() - 1;
        }
        let r = self.actors[pick].map(block)?;
        self.busy[pick].push(r.clone());
        self.last_active[pick] = now;
        Ok(r)
    }

    /// Stops actors with no call left that were last seen busy
    /// [`POOL_IDLE`] ago or more, longest idle first, while more than `min`
    /// run.
    fn stop_idle(&mut self, now: Instant) {
        while self.actors.len() > self.step.pool.min {
            let longest = (0..self.actors.len())
                .filter(|&i| self.busy[i].is_empty())
                .map(|i| (i, now.saturating_duration_since(self.last_active[i])))
                .filter(|(_, idle)| *idle >= POOL_IDLE)
                .max_by_key(|(_, idle)| *idle);
            let Some((i, _)) = longest else {
                return;
            };
            let actor = self.actors.remove(i);
            self.busy.remove(i);
            self.last_active.remove(i);
            let _ = prism::kill(&actor);
            self.stopped_idle += 1;
        }
    }

    fn cpu_free(&self) -> bool {
        prism::cluster_resources()
            .map(|(_, free)| free.get("CPU").as_f64() >= self.step.num_cpus)
            .unwrap_or(false)
    }
}

impl Drop for ActorPool {
    fn drop(&mut self) {
        // The run is over: its actors stop at once, freeing their CPUs
        // (they would also end with their last handle, here).
        for actor in &self.actors {
            let _ = prism::kill(actor);
        }
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
