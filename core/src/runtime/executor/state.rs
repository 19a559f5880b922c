//! What the executor keeps of the actor it hosts, shared by `executor.rs`
//! and its parts: the calls received (the [`CallBook`]), the hosted
//! instance and how it runs calls ([`ActorInstance`], [`Concurrent`] with
//! its [`CallThreads`], [`Checkpoints`]), where it is in ending itself, and
//! the answers of cancelled calls. A leaf: it names nothing of the
//! executor's.

use crate::runtime::registry::{ActorCell, ActorClass};
use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, IdMap, ObjectId, WorkerId};
use prism_protocol::messages::{Response, TaskSpec};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Where the hosted actor is in ending itself (`prism::exit_actor`).
pub(super) const RUNNING: u8 = 0;
pub(super) const EXIT_ASKED: u8 = 1;
pub(super) const EXITING: u8 = 2;

/// Work for the executor thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

pub(super) struct MailItem {
    pub(super) conn: Connection,
    pub(super) request: Option<u64>,
    pub(super) spec: TaskSpec,
}

pub(super) struct ActorInstance {
    pub(super) actor_id: ActorId,
    /// When its state is saved, if it is checkpointed.
    pub(super) checkpoints: Option<Arc<Mutex<Checkpoints>>>,
    pub(super) class: &'static ActorClass,
    pub(super) cell: Arc<ActorCell>,
    /// Actors with `max_concurrency` above 1: their call threads and the
    /// permits bounding their async calls.
    pub(super) concurrent: Option<Concurrent>,
    /// An async actor: the queue its calls are taken from, in order.
    pub(super) in_order: Option<tokio::sync::mpsc::UnboundedSender<MailItem>>,
}

/// When a checkpointed actor's state is saved: after every `every` calls,
/// after the first call once `interval` has passed, or after a call that
/// asked (`prism::checkpoint_actor`).
pub(super) struct Checkpoints {
    pub(super) every: u32,
    pub(super) interval: Option<std::time::Duration>,
    pub(super) calls: u32,
    pub(super) last: std::time::Instant,
    pub(super) key: String,
}

/// How an actor with `max_concurrency` above 1 runs calls.
pub(super) struct Concurrent {
    /// Synchronous methods run on these threads.
    pub(super) threads: Arc<CallThreads>,
    /// Async methods run as tasks holding one of these.
    pub(super) permits: Arc<Semaphore>,
}

/// Up to `max` threads that run queued calls, started as calls arrive and
/// nobody is idle; a thread drains the queue before it sleeps, so a burst
/// of short calls costs few wake-ups.
pub(super) struct CallThreads {
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
    pub(super) fn new(max: usize) -> Arc<Self> {
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

    pub(super) fn push(self: &Arc<Self>, job: Job) {
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
pub(super) struct CallBook {
    /// The next call number expected from each caller.
    pub(super) next_seq: HashMap<WorkerId, u64>,
    /// Calls received and not started, by result object, with the request
    /// to answer if the caller cancels one (`CancelTask`, which comes on
    /// the connection its call came on). Whoever takes a call out of here
    /// runs it, or answers it cancelled: never both.
    pub(super) waiting: IdMap<ObjectId, Option<u64>>,
    /// Calls taken out of `waiting` that may run as async calls, until
    /// they are answered: a `CancelTask` for one notes it or fires its
    /// signal, and the call's future is dropped where it waits (see
    /// `stop_if_cancelled` in `hosting.rs`).
    pub(super) started: IdMap<ObjectId, Started>,
}

/// Where a started async call is for a cancel.
pub(super) enum Started {
    /// Running, nobody waiting for a cancel yet.
    Running,
    /// Its caller cancelled it before its runner waited for that.
    CancelAsked,
    /// Its runner waits for a cancel on this.
    Watched(tokio::sync::oneshot::Sender<()>),
}

/// The error a call cancelled before its end is answered. It names no
/// function: its caller names the call (see `ActorSubmitter`'s answer
/// handling).
pub(super) fn cancelled_unnamed() -> Error {
    Error::TaskCancelled {
        function: String::new(),
        how: String::new(),
    }
}

/// The answer to a call cancelled before it started.
pub(super) fn call_cancelled() -> Response {
    Response::Error(cancelled_unnamed())
}
