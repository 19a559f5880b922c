//! The actor table: each actor's state, its name, its worker, and the
//! callers waiting for it to leave `Pending`.
//!
//! Creation is asynchronous, as in Ray: `CreateActor` is answered once the
//! request is accepted (name free, resources feasible); the actor's worker
//! runs the constructor later and callers wait for the outcome with
//! `GetActor { wait: true }`. Like the scheduler, the table does no I/O:
//! calls that settle an actor return the waiters to answer (`R` is the
//! caller's reply handle).

use prism_protocol::error::{ActorDeath, Error};
use prism_protocol::ids::{ActorId, JobId, WorkerId};
use prism_protocol::messages::{ActorInfo, ActorSpec, ActorState};
use std::collections::{HashMap, HashSet};

#[derive(Debug)]
struct ActorEntry<R> {
    info: ActorInfo,
    /// (namespace, name), while the actor holds it.
    name: Option<(String, String)>,
    /// The worker of its current process (`None` while it waits for one).
    worker: Option<WorkerId>,
    waiters: Vec<R>,
    /// What each of its processes is started from.
    spec: ActorSpec,
    /// Whether the current incarnation's worker was handed the spec.
    handed: bool,
    /// Why it dies if its process exits with no restart left (set by a
    /// kill that allows a restart).
    death_reason: Option<String>,
}

/// What becomes of an actor whose process is gone.
#[derive(Debug)]
pub(crate) enum Lost<R> {
    /// It is restarting: lease a worker for it again.
    Restart(Box<ActorSpec>),
    /// It is dead for good: answer these waiters.
    Dead(Answers<R>),
}

/// Waiters to answer with an actor's settled state.
pub(crate) type Answers<R> = Vec<(R, ActorInfo)>;

/// The last holder of a name, which died for good: what a lookup of the
/// name says while no live actor holds it.
#[derive(Debug, Clone)]
struct Tombstone {
    actor_id: ActorId,
    died_at_ms: u64,
    cause: String,
}

/// Names whose holders died that are remembered; older ones are
/// forgotten first.
const TOMBSTONES_KEPT: usize = 1000;

/// Every actor of the cluster, and the names they hold.
#[derive(Debug)]
pub(crate) struct ActorTable<R> {
    actors: HashMap<ActorId, ActorEntry<R>>,
    names: HashMap<(String, String), ActorId>,
    /// Names whose holder died, with when and why, oldest first.
    tombstones: HashMap<(String, String), Tombstone>,
    tombstone_order: std::collections::VecDeque<(String, String)>,
    /// Actors that died for good since [`ActorTable::take_ended`] last ran.
    ended: Vec<ActorId>,
    /// Actors restarted since then, with their restart counts.
    restarted: Vec<(ActorId, u32)>,
}

impl<R> Default for ActorTable<R> {
    fn default() -> Self {
        ActorTable {
            actors: HashMap::new(),
            names: HashMap::new(),
            tombstones: HashMap::new(),
            tombstone_order: std::collections::VecDeque::new(),
            ended: Vec::new(),
            restarted: Vec::new(),
        }
    }
}

/// Ray's name of an actor's state.
fn state_name(state: &ActorState) -> &'static str {
    match state {
        ActorState::Pending => "PENDING_CREATION",
        ActorState::Restarting => "RESTARTING",
        ActorState::Alive { .. } => "ALIVE",
        ActorState::Dead(_) => "DEAD",
    }
}

fn unknown(actor_id: ActorId) -> Error {
    Error::ActorDied {
        actor_id,
        class: "?".into(),
        reason: "no such actor in the control store".into(),
    }
}

impl<R> ActorTable<R> {
    /// Records a new actor as `Pending` (or `Restarting`, for one its
    /// owner creates again after its node died), taking its name if it
    /// has one.
    pub(crate) fn add(&mut self, spec: ActorSpec) -> Result<(), Error> {
        let name = spec
            .options
            .name
            .clone()
            .map(|n| (spec.options.namespace.clone(), n));
        if let Some(key) = &name {
            if self.names.contains_key(key) {
                return Err(Error::ActorNameTaken {
                    name: key.1.clone(),
                    namespace: key.0.clone(),
                });
            }
            self.names.insert(key.clone(), spec.actor_id);
        }
        self.actors.insert(
            spec.actor_id,
            ActorEntry {
                info: ActorInfo {
                    actor_id: spec.actor_id,
                    class: spec.class.clone(),
                    state: if spec.restarts > 0 {
                        ActorState::Restarting
                    } else {
                        ActorState::Pending
                    },
                    num_restarts: spec.restarts,
                    max_task_retries: spec.options.max_task_retries,
                    max_concurrency: spec.options.max_concurrency,
                    max_restarts: spec.options.max_restarts,
                    owner: spec.owner.clone(),
                    detached: spec.options.detached,
                },
                name,
                worker: None,
                waiters: Vec::new(),
                spec,
                handed: false,
                death_reason: None,
            },
        );
        Ok(())
    }

