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
//! Hosting an actor is in the submodules of this one: `hosting.rs`
//! constructs it and runs its calls in their order, in each concurrency
//! mode, and cancels them; `lifecycle.rs` saves its checkpoints and ends
//! it when it asks (`prism::exit_actor`); `state.rs` holds the calls' book
//! and the hosted instance. `streaming.rs` sends a streaming call's
//! values (tasks' and actor calls' alike). This file keeps the
//! [`Executor`], its requests and the path every call takes: arguments
//! fetched, the function or method run, its result stored and answered.
//!
//! # Panics
//!
//! A panic in a task, a method or a constructor is caught and returned to
//! the caller as [`Error::TaskFailed`] with kind `Panic`; the worker lives
//! on. The panic message is also printed to the worker's stderr, which
//! reaches the driver's terminal.

mod hosting;
mod lifecycle;
mod state;
mod streaming;

use super::objects::Objects;
use super::pending::{Pending, PendingTasks};
use super::refs::Release;
use super::registry::{self, Args, CallError, CallResult, Invocation};
use super::store::Loaded;
use super::streams::{SinkGuard, Stop};
use super::task_runs::{RunGuard, RunId, TaskRuns};
use crate::codec;
use crate::config::Config;
use crate::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, ObjectId, WorkerId};
use prism_protocol::messages::{
    ActorCall, Address, ArgSpec, BecomeActor, CancelTask, DumpStacks, ObjectValue, PushTask,
    Response, ReturnObject, RunKind, TaskSpec,
};
use prism_protocol::rpc::Connection;
use prism_protocol::serve::Answer;
use state::{call_cancelled, ActorInstance, CallBook, MailItem, Started, RUNNING};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

pub(crate) use state::Job;

/// A call's small results, carried in the answer.
fn inline_returns(mut encoded: codec::Encoded) -> ReturnObject {
    let more = std::mem::take(&mut encoded.more);
    ReturnObject {
        value: ObjectValue::Inline(Bytes::from(encoded.into_bytes())),
        contained: Vec::new(),
        more: more.into_iter().map(inline_returns).collect(),
    }
}

