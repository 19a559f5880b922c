//! Calling actors from this process: one [`ActorClient`] per actor, which
//! finds the actor, then writes its calls to the actor's connection in
//! submission order.
//!
//! # Ordering
//!
//! A call is written to the actor's connection at once, from the calling
//! thread, when nothing is queued ahead of it; otherwise one drain task per
//! actor resolves each queued call's arguments and writes it, in order.
//! Calls are numbered by a per-caller sequence, and the actor runs one
//! caller's calls in that order (with `max_concurrency` 1, one at a time).
//!
//! # Cancelling
//!
//! `prism::cancel` on a call still queued here (or set aside after its
//! process died) ends it at once. One already written to the actor is
//! followed there by `CancelTask`, on the same connection: a call not
//! started never runs, a started async call is dropped where it waits,
//! and a started synchronous one runs to its end and keeps its result
//! (each answered as the executor says). A call cancelled while the drain
//! task resolves its arguments is noted in `cancelled`, and ends instead
//! of being written.

use super::objects::Objects;
use super::owned_actors::OwnedActors;
use super::submission::Submission;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, ObjectId, WorkerId};
use prism_protocol::messages::{
    ActorCall, ActorInfo, ActorState, Address, CancelTask, GetActor, LocateActor, OwnedActor,
};
use prism_protocol::rpc::{Connection, Endpoint};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The actor clients of one process.
#[derive(Debug)]
pub(crate) struct ActorSubmitter {
    rt: tokio::runtime::Handle,
    worker_id: WorkerId,
    raylet: Connection,
    objects: Arc<Objects>,
    /// The actors this process created on other nodes, which it places
    /// again when their node dies.
    owned_actors: Arc<OwnedActors>,
    clients: Mutex<HashMap<ActorId, Arc<ActorClient>>>,
}

/// The calling side of one actor in this process.
///
/// A call is written to the actor's connection at once, from the calling
/// thread, when the actor's address is known, its arguments are ready and
/// no earlier call is still waiting; otherwise it joins the backlog, which
/// one drain task sends in order. Either way calls leave in submission
/// order under the state lock, numbered by `seq`.
///
/// When the actor's process dies, the calls it was running are set aside
/// (`lost`) and the drain task finds the actor again: restarted, its lost
/// calls are sent again first (within `max_task_retries`) and then the
/// backlog; dead, every call fails with the reason.
pub(crate) struct ActorClient {
    actor_id: ActorId,
    class: String,
    /// Calls written to the current process and not answered yet.
    in_flight: AtomicUsize,
    state: Mutex<ClientState>,
}

impl std::fmt::Debug for ActorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActorClient({} {})", self.class, self.actor_id)
    }
}

#[derive(Default)]
struct ClientState {
    /// The connection to the actor's current process, while it is alive.
    conn: Option<Connection>,
    /// The worker of the process `conn` reaches (or reached).
    worker: Option<WorkerId>,
    /// The node that process runs (or ran) on, in a multi-node cluster.
    node: Option<String>,
    /// What its node last said about it.
    known: Option<ActorInfo>,
    /// Its owner, if it may restart (known from the handle before any
    /// node answered about it).
    owner: Option<Address>,
    /// Why calls fail, once it is known to be dead.
    dead: Option<Error>,
    seq: u64,
    backlog: VecDeque<Submission>,
    draining: bool,
    /// Calls whose process closed its connection before answering, by
    /// `seq`, until the actor is found again; with whether they reached it
    /// (a write that failed did not).
    lost: BTreeMap<u64, (Submission, bool)>,
    /// Constructor arguments, released once the actor is up (or, for an
    /// actor that may restart, once it is dead).
    ctor_held: Vec<ObjectId>,
    keep_ctor_args: bool,
    /// Calls cancelled while out of the backlog (written to the actor, or
    /// being resolved by the drain task), by first result object, with
    /// the result the cancel named (the note goes once that one is set or
    /// gone): one not yet written ends instead.
    cancelled: HashMap<ObjectId, ObjectId>,
}

/// Cancelled calls noted per actor before those already answered are
/// dropped.
const CANCELLED_KEPT: usize = 64;

thread_local! {
    /// True while this thread writes an actor call: an answer that comes
    /// meanwhile, on this thread, is the write failing.
    static WRITING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What the drain task does next. A local of the drain loop, moved once:
/// boxing the submission would cost an allocation per call for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    Locate(Option<WorkerId>),
    Send(Submission),
}

