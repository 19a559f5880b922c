//! Submitting tasks: dependency resolution, worker leases per resource
//! shape, and pushing tasks straight to leased workers.
//!
//! # How a task travels
//!
//! 1. Its `ObjectRef` arguments are resolved first: the submitter waits
//!    until each is ready and inlines small values into the task, so a
//!    leased worker never sits idle waiting on another task (which could
//!    deadlock a full pool).
//! 2. It joins the queue of its resource shape. While a shape has queued
//!    tasks and fewer lease requests in flight than tasks queued (up to a
//!    cap), the submitter asks the raylet for another worker lease.
//! 3. A granted worker runs queued tasks of that shape one after another;
//!    the task is sent to the worker's own socket, the reply comes back on
//!    the same connection. The raylet is not involved.
//! 4. A worker whose queue ran dry is kept for `lease_idle_ms`, then given
//!    back, so that back-to-back calls skip the lease round trip. It goes
//!    back at once instead when others wait for it: its grant said so
//!    (`contended`), or its raylet named it since (`LeasesWanted`).
//!
//! # Pipelining
//!
//! While a shape's tasks take a worker under [`PIPELINE_BELOW`] each (an
//! average of the recent ones), a worker is sent as many of them at once as
//! fit in that time, up to `max_tasks_in_flight_per_worker`: it starts the
//! next as it answers one, instead of idling for the round trip to this
//! process and back, and sends and reads several at a time. A worker hands
//! back the tasks queued behind one that runs long
//! (`pending::HAND_BACK_AFTER`); they go to the front of the queue, and
//! that worker is sent nothing more until its running task answers.
//! If a worker dies, each task sent to it counts an attempt, as any may
//! have been running; so a task with no attempts left is sent only to a
//! worker with nothing in flight, and nothing is sent behind it.
//!
//! # Raylets and workers
//!
//! The submitter reaches both through a [`LeaseClient`]: over the network
//! ([`RayletLeases`]) in a process, a fake in this module's unit tests.