/// The executing side of a process: what it runs and the actor it hosts.
pub(crate) struct Executor {
    rt: tokio::runtime::Handle,
    config: Arc<Config>,
    worker_id: WorkerId,
    objects: Arc<Objects>,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    actor: Mutex<Option<ActorInstance>>,
    /// The actor this process became, from its constructor on, and how
    /// many times it was restarted before this process.
    hosted: std::sync::OnceLock<(ActorId, u32)>,
    calls: Mutex<CallBook>,
    raylet: Connection,
    exit: AtomicU8,
    /// The running method asked for a checkpoint.
    checkpoint_asked: std::sync::atomic::AtomicBool,
    /// Pushed tasks not started yet.
    pending: Arc<PendingTasks>,
    /// What runs here and ran, for the node's task table.
    runs: Arc<TaskRuns>,
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
        runs: Arc<TaskRuns>,
    ) -> Self {
        Executor {
            runs,
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

    /// The actor this process hosts (from its constructor on).
    pub(crate) fn actor_id(&self) -> Option<ActorId> {
        self.hosted.get().map(|(id, _)| *id)
    }

    /// How many times the hosted actor was restarted before this process
    /// (0 for its first one, and outside an actor).
    pub(crate) fn actor_restarts(&self) -> u32 {
        self.hosted.get().map_or(0, |(_, n)| *n)
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
    /// Queues a task, then posts a job to start it: the job runs the
    /// oldest queued task, none if it was handed back.
    pub(crate) fn serve_push_task(self: &Arc<Self>, request: PushTask, answer: Answer<PushTask>) {
        let (conn, id) = answer.into_parts();
        self.pending.push(Pending::new(conn, id, request.spec));
        let c = self.clone();
        if let Err(e) = self.post(Box::new(move || c.run_next_task())) {
            self.pending.fail_all(&e);
        }
    }

    /// Cancels a task or actor call. An actor call not started yet is
    /// answered now (its caller names the call in the error); a started
    /// async call is dropped by its runner, which answers; a running task
    /// cancelled with `force` ends this process.
    pub(crate) fn serve_cancel_task(&self, request: CancelTask, answer: Answer<CancelTask>) {
        let CancelTask { return_id, force } = request;
        let waiting = {
            let mut calls = self.calls.lock();
            let waiting = calls.waiting.remove(&return_id);
            if let Some(started) = calls.started.get_mut(&return_id) {
                let asked = std::mem::replace(started, Started::CancelAsked);
                if let Started::Watched(signal) = asked {
                    let _ = signal.send(());
                }
            }
            waiting
        };
        if let Some(call) = waiting {
            answer.conn().respond(call, call_cancelled());
            return answer.send(Ok(()));
        }
        if self.pending.cancel(return_id) && force {
            // The caller stops the task by stopping this process: a
            // running function cannot be interrupted. Its other tasks fail
            // with the connection and are retried.
            tracing::warn!(object = %return_id, "a running task was cancelled with force; this worker exits");
            std::process::exit(1);
        }
        answer.send(Ok(()));
    }

    /// Runs an actor's constructor and hosts the actor from now on. A
    /// failed actor's worker has no further use: it leaves after the
    /// answer is out, so its resources return.
    pub(crate) fn serve_become_actor(
        self: &Arc<Self>,
        request: BecomeActor,
        answer: Answer<BecomeActor>,
    ) {
        let exec = self.clone();
        self.rt.clone().spawn(async move {
            let became = exec.become_actor(request.spec).await;
            if became.is_err() {
                tokio::spawn(async {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    std::process::exit(0);
                });
            }
            answer.send(became);
        });
    }

    /// Every thread's stack, and what runs, as JSON.
    pub(crate) fn serve_dump_stacks(&self, _: DumpStacks, answer: Answer<DumpStacks>) {
        let runs = self.runs.clone();
        let actor = self.actor_id().map(|a| a.to_string());
        self.rt.spawn_blocking(move || {
            let threads = super::stacks::dump();
            let running: Vec<String> = runs.running_names();
            let dump = serde_json::json!({
                "pid": std::process::id(),
                "actor_id": actor,
                "running": running,
                "threads": threads,
            });
            answer.send(
                serde_json::to_vec(&dump)
                    .map(Bytes::from)
                    .map_err(|e| Error::invalid("stack dump", e.to_string())),
            );
        });
    }

    /// Queues an actor call in its caller's order.
    pub(crate) fn serve_actor_call(
        self: &Arc<Self>,
        request: ActorCall,
        answer: Answer<ActorCall>,
    ) {
        let ActorCall {
            caller, seq, spec, ..
        } = request;
        let (conn, id) = answer.into_parts();
        let expected = {
            let mut calls = self.calls.lock();
            if let Some(earlier) = calls.waiting.insert(spec.return_id, id) {
                // Never sent twice to one process; if it were, the earlier
                // request would go unanswered.
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
        self.enqueue_actor_call(MailItem {
            conn,
            request: id,
            spec,
        });
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
        let run = self.begin_run(spec);
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
        run.end(result.is_err());
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

    /// Notes that the call `spec` starts running here.
    fn begin_run(self: &Arc<Self>, spec: &TaskSpec) -> RunGuard {
        let actor = self.actor_id();
        let kind = match actor {
            Some(_) => RunKind::ActorCall,
            None => RunKind::Task,
        };
        self.runs
            .begin(RunId::Task(spec.task_id), &spec.function, kind, actor)
    }

    /// An async call that notes its run from now to its end.
    fn recorded(
        self: &Arc<Self>,
        call: registry::BoxFuture<CallResult>,
        spec: &TaskSpec,
    ) -> registry::BoxFuture<CallResult> {
        let run = self.begin_run(spec);
        Box::pin(async move {
            let result = call.await;
            run.end(result.is_err());
            result
        })
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
}

/// The release that deletes object `id`'s copy in a store, if `value`
/// is in one.
fn store_copy(id: ObjectId, value: &ObjectValue) -> Option<Release> {
    match value {
        ObjectValue::InStore { node, .. } => Some(Release::DeleteFromStore(id, node.clone())),
        ObjectValue::Inline(_) => None,
    }
}
