//! The executing side: running pushed tasks, constructing an actor and
//! serving its calls.
//!
//! # Threads
//!
//! A worker's main thread is its *executor thread*: once the worker has
//! registered, it runs jobs from a queue, one at a time, as Ray's workers
//! do. The connection reader posts each task there directly, so a task costs
//! one hand-off in and one out; synchronous functions run right there, async
//! ones are driven to completion there with `block_on`, and anything else
//! the call needs (fetching arguments from the store or their owners,
//! storing a large result) is awaited from that thread too. Because the
//! executor thread is not a runtime thread, user code on it may block,
//! including in a nested `prism::get`.
//!
//! # Actor calls
//!
//! An actor with `max_concurrency` 1 runs every call on the executor thread
//! in arrival order, so each caller's calls run one at a time in the order
//! sent. With a larger `max_concurrency` N, synchronous methods run on up to
//! N call threads of the actor, started in arrival order (threads are
//! started as calls arrive with none idle, and drain the queue before
//! sleeping); async methods run as runtime tasks under N permits. An *async
//! actor* (a class with async methods, `max_concurrency` unset) instead has
//! one runtime task take
//! its calls in arrival order, each under one of N permits: an async call
//! is polled there once and, if it suspends, goes on as a task of its own;
//! a synchronous one runs to its end on the executor thread before the next
//! is taken (Ray's async actors). Methods taking
//! `&mut self` hold the instance's write lock, `&self` methods a read lock.
//!
//! A call not started yet is cancelled by taking it out of the waiting
//! calls. An async call that started is cancelled by dropping its future
//! where it waits ([`stop_if_cancelled`]), whether it runs as a task of
//! its own or on the executor thread; a synchronous call that started
//! runs to its end.
//!
//! # Panics
//!
//! A panic in a task, a method or a constructor is caught and returned to
//! the caller as [`Error::TaskFailed`] with kind `Panic`; the worker lives
//! on. The panic message is also printed to the worker's stderr, which
//! reaches the driver's terminal.

use super::objects::Objects;
use super::pending::{Pending, PendingTasks};
use super::refs::Release;
use super::registry::{self, ActorCell, ActorClass, Args, CallError, CallResult, Invocation};
use super::store::Loaded;
use super::streams::{ItemAck, ItemSender, SinkGuard, Stop};
use crate::codec;
use crate::config::Config;
use crate::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, IdMap, ObjectId, WorkerId};
use prism_protocol::messages::{
    actor_checkpoint_key, ActorCall, ActorSpec, Address, ArgSpec, BecomeActor, Call, CancelTask,
    ExecutorRequest, ExitActor, KvGet, KvPut, ObjectValue, PushTask, Response, ReturnObject,
    StreamItem, TaskSpec,
};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where the hosted actor is in ending itself (`prism::exit_actor`).
const RUNNING: u8 = 0;
const EXIT_ASKED: u8 = 1;
const EXITING: u8 = 2;

/// Work for the executor thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

struct MailItem {
    conn: Connection,
    request: Option<u64>,
    spec: TaskSpec,
}

struct ActorInstance {
    actor_id: ActorId,
    /// When its state is saved, if it is checkpointed.
    checkpoints: Option<Arc<Mutex<Checkpoints>>>,
    class: &'static ActorClass,
    cell: Arc<ActorCell>,
    /// Actors with `max_concurrency` above 1: their call threads and the
    /// permits bounding their async calls.
    concurrent: Option<Concurrent>,
    /// An async actor: the queue its calls are taken from, in order.
    in_order: Option<tokio::sync::mpsc::UnboundedSender<MailItem>>,
}

/// When a checkpointed actor's state is saved: after every `every` calls,
/// after the first call once `interval` has passed, or after a call that
/// asked (`prism::checkpoint_actor`).
struct Checkpoints {
    every: u32,
    interval: Option<std::time::Duration>,
    calls: u32,
    last: std::time::Instant,
    key: String,
}

/// How an actor with `max_concurrency` above 1 runs calls.
struct Concurrent {
    /// Synchronous methods run on these threads.
    threads: Arc<CallThreads>,
    /// Async methods run as tasks holding one of these.
    permits: Arc<Semaphore>,
}

/// Up to `max` threads that run queued calls, started as calls arrive and
/// nobody is idle; a thread drains the queue before it sleeps, so a burst
/// of short calls costs few wake-ups.
struct CallThreads {
    state: std::sync::Mutex<CallThreadsState>,
    wake: std::sync::Condvar,
    max: usize,
}

struct CallThreadsState {
    queue: std::collections::VecDeque<Job>,
    threads: usize,
    idle: usize,
}

impl CallThreads {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(CallThreads {
            state: std::sync::Mutex::new(CallThreadsState {
                queue: Default::default(),
                threads: 0,
                idle: 0,
            }),
            wake: std::sync::Condvar::new(),
            max,
        })
    }

    fn push(self: &Arc<Self>, job: Job) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.queue.push_back(job);
        if state.idle > 0 {
            self.wake.notify_one();
        }
        // An idle thread counts as idle until it wakes, so a burst of calls
        // must not count on one idle thread for each of them: start a
        // thread for every queued call beyond the idle ones.
        if state.queue.len() > state.idle && state.threads < self.max {
            state.threads += 1;
            let pool = self.clone();
            let started = std::thread::Builder::new()
                .name("prism-actor-call".into())
                .spawn(move || pool.run());
            if started.is_err() {
                state.threads -= 1;
            }
        }
    }

    fn run(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                job();
                state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.idle += 1;
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            state.idle -= 1;
        }
    }
}

/// The hosted actor's calls as they arrive.
#[derive(Default)]
struct CallBook {
    /// The next call number expected from each caller.
    next_seq: HashMap<WorkerId, u64>,
    /// Calls received and not started, by result object, with the request
    /// to answer if the caller cancels one (`CancelTask`, which comes on
    /// the connection its call came on). Whoever takes a call out of here
    /// runs it, or answers it cancelled: never both.
    waiting: IdMap<ObjectId, Option<u64>>,
    /// Calls taken out of `waiting` that may run as async calls, until
    /// they are answered: a `CancelTask` for one notes it or fires its
    /// signal, and the call's future is dropped where it waits (see
    /// [`stop_if_cancelled`]).
    started: IdMap<ObjectId, Started>,
}