/// How long a caller waits for the node to notice that a process whose
/// connection closed is gone.
const EXIT_NOTICE_LIMIT: Duration = Duration::from_secs(10);

impl ActorSubmitter {
    pub(crate) fn new(
        rt: tokio::runtime::Handle,
        worker_id: WorkerId,
        raylet: Connection,
        objects: Arc<Objects>,
        owned_actors: Arc<OwnedActors>,
    ) -> Self {
        ActorSubmitter {
            rt,
            worker_id,
            raylet,
            objects,
            owned_actors,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// This process's client of an actor, made on first use.
    pub(crate) fn client(
        self: &Arc<Self>,
        actor_id: ActorId,
        class: &str,
        owner: Option<&Address>,
    ) -> Arc<ActorClient> {
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(&actor_id) {
            if let Some(owner) = owner {
                c.state.lock().owner.get_or_insert_with(|| owner.clone());
            }
            return c.clone();
        }
        let client = Arc::new(ActorClient {
            actor_id,
            class: class.to_string(),
            in_flight: AtomicUsize::new(0),
            state: Mutex::new(ClientState {
                draining: true,
                owner: owner.cloned(),
                ..Default::default()
            }),
        });
        clients.insert(actor_id, client.clone());
        // The drain task first learns where the actor is (or why it died).
        let this = self.clone();
        let c = client.clone();
        self.rt.spawn(async move { this.drain(c).await });
        client
    }

    /// Releases an actor's constructor arguments once it is up (or dead);
    /// with `keep` (it may restart, and each restart runs the constructor
    /// again) only once it is dead for good.
    pub(crate) fn release_after_start(
        &self,
        client: &ActorClient,
        held: Vec<ObjectId>,
        keep: bool,
    ) {
        let mut state = client.state.lock();
        state.keep_ctor_args |= keep;
        let up = state.conn.is_some() && !state.keep_ctor_args;
        if up || state.dead.is_some() {
            drop(state);
            self.objects.release_held(&held);
        } else {
            state.ctor_held.extend(held);
        }
    }

    /// Sends a call now if nothing is ahead of it, else queues it.
    pub(crate) fn send(self: &Arc<Self>, client: &Arc<ActorClient>, mut submission: Submission) {
        let mut state = client.state.lock();
        if let Some(e) = state.dead.clone() {
            drop(state);
            self.objects.finish_task(&submission, Err(e));
            return;
        }
        let ready_now = !state.draining && state.conn.is_some();
        if ready_now {
            match self.objects.resolve_args_now(&mut submission.spec.args) {
                Ok(true) => {
                    self.write_actor_call(client, &mut state, submission);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    drop(state);
                    self.objects.finish_task(&submission, Err(e));
                    return;
                }
            }
        }
        state.backlog.push_back(submission);
        if !state.draining {
            state.draining = true;
            let this = self.clone();
            let c = client.clone();
            self.rt.spawn(async move { this.drain(c).await });
        }
    }

    /// Writes one call to the actor's connection (under the state lock, so
    /// calls leave in order); its answer is handled on the reader task.
    fn write_actor_call(
        self: &Arc<Self>,
        client: &Arc<ActorClient>,
        state: &mut ClientState,
        submission: Submission,
    ) {
        let Some(conn) = state.conn.clone() else {
            state.backlog.push_front(submission);
            return;
        };
        let seq = state.seq;
        state.seq += 1;
        let request = ActorCall {
            actor_id: client.actor_id,
            caller: self.worker_id,
            seq,
            spec: submission.spec.clone(),
        };
        client.in_flight.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        let c = client.clone();
        WRITING.set(true);
        conn.request_with(request, move |outcome| match outcome {
            // This may run right here, under the state lock (the write
            // failed, so the call never reached the process): settle it on
            // a task.
            Err(Error::Disconnected { .. }) => {
                let t = this.clone();
                let reached = !WRITING.get();
                this.rt
                    .spawn(async move { t.call_lost(&c, seq, submission, reached) });
            }
            outcome => {
                c.in_flight.fetch_sub(1, Ordering::SeqCst);
                // The actor names no call in its answer to a cancel (a
                // named one is an argument's task, cancelled).
                let outcome = match outcome {
                    Err(Error::TaskCancelled { function, .. }) if function.is_empty() => {
                        Err(submission.cancelled(false))
                    }
                    outcome => outcome,
                };
                this.objects.finish_task(&submission, outcome);
            }
        });
        WRITING.set(false);
    }

    /// The actor's process closed its connection while running a call: set
    /// the call aside, and have the drain task find out what became of the
    /// actor.
    fn call_lost(
        self: &Arc<Self>,
        client: &Arc<ActorClient>,
        seq: u64,
        submission: Submission,
        reached: bool,
    ) {
        client.state.lock().lost.insert(seq, (submission, reached));
        client.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.forget_connection(client);
    }

    /// Drops the connection to the actor's process and has the drain task
    /// find the actor again (restarted, or dead).
    fn forget_connection(self: &Arc<Self>, client: &Arc<ActorClient>) {
        let mut state = client.state.lock();
        state.conn = None;
        let start = !state.draining;
        state.draining = true;
        drop(state);
        if start {
            let this = self.clone();
            let c = client.clone();
            self.rt.spawn(async move { this.drain(c).await });
        }
    }

    /// The node `actor` runs on as far as this process knows, to ask
    /// first: where this process placed it, or else where it was last
    /// found.
    pub(crate) fn actor_node(&self, actor_id: ActorId) -> Option<String> {
        let client = self.clients.lock().get(&actor_id).cloned();
        match client {
            Some(client) => self.node_of(&client),
            None => self.owned_actors.node_of(actor_id),
        }
    }

    fn node_of(&self, client: &ActorClient) -> Option<String> {
        (self.owned_actors.node_of(client.actor_id)).or_else(|| client.state.lock().node.clone())
    }

    /// This process killed the actor: its later calls go to the restarted
    /// process (or fail with the actor's death), never to the killed one.
    pub(crate) fn killed(self: &Arc<Self>, actor_id: ActorId) {
        let client = self.clients.lock().get(&actor_id).cloned();
        if let Some(client) = client {
            if client.state.lock().conn.is_some() {
                self.forget_connection(&client);
            }
        }
    }

    /// Cancels the call of `actor_id` whose first result is `return_id`
    /// (see "Cancelling" above; the caller named it by its result
    /// `named`). A call that already answered is left as it is.
    pub(crate) fn cancel(
        self: &Arc<Self>,
        actor_id: ActorId,
        return_id: ObjectId,
        named: ObjectId,
    ) {
        let Some(client) = self.clients.lock().get(&actor_id).cloned() else {
            return;
        };
        let mut state = client.state.lock();
        let is_it = |s: &Submission| s.spec.return_id == return_id;
        let queued = match state.backlog.iter().position(is_it) {
            Some(at) => state.backlog.remove(at),
            None => {
                let lost = state.lost.iter().find(|(_, (s, _))| is_it(s));
                let seq = lost.map(|(seq, _)| *seq);
                seq.and_then(|seq| state.lost.remove(&seq)).map(|(s, _)| s)
            }
        };
        if let Some(call) = queued {
            drop(state);
            self.objects.finish_task(&call, Err(call.cancelled(false)));
            return;
        }
        if !self.objects.refs.is_pending(named) {
            return;
        }
        if state.cancelled.len() >= CANCELLED_KEPT {
            let refs = &self.objects.refs;
            state.cancelled.retain(|_, named| refs.is_pending(*named));
        }
        state.cancelled.insert(return_id, named);
        // Under the state lock, so after the call itself if it was written.
        if let Some(conn) = &state.conn {
            let _ = conn.notify(CancelTask {
                return_id,
                force: false,
            });
        }
    }

    /// Finds the actor when there is no connection to it, then sends the
    /// backlog in order, resolving arguments as needed.
    async fn drain(self: Arc<Self>, client: Arc<ActorClient>) {
        loop {
            let step = {
                let mut state = client.state.lock();
                if state.dead.is_none() && state.conn.is_none() {
                    Step::Locate(state.worker)
                } else if let Some(s) = state.backlog.pop_front() {
                    Step::Send(s)
                } else {
                    state.draining = false;
                    return;
                }
            };
            let mut submission = match step {
                Step::Locate(old) => {
                    self.locate(&client, old).await;
                    continue;
                }
                Step::Send(s) => s,
            };
            let dead = client.state.lock().dead.clone();
            if let Some(e) = dead {
                self.fail(&submission, e);
                continue;
            }
            match self
                .objects
                .resolve_args(std::mem::take(&mut submission.spec.args))
                .await
            {
                Ok(args) => submission.spec.args = args,
                Err(e) => {
                    // Cancelled meanwhile: that, not the argument's
                    // failure, is its end.
                    let id = submission.spec.return_id;
                    let cancelled = client.state.lock().cancelled.remove(&id);
                    let e = if cancelled.is_some() {
                        submission.cancelled(false)
                    } else {
                        e
                    };
                    self.objects.finish_task(&submission, Err(e));
                    continue;
                }
            }
            let mut state = client.state.lock();
            if let Some(e) = state.dead.clone() {
                drop(state);
                self.fail(&submission, e);
                continue;
            }
            let id = submission.spec.return_id;
            if !state.cancelled.is_empty() && state.cancelled.remove(&id).is_some() {
                drop(state);
                let error = submission.cancelled(false);
                self.objects.finish_task(&submission, Err(error));
                continue;
            }
            self.write_actor_call(&client, &mut state, submission);
        }
    }

    fn fail(self: &Arc<Self>, submission: &Submission, error: Error) {
        let error = submission.final_error(error);
        self.objects.finish_task(submission, Err(error));
    }

    /// Finds the actor's process (a new one if `old`'s died), then settles
    /// the calls lost with the old one: sent again first if the actor
    /// restarted and they have retries left, failed otherwise.
    async fn locate(self: &Arc<Self>, client: &Arc<ActorClient>, old: Option<WorkerId>) {
        let found = self.find(client, old).await;
        // Every call still out on the old process fails as soon as its
        // connection closes; wait for all of them (bounded).
        let deadline = Instant::now() + EXIT_NOTICE_LIMIT;
        while client.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut failed = Vec::new();
        let held = {
            let mut state = client.state.lock();
            let lost = std::mem::take(&mut state.lost);
            match found {
                Ok((conn, worker, info)) => {
                    state.conn = Some(conn);
                    state.worker = Some(worker);
                    if let ActorState::Alive { address, .. } = &info.state {
                        state.node = Endpoint::parse(address).node;
                    }
                    self.owned_actors
                        .seen_restarts(client.actor_id, info.num_restarts);
                    state.known = Some(info.clone());
                    state.seq = 0;
                    // With one call at a time, only the first call the old
                    // process got can have been running; the ones behind it
                    // never started and simply go to the new process.
                    let first = lost.iter().find(|(_, (_, reached))| *reached);
                    let running = first.map(|(seq, _)| *seq);
                    let sequential = info.max_concurrency == 1;
                    for (seq, (mut submission, reached)) in lost.into_iter().rev() {
                        if !reached || (sequential && Some(seq) != running) {
                            state.backlog.push_front(submission);
                            continue;
                        }
                        let error = Error::ActorUnavailable {
                            actor_id: client.actor_id,
                            class: client.class.clone(),
                            reason: format!(
                                "its process died while {} ran; the actor was restarted \
                                 (restart {}) and this call was not sent again \
                                 (max_task_retries = {}); later calls go to the new process",
                                submission.spec.function, info.num_restarts, info.max_task_retries
                            ),
                        };
                        if submission.failures.is_empty() {
                            submission.retries_left = info.max_task_retries;
                        }
                        if submission.retry_after(&error) {
                            state.backlog.push_front(submission);
                        } else {
                            failed.push((submission, error));
                        }
                    }
                }
                Err(e) => {
                    let e = match (&state.node, e) {
                        // No live node knows it any more: say where it ran.
                        (Some(node), Error::ActorDied { class, reason, .. }) if class == "?" => {
                            let what = if self.objects.peers.is_dead(node) {
                                "died: the cluster's head stopped hearing from it"
                            } else {
                                "no longer knows it: the node died or left the cluster"
                            };
                            // An owner's word on why it is not restarted.
                            let owner = if reason.starts_with("its owner") {
                                format!("; {reason}")
                            } else {
                                String::new()
                            };
                            Error::ActorDied {
                                actor_id: client.actor_id,
                                class: client.class.clone(),
                                reason: format!("it ran on node {node}, which {what}{owner}"),
                            }
                        }
                        (_, e) => e,
                    };
                    state.dead = Some(e.clone());
                    failed.extend(lost.into_values().map(|(s, _)| (s, e.clone())));
                }
            }
            if state.dead.is_some() || !state.keep_ctor_args {
                std::mem::take(&mut state.ctor_held)
            } else {
                Vec::new()
            }
        };
        for (submission, error) in failed {
            // Cancelled while it was out: that is its end.
            let id = submission.spec.return_id;
            if client.state.lock().cancelled.remove(&id).is_some() {
                let error = submission.cancelled(false);
                self.objects.finish_task(&submission, Err(error));
            } else {
                self.fail(&submission, error);
            }
        }
        self.objects.release_held(&held);
    }

    /// Whether an actor no live node holds may still come back: it may
    /// restart, and its owner keeps it (see `owned_actors`). `Err` says
    /// why not, when its owner said (`None` when it cannot restart, or its
    /// owner cannot be reached).
    async fn may_move(&self, client: &ActorClient) -> std::result::Result<(), Option<String>> {
        let (known, owner) = {
            let state = client.state.lock();
            (state.known.clone(), state.owner.clone())
        };
        let owner = match known {
            Some(info) => {
                let max = info.max_restarts;
                if max == 0 || (max > 0 && i64::from(info.num_restarts) >= max) {
                    return Err(None);
                }
                // The head creates a detached actor again, not its owner
                // (which may be gone): look for it meanwhile.
                if info.detached {
                    return Ok(());
                }
                info.owner
            }
            // Never found yet: the handle names the owner of one that may
            // restart, which knows.
            None => match owner {
                Some(owner) => owner,
                None => return Err(None),
            },
        };
        let answer = if &owner == self.objects.address() {
            self.owned_actors.locate(client.actor_id)
        } else {
            let asked = async {
                let conn = self.objects.peers.get(&owner).await?;
                conn.request(LocateActor {
                    actor_id: client.actor_id,
                })
                .await
            };
            // Bounded, connecting included: an owner cut off does not answer.
            match tokio::time::timeout(Duration::from_secs(5), asked).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => return Err(Some("its owner, which restarts it, is gone".into())),
                Err(_) => return Err(Some("its owner, which restarts it, did not answer".into())),
            }
        };
        match answer {
            OwnedActor::Kept => Ok(()),
            OwnedActor::Gone(why) => Err(Some(format!("its owner says {why}"))),
        }
    }

    /// How long a caller looks for an actor that its owner keeps: until
    /// the head has surely declared its node dead, and a margin for the
    /// owner to create it again.
    fn moving_limit(&self) -> Duration {
        // The cluster's timeout is set on its head; this process's setting
        // is the default unless told otherwise, so take the larger.
        let death = self.objects.config.node_death_timeout_ms.max(5_000);
        Duration::from_millis(death) + Duration::from_secs(30)
    }

    /// Waits until the actor is alive in a process other than `old`'s and
    /// connects to it, or returns why it is dead.
    async fn find(
        &self,
        client: &ActorClient,
        mut old: Option<WorkerId>,
    ) -> Result<(Connection, WorkerId, ActorInfo)> {
        let deadline = Instant::now() + EXIT_NOTICE_LIMIT;
        let mut moving: Option<Instant> = None;
        loop {
            let lookup = self
                .raylet
                .request(GetActor {
                    actor_id: client.actor_id,
                    wait: true,
                    node_id: self.node_of(client),
                })
                .await;
            let info = match lookup {
                // No live node holds it. If it may restart, its owner may
                // be creating it again on another node (its node died) or
                // not know yet that its node died: look again meanwhile.
                Err(Error::ActorDied { class, reason, .. }) if class == "?" => {
                    if let Err(why) = self.may_move(client).await {
                        return Err(Error::ActorDied {
                            actor_id: client.actor_id,
                            class,
                            reason: why.unwrap_or(reason),
                        });
                    }
                    let limit = self.moving_limit();
                    let since = *moving.get_or_insert_with(Instant::now);
                    if since.elapsed() > limit {
                        return Err(Error::ActorDied {
                            actor_id: client.actor_id,
                            class: client.class.clone(),
                            reason: format!(
                                "no live node holds it, and its owner did not create it again \
                                 within {} s",
                                limit.as_secs()
                            ),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                other => other?,
            };
            let (address, worker) = match &info.state {
                ActorState::Alive {
                    address, worker, ..
                } => (address.clone(), *worker),
                ActorState::Dead(e) => return Err(e.clone()),
                ActorState::Pending | ActorState::Restarting => {
                    return Err(Error::UnexpectedReply {
                        request: "GetActor (waiting)".into(),
                        reply: "an actor that is not started yet".into(),
                    })
                }
            };
            if Some(worker) != old {
                match self.objects.peers.get(&address).await {
                    Ok(conn) if !conn.is_closed() => return Ok((conn, worker, info)),
                    // It died before we reached it: its exit decides.
                    _ => old = Some(worker),
                }
            }
            if Instant::now() > deadline {
                return Err(Error::ActorDied {
                    actor_id: client.actor_id,
                    class: client.class.clone(),
                    reason: format!(
                        "the connection to its process closed, and after {} s its node \
                         still reports that process alive",
                        EXIT_NOTICE_LIMIT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
