//! A worker's pushed tasks that have not started yet.
//!
//! A submitter may send a worker its next task while the current one runs
//! (see "Pipelining" in `submitter`), so that the executor thread finds it
//! waiting when it finishes instead of idling for a round trip. A task
//! queued behind one that runs long would wait for it while another worker
//! may be free, or, if the running task waits for it, forever. So once the
//! running task has run for [`HAND_BACK_AFTER`] with others queued behind
//! it, the worker hands those back unstarted ([`Error::TaskHandedBack`]),
//! and their submitters send them to other workers.

use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::{ObjectId, WorkerId};
use prism_protocol::messages::{Response, TaskSpec};
use prism_protocol::rpc::Connection;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a running task may keep tasks queued behind it before they
/// are handed back. 10 ms: submitters queue tasks only behind tasks that
/// usually take well under a millisecond, so this is a task running ten
/// times longer than its kind usually does, or one that waits.
pub(crate) const HAND_BACK_AFTER: Duration = Duration::from_millis(10);

/// A task pushed to this worker, with where its answer goes.
pub(crate) struct Pending {
    pub(crate) conn: Connection,
    pub(crate) request: Option<u64>,
    pub(crate) spec: TaskSpec,
    /// A streaming task's stop flag, set by a cancel while it runs: it
    /// makes no further value.
    pub(crate) stop: Option<Arc<AtomicBool>>,
}