use super::lease_client::{LeaseClient, RayletLeases};
use super::lineage::{Lineage, Resubmit};
use super::objects::Objects;
use super::refs::ValueState;
use super::submission::{SchedulingKey, Submission};
use crate::config::Config;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::{LeaseId, ObjectId, TaskId, WorkerId};
use prism_protocol::messages::{
    ArgSpec, CancelLeaseRequests, CancelTask, LeaseGrant, LeaseReply, PushTask, RequestLease,
    ReturnLease, ReturnObject, WorkerExitReason, MAX_LEASE_HOPS,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker leased for a shape's tasks.
#[derive(Debug)]
struct LeasedWorker<L: LeaseClient> {
    lease_id: LeaseId,
    /// The raylet that granted it (this node's, or another node's after a
    /// spillback), to give it back to.
    raylet: L::Raylet,
    worker_id: WorkerId,
    pid: u32,
    conn: L::Worker,
    idle_since: Instant,
    /// Others waited for workers when it was granted: it goes back as
    /// soon as it is idle.
    contended: bool,
}

// By hand: a derive would ask `L: Clone` of the lease client itself.
impl<L: LeaseClient> Clone for LeasedWorker<L> {
    fn clone(&self) -> Self {
        LeasedWorker {
            lease_id: self.lease_id,
            raylet: self.raylet.clone(),
            worker_id: self.worker_id,
            pid: self.pid,
            conn: self.conn.clone(),
            idle_since: self.idle_since,
            contended: self.contended,
        }
    }
}

/// The work a worker is sent ahead, measured in its recent tasks' time:
/// shapes whose tasks take a worker less than this, on average, are sent
/// to workers several at a time (see "Pipelining" above), as many as fit
/// in it.
const PIPELINE_BELOW: Duration = Duration::from_millis(1);

/// A leased worker's tasks in flight.
#[derive(Debug)]
struct Busy<L: LeaseClient> {
    /// Tasks sent and not answered.
    in_flight: usize,
    /// It handed tasks back: it is sent no more until `in_flight` is 0.
    handed_back: bool,
    /// Its one task in flight may not be attempted again: nothing is sent
    /// behind it (if the worker died, a task behind it would count an
    /// attempt too, and its answer could be lost with the process).
    sole: bool,
    /// When it last answered a task.
    last_answer: Option<Instant>,
    /// Its connection, to cancel a task sent to it.
    conn: Option<L::Worker>,
}

// By hand: a derive would ask `L: Default` of the lease client.
impl<L: LeaseClient> Default for Busy<L> {
    fn default() -> Self {
        Busy {
            in_flight: 0,
            handed_back: false,
            sole: false,
            last_answer: None,
            conn: None,
        }
    }
}

/// One resource shape's queued tasks and the workers leased for them.
#[derive(Debug)]
struct ShapeQueue<L: LeaseClient> {
    tasks: VecDeque<Submission>,
    idle: Vec<LeasedWorker<L>>,
    /// Workers with tasks in flight, by lease.
    busy: HashMap<LeaseId, Busy<L>>,
    /// The time a worker spent on each of this shape's recent tasks,
    /// averaged; `None` before the first answer.
    service: Option<Duration>,
    requesting: usize,
    /// The local raylet was asked to withdraw this shape's queued requests
    /// since the last new one was sent.
    withdrawing: bool,
    /// Granted workers in a row that could not be reached.
    unreachable: u32,
}

// By hand: a derive would ask `L: Default` of the lease client.
impl<L: LeaseClient> Default for ShapeQueue<L> {
    fn default() -> Self {
        ShapeQueue {
            tasks: VecDeque::new(),
            idle: Vec::new(),
            busy: HashMap::new(),
            service: None,
            requesting: 0,
            withdrawing: false,
            unreachable: 0,
        }
    }
}

impl<L: LeaseClient> ShapeQueue<L> {
    /// Tasks a worker may have in flight now: about [`PIPELINE_BELOW`]
    /// of work, at most `max`.
    fn depth(&self, max: usize) -> usize {
        match self.service {
            Some(service) if service < PIPELINE_BELOW => {
                let fit = PIPELINE_BELOW.as_nanos() / service.as_nanos().max(1);
                usize::try_from(fit)
                    .unwrap_or(usize::MAX)
                    .clamp(1, max.max(1))
            }
            _ => 1,
        }
    }

    /// The next task for the worker of `lease`, counted in flight, if it
    /// may take one now: it has fewer than `depth` in flight, did not hand
    /// tasks back, and has nothing in flight when either the task it runs
    /// or the next one may not be attempted again. (If a worker dies, every
    /// task sent to it counts an attempt, as any may have been running.)
    fn take_one(&mut self, worker: &LeasedWorker<L>, depth: usize) -> Option<Submission> {
        let last_chance = self.tasks.front()?.retries_left == 0;
        // A new entry (nothing in flight) always takes one, as `depth` is
        // at least 1, so no empty entry is left behind.
        debug_assert!(depth >= 1);
        let busy = self.busy.entry(worker.lease_id).or_default();
        if busy.conn.is_none() {
            busy.conn = Some(worker.conn.clone());
        }
        let behind = busy.in_flight > 0;
        if busy.handed_back || busy.sole || busy.in_flight >= depth || (last_chance && behind) {
            return None;
        }
        busy.in_flight += 1;
        busy.sole = last_chance;
        self.tasks.pop_front()
    }

    /// Folds the time a worker spent on one task into the average.
    fn served(&mut self, took: Duration) {
        self.service = Some(match self.service {
            Some(mean) => (mean * 7 + took) / 8,
            None => took,
        });
    }
}

/// What a lease request came to.
enum Leased<L: LeaseClient> {
    Worker(LeasedWorker<L>),
    /// Withdrawn (`CancelLeaseRequests`) before it was granted.
    Withdrawn,
    /// Granted, but the worker could not be reached.
    Unreachable(Error),
}

/// Granted workers in a row that may be unreachable before a shape's
/// waiting tasks fail with the connection error.
const MAX_UNREACHABLE_WORKERS: u32 = 10;

/// Times a lease is asked again after the node it was sent to could not be
/// reached (200 ms apart: 10 s, twice the default time in which the head
/// marks a silent node dead).
const MAX_UNREACHABLE_SPILLBACKS: u32 = 50;

/// The task submitter of one process. `L`: how it reaches raylets and
/// leased workers (over the network, but for unit tests).
#[derive(Debug)]
pub(crate) struct TaskSubmitter<L: LeaseClient = RayletLeases> {
    rt: tokio::runtime::Handle,
    config: Arc<Config>,
    /// Asks raylets for leases and gives them back, pushes tasks to the
    /// workers granted.
    leases: L,
    objects: Arc<Objects>,
    shapes: Mutex<HashMap<SchedulingKey, ShapeQueue<L>>>,
    /// Busy leases others wait for (`LeasesWanted`): each goes back as
    /// soon as it is idle. Locked after `shapes`.
    wanted: Mutex<HashSet<LeaseId>>,
    /// Tasks cancelled after they left the queue (sent to a worker, or
    /// still resolving their arguments), by first result object: each
    /// ends with `TaskCancelled` whatever it answers. Locked after
    /// `shapes`.
    cancelled: Mutex<HashMap<ObjectId, Cancelled>>,
    /// `cancelled` is not empty (read without the lock on every answer).
    any_cancelled: AtomicBool,
}

impl<L: LeaseClient> TaskSubmitter<L> {
    /// The tasks waiting in the queues for a worker, the oldest first (at
    /// most `limit`): id, function and submission time.
    pub(crate) fn queued(&self, limit: usize) -> Vec<(TaskId, String, u64)> {
        let shapes = self.shapes.lock();
        let mut all: Vec<(TaskId, String, u64)> = shapes
            .values()
            .flat_map(|q| q.tasks.iter())
            .map(|s| (s.spec.task_id, s.spec.function.clone(), s.submitted_us))
            .collect();
        drop(shapes);
        all.sort_by_key(|t| t.2);
        all.truncate(limit);
        all
    }
}

/// A cancel noted for a task that left the queue.
#[derive(Debug, Clone, Copy)]
struct Cancelled {
    /// It was cancelled with `force`.
    force: bool,
    /// The result the cancel named: the note is dropped once that result
    /// is set or gone (it may be a later result of a task whose first
    /// result's references are all dropped).
    named: ObjectId,
}

/// Wanted leases kept before those this process no longer holds are
/// dropped (a raylet may name a lease its return has not reached yet).
const WANTED_KEPT: usize = 64;

impl<L: LeaseClient> TaskSubmitter<L> {
    /// A submitter of tasks for `objects`, leasing workers through
    /// `leases`.
    pub(crate) fn new(
        rt: tokio::runtime::Handle,
        config: Arc<Config>,
        objects: Arc<Objects>,
        leases: L,
    ) -> Self {
        TaskSubmitter {
            rt,
            config,
            leases,
            objects,
            shapes: Mutex::new(HashMap::new()),
            wanted: Mutex::new(HashSet::new()),
            cancelled: Mutex::new(HashMap::new()),
            any_cancelled: AtomicBool::new(false),
        }
    }

    /// The objects this submitter submits tasks for.
    pub(crate) fn objects(&self) -> &Arc<Objects> {
        &self.objects
    }

    /// Cancels the task whose first result is `return_id` (see
    /// `prism::cancel`, which named the task by its result `named`). A
    /// task queued here ends at once; one sent to a worker ends when the
    /// worker answers: at once if it waits there unstarted, when its
    /// worker exits for `force`, or when it finishes (its results
    /// dropped). A task that already finished is left as it is.
    pub(crate) fn cancel(self: &Arc<Self>, return_id: ObjectId, named: ObjectId, force: bool) {
        let mut queued = None;
        let mut workers = Vec::new();
        {
            let mut shapes = self.shapes.lock();
            for queue in shapes.values_mut() {
                if let Some(at) = queue.tasks.iter().position(|t| t.spec.makes(return_id)) {
                    queued = queue.tasks.remove(at);
                    break;
                }
            }
            if queued.is_none() {
                if !self.objects.refs.is_pending(named) {
                    return;
                }
                let mut cancelled = self.cancelled.lock();
                let noted = cancelled
                    .entry(return_id)
                    .or_insert(Cancelled { force, named });
                noted.force |= force;
                // Read by `dispatch` after its write, without a lock.
                self.any_cancelled.store(true, Ordering::SeqCst);
                drop(cancelled);
                workers = (shapes.values())
                    .flat_map(|q| q.busy.values().filter_map(|b| b.conn.clone()))
                    .collect();
            }
        }
        if let Some(task) = queued {
            self.objects.finish_task(&task, Err(task.cancelled(false)));
            return;
        }
        // Only the worker that has it acts on it. A task taken from the
        // queue but not yet written to its worker misses this notice; its
        // `dispatch` sends it again after the task.
        for conn in workers {
            let _ = self
                .leases
                .cancel_task(&conn, CancelTask { return_id, force });
        }
    }

    /// Releases what a cancelled task's answer holds (a stored value, and
    /// borrows of the references inside it): its ref fails instead.
    fn discard_answer(self: &Arc<Self>, task: &Submission, answer: Result<ReturnObject>) {
        let Ok(mut first) = answer else {
            return;
        };
        let more = std::mem::take(&mut first.more);
        let mut releases = Vec::new();
        for (id, ret) in task.spec.returns().zip(std::iter::once(first).chain(more)) {
            let refs = &self.objects.refs;
            releases.extend(refs.discard(id, ValueState::Ready(ret.value), &ret.contained));
        }
        self.objects.apply_releases(releases);
    }

    /// Whether the task making `return_id` was cancelled (and is no
    /// longer): then it ends with `TaskCancelled`.
    fn take_cancelled(&self, return_id: ObjectId) -> bool {
        if !self.any_cancelled.load(Ordering::Acquire) {
            return false;
        }
        let mut cancelled = self.cancelled.lock();
        let was = cancelled.remove(&return_id).is_some();
        if !was {
            // Entries whose object is set, or gone, finished as they were
            // cancelled.
            cancelled.retain(|_, c| self.objects.refs.is_pending(c.named));
        }
        if cancelled.is_empty() {
            self.any_cancelled.store(false, Ordering::Release);
        }
        was
    }

    /// Others wait for these leases (a raylet said so): the idle ones go
    /// back now, the busy ones as soon as their tasks run out, rather
    /// than after `lease_idle_ms`.
    pub(crate) fn leases_wanted(&self, leases: &[LeaseId]) {
        let mut back = Vec::new();
        {
            let mut shapes = self.shapes.lock();
            let mut wanted = self.wanted.lock();
            wanted.extend(leases.iter().copied());
            for queue in shapes.values_mut() {
                let (give, keep): (Vec<_>, Vec<_>) = queue
                    .idle
                    .drain(..)
                    .partition(|w| wanted.contains(&w.lease_id));
                queue.idle = keep;
                back.extend(give);
            }
            for w in &back {
                wanted.remove(&w.lease_id);
            }
            if wanted.len() > WANTED_KEPT {
                let held: HashSet<LeaseId> = shapes
                    .values()
                    .flat_map(|q| q.busy.keys().copied())
                    .collect();
                wanted.retain(|id| held.contains(id));
            }
        }
        for w in back {
            self.give_back(&w);
        }
    }

    /// Gives a lease back to the raylet that granted it.
    fn give_back(&self, worker: &LeasedWorker<L>) {
        let lease = ReturnLease {
            lease_id: worker.lease_id,
            unreachable: false,
        };
        let _ = self.leases.return_lease(&worker.raylet, lease);
    }

    /// Leases a worker for `shape`: from this node's raylet, or from the
    /// node it sends the request on to. `None`: the request was withdrawn
    /// (see [`withdraw_requests`](Self::withdraw_requests)).
    async fn lease(&self, shape: &SchedulingKey) -> Result<Option<(L::Raylet, LeaseGrant)>> {
        let request = |hops| RequestLease {
            shape: shape.shape.clone(),
            bundle: shape.bundle,
            strategy: shape.strategy,
            env_vars: shape.env_vars.clone(),
            hops,
        };
        // A node can die between its last heartbeat and our request: ask
        // this node's raylet again (its view counts the first try against
        // that node, and drops it once the head marks it dead), a bounded
        // number of times.
        let mut unreachable = 0;
        loop {
            let local = self.leases.local();
            let (raylet, node_id) = match self.leases.request_lease(local, request(0)).await? {
                LeaseReply::Granted(grant) => return Ok(Some((local.clone(), grant))),
                LeaseReply::Spillback { raylet, node_id } => (raylet, node_id),
                LeaseReply::Cancelled => return Ok(None),
            };
            // A request waiting at the node it was sent to may be sent on
            // again, to a node with room, up to MAX_LEASE_HOPS times.
            let mut at = node_id.clone();
            let leased = async {
                let (mut raylet, mut hops) = (raylet, 1);
                loop {
                    let remote = self.leases.remote(&raylet).await?;
                    match self.leases.request_lease(&remote, request(hops)).await? {
                        LeaseReply::Granted(grant) => return Ok(Some((remote, grant))),
                        LeaseReply::Cancelled => return Ok(None),
                        LeaseReply::Spillback {
                            raylet: next,
                            node_id: next_id,
                        } if hops < MAX_LEASE_HOPS => {
                            tracing::debug!(from = %at, to = %next_id, "a waiting lease request is sent on");
                            (raylet, at, hops) = (next, next_id, hops + 1);
                        }
                        LeaseReply::Spillback { .. } => {
                            return Err(Error::SentOnAgain {
                                node_id: at.to_string(),
                                what: "a lease request".into(),
                            })
                        }
                    }
                }
            }
            .await;
            match leased {
                Err(e @ (Error::Disconnected { .. } | Error::Io { .. }))
                    if unreachable < MAX_UNREACHABLE_SPILLBACKS =>
                {
                    unreachable += 1;
                    tracing::debug!(node = %at, error = %e, "a node sent to is unreachable; asking again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }
    /// Runs a task again to make its lost result (see `Objects::rebuild`),
    /// holding `held` (its arguments by reference) until it answers.
    pub(crate) fn rebuild(self: &Arc<Self>, lineage: Lineage, held: Vec<ObjectId>) {
        let mut spec = lineage.spec;
        spec.task_id = TaskId::new();
        let retries = (lineage.max_retries - 1).max(-1);
        self.submit(
            lineage.key,
            Submission::new(spec, held).retries(retries, false, Vec::new()),
        );
    }

    /// Resolves, queues and eventually runs a task. When every argument is
    /// a value or a ready object this happens on the calling thread, and the
    /// task may be on its way to a worker before this returns.
    pub(crate) fn submit(self: &Arc<Self>, shape: SchedulingKey, mut submission: Submission) {
        match self.objects.resolve_args_now(&mut submission.spec.args) {
            Ok(true) => self.enqueue(shape, submission),
            Err(e) => self.objects.finish_task(&submission, Err(e)),
            Ok(false) => {
                let submitter = self.clone();
                self.rt.spawn(async move {
                    let objects = &submitter.objects;
                    match objects.resolve_args(submission.spec.args.clone()).await {
                        Ok(args) => {
                            let mut submission = submission;
                            submission.spec.args = args;
                            submitter.enqueue(shape, submission);
                        }
                        // Cancelled while it waited: that, not the argument's
                        // failure, is its end.
                        Err(_) if submitter.take_cancelled(submission.spec.return_id) => {
                            objects.finish_task(&submission, Err(submission.cancelled(false)))
                        }
                        Err(e) => objects.finish_task(&submission, Err(e)),
                    }
                });
            }
        }
    }

    fn enqueue(self: &Arc<Self>, shape: SchedulingKey, submission: Submission) {
        if self.take_cancelled(submission.spec.return_id) {
            return self
                .objects
                .finish_task(&submission, Err(submission.cancelled(false)));
        }
        // A task whose arguments are values, or objects this process owns,
        // can be run again to make its result if the node storing it dies.
        if let Some(deps) = self.owned_deps(&submission) {
            self.objects.record_lineage(Lineage {
                key: shape.clone(),
                spec: submission.spec.clone(),
                max_retries: submission.retries_left,
                deps,
            });
        }
        let mut shapes = self.shapes.lock();
        let queue = shapes.entry(shape.clone()).or_default();
        queue.tasks.push_back(submission);
        let ready = self.pump(&shape, queue);
        drop(shapes);
        self.dispatch_all(&shape, ready);
    }

    /// The objects a task takes by reference, if it takes no others:
    /// each owned here, and none inside a value argument.
    fn owned_deps(&self, submission: &Submission) -> Option<Vec<ObjectId>> {
        let mut deps = Vec::new();
        for arg in &submission.spec.args {
            match arg {
                ArgSpec::Value(_) => {}
                ArgSpec::Ref(info) if self.objects.refs.is_mine(&info.owner) => deps.push(info.id),
                ArgSpec::Ref(_) => return None,
            }
        }
        // (Small ready objects named by reference were resolved into
        // values since: those values are in the spec.)
        (!submission.refs_in_values).then_some(deps)
    }

    fn dispatch_all(
        self: &Arc<Self>,
        shape: &SchedulingKey,
        ready: Vec<(LeasedWorker<L>, Submission)>,
    ) {
        for (worker, task) in ready {
            self.dispatch(shape.clone(), worker, task);
        }
    }

    /// Matches queued tasks with idle workers (returned, to be dispatched
    /// once the queue's lock is released) and asks for more leases.
    #[must_use]
    fn pump(
        self: &Arc<Self>,
        shape: &SchedulingKey,
        queue: &mut ShapeQueue<L>,
    ) -> Vec<(LeasedWorker<L>, Submission)> {
        // One task to each idle worker, then more to each in turn up to
        // the depth the shape's tasks allow.
        let depth = queue.depth(self.config.max_tasks_in_flight_per_worker);
        let mut ready = Vec::new();
        let mut takers = Vec::new();
        while !queue.tasks.is_empty() {
            let Some(worker) = queue.idle.pop() else {
                break;
            };
            match queue.take_one(&worker, depth) {
                Some(task) => {
                    takers.push(worker.clone());
                    ready.push((worker, task));
                }
                None => {
                    queue.idle.push(worker);
                    break;
                }
            }
        }
        for _ in 1..depth {
            let before = ready.len();
            for worker in &takers {
                if let Some(task) = queue.take_one(worker, depth) {
                    ready.push((worker.clone(), task));
                }
            }
            if ready.len() == before {
                break;
            }
        }
        while queue.requesting
            < queue
                .tasks
                .len()
                .min(self.config.max_lease_requests_per_shape.max(1))
        {
            queue.requesting += 1;
            queue.withdrawing = false;
            let this = self.clone();
            let shape = shape.clone();
            self.rt
                .spawn(async move { this.request_lease(shape).await });
        }
        ready
    }

    async fn request_lease(self: &Arc<Self>, shape: SchedulingKey) {
        let granted = async {
            let Some((raylet, grant)) = self.lease(&shape).await? else {
                return Ok(Leased::Withdrawn);
            };
            let conn = match self.leases.worker(&grant.address).await {
                Ok(conn) => conn,
                Err(e) => {
                    // The worker died between its grant and this connect
                    // (a kill, the memory monitor), or does not listen. Its
                    // raylet stops it and grants it to no one else: before
                    // it saw the exit, it would hand the dead worker to
                    // every request waiting, each failing in turn.
                    let lease = ReturnLease {
                        lease_id: grant.lease_id,
                        unreachable: true,
                    };
                    let _ = self.leases.return_lease(&raylet, lease);
                    return Ok(Leased::Unreachable(e));
                }
            };
            Ok::<_, Error>(Leased::<L>::Worker(LeasedWorker {
                lease_id: grant.lease_id,
                raylet,
                worker_id: grant.worker_id,
                pid: grant.pid,
                conn,
                idle_since: Instant::now(),
                contended: grant.contended,
            }))
        }
        .await;
        let mut shapes = self.shapes.lock();
        let queue = shapes.entry(shape.clone()).or_default();
        queue.requesting = queue.requesting.saturating_sub(1);
        match &granted {
            Ok(Leased::Worker(_)) => queue.unreachable = 0,
            Ok(Leased::Unreachable(_)) => queue.unreachable += 1,
            _ => {}
        }
        let give_up = queue.unreachable > MAX_UNREACHABLE_WORKERS;
        match granted {
            // Withdrawn, or its worker was gone: asked again if tasks wait.
            Ok(Leased::Withdrawn) => {
                let ready = self.pump(&shape, queue);
                drop(shapes);
                self.dispatch_all(&shape, ready);
            }
            Ok(Leased::Unreachable(_)) if !give_up => {
                let ready = self.pump(&shape, queue);
                drop(shapes);
                self.dispatch_all(&shape, ready);
            }
            // Granted after this shape's tasks ran out: other clients may
            // be waiting for the worker, so it goes back at once rather
            // than after `lease_idle_ms`.
            Ok(Leased::Worker(worker)) if queue.tasks.is_empty() => {
                drop(shapes);
                self.give_back(&worker);
            }
            Ok(Leased::Worker(worker)) => {
                queue.idle.push(worker);
                let ready = self.pump(&shape, queue);
                drop(shapes);
                self.dispatch_all(&shape, ready);
                self.schedule_idle_return(&shape);
            }
            Ok(Leased::Unreachable(e)) | Err(e) => {
                // The raylet refused (infeasible, bad shape) or is gone, or
                // worker after worker could not be reached: every task
                // waiting for this shape fails the same way.
                queue.unreachable = 0;
                let failed: Vec<Submission> = queue.tasks.drain(..).collect();
                drop(shapes);
                for s in failed {
                    self.objects.finish_task(&s, Err(e.clone()));
                }
            }
        }
    }

    /// Pushes a task to a leased worker. The answer is handled on the
    /// connection's reader task, which also sends the shape's next queued
    /// task to the same worker: no task is spawned per call.
    fn dispatch(self: &Arc<Self>, shape: SchedulingKey, worker: LeasedWorker<L>, task: Submission) {
        let this = self.clone();
        let conn = worker.conn.clone();
        let return_id = task.spec.return_id;
        let request = PushTask {
            spec: task.spec.clone(),
        };
        let sent = Instant::now();
        self.leases.push_task(&conn, request, move |outcome| {
            this.on_task_reply(shape, worker, task, sent, outcome)
        });
        // Cancelled after it left the queue and before this write: the
        // worker got the cancel before the task, so it is told again.
        if self.any_cancelled.load(Ordering::SeqCst) {
            let force = self.cancelled.lock().get(&return_id).map(|c| c.force);
            if let Some(force) = force {
                let _ = self
                    .leases
                    .cancel_task(&conn, CancelTask { return_id, force });
            }
        }
    }

    fn on_task_reply(
        self: &Arc<Self>,
        shape: SchedulingKey,
        worker: LeasedWorker<L>,
        task: Submission,
        sent: Instant,
        outcome: Result<ReturnObject, Error>,
    ) {
        if !matches!(outcome, Err(Error::Disconnected { .. })) {
            return self.settle_task(shape, worker, task, Some(sent), outcome, false);
        }
        // The worker died: ask the raylet why (it knows when it stopped
        // the worker itself, as the memory monitor does), off the reader
        // task.
        let this = self.clone();
        self.rt.spawn(async move {
            let request = WorkerExitReason {
                worker_id: worker.worker_id,
            };
            let known = (this.leases)
                .worker_exit_reason(&worker.raylet, request)
                .await
                .ok()
                .flatten();
            let reason = known.unwrap_or_else(|| {
                "the connection to the worker closed mid-task (the process exited or was killed)"
                    .into()
            });
            let died = Error::WorkerDied {
                function: task.spec.function.clone(),
                worker: worker.worker_id,
                pid: worker.pid,
                reason,
            };
            this.settle_task(shape, worker, task, None, Err(died), true);
        });
    }

    /// Finishes or retries a task once its outcome is known, and gives its
    /// worker the shape's next tasks (unless the worker died, or is still
    /// busy with a task that runs long). `sent`: when it was sent, for an
    /// answer from the worker.
    fn settle_task(
        self: &Arc<Self>,
        shape: SchedulingKey,
        worker: LeasedWorker<L>,
        mut task: Submission,
        sent: Option<Instant>,
        result: Result<ReturnObject, Error>,
        worker_died: bool,
    ) {
        let handed_back = matches!(result, Err(Error::TaskHandedBack { .. }));
        // Answered without running (handed back, or cancelled unstarted):
        // no service time to count.
        let unstarted = handed_back || matches!(result, Err(Error::TaskCancelled { .. }));
        let result = if self.take_cancelled(task.spec.return_id) {
            self.discard_answer(&task, result);
            Err(task.cancelled(worker_died))
        } else {
            result
        };
        let retry = match &result {
            Err(Error::TaskCancelled { .. }) => false,
            // Never started: sent again, no attempt counted.
            Err(_) if handed_back => true,
            Err(e) => task.retry_after(e),
            Ok(_) => false,
        };
        if !retry {
            let result = result.map_err(|e| task.final_error(e));
            self.objects.finish_task(&task, result);
        }
        let now = Instant::now();
        let max_depth = self.config.max_tasks_in_flight_per_worker;
        let mut shapes = self.shapes.lock();
        let queue = shapes.entry(shape.clone()).or_default();
        // Cancelled since the check above: a cancel that finds the task
        // neither here nor queued marks it under this lock.
        let mut ended = None;
        if retry && self.take_cancelled(task.spec.return_id) {
            ended = Some(task);
        } else if retry {
            // Next in line: on this worker if it lives and is free, else on
            // another or a new lease.
            queue.tasks.push_front(task);
        }
        let end = |ended: Option<Submission>| {
            if let Some(task) = ended {
                let error = task.cancelled(worker_died);
                self.objects.finish_task(&task, Err(error));
            }
        };
        let busy = queue.busy.entry(worker.lease_id).or_default();
        busy.in_flight = busy.in_flight.saturating_sub(1);
        busy.handed_back |= handed_back;
        let mut took = None;
        if let (Some(sent), false) = (sent, unstarted) {
            // It started this task when it answered the one before, or
            // when the task arrived.
            let started = busy.last_answer.map_or(sent, |last| last.max(sent));
            took = Some(now.saturating_duration_since(started));
            busy.last_answer = Some(now);
        }
        let in_flight = busy.in_flight;
        if in_flight == 0 {
            queue.busy.remove(&worker.lease_id);
        }
        if let Some(took) = took {
            queue.served(took);
        }
        if worker_died {
            // The raylet frees a dead worker's lease when it sees the exit.
            let ready = self.pump(&shape, queue);
            drop(shapes);
            end(ended);
            self.dispatch_all(&shape, ready);
            return;
        }
        let depth = queue.depth(max_depth);
        let next: Vec<Submission> = std::iter::from_fn(|| queue.take_one(&worker, depth)).collect();
        // A task handed back, or sent again, may need another worker.
        let elsewhere = if retry {
            self.pump(&shape, queue)
        } else {
            Vec::new()
        };
        if in_flight + next.len() > 0 {
            drop(shapes);
            end(ended);
            for task in next {
                self.dispatch(shape.clone(), worker.clone(), task);
            }
            self.dispatch_all(&shape, elsewhere);
            return;
        }
        let withdraw = queue.requesting > 0 && !queue.withdrawing;
        queue.withdrawing |= withdraw;
        let hold = !worker.contended && !self.wanted.lock().remove(&worker.lease_id);
        if hold {
            let mut idle = worker;
            idle.idle_since = now;
            queue.idle.push(idle);
            drop(shapes);
            self.schedule_idle_return(&shape);
        } else {
            drop(shapes);
            self.give_back(&worker);
        }
        end(ended);
        self.dispatch_all(&shape, elsewhere);
        if withdraw {
            self.withdraw_requests(&shape);
        }
    }

    /// Asks the local raylet to withdraw this shape's queued lease
    /// requests: the shape's tasks ran out, and a worker granted now would
    /// only sit idle while other clients wait for it.
    fn withdraw_requests(&self, shape: &SchedulingKey) {
        let _ = self.leases.withdraw_requests(CancelLeaseRequests {
            shape: shape.shape.clone(),
            bundle: shape.bundle,
            env_vars: shape.env_vars.clone(),
        });
    }

    /// Gives back workers that stayed idle for `lease_idle_ms`.
    fn schedule_idle_return(self: &Arc<Self>, shape: &SchedulingKey) {
        let hold = Duration::from_millis(self.config.lease_idle_ms);
        let this = self.clone();
        let shape = shape.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(hold).await;
            let expired: Vec<LeasedWorker<L>> = {
                let mut shapes = this.shapes.lock();
                let Some(queue) = shapes.get_mut(&shape) else {
                    return;
                };
                let (old, keep): (Vec<_>, Vec<_>) = queue
                    .idle
                    .drain(..)
                    .partition(|w| w.idle_since.elapsed() >= hold);
                queue.idle = keep;
                old
            };
            for w in expired {
                this.give_back(&w);
            }
        });
    }

    /// Gives back every idle lease (shutdown).
    pub(crate) fn return_all_leases(&self) {
        let mut shapes = self.shapes.lock();
        for queue in shapes.values_mut() {
            for w in queue.idle.drain(..) {
                self.give_back(&w);
            }
        }
    }
}

impl<L: LeaseClient> Resubmit for TaskSubmitter<L> {
    fn resubmit(self: Arc<Self>, lineage: Lineage, held: Vec<ObjectId>) {
        self.rebuild(lineage, held);
    }
}

#[cfg(test)]
mod tests;