/// Where a started async call is for a cancel.
enum Started {
    /// Running, nobody waiting for a cancel yet.
    Running,
    /// Its caller cancelled it before its runner waited for that.
    CancelAsked,
    /// Its runner waits for a cancel on this.
    Watched(tokio::sync::oneshot::Sender<()>),
}

/// A started async call's hold on its `started` entry; dropping it
/// forgets the entry. The signal is made only for a call that suspends.
struct CancelWatch {
    exec: Arc<Executor>,
    return_id: ObjectId,
}

impl CancelWatch {
    /// Whether the call's caller cancelled it already.
    fn fired(&self) -> bool {
        let calls = self.exec.calls.lock();
        matches!(
            calls.started.get(&self.return_id),
            Some(Started::CancelAsked)
        )
    }

    /// Waits until the call's caller cancels it (forever if it never does).
    async fn cancelled(&self) {
        let Some(signal) = self.watch() else {
            return;
        };
        if signal.await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The signal a cancel fires from now on; `None` if the call was
    /// cancelled already.
    fn watch(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let mut calls = self.exec.calls.lock();
        let entry = calls
            .started
            .entry(self.return_id)
            .or_insert(Started::Running);
        if matches!(entry, Started::CancelAsked) {
            return None;
        }
        let (fire, signal) = tokio::sync::oneshot::channel();
        *entry = Started::Watched(fire);
        Some(signal)
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        self.exec.calls.lock().started.remove(&self.return_id);
    }
}

/// A call's small results, carried in the answer.
fn inline_returns(mut encoded: codec::Encoded) -> ReturnObject {
    let more = std::mem::take(&mut encoded.more);
    ReturnObject {
        value: ObjectValue::Inline(Bytes::from(encoded.into_bytes())),
        contained: Vec::new(),
        more: more.into_iter().map(inline_returns).collect(),
    }
}

/// The error a call cancelled before its end is answered. It names no
/// function: its caller names the call (see `ActorSubmitter`'s answer
/// handling).
fn cancelled_unnamed() -> Error {
    Error::TaskCancelled {
        function: String::new(),
        how: String::new(),
    }
}

/// Runs an async call until it ends or its caller cancels it: then it is
/// dropped where it waits (releasing the actor's lock and its permit) and
/// ends cancelled, as Ray cancels an async actor's running coroutine.
async fn stop_if_cancelled<F>(mut call: F, watch: CancelWatch) -> CallResult
where
    F: Future<Output = CallResult> + Unpin,
{
    // The call first: one that ends without suspending needs no signal.
    tokio::select! {
        biased;
        result = &mut call => return result,
        () = watch.cancelled() => {}
    }
    // A panic in its drop still leaves the caller its answer.
    if std::panic::catch_unwind(AssertUnwindSafe(|| drop(call))).is_err() {
        tracing::warn!("a cancelled call panicked while it was dropped");
    }
    Err(CallError::Runtime(cancelled_unnamed()))
}

/// The answer to a call cancelled before it started.
fn call_cancelled() -> Response {
    Response::Error(cancelled_unnamed())
}

/// The executing side of a process: what it runs and the actor it hosts.
pub(crate) struct Executor {
    rt: tokio::runtime::Handle,
    config: Arc<Config>,
    worker_id: WorkerId,
    objects: Arc<Objects>,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    actor: Mutex<Option<ActorInstance>>,
    /// The actor this process became, from its constructor on.
    hosted: std::sync::OnceLock<ActorId>,
    calls: Mutex<CallBook>,
    raylet: Connection,
    exit: AtomicU8,
    /// The running method asked for a checkpoint.
    checkpoint_asked: std::sync::atomic::AtomicBool,
    /// Pushed tasks not started yet.
    pending: Arc<PendingTasks>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("worker_id", &self.worker_id)
            .finish()
    }
}