    /// The actor got `worker`: returns its spec, to hand to the worker
    /// (once per process; `None` after that, for a dead actor or for an
    /// unknown one).
    pub(crate) fn assign(&mut self, actor: ActorId, worker: WorkerId) -> Option<ActorSpec> {
        let entry = self.actors.get_mut(&actor)?;
        if entry.handed || matches!(entry.info.state, ActorState::Dead(_)) {
            return None;
        }
        entry.worker = Some(worker);
        entry.handed = true;
        // The worker learns how many times the actor was restarted
        // (`RuntimeContext::was_current_actor_restarted`).
        let mut spec = entry.spec.clone();
        spec.restarts = entry.info.num_restarts;
        Some(spec)
    }

    /// The constructor on `worker` finished (`state` is `Alive` or
    /// `Dead`); a pending or restarting actor still on that worker takes
    /// that state. Returns the waiters to answer.
    pub(crate) fn started(
        &mut self,
        actor: ActorId,
        worker: WorkerId,
        state: ActorState,
    ) -> Answers<R> {
        match self.actors.get_mut(&actor) {
            Some(entry)
                if entry.worker == Some(worker)
                    && matches!(
                        entry.info.state,
                        ActorState::Pending | ActorState::Restarting
                    ) =>
            {
                entry.info.state = state;
                if matches!(entry.info.state, ActorState::Dead(_)) {
                    self.ended.push(actor);
                    self.free_name(actor);
                    return self.actors.get_mut(&actor).map(wake).unwrap_or_default();
                }
                wake(entry)
            }
            _ => Vec::new(),
        }
    }

    /// The actor's process is gone (`reason` says how). With restarts left
    /// and `may_restart` (its job still runs), it becomes `Restarting` and
    /// the caller leases a worker for it again; otherwise it dies.
    pub(crate) fn lost(&mut self, actor: ActorId, reason: String, may_restart: bool) -> Lost<R> {
        let Some(entry) = self.actors.get_mut(&actor) else {
            return Lost::Dead(Vec::new());
        };
        if matches!(entry.info.state, ActorState::Dead(_)) {
            return Lost::Dead(Vec::new());
        }
        let max = entry.spec.options.max_restarts;
        let restarts_left = max < 0 || i64::from(entry.info.num_restarts) < max;
        if !(restarts_left && may_restart) {
            let reason = match entry.death_reason.take() {
                Some(why) => why,
                None if max != 0 && may_restart => format!(
                    "{reason}; it was restarted {} time(s), its max_restarts",
                    entry.info.num_restarts
                ),
                None => reason,
            };
            return Lost::Dead(self.died(actor, reason));
        }
        entry.info.num_restarts += 1;
        self.restarted.push((actor, entry.info.num_restarts));
        entry.info.state = ActorState::Restarting;
        entry.worker = None;
        entry.handed = false;
        entry.death_reason = None;
        tracing::info!(
            actor = %actor,
            class = %entry.info.class,
            restart = entry.info.num_restarts,
            %reason,
            "restarting an actor whose process died"
        );
        Lost::Restart(Box::new(entry.spec.clone()))
    }

    /// `job` ended: its live actors other than `keep` (its detached ones)
    /// die, when their processes are stopped, saying so.
    pub(crate) fn job_ending(&mut self, job: JobId, keep: &HashSet<ActorId>) {
        for (id, entry) in self.actors.iter_mut() {
            if entry.spec.job == job
                && !keep.contains(id)
                && !matches!(entry.info.state, ActorState::Dead(_))
            {
                entry.death_reason =
                    Some("its job ended: the driver that started the job exited".into());
            }
        }
    }

    /// The reason the actor dies with if its process exits with no restart
    /// left (a kill that allows a restart).
    pub(crate) fn set_death_reason(&mut self, actor: ActorId, reason: String) {
        if let Some(entry) = self.actors.get_mut(&actor) {
            entry.death_reason = Some(reason);
        }
    }

