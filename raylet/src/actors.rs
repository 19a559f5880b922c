//! The actor table: each actor's state, its name, its worker, and the
//! callers waiting for it to leave `Pending`.
//!
//! Creation is asynchronous, as in Ray: `CreateActor` is answered once the
//! request is accepted (name free, resources feasible); the actor's worker
//! runs the constructor later and callers wait for the outcome with
//! `GetActor { wait: true }`. Like the scheduler, the table does no I/O:
//! calls that settle an actor return the waiters to answer (`R` is the
//! caller's reply handle).

use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, WorkerId};
use prism_protocol::messages::{ActorInfo, ActorSpec, ActorState};
use std::collections::HashMap;

#[derive(Debug)]
struct ActorEntry<R> {
    info: ActorInfo,
    /// (namespace, name), while the actor holds it.
    name: Option<(String, String)>,
    worker: Option<WorkerId>,
    waiters: Vec<R>,
    /// The spec, until handed to the actor's worker.
    spec: Option<ActorSpec>,
}

/// Waiters to answer with an actor's settled state.
pub(crate) type Answers<R> = Vec<(R, ActorInfo)>;

/// Every actor of the cluster, and the names they hold.
#[derive(Debug)]
pub(crate) struct ActorTable<R> {
    actors: HashMap<ActorId, ActorEntry<R>>,
    names: HashMap<(String, String), ActorId>,
}

impl<R> Default for ActorTable<R> {
    fn default() -> Self {
        ActorTable {
            actors: HashMap::new(),
            names: HashMap::new(),
        }
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
    /// Records a new actor as `Pending`, taking its name if it has one.
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
                    state: ActorState::Pending,
                },
                name,
                worker: None,
                waiters: Vec::new(),
                spec: Some(spec),
            },
        );
        Ok(())
    }

    /// The actor got `worker`: returns its spec, to hand to the worker
    /// (once; `None` after that or for an unknown actor).
    pub(crate) fn assign(&mut self, actor: ActorId, worker: WorkerId) -> Option<ActorSpec> {
        let entry = self.actors.get_mut(&actor)?;
        entry.worker = Some(worker);
        entry.spec.take()
    }

    /// The constructor finished (`state` is `Alive` or `Dead`); a pending
    /// actor takes that state. Returns the waiters to answer.
    pub(crate) fn started(&mut self, actor: ActorId, state: ActorState) -> Answers<R> {
        match self.actors.get_mut(&actor) {
            Some(entry) if matches!(entry.info.state, ActorState::Pending) => {
                entry.info.state = state;
                wake(entry)
            }
            _ => Vec::new(),
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
        }
        if let Some(key) = entry.name.take() {
            self.names.remove(&key);
        }
        wake(entry)
    }

    /// An actor's state now, or (with `wait`, while pending) `None` after
    /// queueing `reply` for [`ActorTable::started`] or
    /// [`ActorTable::died`].
    pub(crate) fn watch(
        &mut self,
        actor: ActorId,
        wait: bool,
        reply: R,
    ) -> Option<(R, Result<ActorInfo, Error>)> {
        match self.actors.get_mut(&actor) {
            None => Some((reply, Err(unknown(actor)))),
            Some(entry) if wait && matches!(entry.info.state, ActorState::Pending) => {
                entry.waiters.push(reply);
                None
            }
            Some(entry) => Some((reply, Ok(entry.info.clone()))),
        }
    }

    /// The actor holding `name` in `namespace`.
    pub(crate) fn named(&self, name: &str, namespace: &str) -> Result<ActorInfo, Error> {
        self.names
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|id| self.actors.get(id))
            .map(|e| e.info.clone())
            .ok_or_else(|| Error::ActorNotFound {
                name: name.to_string(),
                namespace: namespace.to_string(),
            })
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
    use prism_protocol::ids::JobId;
    use prism_protocol::messages::ActorOptions;
    use prism_protocol::resources::ResourceSet;

    fn spec(name: Option<&str>) -> ActorSpec {
        ActorSpec {
            actor_id: ActorId::new(),
            class: "demo::Counter".into(),
            args: Vec::new(),
            options: ActorOptions {
                name: name.map(String::from),
                namespace: "ns".into(),
                max_concurrency: 1,
                resources: ResourceSet::new(),
                placement: None,
            },
            owner: String::new(),
            job: JobId::new(),
        }
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
        assert_eq!(table.named("counter", "ns").unwrap().actor_id, id);
        let answers = table.died(id, "killed".into());
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0, 7);
        assert!(matches!(answers[0].1.state, ActorState::Dead(_)));
        assert!(
            table.named("counter", "ns").is_err(),
            "the name is free again"
        );
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
        assert!(table.started(id, alive).is_empty());
        // A late constructor failure does not overwrite Alive.
        table.started(id, ActorState::Dead(unknown(id)));
        let (_, now) = table.watch(id, true, 1).unwrap();
        assert!(matches!(now.unwrap().state, ActorState::Alive { .. }));
        assert!(table.worker_of(ActorId::new()).is_err());
    }
}