impl Executor {
    pub(crate) fn new(
        rt: tokio::runtime::Handle,
        config: Arc<Config>,
        worker_id: WorkerId,
        objects: Arc<Objects>,
        raylet: Connection,
    ) -> Self {
        Executor {
            pending: PendingTasks::new(worker_id, rt.clone()),
            rt,
            config,
            worker_id,
            objects,
            jobs: Mutex::new(None),
            actor: Mutex::new(None),
            hosted: std::sync::OnceLock::new(),
            calls: Mutex::new(CallBook::default()),
            raylet,
            exit: AtomicU8::new(RUNNING),
            checkpoint_asked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The hosted actor's method asks for its state to be saved once it
    /// returns.
    pub(crate) fn request_checkpoint(&self) -> Result<()> {
        let actor = self.actor.lock();
        match actor.as_ref() {
            None => Err(Error::invalid(
                "checkpoint_actor",
                "called outside an actor's method; only an actor can checkpoint itself",
            )),
            Some(a) if a.checkpoints.is_none() => Err(Error::invalid(
                "checkpoint_actor",
                format!(
                    "actor {} was not created with checkpoints: give it \
                     ActorOptions::checkpoint_every or checkpoint_interval",
                    a.class.name
                ),
            )),
            Some(_) => {
                self.checkpoint_asked.store(true, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// After a call of a checkpointed actor, on its executor thread: saves
    /// its state to the node's key-value table when one is due. The call's
    /// caller hears back only after that, so a call that answered before a
    /// checkpoint is in it.
    fn checkpoint_if_due(&self, class: &ActorClass, cell: &ActorCell, policy: &Mutex<Checkpoints>) {
        let key = {
            let mut p = policy.lock();
            p.calls += 1;
            let asked = self.checkpoint_asked.swap(false, Ordering::SeqCst);
            let by_count = p.every > 0 && p.calls >= p.every;
            let by_time = p.interval.is_some_and(|i| p.last.elapsed() >= i);
            if !(asked || by_count || by_time) {
                return;
            }
            p.calls = 0;
            p.last = std::time::Instant::now();
            p.key.clone()
        };
        let encoded = {
            let state = cell.blocking_read();
            (class.snapshot)(&**state)
        };
        let bytes = match encoded {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => return tracing::warn!(error = %e, "checkpoint not taken"),
            None => return,
        };
        let saved = self.raylet_blocking(KvPut {
            key,
            value: Bytes::from(bytes),
            overwrite: true,
        });
        if let Err(e) = saved {
            tracing::warn!(error = %e, "checkpoint not saved");
        }
    }

    /// Sends `request` to the raylet from a thread that runs synchronous
    /// methods, and waits for the answer (at most 10 s).
    fn raylet_blocking<C>(&self, request: C) -> Result<C::Reply>
    where
        C: Call + Send + 'static,
        C::Reply: Send + 'static,
    {
        let raylet = self.raylet.clone();
        super::block_on(&self.rt, async move {
            let limit = std::time::Duration::from_secs(10);
            match tokio::time::timeout(limit, raylet.request(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(Error::io(
                    format!("{} to the raylet", C::NAME),
                    "no answer within 10 s",
                )),
            }
        })
    }

    /// The hosted actor asked to end once the running method returns.
    pub(crate) fn request_exit(&self) -> Result<()> {
        if self.actor.lock().is_none() {
            return Err(Error::invalid(
                "exit_actor",
                "called outside an actor's method; only an actor can end itself \
                 (to stop one from outside, use prism::kill)",
            ));
        }
        let _ = self
            .exit
            .compare_exchange(RUNNING, EXIT_ASKED, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }

    /// The error a call gets when it was queued behind `exit_actor`.
    fn exited_error(
        &self,
        actor_id: ActorId,
        class: &ActorClass,
        spec: &TaskSpec,
    ) -> Option<Response> {
        if self.exit.load(Ordering::SeqCst) == RUNNING {
            return None;
        }
        Some(Response::Error(Error::ActorDied {
            actor_id,
            class: class.name.to_string(),
            reason: format!(
                "it ended itself with prism::exit_actor before {} ran",
                spec.function
            ),
        }))
    }

    /// If the method that just returned called `exit_actor`: tells the
    /// node the actor is gone for good, before its caller hears the answer
    /// (so whoever looks it up next finds it dead, its name free). Blocks;
    /// for the threads that run synchronous methods.
    fn announce_exit_blocking(&self) -> bool {
        let Some(actor_id) = self.begin_exit() else {
            return false;
        };
        if let Err(e) = self.raylet_blocking(ExitActor { actor_id }) {
            tracing::warn!(error = %e, "could not tell the node the actor exited");
        }
        true
    }

    /// [`Executor::announce_exit_blocking`] for async methods.
    async fn announce_exit(&self) -> bool {
        let Some(actor_id) = self.begin_exit() else {
            return false;
        };
        if let Err(e) = self.raylet.request(ExitActor { actor_id }).await {
            tracing::warn!(error = %e, "could not tell the node the actor exited");
        }
        true
    }

    /// The actor this process hosts (from its constructor on).
    pub(crate) fn actor_id(&self) -> Option<ActorId> {
        self.hosted.get().copied()
    }

    /// The hosted actor, if it asked to exit and nobody started exiting.
    fn begin_exit(&self) -> Option<ActorId> {
        if self.exit.load(Ordering::SeqCst) != EXIT_ASKED {
            return None;
        }
        self.exit
            .compare_exchange(EXIT_ASKED, EXITING, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        self.actor_id()
    }

    /// After the exiting call's answer was queued on `conn`: gives it a
    /// bounded time to leave, then ends the process.
    fn exit_after_answer(&self, conn: &Connection) {
        let conn = conn.clone();
        self.rt.spawn(async move {
            for _ in 0..2000 {
                if conn.unsent_frames() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            tracing::info!("the actor ended itself with prism::exit_actor");
            std::process::exit(0);
        });
    }

    /// Installs the executor thread's queue.
    pub(crate) fn set_queue(&self, tx: std::sync::mpsc::Sender<Job>) {
        *self.jobs.lock() = Some(tx);
    }

    fn post(&self, job: Job) -> Result<()> {
        match self.jobs.lock().as_ref() {
            Some(tx) => tx.send(job).map_err(|_| Error::NotServed {
                service: "this worker (its executor thread has stopped)".into(),
                request: "a task or actor call".into(),
            }),
            None => Err(Error::NotServed {
                service: "a driver".into(),
                request: "PushTask (only workers execute tasks)".into(),
            }),
        }
    }
}

impl Executor {
    /// Handles task, actor and lifecycle requests.
    pub(crate) fn handle(
        self: &Arc<Self>,
        conn: &Connection,
        id: Option<u64>,
        request: ExecutorRequest,
    ) {
        let exec = self;
        match request {
            ExecutorRequest::PushTask(PushTask { spec }) => {
                // Queued first, then a job posted to start it: the job
                // runs the oldest queued task, none if it was handed back.
                exec.pending.push(Pending::new(conn.clone(), id, spec));
                let c = exec.clone();
                if let Err(e) = exec.post(Box::new(move || c.run_next_task())) {
                    exec.pending.fail_all(&e);
                }
            }
            ExecutorRequest::CancelTask(CancelTask { return_id, force }) => {
                // An actor call not started yet is answered now; its caller
                // names the call in the error.
                let waiting = {
                    let mut calls = exec.calls.lock();
                    let waiting = calls.waiting.remove(&return_id);
                    // A started async call: its runner drops it and
                    // answers.
                    if let Some(started) = calls.started.get_mut(&return_id) {
                        let asked = std::mem::replace(started, Started::CancelAsked);
                        if let Started::Watched(signal) = asked {
                            let _ = signal.send(());
                        }
                    }
                    waiting
                };
                if let Some(request) = waiting {
                    conn.respond(request, call_cancelled());
                    return;
                }
                if exec.pending.cancel(return_id) && force {
                    // The caller stops the task by stopping this process:
                    // a running function cannot be interrupted. Its other
                    // tasks fail with the connection and are retried.
                    tracing::warn!(object = %return_id, "a running task was cancelled with force; this worker exits");
                    std::process::exit(1);
                }
            }
            ExecutorRequest::BecomeActor(BecomeActor { spec }) => {
                let exec = exec.clone();
                let conn = conn.clone();
                exec.rt.clone().spawn(async move {
                    let response = match exec.become_actor(spec).await {
                        Ok(()) => Response::Ok,
                        Err(e) => {
                            // A failed actor's worker has no further use; leave
                            // after the answer is out so its resources return.
                            tokio::spawn(async {
                                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                                std::process::exit(0);
                            });
                            Response::Error(e)
                        }
                    };
                    conn.respond(id, response);
                });
            }
            ExecutorRequest::ActorCall(ActorCall {
                caller, seq, spec, ..
            }) => {
                let expected = {
                    let mut calls = exec.calls.lock();
                    if let Some(earlier) = calls.waiting.insert(spec.return_id, id) {
                        // Never sent twice to one process; if it were, the
                        // earlier request would go unanswered.
                        tracing::error!(object = %spec.return_id, ?earlier, "an actor call arrived twice");
                    }
                    let next = calls.next_seq.entry(caller).or_default();
                    let expected = *next;
                    *next = seq + 1;
                    expected
                };
                if seq != expected {
                    tracing::warn!(%caller, seq, expected, "actor call arrived out of order");
                }
                exec.enqueue_actor_call(MailItem {
                    conn: conn.clone(),
                    request: id,
                    spec,
                });
            }
        }
    }
}

impl Executor {
    async fn fetch_args(self: &Arc<Self>, args: Vec<ArgSpec>) -> Result<Args> {
        let mut loaded = Vec::with_capacity(args.len());
        for arg in args {
            loaded.push(match arg {
                ArgSpec::Value(bytes) => Loaded::Inline(bytes),
                ArgSpec::Ref(info) => self.objects.fetch(&info).await?,
            });
        }
        Ok(Args::new(loaded))
    }

    /// Fetches arguments from the executor thread; inline ones need no I/O.
    fn fetch_args_here(self: &Arc<Self>, args: &[ArgSpec]) -> Result<Args> {
        let inline: Vec<Loaded> = args
            .iter()
            .filter_map(|a| match a {
                ArgSpec::Value(b) => Some(Loaded::Inline(b.clone())),
                ArgSpec::Ref(_) => None,
            })
            .collect();
        if inline.len() == args.len() {
            return Ok(Args::new(inline));
        }
        let exec = self.clone();
        let args = args.to_vec();
        self.rt.block_on(async move { exec.fetch_args(args).await })
    }

    /// Runs an invocation of the call `spec` on this (non-runtime)
    /// thread, catching panics. A streaming call sends its values from
    /// here as they are made (see `streams`).
    ///
    /// `stop`: a streaming task's stop flag (its `Pending::stop`). A
    /// streaming actor call's cancel is noted in the call book instead:
    /// it was claimed into `CallBook::started` (see [`claim`](Self::claim)).
    fn invoke_here(
        self: &Arc<Self>,
        invocation: Invocation,
        spec: &TaskSpec,
        stop: Option<&Arc<AtomicBool>>,
    ) -> CallResult {
        let _running = registry::RunningTask::enter(spec.task_id);
        let sink = spec.streaming.then(|| {
            let stop: Stop = match stop {
                Some(flag) => {
                    let flag = flag.clone();
                    Box::new(move || flag.load(Ordering::Acquire))
                }
                None => {
                    let exec = self.clone();
                    let id = spec.return_id;
                    Box::new(move || {
                        let calls = exec.calls.lock();
                        matches!(calls.started.get(&id), Some(Started::CancelAsked))
                    })
                }
            };
            SinkGuard::enter(
                Box::new(self.clone()),
                spec.return_id,
                spec.caller.clone(),
                stop,
                spec.stream_backpressure,
            )
        });
        let outcome = match invocation {
            Invocation::Blocking(f) => std::panic::catch_unwind(AssertUnwindSafe(f)),
            Invocation::Async(fut) => {
                std::panic::catch_unwind(AssertUnwindSafe(|| self.rt.block_on(fut)))
            }
        };
        let mut result =
            outcome.unwrap_or_else(|payload| Err(registry::panic_payload_error(payload)));
        let Some(sink) = sink else {
            return result;
        };
        // Every value sent is answered before the call is: the caller's
        // generator has them all when it learns the call ended.
        let settled = self.settle_items(sink.take_in_flight());
        if let (Ok(_), Err(e)) = (&result, settled) {
            result = Err(CallError::Runtime(e));
        }
        // Stopped by a cancel, or because its generator was dropped: the
        // error names the function (a caller that cancelled names it too).
        if let Err(CallError::Runtime(Error::TaskCancelled { function, .. })) = &mut result {
            if function.is_empty() {
                function.clone_from(&spec.function);
            }
        }
        if stop.is_none() {
            self.calls.lock().started.remove(&spec.return_id);
        }
        if result.is_ok() && !sink.used() {
            let reason = format!(
                "`{}` returns one value but its caller expects a stream (num_returns = \
                 \"streaming\"): build the caller and the workers from the same code",
                spec.function
            );
            return Err(CallError::Runtime(Error::invalid("num_returns", reason)));
        }
        result
    }

    /// Stores value `index` of the streaming call `generator` and sends it
    /// to the caller, `owner`; returns once it is sent, with the caller's
    /// answer to wait for ([`settle_items`](Self::settle_items)). Called
    /// from the thread running the call.
    pub(crate) fn send_item(
        self: &Arc<Self>,
        generator: ObjectId,
        index: u64,
        owner: &Address,
        encoded: codec::Encoded,
    ) -> Result<ItemAck> {
        let exec = self.clone();
        let owner = owner.clone();
        super::block_on(&self.rt, async move {
            // As for a call's result (`finish_call`): references from the
            // arguments are known to their owners before the caller may
            // let go of them.
            exec.objects.register_borrows().await?;
            let id = ObjectId::new();
            let (item, keep_alive) = exec.store_return(id, encoded, &owner).await?;
            let copy = store_copy(id, &item.value);
            let sent = async {
                exec.objects.lend(&item.contained, &owner).await?;
                drop(keep_alive);
                let item = StreamItem {
                    generator,
                    index,
                    id,
                    item,
                };
                exec.objects.send_stream_item(&owner, item).await
            }
            .await;
            match sent {
                Ok(answer) => Ok(ItemAck { answer, copy }),
                // This process is the caller and the stream is closed: it
                // freed the value already.
                Err(e @ Error::TaskCancelled { .. }) => Err(e),
                Err(e) => {
                    // The caller never took it: its copy goes.
                    exec.objects.apply_releases(copy.into_iter().collect());
                    Err(e)
                }
            }
        })
    }

    /// Waits for the caller's answers to sent values of a streaming call,
    /// oldest first; the first failure, once all answered. A value the
    /// caller did not take in loses its copy here, unless the caller
    /// answered that the stream is closed (it freed the value itself).
    pub(crate) fn settle_items(self: &Arc<Self>, acks: Vec<ItemAck>) -> Result<()> {
        if acks.iter().all(|a| a.answer.is_none()) {
            return Ok(());
        }
        let objects = self.objects.clone();
        super::block_on(&self.rt, async move {
            let mut failed = None;
            for ack in acks {
                let Some(answer) = ack.answer else {
                    continue;
                };
                let answered = answer.await.ok();
                if let Err(e) = item_answered(&objects, ack.copy, answered) {
                    failed.get_or_insert(e);
                }
            }
            failed.map_or(Ok(()), Err)
        })
    }

    /// The first of `acks` already answered, without waiting: `None` when
    /// the oldest is not answered yet, else its outcome (the ack is taken
    /// off the front).
    pub(crate) fn settle_answered(
        &self,
        acks: &mut std::collections::VecDeque<ItemAck>,
    ) -> Option<Result<()>> {
        let front = acks.front_mut()?;
        let answered = match &mut front.answer {
            None => None,
            Some(answer) => match answer.try_recv() {
                Ok(response) => Some(response),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => None,
            },
        };
        let ack = acks.pop_front()?;
        if ack.answer.is_none() {
            return Some(Ok(()));
        }
        Some(item_answered(&self.objects, ack.copy, answered))
    }

    /// Runs the oldest pushed task not yet started, if any, on the
    /// executor thread, and answers it.
    fn run_next_task(self: &Arc<Self>) {
        let Some(task) = self.pending.start_next() else {
            return;
        };
        let response = self.run_task_here(&task.spec, task.stop.as_ref());
        self.pending.finished();
        task.conn.respond(task.request, response);
    }

    /// Runs a task on the executor thread and builds its reply.
    fn run_task_here(
        self: &Arc<Self>,
        spec: &TaskSpec,
        stop: Option<&Arc<AtomicBool>>,
    ) -> Response {
        let Some(function) = registry::find_function(&spec.function) else {
            return Response::Error(self.unknown(&spec.function));
        };
        let result = match self.fetch_args_here(&spec.args) {
            Ok(args) => self.invoke_here((function.invoke)(args), spec, stop),
            Err(e) => Err(CallError::Runtime(e)),
        };
        self.finish_here(spec, result)
    }

    /// [`CoreWorker::finish_call`] from the executor thread, without the
    /// runtime when the result is small and refers to no objects.
    fn finish_here(self: &Arc<Self>, spec: &TaskSpec, result: CallResult) -> Response {
        if let Ok(encoded) = &result {
            let limit = self.config.max_direct_call_object_size_bytes;
            let plain = |e: &codec::Encoded| e.len() as u64 <= limit && e.contained.is_empty();
            if plain(encoded)
                && encoded.more.iter().all(plain)
                && encoded.more.len() == spec.more_returns.len()
                && !self.objects.refs.has_unregistered()
            {
                if let Ok(encoded) = result {
                    return Response::Object(inline_returns(encoded));
                }
            }
        }
        let exec = self.clone();
        let spec = spec.clone();
        self.rt
            .block_on(async move { exec.finish_call(&spec, result).await })
    }

    fn unknown(&self, name: &str) -> Error {
        Error::UnknownFunction {
            name: name.to_string(),
            binary: std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "this worker's binary".into()),
        }
    }

    /// Stores a call's result and builds the reply to its caller.
    async fn finish_call(self: &Arc<Self>, spec: &TaskSpec, result: CallResult) -> Response {
        let outcome = async {
            // References deserialized from the arguments and still held must
            // be known to their owners before the caller lets go (refs.rs,
            // invariant 3), whether the call succeeded or not: a method
            // that kept a handle in its state and then failed keeps it.
            self.objects.register_borrows().await?;
            let mut encoded = match result {
                Ok(encoded) => encoded,
                Err(CallError::App { kind, message }) => {
                    return Err(Error::TaskFailed {
                        function: spec.function.clone(),
                        message,
                        kind,
                        worker: self.worker_id,
                        pid: std::process::id(),
                    })
                }
                Err(CallError::Runtime(e)) => return Err(e),
            };
            let more = std::mem::take(&mut encoded.more);
            if more.len() != spec.more_returns.len() {
                let reason = format!(
                    "`{}` returned {} values where its caller expects {}: build the caller \
                     and the workers from the same code",
                    spec.function,
                    more.len() + 1,
                    spec.more_returns.len() + 1
                );
                return Err(Error::invalid("num_returns", reason));
            }
            let mut stored = Vec::with_capacity(more.len() + 1);
            for (id, value) in spec.returns().zip(std::iter::once(encoded).chain(more)) {
                match self.store_return(id, value, &spec.caller).await {
                    Ok(ret) => stored.push(ret),
                    Err(e) => {
                        // The caller learns of none: what was stored goes.
                        self.drop_stored(spec, &stored);
                        return Err(e);
                    }
                }
            }
            // Lent once every value is stored, so a failed store leaves
            // no borrow behind.
            let mut answer: Option<ReturnObject> = None;
            for (ret, keep_alive) in stored {
                self.objects.lend(&ret.contained, &spec.caller).await?;
                drop(keep_alive);
                match &mut answer {
                    Some(first) => first.more.push(ret),
                    None => answer = Some(ret),
                }
            }
            answer.ok_or_else(|| Error::invalid("num_returns", "a call returned no values"))
        }
        .await;
        match outcome {
            Ok(ret) => Response::Object(ret),
            Err(e) => Response::Error(e),
        }
    }

    /// Stores one result of a call as object `id` (a large value stays in
    /// this node's store, which a caller on another node pulls it from),
    /// with the handles of the references inside it, kept until they are
    /// lent to the caller.
    async fn store_return(
        &self,
        id: ObjectId,
        mut encoded: codec::Encoded,
        caller: &Address,
    ) -> Result<(ReturnObject, Vec<codec::KeepAlive>)> {
        let contained = encoded.contained.clone();
        let keep_alive = std::mem::take(&mut encoded.keep_alive);
        let value = self.objects.store_value(id, encoded, caller).await?;
        let ret = ReturnObject {
            value,
            contained,
            more: Vec::new(),
        };
        Ok((ret, keep_alive))
    }

    /// Deletes the stored copies of a call's results whose answer failed.
    fn drop_stored(&self, spec: &TaskSpec, stored: &[(ReturnObject, Vec<codec::KeepAlive>)]) {
        let copies = spec
            .returns()
            .zip(stored)
            .filter_map(|(id, (ret, _))| store_copy(id, &ret.value));
        self.objects.apply_releases(copies.collect());
    }

    async fn become_actor(self: &Arc<Self>, spec: ActorSpec) -> Result<()> {
        // A process becomes one actor only; the constructor already sees it.
        let _ = self.hosted.set(spec.actor_id);
        let class = registry::find_class(&spec.class).ok_or_else(|| self.unknown(&spec.class))?;
        let checkpointed =
            spec.options.checkpoint_every > 0 || spec.options.checkpoint_interval_ms > 0;
        let key = actor_checkpoint_key(spec.actor_id);
        let saved = if checkpointed {
            self.raylet.request(KvGet { key: key.clone() }).await?
        } else {
            None
        };
        let created = match saved.map(|bytes| (class.restore)(&bytes)) {
            Some(Some(Ok(state))) => {
                tracing::info!(actor = %spec.actor_id, "actor restored from its latest checkpoint");
                Ok(state)
            }
            Some(Some(Err(e))) => Err(CallError::Runtime(Error::invalid("checkpoint", e))),
            _ => {
                let args = self.fetch_args(spec.args.clone()).await?;
                let construct = class.construct;
                match tokio::task::spawn_blocking(move || construct(args)).await {
                    Ok(r) => r,
                    Err(e) => Err(registry::panic_error(e)),
                }
            }
        };
        let failed = |message: String| Error::ActorCreationFailed {
            actor_id: spec.actor_id,
            class: spec.class.clone(),
            message,
        };
        let instance = match created {
            Ok(i) => i,
            Err(CallError::App { message, kind }) => {
                return Err(failed(format!("{kind:?}: {message}")))
            }
            Err(CallError::Runtime(e)) => return Err(failed(e.to_string())),
        };
        self.objects.register_borrows().await?;
        let cell: Arc<ActorCell> = Arc::new(tokio::sync::RwLock::new(instance));
        let concurrency = spec.options.max_concurrency.max(1) as usize;
        let in_order = spec.options.async_actor.then(|| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let permits = Arc::new(Semaphore::new(concurrency));
            let exec = self.clone();
            tokio::spawn(exec.take_in_order(class, cell.clone(), spec.actor_id, permits, rx));
            tx
        });
        let concurrent = (concurrency > 1 && !spec.options.async_actor).then(|| Concurrent {
            threads: CallThreads::new(concurrency),
            permits: Arc::new(Semaphore::new(concurrency)),
        });
        tracing::info!(actor = %spec.actor_id, class = %spec.class, concurrency, "actor constructed");
        let checkpoints = checkpointed.then(|| {
            Arc::new(Mutex::new(Checkpoints {
                every: spec.options.checkpoint_every,
                interval: (spec.options.checkpoint_interval_ms > 0)
                    .then(|| std::time::Duration::from_millis(spec.options.checkpoint_interval_ms)),
                calls: 0,
                last: std::time::Instant::now(),
                key,
            }))
        });
        *self.actor.lock() = Some(ActorInstance {
            actor_id: spec.actor_id,
            checkpoints,
            class,
            cell,
            concurrent,
            in_order,
        });
        Ok(())
    }

    /// Takes a received call out of the waiting ones, to run or answer
    /// it: `false` if it was cancelled (and answered) meanwhile.
    fn claim(&self, item: &MailItem) -> bool {
        let claimed = self.calls.lock().waiting.remove(&item.spec.return_id);
        claimed.is_some()
    }

    /// [`claim`](Self::claim) for a synchronous call about to run here: a
    /// streaming one goes into `started` as it is claimed, so that a cancel
    /// from then on reaches it (see [`invoke_here`](Self::invoke_here),
    /// which takes it out at the call's end).
    fn claim_to_run(&self, item: &MailItem) -> bool {
        let return_id = item.spec.return_id;
        let mut calls = self.calls.lock();
        let claimed = calls.waiting.remove(&return_id).is_some();
        if claimed && item.spec.streaming {
            calls.started.insert(return_id, Started::Running);
        }
        claimed
    }

    /// Claims a call (as [`claim`](Self::claim)) that may run as an async
    /// call, so that its caller's cancel reaches it from now on.
    fn claim_cancellable(self: &Arc<Self>, item: &MailItem) -> Option<CancelWatch> {
        let return_id = item.spec.return_id;
        let mut calls = self.calls.lock();
        calls.waiting.remove(&return_id)?;
        calls.started.insert(return_id, Started::Running);
        Some(CancelWatch {
            exec: self.clone(),
            return_id,
        })
    }

    fn enqueue_actor_call(self: &Arc<Self>, item: MailItem) {
        let actor = self.actor.lock();
        let Some(instance) = actor.as_ref() else {
            if !self.claim(&item) {
                return;
            }
            item.conn.respond(
                item.request,
                Response::Error(Error::NotServed {
                    service: "this worker (it hosts no actor)".into(),
                    request: "ActorCall".into(),
                }),
            );
            return;
        };
        let actor_id = instance.actor_id;
        if let Some(queue) = &instance.in_order {
            let queue = queue.clone();
            drop(actor);
            // The taker lives as long as the process does.
            if let Err(unsent) = queue.send(item) {
                let item = unsent.0;
                if self.claim(&item) {
                    let gone = Error::NotServed {
                        service: "this actor (its call queue is closed)".into(),
                        request: "ActorCall".into(),
                    };
                    item.conn.respond(item.request, Response::Error(gone));
                }
            }
            return;
        }
        if let Some(concurrent) = &instance.concurrent {
            if let Some(refused) = self.exited_error(actor_id, instance.class, &item.spec) {
                drop(actor);
                if self.claim(&item) {
                    item.conn.respond(item.request, refused);
                }
                return;
            }
            let (threads, permits) = (concurrent.threads.clone(), concurrent.permits.clone());
            let (class, cell) = (instance.class, instance.cell.clone());
            drop(actor);
            self.start_concurrent_call(class, cell, threads, permits, item);
            return;
        }
        let (class, cell) = (instance.class, instance.cell.clone());
        let checkpoints = instance.checkpoints.clone();
        drop(actor);
        let exec = self.clone();
        let posted = self.post(Box::new(move || {
            let Some(watch) = exec.claim_cancellable(&item) else {
                return;
            };
            if let Some(refused) = exec.exited_error(actor_id, class, &item.spec) {
                item.conn.respond(item.request, refused);
                return;
            }
            // Only a checkpointed actor reads its state after the call.
            let checkpointing = checkpoints.as_ref().map(|policy| (policy, cell.clone()));
            let result = exec.build_actor_call(class, cell, &item.spec, |exec, args| {
                exec.fetch_args_here(args)
            });
            let result = match result {
                // Cancelled while its arguments loaded.
                Ok(_) if watch.fired() => Err(CallError::Runtime(cancelled_unnamed())),
                Ok(Invocation::Async(call)) => {
                    let call = Invocation::Async(Box::pin(stop_if_cancelled(call, watch)));
                    exec.invoke_here(call, &item.spec, None)
                }
                Ok(blocking) => {
                    // A synchronous call cannot be stopped once it runs; a
                    // streaming one stops before its next value, and
                    // keeps its `started` entry for that until its end.
                    if !item.spec.streaming {
                        drop(watch);
                    }
                    exec.invoke_here(blocking, &item.spec, None)
                }
                Err(e) => Err(CallError::Runtime(e)),
            };
            let response = exec.finish_here(&item.spec, result);
            if let Some((policy, cell)) = checkpointing {
                exec.checkpoint_if_due(class, &cell, policy);
            }
            let exiting = exec.announce_exit_blocking();
            item.conn.respond(item.request, response);
            if exiting {
                exec.exit_after_answer(&item.conn);
            }
        }));
        if let Err(e) = posted {
            tracing::error!(error = %e, "cannot run an actor call");
        }
    }

    /// Takes an async actor's calls in arrival order, as a runtime task:
    /// each first takes one of `permits` (waiting there, still
    /// cancellable, when all are held). An async call is polled once here
    /// and, if it suspends, goes on as a task of its own holding its
    /// permit; a synchronous one runs to its end on the executor thread
    /// before the next call is taken.
    async fn take_in_order(
        self: Arc<Self>,
        class: &'static ActorClass,
        cell: Arc<ActorCell>,
        actor_id: ActorId,
        permits: Arc<Semaphore>,
        mut calls: tokio::sync::mpsc::UnboundedReceiver<MailItem>,
    ) {
        while let Some(item) = calls.recv().await {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let Some(watch) = self.claim_cancellable(&item) else {
                continue;
            };
            if let Some(refused) = self.exited_error(actor_id, class, &item.spec) {
                item.conn.respond(item.request, refused);
                continue;
            }
            // Inline arguments need no I/O here either.
            let args = self.fetch_args(item.spec.args.clone()).await;
            if watch.fired() {
                item.conn.respond(item.request, call_cancelled());
                continue;
            }
            let built = args.and_then(|args| {
                self.build_actor_call(class, cell.clone(), &item.spec, move |_, _| Ok(args))
            });
            match built {
                Ok(Invocation::Async(fut)) => self.start_in_order(fut, permit, watch, item).await,
                Ok(Invocation::Blocking(f)) => {
                    // A synchronous call cannot be stopped once it runs; a
                    // streaming one keeps its `started` entry, and stops
                    // before its next value.
                    let keep = item.spec.streaming.then_some(watch);
                    self.run_on_executor_thread(f, item).await;
                    drop(keep);
                }
                Err(e) => item.conn.respond(item.request, Response::Error(e)),
            }
        }
    }

    /// Polls an async call once, answering it if it finished; otherwise it
    /// goes on as a task of its own, holding `permit`, until it ends or its
    /// caller cancels it.
    async fn start_in_order(
        self: &Arc<Self>,
        fut: registry::BoxFuture<CallResult>,
        permit: OwnedSemaphorePermit,
        watch: CancelWatch,
        item: MailItem,
    ) {
        let mut call = registry::CatchUnwind(fut, item.spec.task_id);
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::pin::Pin::new(&mut call).poll(cx))
        })
        .await;
        match first {
            std::task::Poll::Ready(result) => {
                drop(watch);
                self.answer_async(result, item).await
            }
            // Its task polls it again at once, so it wakes that task from
            // now on.
            std::task::Poll::Pending => {
                let exec = self.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    exec.finish_or_cancel(call, watch, item).await;
                });
            }
        }
    }

    /// Runs a started async call to its end, or until its caller cancels
    /// it ([`stop_if_cancelled`]), and answers it as any call ends:
    /// references it kept from its arguments are known to their owners
    /// before its caller lets go, and an exit it asked for happens.
    async fn finish_or_cancel(
        self: &Arc<Self>,
        call: registry::CatchUnwind,
        watch: CancelWatch,
        item: MailItem,
    ) {
        let result = stop_if_cancelled(call, watch).await;
        self.answer_async(result, item).await;
    }

    /// Runs a synchronous call of an async actor on the executor thread
    /// (it may block) and waits until it was answered.
    async fn run_on_executor_thread(
        self: &Arc<Self>,
        f: Box<dyn FnOnce() -> CallResult + Send>,
        item: MailItem,
    ) {
        let (done, answered) = tokio::sync::oneshot::channel::<()>();
        let exec = self.clone();
        let posted = self.post(Box::new(move || {
            exec.run_blocking_call(f, item);
            let _ = done.send(());
        }));
        match posted {
            Ok(()) => {
                let _ = answered.await;
            }
            Err(e) => tracing::error!(error = %e, "cannot run an actor call"),
        }
    }

    /// Runs a synchronous actor call on this (non-runtime) thread and
    /// answers it; the process leaves after the answer if it asked to.
    fn run_blocking_call(
        self: &Arc<Self>,
        f: Box<dyn FnOnce() -> CallResult + Send>,
        item: MailItem,
    ) {
        let result = self.invoke_here(Invocation::Blocking(f), &item.spec, None);
        let response = self.finish_here(&item.spec, result);
        let exiting = self.announce_exit_blocking();
        item.conn.respond(item.request, response);
        if exiting {
            self.exit_after_answer(&item.conn);
        }
    }

    /// Stores an async call's result and answers its caller.
    async fn answer_async(self: &Arc<Self>, result: CallResult, item: MailItem) {
        let response = self.finish_call(&item.spec, result).await;
        let exiting = self.announce_exit().await;
        item.conn.respond(item.request, response);
        if exiting {
            self.exit_after_answer(&item.conn);
        }
    }

    /// Resolves a call's method and arguments into an invocation.
    fn build_actor_call(
        self: &Arc<Self>,
        class: &'static ActorClass,
        cell: Arc<ActorCell>,
        spec: &TaskSpec,
        fetch: impl FnOnce(&Arc<Self>, &[ArgSpec]) -> Result<Args>,
    ) -> Result<Invocation> {
        let prefix_len = class.name.len() + 2;
        let method = spec
            .function
            .get(prefix_len..)
            .filter(|_| spec.function.starts_with(class.name))
            .ok_or_else(|| self.unknown(&spec.function))?;
        let args = fetch(self, &spec.args)?;
        (class.dispatch)(cell, method, args).ok_or_else(|| self.unknown(&spec.function))
    }

    /// Starts a call of an actor with `max_concurrency` above 1: a sync
    /// method goes to the actor's call threads, an async one runs as a task
    /// under the permits. Arguments that must be fetched are fetched first,
    /// in a task.
    fn start_concurrent_call(
        self: &Arc<Self>,
        class: &'static ActorClass,
        cell: Arc<ActorCell>,
        threads: Arc<CallThreads>,
        permits: Arc<Semaphore>,
        item: MailItem,
    ) {
        let inline = item
            .spec
            .args
            .iter()
            .all(|a| matches!(a, ArgSpec::Value(_)));
        if !inline {
            let exec = self.clone();
            self.rt.spawn(async move {
                match exec.fetch_args(item.spec.args.clone()).await {
                    Ok(args) => {
                        let built =
                            exec.build_actor_call(class, cell, &item.spec, move |_, _| Ok(args));
                        exec.run_concurrent_call(built, threads, permits, item);
                    }
                    Err(e) if exec.claim(&item) => {
                        item.conn.respond(item.request, Response::Error(e))
                    }
                    Err(_) => {}
                }
            });
            return;
        }
        let built = self.build_actor_call(class, cell, &item.spec, |c, a| c.fetch_args_here(a));
        self.run_concurrent_call(built, threads, permits, item);
    }

    fn run_concurrent_call(
        self: &Arc<Self>,
        built: Result<Invocation>,
        threads: Arc<CallThreads>,
        permits: Arc<Semaphore>,
        item: MailItem,
    ) {
        let exec = self.clone();
        match built {
            Ok(Invocation::Blocking(f)) => threads.push(Box::new(move || {
                if exec.claim_to_run(&item) {
                    exec.run_blocking_call(f, item);
                }
            })),
            Ok(Invocation::Async(fut)) => {
                self.rt.spawn(async move {
                    let Ok(_permit) = permits.acquire_owned().await else {
                        return;
                    };
                    let Some(watch) = exec.claim_cancellable(&item) else {
                        return;
                    };
                    let call = registry::CatchUnwind(fut, item.spec.task_id);
                    exec.finish_or_cancel(call, watch, item).await;
                });
            }
            Err(e) if self.claim(&item) => item.conn.respond(item.request, Response::Error(e)),
            Err(_) => {}
        }
    }
}

/// The release that deletes object `id`'s copy in a store, if `value`
/// is in one.
fn store_copy(id: ObjectId, value: &ObjectValue) -> Option<Release> {
    match value {
        ObjectValue::InStore { node, .. } => Some(Release::DeleteFromStore(id, node.clone())),
        ObjectValue::Inline(_) => None,
    }
}

/// Records the caller's answer to a sent stream value (`None`: the
/// connection went before it answered). A value the caller did not take
/// in loses its copy, unless the caller answered that the stream is
/// closed: then it freed the value itself.
fn item_answered(
    objects: &Arc<Objects>,
    copy: Option<Release>,
    answered: Option<Response>,
) -> Result<()> {
    let error = match answered {
        Some(Response::Ok) => return Ok(()),
        Some(Response::Error(e @ Error::TaskCancelled { .. })) => return Err(e),
        Some(Response::Error(e)) => e,
        Some(other) => Error::Protocol {
            message: format!("a stream's value was answered {other:?}"),
        },
        None => Error::Disconnected {
            peer: "the caller of a streaming call".into(),
        },
    };
    objects.apply_releases(copy.into_iter().collect());
    Err(error)
}

impl ItemSender for Arc<Executor> {
    fn send_item(
        &self,
        generator: ObjectId,
        index: u64,
        owner: &Address,
        encoded: codec::Encoded,
    ) -> Result<ItemAck> {
        Executor::send_item(self, generator, index, owner, encoded)
    }

    fn settle_items(&self, acks: Vec<ItemAck>) -> Result<()> {
        Executor::settle_items(self, acks)
    }

    fn settle_answered(
        &self,
        acks: &mut std::collections::VecDeque<ItemAck>,
    ) -> Option<Result<()>> {
        Executor::settle_answered(self, acks)
    }
}