    /// Marks an actor dead (its process exited, it was killed, or it can
    /// never be placed), freeing its name. Returns the waiters to answer.
    pub(crate) fn died(&mut self, actor: ActorId, reason: String) -> Answers<R> {
        let Some(entry) = self.actors.get_mut(&actor) else {
            return Vec::new();
        };
        if !matches!(entry.info.state, ActorState::Dead(_)) {
            entry.info.state = ActorState::Dead(Error::ActorDied {
                actor_id: actor,
                class: entry.info.class.clone(),
                reason,
            });
            self.ended.push(actor);
        }
        let answers = wake(entry);
        self.free_name(actor);
        answers
    }

    /// The actors that died for good since the last call.
    pub(crate) fn take_ended(&mut self) -> Vec<ActorId> {
        std::mem::take(&mut self.ended)
    }

    /// The actors restarted since the last call, with their counts.
    pub(crate) fn take_restarted(&mut self) -> Vec<(ActorId, u32)> {
        std::mem::take(&mut self.restarted)
    }

    fn free_name(&mut self, actor: ActorId) {
        let Some(entry) = self.actors.get_mut(&actor) else {
            return;
        };
        let Some(key) = entry.name.take() else {
            return;
        };
        self.names.remove(&key);
        let cause = match &entry.info.state {
            ActorState::Dead(Error::ActorDied { reason, .. }) => reason.clone(),
            ActorState::Dead(other) => other.to_string(),
            _ => "it ended".to_string(),
        };
        let stone = Tombstone {
            actor_id: actor,
            died_at_ms: prism_protocol::clock::unix_ms(),
            cause,
        };
        if self.tombstones.insert(key.clone(), stone).is_none() {
            self.tombstone_order.push_back(key);
        }
        while self.tombstone_order.len() > TOMBSTONES_KEPT {
            if let Some(old) = self.tombstone_order.pop_front() {
                self.tombstones.remove(&old);
            }
        }
    }

    /// An actor's state now, or (with `wait`, while pending or
    /// restarting) `None` after queueing `reply` for
    /// [`ActorTable::started`] or [`ActorTable::died`].
    pub(crate) fn watch(
        &mut self,
        actor: ActorId,
        wait: bool,
        reply: R,
    ) -> Option<(R, Result<ActorInfo, Error>)> {
        match self.actors.get_mut(&actor) {
            None => Some((reply, Err(unknown(actor)))),
            Some(entry)
                if wait
                    && matches!(
                        entry.info.state,
                        ActorState::Pending | ActorState::Restarting
                    ) =>
            {
                entry.waiters.push(reply);
                None
            }
            Some(entry) => Some((reply, Ok(entry.info.clone()))),
        }
    }

    /// Whether the table holds `actor` (in any state).
    /// Every actor the table holds, as the state API lists it (Ray's
    /// field names), at most `limit`; and how many there are.
    pub(crate) fn rows(&self, limit: usize) -> (Vec<serde_json::Value>, usize) {
        let rows = self
            .actors
            .values()
            .take(limit)
            .map(|entry| {
                let info = &entry.info;
                let (pid, address, death_cause) = match &info.state {
                    ActorState::Alive { address, pid, .. } => {
                        (Some(*pid), Some(address.clone()), None)
                    }
                    ActorState::Dead(e) => (None, None, Some(e.to_string())),
                    _ => (None, None, None),
                };
                serde_json::json!({
                    "actor_id": info.actor_id.to_string(),
                    "class_name": info.class,
                    "state": state_name(&info.state),
                    "job_id": entry.spec.job.to_string(),
                    // The name it was given, kept after it died (and
                    // its name went free).
                    "name": entry.spec.options.name.clone().unwrap_or_default(),
                    "ray_namespace": entry.spec.options.namespace,
                    "pid": pid,
                    "address": address,
                    "num_restarts": info.num_restarts,
                    "max_restarts": info.max_restarts,
                    "death_cause": death_cause.or_else(|| entry.death_reason.clone()),
                    "worker_id": entry.worker.map(|w| w.to_string()),
                })
            })
            .collect();
        (rows, self.actors.len())
    }

    /// How many actors the table holds, by Ray's state name and class.
    pub(crate) fn counts(&self) -> std::collections::BTreeMap<(&'static str, String), u64> {
        let mut out = std::collections::BTreeMap::new();
        for entry in self.actors.values() {
            let state = state_name(&entry.info.state);
            *out.entry((state, entry.info.class.clone())).or_insert(0) += 1;
        }
        out
    }

    pub(crate) fn knows(&self, actor: ActorId) -> bool {
        self.actors.contains_key(&actor)
    }

    /// An actor's state now, if this node holds it.
    pub(crate) fn info(&self, actor: ActorId) -> Option<ActorInfo> {
        self.actors.get(&actor).map(|e| e.info.clone())
    }

