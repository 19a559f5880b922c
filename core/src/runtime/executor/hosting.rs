//! Hosting an actor: constructing it (or restoring it from its latest
//! checkpoint) and serving its calls in its concurrency mode.
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
//! Checkpoints and the actor's own exit are in `lifecycle.rs`; the calls'
//! book and the instance's state in `state.rs`.

use super::state::{
    call_cancelled, cancelled_unnamed, ActorInstance, CallThreads, Checkpoints, Concurrent,
    MailItem, Started,
};
use super::Executor;
use crate::runtime::registry::{
    self, ActorCell, ActorClass, Args, CallError, CallResult, Invocation,
};
use crate::runtime::task_runs::RunId;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, ObjectId};
use prism_protocol::messages::{
    actor_checkpoint_key, ActorSpec, ArgSpec, KvGet, Response, RunKind, TaskSpec,
};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

impl Executor {
    pub(super) async fn become_actor(self: &Arc<Self>, spec: ActorSpec) -> Result<()> {
        // A process becomes one actor only; the constructor already sees it.
        let _ = self.hosted.set((spec.actor_id, spec.restarts));
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
                let run = self.runs.begin(
                    RunId::Constructor(spec.actor_id),
                    &format!("{}::__init__", spec.class),
                    RunKind::ActorCreation,
                    Some(spec.actor_id),
                );
                let created = match tokio::task::spawn_blocking(move || construct(args)).await {
                    Ok(r) => r,
                    Err(e) => Err(registry::panic_error(e)),
                };
                run.end(created.is_err());
                created
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

    pub(super) fn enqueue_actor_call(self: &Arc<Self>, item: MailItem) {
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
        let fut = self.recorded(fut, &item.spec);
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
                    let fut = exec.recorded(fut, &item.spec);
                    let call = registry::CatchUnwind(fut, item.spec.task_id);
                    exec.finish_or_cancel(call, watch, item).await;
                });
            }
            Err(e) if self.claim(&item) => item.conn.respond(item.request, Response::Error(e)),
            Err(_) => {}
        }
    }
}