impl Pending {
    pub(crate) fn new(conn: Connection, request: Option<u64>, spec: TaskSpec) -> Self {
        let stop = spec.streaming.then(|| Arc::new(AtomicBool::new(false)));
        Pending {
            conn,
            request,
            spec,
            stop,
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Pending>,
    /// The executor thread is running a task.
    running: bool,
    /// The result object of the task it runs, and its stop flag.
    running_task: Option<(ObjectId, Option<Arc<AtomicBool>>)>,
    /// A watch (see [`PendingTasks::watch`]) is on.
    watching: bool,
}

/// The tasks pushed to this worker and not started, in arrival order.
pub(crate) struct PendingTasks {
    worker: WorkerId,
    rt: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Tasks started so far.
    started: AtomicU64,
}

impl PendingTasks {
    pub(crate) fn new(worker: WorkerId, rt: tokio::runtime::Handle) -> Arc<Self> {
        Arc::new(PendingTasks {
            worker,
            rt,
            state: Mutex::new(State::default()),
            started: AtomicU64::new(0),
        })
    }

    /// Queues a pushed task; the caller posts a job that starts it (see
    /// [`start_next`](Self::start_next)).
    pub(crate) fn push(self: &Arc<Self>, task: Pending) {
        let mut state = self.state.lock();
        state.queue.push_back(task);
        self.watch_if_waiting(&mut state);
    }

    /// On the executor thread: the next task to run, now marked running,
    /// or `None` when the task this job was posted for was handed back.
    pub(crate) fn start_next(self: &Arc<Self>) -> Option<Pending> {
        let mut state = self.state.lock();
        let next = state.queue.pop_front()?;
        state.running = true;
        state.running_task = Some((next.spec.return_id, next.stop.clone()));
        self.started.fetch_add(1, Ordering::Relaxed);
        self.watch_if_waiting(&mut state);
        Some(next)
    }

    /// Starts a watch if tasks wait behind a running one and none is on.
    fn watch_if_waiting(self: &Arc<Self>, state: &mut State) {
        if state.running && !state.queue.is_empty() && !state.watching {
            state.watching = true;
            self.rt.spawn(self.clone().watch());
        }
    }

    /// On the executor thread: the running task finished.
    pub(crate) fn finished(&self) {
        let mut state = self.state.lock();
        state.running = false;
        state.running_task = None;
    }

    /// Its caller cancelled the task whose result is `return_id`: if it
    /// waits here it is answered [`Error::TaskCancelled`] and never runs.
    /// Returns whether it is the task running now.
    pub(crate) fn cancel(&self, return_id: ObjectId) -> bool {
        let (dropped, running) = {
            let mut state = self.state.lock();
            let at = state
                .queue
                .iter()
                .position(|p| p.spec.return_id == return_id);
            let dropped = at.and_then(|i| state.queue.remove(i));
            let running = match &state.running_task {
                Some((id, stop)) if *id == return_id => {
                    if let Some(stop) = stop {
                        stop.store(true, Ordering::Release);
                    }
                    true
                }
                _ => false,
            };
            (dropped, running)
        };
        if let Some(task) = dropped {
            let error = Error::TaskCancelled {
                function: task.spec.function.clone(),
                how: String::new(),
            };
            task.conn.respond(task.request, Response::Error(error));
        }
        running
    }

    /// Answers every queued task with `error` (the executor thread is
    /// gone).
    pub(crate) fn fail_all(&self, error: &Error) {
        let failed: Vec<Pending> = self.state.lock().queue.drain(..).collect();
        for task in failed {
            task.conn
                .respond(task.request, Response::Error(error.clone()));
        }
    }

    /// While tasks are queued: hands them back once one task has been
    /// running for a whole [`HAND_BACK_AFTER`].
    async fn watch(self: Arc<Self>) {
        loop {
            let seen = self.started.load(Ordering::Relaxed);
            tokio::time::sleep(HAND_BACK_AFTER).await;
            let handed: Vec<Pending> = {
                let mut state = self.state.lock();
                if state.queue.is_empty() {
                    state.watching = false;
                    return;
                }
                if !state.running || self.started.load(Ordering::Relaxed) != seen {
                    continue;
                }
                state.watching = false;
                state.queue.drain(..).collect()
            };
            tracing::debug!(
                worker = %self.worker,
                tasks = handed.len(),
                "handing back tasks queued behind a long one"
            );
            for task in handed {
                let error = Error::TaskHandedBack {
                    function: task.spec.function.clone(),
                    worker: self.worker,
                    reason: format!(
                        "the task ahead of it ran for more than {} ms",
                        HAND_BACK_AFTER.as_millis()
                    ),
                };
                task.conn.respond(task.request, Response::Error(error));
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::messages::{ExecutorRequest, PushTask, Request, ReturnObject};
    use prism_protocol::rpc::Handler;
    use tokio::sync::mpsc;

    /// The worker's side of a connection: queues every pushed task.
    struct Queues(Arc<PendingTasks>);

    impl Handler for Queues {
        fn handle(&self, conn: &Connection, request: Option<u64>, body: Request) {
            if let Request::Executor(ExecutorRequest::PushTask(PushTask { spec })) = body {
                self.0.push(Pending::new(conn.clone(), request, spec));
            }
        }
    }

    struct Ignores;

    impl Handler for Ignores {
        fn handle(&self, _: &Connection, _: Option<u64>, _: Request) {}
    }

    fn push(function: &str) -> PushTask {
        PushTask {
            spec: TaskSpec::new(
                function.into(),
                Vec::new(),
                ObjectId::new(),
                Vec::new(),
                String::new(),
            ),
        }
    }

    /// Sends three tasks over a real socket pair; returns the queue and
    /// the submitter's answers, in arrival order, as (function, outcome).
    async fn three_sent() -> (
        Arc<PendingTasks>,
        mpsc::UnboundedReceiver<(String, Result<ReturnObject, Error>)>,
    ) {
        let (a, b) = tokio::net::UnixStream::pair().expect("a socket pair");
        let rt = tokio::runtime::Handle::current();
        let queue = PendingTasks::new(prism_protocol::ids::WorkerId::new(), rt);
        let _worker = Connection::start(a, "worker".into(), Arc::new(Queues(queue.clone())));
        let submitter = Connection::start(b, "submitter".into(), Arc::new(Ignores));
        let (tx, rx) = mpsc::unbounded_channel();
        for f in ["first", "second", "third"] {
            let tx = tx.clone();
            submitter.request_with(push(f), move |outcome| {
                let _ = tx.send((f.to_string(), outcome));
            });
        }
        for _ in 0..1000 {
            if queue.state.lock().queue.len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(queue.state.lock().queue.len(), 3, "three tasks arrive");
        (queue, rx)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_queued_behind_a_long_one_are_handed_back_unstarted() {
        let (queue, mut rx) = three_sent().await;
        // The first starts and keeps running; the two behind it (which
        // arrived before it started) come back.
        let first = queue.start_next().expect("a task to start");
        assert_eq!(first.spec.function, "first");
        let mut handed = Vec::new();
        for _ in 0..2 {
            let (function, outcome) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("handed back within 10 s")
                .expect("an answer");
            match outcome {
                Err(Error::TaskHandedBack {
                    function: f,
                    reason,
                    ..
                }) => {
                    assert_eq!(f, function);
                    assert!(reason.contains("ran for more than"), "{reason}");
                }
                other => panic!("{function}: expected it handed back, got {other:?}"),
            }
            handed.push(function);
        }
        assert_eq!(handed, ["second", "third"], "in the order sent");
        // Nothing is left to start; the jobs posted for them do nothing.
        assert!(queue.start_next().is_none());
        queue.finished();
        assert!(!queue.state.lock().watching, "the watch ended");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_task_is_answered_unstarted_and_the_others_stay() {
        let (queue, mut rx) = three_sent().await;
        let first = queue.start_next().expect("a task to start");
        let second = queue.state.lock().queue[0].spec.return_id;
        assert!(queue.cancel(first.spec.return_id), "the first one runs");
        assert!(!queue.cancel(second), "the second one waits");
        let left: Vec<String> = (queue.state.lock().queue.iter())
            .map(|p| p.spec.function.clone())
            .collect();
        assert_eq!(left, ["third"], "only the cancelled one left the queue");
        let (function, outcome) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("answered within 10 s")
            .expect("an answer");
        assert_eq!(function, "second");
        assert!(
            matches!(outcome, Err(Error::TaskCancelled { .. })),
            "{outcome:?}"
        );
        queue.finished();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_that_keep_starting_are_not_handed_back() {
        let (queue, mut rx) = three_sent().await;
        // Each task runs 3 ms, under the hand-back time, and a new one is
        // pushed as each starts: the watch sees tasks start and leaves
        // them be.
        for _ in 0..10 {
            let task = queue.start_next().expect("a task to start");
            queue.push(Pending::new(task.conn.clone(), None, push("more").spec));
            tokio::time::sleep(Duration::from_millis(3)).await;
            queue.finished();
        }
        tokio::time::sleep(HAND_BACK_AFTER * 3).await;
        assert!(rx.try_recv().is_err(), "nothing was handed back");
        assert_eq!(queue.state.lock().queue.len(), 3, "still queued");
    }
}