    /// The actor holding `name` in `namespace`; when none does and the
    /// last holder died here (on node `here`), an error that says when and
    /// why.
    pub(crate) fn named(
        &self,
        name: &str,
        namespace: &str,
        here: &str,
    ) -> Result<ActorInfo, Error> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(entry) = self.names.get(&key).and_then(|id| self.actors.get(id)) {
            return Ok(entry.info.clone());
        }
        Err(match self.tombstones.get(&key) {
            Some(t) => Error::NamedActorDied {
                name: name.to_string(),
                namespace: namespace.to_string(),
                death: Box::new(ActorDeath {
                    actor_id: t.actor_id,
                    node: here.to_string(),
                    died_at_ms: t.died_at_ms,
                    cause: t.cause.clone(),
                }),
            },
            None => Error::ActorNotFound {
                name: name.to_string(),
                namespace: namespace.to_string(),
            },
        })
    }

    /// The job an actor belongs to.
    pub(crate) fn job_of(&self, actor: ActorId) -> Option<JobId> {
        self.actors.get(&actor).map(|e| e.spec.job)
    }

    /// The live actors that process `owner` created and that end with it
    /// (all but detached ones).
    pub(crate) fn owned_by(&self, owner: &str) -> Vec<ActorId> {
        self.actors
            .iter()
            .filter(|(_, e)| {
                e.spec.owner == owner
                    && !e.spec.options.detached
                    && !matches!(e.info.state, ActorState::Dead(_))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// `job`'s detached actors that are not dead.
    pub(crate) fn detached_of(&self, job: JobId) -> HashSet<ActorId> {
        self.actors
            .iter()
            .filter(|(_, e)| {
                e.spec.job == job
                    && e.spec.options.detached
                    && !matches!(e.info.state, ActorState::Dead(_))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The worker an actor runs on (`None` while it waits for one).
    pub(crate) fn worker_of(&self, actor: ActorId) -> Result<Option<WorkerId>, Error> {
        self.actors
            .get(&actor)
            .map(|e| e.worker)
            .ok_or_else(|| unknown(actor))
    }
}

fn wake<R>(entry: &mut ActorEntry<R>) -> Answers<R> {
    let info = entry.info.clone();
    entry
        .waiters
        .drain(..)
        .map(|reply| (reply, info.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::messages::ActorOptions;
    use prism_protocol::resources::ResourceSet;

    fn spec(name: Option<&str>) -> ActorSpec {
        restartable(name, 0)
    }

    fn restartable(name: Option<&str>, max_restarts: i64) -> ActorSpec {
        ActorSpec {
            actor_id: ActorId::new(),
            class: "demo::Counter".into(),
            args: Vec::new(),
            options: ActorOptions {
                name: name.map(String::from),
                namespace: "ns".into(),
                max_concurrency: 1,
                async_actor: false,
                resources: ResourceSet::new(),
                placement: None,
                strategy: Default::default(),
                max_restarts,
                max_task_retries: 0,
                detached: false,
                checkpoint_every: 0,
                checkpoint_interval_ms: 0,
                env_vars: Default::default(),
            },
            owner: String::new(),
            job: JobId::new(),
            restarts: 0,
        }
    }

    #[test]
    fn an_actor_created_again_after_its_node_died_restarts_counting_on() {
        let mut table: ActorTable<u32> = ActorTable::default();
        let mut again = restartable(Some("kept"), 2);
        again.restarts = 1;
        let id = again.actor_id;
        table.add(again).unwrap();
        let info = table.info(id).unwrap();
        assert!(matches!(info.state, ActorState::Restarting), "{info:?}");
        assert_eq!((info.num_restarts, info.max_restarts), (1, 2));
        assert!(table.watch(id, true, 1).is_none(), "waited through");
        assert!(matches!(
            table.lost(id, "crash".into(), true),
            Lost::Restart(_)
        ));
        assert!(table.take_ended().is_empty(), "restarting is not dead");
        assert_eq!(
            table.take_restarted(),
            vec![(id, 2)],
            "the restart is reported"
        );
        assert!(matches!(
            table.lost(id, "crash".into(), true),
            Lost::Dead(_)
        ));
        assert_eq!(table.take_ended(), vec![id], "its death is reported once");
        assert!(table.take_ended().is_empty());
    }

    #[test]
    fn a_name_is_held_until_its_actor_dies_and_waiters_hear_the_outcome() {
        let mut table: ActorTable<u32> = ActorTable::default();
        let first = spec(Some("counter"));
        let id = first.actor_id;
        table.add(first).unwrap();
        let err = table.add(spec(Some("counter"))).unwrap_err();
        assert!(matches!(err, Error::ActorNameTaken { .. }), "{err}");
        assert!(
            table.watch(id, true, 7).is_none(),
            "a pending actor is waited for"
        );
        assert_eq!(table.named("counter", "ns", "node-a").unwrap().actor_id, id);
        let answers = table.died(id, "killed".into());
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0, 7);
        assert!(matches!(answers[0].1.state, ActorState::Dead(_)));
        match table.named("counter", "ns", "node-a") {
            Err(e @ Error::NamedActorDied { .. }) => {
                let said = e.to_string();
                assert!(said.contains("on node node-a: killed"), "{said}");
                assert!(said.contains(" UTC"), "{said}");
            }
            other => panic!("a dead holder's name says that it died: {other:?}"),
        }
        table.add(spec(Some("counter"))).unwrap();
    }

    #[test]
    fn the_spec_goes_to_the_first_worker_only_and_a_started_actor_stays_alive() {
        let mut table: ActorTable<u32> = ActorTable::default();
        let s = spec(None);
        let id = s.actor_id;
        table.add(s).unwrap();
        let worker = WorkerId::new();
        assert!(table.assign(id, worker).is_some());
        assert!(table.assign(id, worker).is_none());
        assert_eq!(table.worker_of(id).unwrap(), Some(worker));
        let alive = ActorState::Alive {
            address: "a".into(),
            worker,
            pid: 1,
        };
        assert!(table.started(id, worker, alive).is_empty());
        // A late constructor failure does not overwrite Alive.
        table.started(id, worker, ActorState::Dead(unknown(id)));
        let (_, now) = table.watch(id, true, 1).unwrap();
        assert!(matches!(now.unwrap().state, ActorState::Alive { .. }));
        assert!(table.worker_of(ActorId::new()).is_err());
    }

    fn alive(worker: WorkerId) -> ActorState {
        ActorState::Alive {
            address: "a".into(),
            worker,
            pid: 1,
        }
    }

    #[test]
    fn a_lost_actor_restarts_until_max_restarts_then_dies_keeping_its_name_meanwhile() {
        let mut table: ActorTable<u32> = ActorTable::default();
        let s = restartable(Some("svc"), 2);
        let id = s.actor_id;
        table.add(s).unwrap();
        for restart in 1..=2u32 {
            let worker = WorkerId::new();
            assert!(table.assign(id, worker).is_some());
            table.started(id, worker, alive(worker));
            assert!(matches!(
                table.lost(id, "exit 9".into(), true),
                Lost::Restart(_)
            ));
            let info = table.named("svc", "ns", "node-a").unwrap();
            assert!(matches!(info.state, ActorState::Restarting));
            assert_eq!(info.num_restarts, restart);
            // Callers that wait hear the outcome of the restart.
            assert!(table.watch(id, true, 5).is_none());
            // The old process's late constructor answer is ignored.
            assert!(table.started(id, worker, alive(worker)).is_empty());
        }
        let worker = WorkerId::new();
        table.assign(id, worker).unwrap();
        let answers = table.started(id, worker, alive(worker));
        assert_eq!(answers.len(), 1, "the waiter hears the restart");
        let Lost::Dead(answers) = table.lost(id, "exit 9".into(), true) else {
            panic!("restarts are used up");
        };
        assert!(answers.is_empty());
        let (_, info) = table.watch(id, false, 0).unwrap();
        let ActorState::Dead(e) = info.unwrap().state else {
            panic!("dead");
        };
        assert!(e.to_string().contains("restarted 2 time(s)"), "{e}");
        assert!(
            table.named("svc", "ns", "node-a").is_err(),
            "the name is free"
        );
    }

    #[test]
    fn an_actor_of_an_ended_job_or_killed_for_good_is_not_restarted() {
        let mut table: ActorTable<u32> = ActorTable::default();
        let s = restartable(None, -1);
        let id = s.actor_id;
        table.add(s).unwrap();
        assert!(matches!(
            table.lost(id, "job ended".into(), false),
            Lost::Dead(_)
        ));
        assert!(table.assign(id, WorkerId::new()).is_none());
        // A kill that allows a restart, with none left, dies with its reason.
        let s = restartable(None, 0);
        let id = s.actor_id;
        table.add(s).unwrap();
        table.set_death_reason(id, "killed by prism::kill_allow_restart".into());
        table.lost(id, "signal 9".into(), true);
        let (_, info) = table.watch(id, false, 0).unwrap();
        let ActorState::Dead(e) = info.unwrap().state else {
            panic!("dead");
        };
        assert!(e.to_string().contains("kill_allow_restart"), "{e}");
    }
}
