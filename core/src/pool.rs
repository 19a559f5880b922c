//! A fixed set of actors that calls are spread over (Ray's `ActorPool`).
//!
//! Each actor of the pool runs one submitted call at a time. A call
//! submitted while every actor is busy waits in the pool and goes to the
//! first actor whose call finishes. Results are read in submission order
//! ([`ActorPool::get_next`]) or as they finish
//! ([`ActorPool::get_next_unordered`]). While a read waits, the actors of
//! calls that finish meanwhile take the waiting calls at once, so a slow
//! first call does not leave the others idle (Ray hands an actor back
//! only when its own result is read).

use crate::actor::{Actor, ActorHandle};
use crate::api::{get, wait};
use crate::object_ref::ObjectRef;
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A call kept until an actor is free: given the actor, it submits.
type Call<A, R> = Box<dyn FnOnce(&ActorHandle<A>) -> Result<ObjectRef<R>> + Send>;

/// Actors of one class that calls are spread over, one call per actor at
/// a time, as Ray's `ray.util.ActorPool`.
///
/// Calls are closures given an actor: `pool.submit(move |a| a.work(x))`.
/// Reads block like [`get`]; from `async` code, call them on a blocking
/// thread.
///
/// ```no_run
/// #[prism::actor]
/// struct Doubler;
///
/// #[prism::actor]
/// impl Doubler {
///     fn new() -> Self {
///         Doubler
///     }
///     fn double(&self, x: i64) -> i64 {
///         2 * x
///     }
/// }
///
/// # fn main() -> prism::Result<()> {
/// prism::init(prism::Config::default())?;
/// let actors = vec![Doubler::remote()?, Doubler::remote()?];
/// let mut pool = prism::ActorPool::new(actors);
/// // In the order given, two at a time.
/// let doubled: Vec<i64> = pool
///     .map(|a, x| a.double(x), 1..=4)
///     .collect::<prism::Result<_>>()?;
/// assert_eq!(doubled, vec![2, 4, 6, 8]);
/// // One call at a time, read as they finish.
/// pool.submit(|a| a.double(10));
/// pool.submit(|a| a.double(20));
/// let mut both = vec![pool.get_next_unordered()?, pool.get_next_unordered()?];
/// both.sort();
/// assert_eq!(both, vec![20, 40]);
/// assert!(!pool.has_next());
/// # Ok(())
/// # }
/// ```
pub struct ActorPool<A: Actor, R> {
    idle: VecDeque<ActorHandle<A>>,
    /// Calls an actor runs, by submission number: their result and the
    /// actor, which goes back to the pool when the call finishes.
    running: BTreeMap<u64, (ObjectRef<R>, ActorHandle<A>)>,
    /// Calls finished and not read yet, by submission number (with the
    /// error of a call that could not be submitted).
    done: BTreeMap<u64, Result<ObjectRef<R>>>,
    /// Calls submitted while no actor was idle, oldest first.
    queued: VecDeque<(u64, Call<A, R>)>,
    next: u64,
}

impl<A: Actor, R> std::fmt::Debug for ActorPool<A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorPool")
            .field("class", &A::CLASS)
            .field("idle", &self.idle.len())
            .field("running", &self.running.len())
            .field("unread", &(self.running.len() + self.done.len()))
            .field("queued", &self.queued.len())
            .finish()
    }
}

