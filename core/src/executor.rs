//! The executing side: running pushed tasks, constructing an actor and
//! serving its calls.
//!
//! # Actor calls
//!
//! Calls are queued in arrival order as the connection reader hands them
//! over (so each caller's order is kept), and a dispatcher starts them under
//! a semaphore of `max_concurrency` permits: with one permit a call starts
//! only after the previous one finished. Methods taking `&mut self` hold
//! the instance's write lock, `&self` methods a read lock, so concurrent
//! calls never alias a mutable borrow.
//!
//! # Panics
//!
//! A panic in a task, a method or a constructor is caught (the call runs as
//! its own tokio task) and returned to the caller as
//! [`Error::TaskFailed`] with kind `Panic`; the worker lives on. The panic
//! message is also printed to the worker's stderr, which reaches the
//! driver's terminal.

use crate::core_worker::{CoreWorker, Loaded};
use crate::private::{self, ActorCell, ActorClass, Args, CallError, CallResult, Invocation};
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::messages::{ActorSpec, ArgSpec, Request, Response, ReturnObject, TaskSpec};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

struct MailItem {
    conn: Connection,
    request: Option<u64>,
    spec: TaskSpec,
}

struct ActorInstance {
    spec: ActorSpec,
    mailbox: mpsc::UnboundedSender<MailItem>,
}

/// What a worker process is serving.
#[derive(Default)]
pub(crate) struct ExecutorState {
    actor: Mutex<Option<ActorInstance>>,
    next_seq: Mutex<HashMap<prism_protocol::ids::WorkerId, u64>>,
}

/// Handles task, actor and lifecycle requests.
pub(crate) fn handle(core: &Arc<CoreWorker>, conn: &Connection, id: Option<u64>, request: Request) {
    match request {
        Request::PushTask(spec) => {
            let core = core.clone();
            let conn = conn.clone();
            core.rt.clone().spawn(async move {
                let response = core.run_task(spec).await;
                conn.respond(id, response);
            });
        }
        Request::BecomeActor(spec) => {
            let core = core.clone();
            let conn = conn.clone();
            core.rt.clone().spawn(async move {
                let response = match core.become_actor(spec).await {
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
        Request::ActorCall {
            caller, seq, spec, ..
        } => {
            let expected = {
                let mut seqs = core.executor.next_seq.lock();
                let next = seqs.entry(caller).or_default();
                let expected = *next;
                *next = seq + 1;
                expected
            };
            if seq != expected {
                tracing::warn!(%caller, seq, expected, "actor call arrived out of order");
            }
            let actor = core.executor.actor.lock();
            match actor.as_ref() {
                Some(instance) => {
                    let _ = instance.mailbox.send(MailItem {
                        conn: conn.clone(),
                        request: id,
                        spec,
                    });
                }
                None => conn.respond(
                    id,
                    Response::Error(Error::Protocol {
                        message: "this worker is not an actor".into(),
                    }),
                ),
            }
        }
        other => conn.respond(
            id,
            Response::Error(Error::Protocol {
                message: format!("a core worker does not serve {other:?}"),
            }),
        ),
    }
}

impl CoreWorker {
    async fn fetch_args(self: &Arc<Self>, args: Vec<ArgSpec>) -> Result<Args> {
        let mut loaded = Vec::with_capacity(args.len());
        for arg in args {
            loaded.push(match arg {
                ArgSpec::Value(bytes) => Loaded::Inline(bytes),
                ArgSpec::Ref(info) => self.fetch(&info).await?,
            });
        }
        Ok(Args::new(loaded))
    }

    async fn run_task(self: &Arc<Self>, spec: TaskSpec) -> Response {
        let Some(function) = private::find_function(&spec.function) else {
            return Response::Error(self.unknown(&spec.function));
        };
        let result = match self.fetch_args(spec.args.clone()).await {
            Ok(args) => run_invocation((function.invoke)(args)).await,
            Err(e) => Err(CallError::Runtime(e)),
        };
        self.finish_call(&spec, result).await
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
            // References deserialized from the arguments and still held must
            // be known to their owners before the caller lets go (refs.rs,
            // invariant 3).
            self.register_borrows().await?;
            let contained = encoded.contained.clone();
            let keep_alive = std::mem::take(&mut encoded.keep_alive);
            let value = self.store_value(spec.return_id, encoded).await?;
            self.lend(&contained, &spec.caller).await?;
            drop(keep_alive);
            Ok(ReturnObject { value, contained })
        }
        .await;
        match outcome {
            Ok(ret) => Response::Object(ret),
            Err(e) => Response::Error(e),
        }
    }

    async fn become_actor(self: &Arc<Self>, spec: ActorSpec) -> Result<()> {
        let class = private::find_class(&spec.class).ok_or_else(|| self.unknown(&spec.class))?;
        let args = self.fetch_args(spec.args.clone()).await?;
        let construct = class.construct;
        let created = match tokio::task::spawn_blocking(move || construct(args)).await {
            Ok(r) => r,
            Err(e) => Err(private::panic_error(e)),
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
        self.register_borrows().await?;
        let cell: Arc<ActorCell> = Arc::new(tokio::sync::RwLock::new(instance));
        let (tx, rx) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(spec.options.max_concurrency.max(1) as usize));
        tracing::info!(actor = %spec.actor_id, class = %spec.class, "actor constructed");
        *self.executor.actor.lock() = Some(ActorInstance { spec, mailbox: tx });
        let core = self.clone();
        self.rt
            .spawn(async move { core.serve_actor(class, cell, permits, rx).await });
        Ok(())
    }

    async fn serve_actor(
        self: Arc<Self>,
        class: &'static ActorClass,
        cell: Arc<ActorCell>,
        permits: Arc<Semaphore>,
        mut rx: mpsc::UnboundedReceiver<MailItem>,
    ) {
        let prefix = format!("{}::", class.name);
        while let Some(item) = rx.recv().await {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let core = self.clone();
            let cell = cell.clone();
            let method = item.spec.function.strip_prefix(&prefix).map(str::to_string);
            tokio::spawn(async move {
                let result = match method {
                    None => Err(CallError::Runtime(core.unknown(&item.spec.function))),
                    Some(method) => match core.fetch_args(item.spec.args.clone()).await {
                        Err(e) => Err(CallError::Runtime(e)),
                        Ok(args) => match (class.dispatch)(cell, &method, args) {
                            None => Err(CallError::Runtime(core.unknown(&item.spec.function))),
                            Some(fut) => match tokio::spawn(fut).await {
                                Ok(r) => r,
                                Err(e) => Err(private::panic_error(e)),
                            },
                        },
                    },
                };
                let response = core.finish_call(&item.spec, result).await;
                drop(permit);
                item.conn.respond(item.request, response);
            });
        }
    }

    /// The actor this worker serves, if any (for logs).
    #[allow(dead_code)]
    pub(crate) fn actor_class(&self) -> Option<String> {
        self.executor
            .actor
            .lock()
            .as_ref()
            .map(|a| a.spec.class.clone())
    }
}

async fn run_invocation(invocation: Invocation) -> CallResult {
    let joined = match invocation {
        Invocation::Blocking(f) => tokio::task::spawn_blocking(f).await,
        Invocation::Async(fut) => tokio::spawn(fut).await,
    };
    joined.unwrap_or_else(|e| Err(private::panic_error(e)))
}
