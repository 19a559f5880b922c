//! The actors this process created on other nodes, kept so that it can
//! create them again when their node dies.
//!
//! On one node an actor's restarts are the raylet's business: its actor
//! table keeps the spec and leases a new worker when the process dies. An
//! actor sent to another node lives in that node's table, which dies with
//! the node. Its creator (the owner, as in Ray) is the one process that
//! both holds the spec and lives on: when the head declares the node dead
//! it creates the actor again, under the same id and counting the restart,
//! wherever the actor's strategy puts it now. Callers that find no live
//! node holding the actor ask the owner ([`LocateActor`]) whether to look
//! again or give up.
//!
//! A record is dropped when the actor dies for good: the node that held it
//! says so ([`ActorEnded`](prism_protocol::messages::ActorEnded)), or this
//! process killed it for good or dropped its last handle.

use super::lessee::Lessee;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_config::Backoff;
use prism_protocol::ids::ActorId;
use prism_protocol::messages::{ActorPlacement, ActorSpec, CreateActor, KillActor, OwnedActor};
use prism_protocol::rpc::Connection;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Creates an actor where its strategy puts it: here, or (answered
/// `Elsewhere` by the local raylet) on another node, as a lessee of this
/// job so that it ends with the job. Returns the other node, if any.
pub(crate) async fn place(
    raylet: &Connection,
    lessee: &Lessee,
    spec: ActorSpec,
) -> Result<Option<String>> {
    match raylet.request(CreateActor { spec: spec.clone() }).await? {
        ActorPlacement::Accepted => Ok(None),
        ActorPlacement::Elsewhere { raylet, node_id } => {
            let remote = lessee.connect(&raylet).await?;
            match remote.request(CreateActor { spec }).await? {
                ActorPlacement::Accepted => Ok(Some(node_id)),
                ActorPlacement::Elsewhere { .. } => Err(Error::SentOnAgain {
                    node_id: node_id.to_string(),
                    what: "an actor".into(),
                }),
            }
        }
    }
}

/// How long an actor whose node died keeps being placed again while the
/// nodes chosen for it cannot be reached (they may be dying too): a few
/// times the head's default `node_death_timeout_ms`, so the view of the
/// cluster has dropped them by then.
const PLACE_AGAIN_FOR: Duration = Duration::from_secs(15);

/// One actor this process created on another node.
#[derive(Debug)]
struct Away {
    spec: ActorSpec,
    /// The node it runs on; empty while it is being created again, and
    /// once it runs on this process's own node.
    node: String,
    /// Restarts counted so far, by its last node and by this process.
    restarts: u32,
    /// Why it could not be created again, once that failed.
    failed: Option<String>,
}

/// The actors this process created on other nodes that may restart, and
/// the node of each actor it created on another node.
#[derive(Debug)]
pub(crate) struct OwnedActors {
    rt: tokio::runtime::Handle,
    raylet: Connection,
    lessee: Arc<Lessee>,
    away: Mutex<HashMap<ActorId, Away>>,
    /// Where they run, and which ended while handles remain.
    nodes: Mutex<ActorNodes>,
}

/// Where each actor this process created on another node runs, and which
/// of them ended while handles to them remain: plain bookkeeping.
#[derive(Debug, Default)]
struct ActorNodes {
    /// The node each actor was last placed on, restartable or not, until
    /// it ends: a kill goes to that node instead of asking every node.
    nodes: HashMap<ActorId, String>,
    /// Of the actors in `nodes`, those whose handles are counted (neither
    /// named nor detached): their last handle's drop ends them.
    counted: HashSet<ActorId>,
    /// Counted actors that ended for good while handles to them remain:
    /// their last handle's drop has nothing left to stop and sends no kill
    /// (one with no node to go to would ask every node in turn). Each is
    /// dropped with that last handle, so the set holds no more than the
    /// handles this process keeps.
    gone: HashSet<ActorId>,
}

impl ActorNodes {
    fn placed(&mut self, actor: ActorId, node: &str, counted: bool) {
        self.nodes.insert(actor, node.to_string());
        if counted {
            self.counted.insert(actor);
        }
    }

    /// Created again: on `node`, or (`None`) on this process's own node.
    fn moved(&mut self, actor: ActorId, node: Option<&str>) {
        match node {
            Some(node) => self.nodes.insert(actor, node.to_string()),
            None => self.nodes.remove(&actor),
        };
    }

    fn ended(&mut self, actor: ActorId) {
        if self.nodes.remove(&actor).is_some() && self.counted.remove(&actor) {
            self.gone.insert(actor);
        }
    }

    fn out_of_scope(&mut self, actor: ActorId) -> Option<Option<String>> {
        if self.gone.remove(&actor) {
            return None;
        }
        self.counted.remove(&actor);
        Some(self.nodes.remove(&actor))
    }

    fn kill_failed(&mut self, actor: ActorId) {
        self.gone.remove(&actor);
    }

    fn node_of(&self, actor: ActorId) -> Option<String> {
        self.nodes.get(&actor).cloned()
    }
}

impl OwnedActors {
    pub(crate) fn new(rt: tokio::runtime::Handle, raylet: Connection, lessee: Arc<Lessee>) -> Self {
        OwnedActors {
            rt,
            raylet,
            lessee,
            away: Mutex::new(HashMap::new()),
            nodes: Mutex::new(ActorNodes::default()),
        }
    }

    /// Records an actor created on `node`, if it may restart. One in a
    /// placement-group bundle is created again in its bundle: the local
    /// raylet routes it there, waiting while the group's home moves the
    /// bundle off the dead node. A detached one outside a bundle is the
    /// head's to create again (it outlives this process), so it is not
    /// kept here.
    pub(crate) fn placed(&self, spec: &ActorSpec, node: &str) {
        let counted = spec.options.name.is_none() && !spec.options.detached;
        self.nodes.lock().placed(spec.actor_id, node, counted);
        let heads = spec.options.detached && spec.options.placement.is_none();
        if spec.options.max_restarts == 0 || heads {
            return;
        }
        self.away.lock().insert(
            spec.actor_id,
            Away {
                spec: spec.clone(),
                node: node.to_string(),
                restarts: spec.restarts,
                failed: None,
            },
        );
    }

    /// The actor is dead for good: never create it again.
    pub(crate) fn ended(&self, actor: ActorId) {
        self.away.lock().remove(&actor);
        self.nodes.lock().ended(actor);
    }

    /// Every handle to `actor` is gone: where its kill goes. `None` when
    /// it already ended for good (nothing is left to stop); else the node
    /// it runs on, if this process created it on another node.
    pub(crate) fn out_of_scope(&self, actor: ActorId) -> Option<Option<String>> {
        let node = self.nodes.lock().out_of_scope(actor)?;
        self.away.lock().remove(&actor);
        Some(node)
    }

    /// A kill of `actor` for good that this process sent failed: it may
    /// live on, so its last handle's drop sends a kill again.
    pub(crate) fn kill_failed(&self, actor: ActorId) {
        self.nodes.lock().kill_failed(actor);
    }

    /// The node this process last placed `actor` on, if it created it on
    /// another node and it has not ended.
    pub(crate) fn node_of(&self, actor: ActorId) -> Option<String> {
        self.nodes.lock().node_of(actor)
    }

    /// Its node counted `restarts` restarts (seen by a caller here).
    pub(crate) fn seen_restarts(&self, actor: ActorId, restarts: u32) {
        if let Some(away) = self.away.lock().get_mut(&actor) {
            away.restarts = away.restarts.max(restarts);
        }
    }

    /// What this process says about `actor` to a caller that found no
    /// live node holding it.
    pub(crate) fn locate(&self, actor: ActorId) -> OwnedActor {
        match self.away.lock().get(&actor) {
            Some(Away {
                failed: Some(why), ..
            }) => OwnedActor::Gone(why.clone()),
            Some(_) => OwnedActor::Kept,
            None => OwnedActor::Gone(
                "its owner no longer keeps it: it ended, was killed, used up its restarts, or \
                 ran on the owner's own node"
                    .into(),
            ),
        }
    }

    /// `node` died: each actor of this process there with restarts left is
    /// created again wherever its strategy puts it now.
    pub(crate) fn node_died(self: &Arc<Self>, node: &str) {
        let mut again = Vec::new();
        {
            let mut away = self.away.lock();
            for (id, a) in away.iter_mut() {
                if a.node != node || a.failed.is_some() {
                    continue;
                }
                let max = a.spec.options.max_restarts;
                if max >= 0 && i64::from(a.restarts) >= max {
                    a.failed = Some(format!(
                        "it ran on node {node}, which died, and it was restarted {} time(s), \
                         its max_restarts",
                        a.restarts
                    ));
                    continue;
                }
                a.restarts += 1;
                // Being placed: a second notice of this death (each node
                // may tell it) must not create it twice.
                a.node.clear();
                let mut spec = a.spec.clone();
                spec.restarts = a.restarts;
                again.push((*id, spec));
            }
        }
        for (id, spec) in again {
            let this = self.clone();
            let dead = node.to_string();
            self.rt
                .spawn(async move { this.create_again(id, spec, &dead).await });
        }
    }

    async fn create_again(&self, id: ActorId, spec: ActorSpec, dead: &str) {
        let class = spec.class.clone();
        let restart = spec.restarts;
        tracing::warn!(actor = %id, %class, node = %dead, restart, "an actor's node died; creating it again");
        // The node chosen may be dying too, not yet out of the view of the
        // cluster that this node holds: an unreachable raylet is tried
        // again, briefly, until the view has moved on.
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
            .until(std::time::Instant::now() + PLACE_AGAIN_FOR);
        let placed = loop {
            let outcome = place(&self.raylet, &self.lessee, spec.clone()).await;
            match outcome {
                Err(e @ (Error::Io { .. } | Error::Disconnected { .. })) if backoff.fits() => {
                    tracing::debug!(actor = %id, error = %e, "the node chosen for an actor is unreachable; placing it again");
                    if let Some(pause) = backoff.next_pause() {
                        tokio::time::sleep(pause).await;
                    }
                }
                other => break other,
            }
        };
        let orphan = {
            let mut away = self.away.lock();
            match (away.get_mut(&id), &placed) {
                // It ended meanwhile (killed, or its last handle dropped):
                // the copy just made must not live on.
                (None, Ok(_)) => true,
                (None, Err(_)) => false,
                (Some(record), Ok(Some(node))) => {
                    record.node = node.clone();
                    self.nodes.lock().moved(id, Some(node));
                    false
                }
                // On this process's own node, it lives and dies with it:
                // the local raylet restarts it from now on. The record
                // stays (with no node) until it ends: a caller whose lookup
                // just missed the new copy must still hear that it is kept.
                (Some(record), Ok(None)) => {
                    record.node = String::new();
                    self.nodes.lock().moved(id, None);
                    false
                }
                (Some(record), Err(e)) => {
                    tracing::warn!(actor = %id, %class, error = %e, "an actor could not be created again");
                    record.failed = Some(format!(
                        "it ran on node {dead}, which died, and creating it again failed: {e}"
                    ));
                    false
                }
            }
        };
        if orphan {
            let kill = KillActor {
                actor_id: id,
                no_restart: true,
                out_of_scope: false,
                node_id: placed.ok().flatten(),
            };
            let _ = self.raylet.request(kill).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ActorNodes;
    use prism_protocol::ids::ActorId;

    #[test]
    fn an_actor_that_ended_sends_no_kill_when_its_last_handle_drops() {
        let mut nodes = ActorNodes::default();
        let (killed, live, named) = (ActorId::new(), ActorId::new(), ActorId::new());
        nodes.placed(killed, "b", true);
        nodes.placed(live, "c", true);
        nodes.placed(named, "b", false);
        // Killed for good (or told it ended): no node to send a kill to,
        // and nothing to send.
        nodes.ended(killed);
        assert_eq!(nodes.node_of(killed), None);
        assert_eq!(nodes.out_of_scope(killed), None);
        // Its record is gone with the last handle: a second drop (there is
        // none) would send a kill without a node.
        assert_eq!(nodes.out_of_scope(killed), Some(None));
        // A live actor's kill goes to its node.
        assert_eq!(nodes.out_of_scope(live), Some(Some("c".to_string())));
        assert_eq!(nodes.node_of(live), None);
        // A named actor ends with no handle drop: nothing kept for it.
        nodes.ended(named);
        assert!(nodes.gone.is_empty() && nodes.counted.is_empty() && nodes.nodes.is_empty());
    }

    #[test]
    fn a_failed_kill_leaves_the_last_handle_to_stop_the_actor() {
        let mut nodes = ActorNodes::default();
        let actor = ActorId::new();
        nodes.placed(actor, "b", true);
        nodes.ended(actor);
        nodes.kill_failed(actor);
        // Its node was forgotten with the kill: the drop's kill asks
        // around, as before.
        assert_eq!(nodes.out_of_scope(actor), Some(None));
    }

    #[test]
    fn an_actor_created_again_is_found_on_its_new_node() {
        let mut nodes = ActorNodes::default();
        let actor = ActorId::new();
        nodes.placed(actor, "b", true);
        nodes.moved(actor, Some("c"));
        assert_eq!(nodes.node_of(actor).as_deref(), Some("c"));
        // Back on this process's own node: its raylet holds it.
        nodes.moved(actor, None);
        nodes.ended(actor);
        assert_eq!(nodes.out_of_scope(actor), Some(None));
        assert!(nodes.counted.is_empty() && nodes.gone.is_empty());
    }
}