impl<A: Actor, R: DeserializeOwned + Send + 'static> ActorPool<A, R> {
    /// A pool of `actors`, all idle.
    pub fn new(actors: impl IntoIterator<Item = ActorHandle<A>>) -> Self {
        ActorPool {
            idle: actors.into_iter().collect(),
            running: BTreeMap::new(),
            done: BTreeMap::new(),
            queued: VecDeque::new(),
            next: 0,
        }
    }

    /// Submits a call: `call` is given an idle actor now, or the first one
    /// to finish its call later. An error `call` returns when it runs is
    /// what reading its result gives.
    pub fn submit<F>(&mut self, call: F)
    where
        F: FnOnce(&ActorHandle<A>) -> Result<ObjectRef<R>> + Send + 'static,
    {
        let index = self.next;
        self.next += 1;
        self.queued.push_back((index, Box::new(call)));
        self.start_queued();
    }

    /// Calls `call` once per value, spread over the pool's actors, and
    /// returns their results in the order of `values`. All are submitted
    /// before the first is read; results of earlier submissions stay
    /// unread, for [`get_next`](Self::get_next).
    pub fn map<V, F>(
        &mut self,
        call: F,
        values: impl IntoIterator<Item = V>,
    ) -> impl Iterator<Item = Result<R>> + '_
    where
        F: Fn(&ActorHandle<A>, V) -> Result<ObjectRef<R>> + Send + Sync + 'static,
        V: Send + 'static,
    {
        self.submit_all(call, values, true)
    }

    /// [`map`](Self::map), with each result given as soon as its call
    /// finishes, whatever the order of `values`.
    pub fn map_unordered<V, F>(
        &mut self,
        call: F,
        values: impl IntoIterator<Item = V>,
    ) -> impl Iterator<Item = Result<R>> + '_
    where
        F: Fn(&ActorHandle<A>, V) -> Result<ObjectRef<R>> + Send + Sync + 'static,
        V: Send + 'static,
    {
        self.submit_all(call, values, false)
    }

    /// The result of the oldest submitted call not read yet, waiting for
    /// it. [`Error::InvalidArgument`] if there is none, or if calls wait
    /// for an actor and the pool has none left.
    pub fn get_next(&mut self) -> Result<R> {
        self.read(0..u64::MAX, true, None)?
    }

    /// [`get_next`](Self::get_next) that gives up after `timeout` with
    /// [`Error::GetTimeout`]; the result stays in the pool, to read later.
    pub fn get_next_timeout(&mut self, timeout: Duration) -> Result<R> {
        self.read(0..u64::MAX, true, Some(timeout))?
    }

    /// The result of whichever unread call finishes first.
    pub fn get_next_unordered(&mut self) -> Result<R> {
        self.read(0..u64::MAX, false, None)?
    }

    /// [`get_next_unordered`](Self::get_next_unordered) that gives up after
    /// `timeout` with [`Error::GetTimeout`].
    pub fn get_next_unordered_timeout(&mut self, timeout: Duration) -> Result<R> {
        self.read(0..u64::MAX, false, Some(timeout))?
    }

    /// Whether any submitted call's result is still unread.
    pub fn has_next(&self) -> bool {
        !self.running.is_empty() || !self.done.is_empty() || !self.queued.is_empty()
    }

    /// Whether an actor is idle, so that a submitted call starts at once.
    pub fn has_free(&self) -> bool {
        !self.idle.is_empty()
    }

    /// Adds an actor; it takes a waiting call at once, if one waits.
    /// [`Error::InvalidArgument`] if it is in the pool already (idle or
    /// running a call), as Ray refuses it.
    pub fn push(&mut self, actor: ActorHandle<A>) -> Result<()> {
        let id = actor.id();
        let busy = self.running.values().map(|(_, actor)| actor);
        if self.idle.iter().chain(busy).any(|a| a.id() == id) {
            return Err(Error::invalid(
                "ActorPool::push",
                format!("actor {id} is in this pool already"),
            ));
        }
        self.idle.push_back(actor);
        self.start_queued();
        Ok(())
    }

    /// Takes an idle actor out of the pool, if one is idle.
    pub fn pop_idle(&mut self) -> Option<ActorHandle<A>> {
        self.idle.pop_front()
    }

    /// Submits one call per value and returns their results, read in
    /// order or as they finish.
    fn submit_all<V, F>(
        &mut self,
        call: F,
        values: impl IntoIterator<Item = V>,
        ordered: bool,
    ) -> Results<'_, A, R>
    where
        F: Fn(&ActorHandle<A>, V) -> Result<ObjectRef<R>> + Send + Sync + 'static,
        V: Send + 'static,
    {
        let call = Arc::new(call);
        let start = self.next;
        for value in values {
            let call = call.clone();
            self.submit(move |actor| call(actor, value));
        }
        Results {
            range: start..self.next,
            pool: self,
            ordered,
            failed: false,
        }
    }

    /// Gives waiting calls to idle actors, oldest first.
    fn start_queued(&mut self) {
        while !self.queued.is_empty() {
            let Some(actor) = self.idle.pop_front() else {
                return;
            };
            let Some((index, call)) = self.queued.pop_front() else {
                self.idle.push_front(actor);
                return;
            };
            match call(&actor) {
                Ok(result) => {
                    self.running.insert(index, (result, actor));
                }
                // Nothing runs on it: it takes the next call.
                Err(e) => {
                    self.idle.push_front(actor);
                    self.done.insert(index, Err(e));
                }
            }
        }
    }

    /// Marks a call finished and gives its actor the next waiting call.
    fn finished(&mut self, index: u64) {
        if let Some((result, actor)) = self.running.remove(&index) {
            self.done.insert(index, Ok(result));
            self.idle.push_back(actor);
            self.start_queued();
        }
    }

    /// Whether a call numbered in `range` waits for an actor (the queue
    /// is in submission order).
    fn queued_in(&self, range: &Range<u64>) -> bool {
        let first = self.queued.partition_point(|(i, _)| *i < range.start);
        self.queued.get(first).is_some_and(|(i, _)| *i < range.end)
    }

    /// Whether a call numbered in `range` is still to be read.
    fn unread_in(&self, range: &Range<u64>) -> bool {
        self.running.range(range.clone()).next().is_some()
            || self.done.range(range.clone()).next().is_some()
            || self.queued_in(range)
    }

    /// Reads one result of a call numbered in `range`: the oldest
    /// (`ordered`) or any finished one. Waits for running calls, handing
    /// each finished call's actor a waiting call, until that result is
    /// ready or `timeout` passes. The outer error means nothing was read
    /// (no call to read, no actor, time out); the inner result is the
    /// call's.
    fn read(
        &mut self,
        range: Range<u64>,
        ordered: bool,
        timeout: Option<Duration>,
    ) -> Result<Result<R>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            // Calls still waiting for an actor are younger than every
            // sent one, so the oldest unread call is a sent one, if any.
            let oldest_done = self.done.range(range.clone()).next().map(|(i, _)| *i);
            let pick = match oldest_done {
                Some(done) if ordered => {
                    let oldest_running = self.running.range(range.clone()).next();
                    oldest_running
                        .is_none_or(|(i, _)| done < *i)
                        .then_some(done)
                }
                done => done,
            };
            if let Some(result) = pick.and_then(|i| self.done.remove(&i)) {
                return Ok(result.and_then(|r| get(&r)));
            }
            if self.running.is_empty() {
                if !self.queued_in(&range) {
                    return Err(nothing_to_read());
                }
                return Err(Error::invalid(
                    "ActorPool",
                    format!(
                        "{} calls wait for an actor and the pool has none; push one",
                        self.queued.len()
                    ),
                ));
            }
            // Every running call, not only those in `range`: each that
            // finishes hands its actor on.
            let refs: Vec<ObjectRef<R>> = self.running.values().map(|(r, _)| r.clone()).collect();
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let (ready, _) = wait(&refs, 1, left)?;
            if ready.is_empty() {
                return Err(Error::GetTimeout {
                    waited_ms: timeout.map_or(0, |t| t.as_millis() as u64),
                    pending: refs.len(),
                    total: refs.len(),
                });
            }
            for r in &ready {
                let index = self.running.iter().find(|(_, (x, _))| x.id() == r.id());
                if let Some(index) = index.map(|(i, _)| *i) {
                    self.finished(index);
                }
            }
        }
    }
}

fn nothing_to_read() -> Error {
    Error::invalid(
        "ActorPool",
        "no submitted call is left to read; submit one first",
    )
}

/// The results of one [`ActorPool::map`] or
/// [`ActorPool::map_unordered`], read as the iterator is advanced.
struct Results<'a, A: Actor, R> {
    pool: &'a mut ActorPool<A, R>,
    range: Range<u64>,
    ordered: bool,
    /// A read failed without taking a result (no actor left, say): it
    /// would fail again, so the iterator ends after saying so once.
    failed: bool,
}

impl<A: Actor, R: DeserializeOwned + Send + 'static> Iterator for Results<'_, A, R> {
    type Item = Result<R>;

    fn next(&mut self) -> Option<Result<R>> {
        let pool = &mut *self.pool;
        if self.failed || !pool.unread_in(&self.range) {
            return None;
        }
        let read = pool.read(self.range.clone(), self.ordered, None);
        self.failed = read.is_err();
        Some(read.and_then(|result| result))
    }
}
