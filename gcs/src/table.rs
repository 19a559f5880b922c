//! The node table: plain logic over time given by the caller, so that its
//! tests need no clock and no network.

use crate::pb::{Demand, NodeInfo, NodeState, Resource};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Dead nodes kept for `prism status` and `nodes()`; older ones are
/// forgotten, so a cluster whose nodes come and go does not grow without
/// bound.
const DEAD_NODES_KEPT: usize = 1000;

#[derive(Debug)]
struct Entry {
    info: NodeInfo,
    last_heartbeat: Instant,
    /// Registration order, for a stable listing.
    seq: u64,
    /// False for a member read back from the durable state that has not
    /// sent a heartbeat to this control store yet.
    confirmed: bool,
}

/// What a heartbeat found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// A live member: its report was taken.
    Alive,
    /// The node was marked dead before, for this reason.
    Dead(String),
    /// No node of that id ever registered.
    Unknown,
}

#[derive(Debug, Default)]
pub(crate) struct NodeTable {
    nodes: BTreeMap<String, Entry>,
    next_seq: u64,
}

impl NodeTable {
    /// Whether `node_id` is a live member.
    pub(crate) fn is_alive(&self, node_id: &str) -> bool {
        self.nodes
            .get(node_id)
            .is_some_and(|e| e.info.state == NodeState::Alive as i32)
    }

    /// Adds a node. An id seen before (alive or dead) is refused: a node
    /// that comes back is a new node with a new id. Returns the nodes it
    /// marked dead: a new head replaces a restored head that never spoke.
    pub(crate) fn register(&mut self, info: NodeInfo, now: Instant) -> Result<Vec<String>, String> {
        if info.node_id.is_empty() {
            return Err("the node has no id".into());
        }
        if let Some(old) = self.nodes.get(&info.node_id) {
            return Err(match NodeState::try_from(old.info.state) {
                Ok(NodeState::Dead) => format!(
                    "node {} was marked dead ({}); a node that comes back must join under a new id",
                    info.node_id, old.info.death_cause
                ),
                _ => format!("node {} is already registered", info.node_id),
            });
        }
        let mut replaced = Vec::new();
        if info.is_head {
            // A head read back from the state that has not spoken since is
            // the one this new head replaces (the head node restarted).
            let stale: Vec<String> = self
                .alive()
                .filter(|e| e.info.is_head && !e.confirmed)
                .map(|e| e.info.node_id.clone())
                .collect();
            if self.alive().any(|e| e.info.is_head && e.confirmed) {
                return Err("the cluster already has a live head node".into());
            }
            for id in &stale {
                self.mark_dead(id, "the head node started again".into());
            }
            replaced = stale;
        }
        self.insert(info, now, true);
        Ok(replaced)
    }

    /// Takes back a member read from the durable state: alive as of `now`,
    /// so that it is marked dead only if no heartbeat comes within the
    /// death timeout.
    pub(crate) fn restore(&mut self, info: NodeInfo, now: Instant) {
        self.insert(info, now, false);
    }

    /// Adds a live member, all free unless it says otherwise.
    fn insert(&mut self, mut info: NodeInfo, now: Instant, confirmed: bool) {
        info.state = NodeState::Alive as i32;
        info.death_cause.clear();
        if info.available.is_empty() {
            info.available = info.total.clone();
        }
        self.next_seq += 1;
        self.nodes.insert(
            info.node_id.clone(),
            Entry {
                info,
                last_heartbeat: now,
                seq: self.next_seq,
                confirmed,
            },
        );
    }

    /// Drops a node outright (its registration could not be saved).
    pub(crate) fn forget(&mut self, node_id: &str) {
        self.nodes.remove(node_id);
    }

    /// A node's record, as registered.
    pub(crate) fn get(&self, node_id: &str) -> Option<&NodeInfo> {
        self.nodes.get(node_id).map(|e| &e.info)
    }

    pub(crate) fn heartbeat(
        &mut self,
        node_id: &str,
        available: Vec<Resource>,
        demands: Vec<Demand>,
        now: Instant,
    ) -> Beat {
        let Some(entry) = self.nodes.get_mut(node_id) else {
            return Beat::Unknown;
        };
        if entry.info.state == NodeState::Dead as i32 {
            return Beat::Dead(entry.info.death_cause.clone());
        }
        entry.last_heartbeat = now;
        entry.confirmed = true;
        entry.info.available = available;
        entry.info.demands = demands;
        Beat::Alive
    }

    /// Marks a node dead; false if it was not a live member.
    pub(crate) fn mark_dead(&mut self, node_id: &str, cause: String) -> bool {
        let marked = match self.nodes.get_mut(node_id) {
            Some(e) if e.info.state == NodeState::Alive as i32 => {
                e.info.state = NodeState::Dead as i32;
                e.info.death_cause = cause;
                e.info.died_at_unix_ms = prism_protocol::clock::unix_ms();
                e.info.available.clear();
                e.info.demands.clear();
                true
            }
            _ => false,
        };
        self.forget_old_dead();
        marked
    }

    /// Marks dead every live node whose last heartbeat is older than
    /// `timeout`, and returns them with the cause.
    pub(crate) fn check_deaths(
        &mut self,
        now: Instant,
        timeout: Duration,
    ) -> Vec<(String, String)> {
        let late: Vec<(String, String)> = self
            .alive()
            .filter(|e| now.saturating_duration_since(e.last_heartbeat) > timeout)
            .map(|e| {
                let silent = now.saturating_duration_since(e.last_heartbeat);
                (
                    e.info.node_id.clone(),
                    format!(
                        "no heartbeat for {:.1} s (the limit is {:.1} s): its raylet died, \
                         its machine stopped, or the network to it was cut",
                        silent.as_secs_f64(),
                        timeout.as_secs_f64()
                    ),
                )
            })
            .collect();
        for (id, cause) in &late {
            self.mark_dead(id, cause.clone());
        }
        late
    }

    /// Every node, in the order they registered, as of `now`.
    pub(crate) fn snapshot(&self, now: Instant) -> Vec<NodeInfo> {
        let mut entries: Vec<&Entry> = self.nodes.values().collect();
        entries.sort_by_key(|e| e.seq);
        entries
            .into_iter()
            .map(|e| {
                let mut info = e.info.clone();
                info.last_heartbeat_ms_ago =
                    now.saturating_duration_since(e.last_heartbeat).as_millis() as u64;
                info
            })
            .collect()
    }

    /// The live nodes, as of `now`.
    pub(crate) fn alive_snapshot(&self, now: Instant) -> Vec<NodeInfo> {
        let mut nodes = self.snapshot(now);
        nodes.retain(|n| n.state == NodeState::Alive as i32);
        nodes
    }

    fn alive(&self) -> impl Iterator<Item = &Entry> {
        self.nodes
            .values()
            .filter(|e| e.info.state == NodeState::Alive as i32)
    }

    fn forget_old_dead(&mut self) {
        let mut dead: Vec<(u64, String)> = self
            .nodes
            .values()
            .filter(|e| e.info.state == NodeState::Dead as i32)
            .map(|e| (e.seq, e.info.node_id.clone()))
            .collect();
        let excess = dead.len().saturating_sub(DEAD_NODES_KEPT);
        dead.sort();
        for (_, id) in dead.into_iter().take(excess) {
            self.nodes.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, head: bool) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            is_head: head,
            total: vec![Resource {
                name: "CPU".into(),
                units: 20_000,
            }],
            ..NodeInfo::default()
        }
    }

    #[test]
    fn nodes_register_once_and_a_dead_id_cannot_come_back() {
        let (mut t, now) = (NodeTable::default(), Instant::now());
        t.register(node("a", true), now).unwrap();
        assert!(t
            .register(node("a", false), now)
            .unwrap_err()
            .contains("already"));
        assert!(t
            .register(node("b", true), now)
            .unwrap_err()
            .contains("head"));
        t.register(node("b", false), now).unwrap();
        let listed = t.snapshot(now);
        assert_eq!(
            listed
                .iter()
                .map(|n| n.node_id.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            listed[1].available, listed[1].total,
            "a new node is all free"
        );
        assert!(t.mark_dead("b", "stopped".into()));
        assert!(!t.mark_dead("b", "again".into()));
        let err = t.register(node("b", false), now).unwrap_err();
        assert!(
            err.contains("marked dead (stopped)") && err.contains("new id"),
            "{err}"
        );
    }

    #[test]
    fn a_silent_node_is_marked_dead_and_told_so_when_it_speaks_again() {
        let (mut t, start) = (NodeTable::default(), Instant::now());
        t.register(node("a", true), start).unwrap();
        t.register(node("b", false), start).unwrap();
        let timeout = Duration::from_secs(5);
        let later = start + Duration::from_secs(4);
        assert_eq!(t.heartbeat("a", vec![], vec![], later), Beat::Alive);
        assert!(t.check_deaths(later, timeout).is_empty());
        let dead = t.check_deaths(start + Duration::from_secs(6), timeout);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].0, "b");
        assert!(
            dead[0].1.contains("no heartbeat for 6.0 s"),
            "{}",
            dead[0].1
        );
        match t.heartbeat("b", vec![], vec![], start + Duration::from_secs(7)) {
            Beat::Dead(cause) => assert!(cause.contains("no heartbeat")),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.heartbeat("zz", vec![], vec![], later), Beat::Unknown);
        let listed = t.snapshot(start + Duration::from_secs(6));
        assert_eq!(listed[1].state, NodeState::Dead as i32);
        assert!(listed[1].available.is_empty());
        assert_eq!(listed[0].last_heartbeat_ms_ago, 2000);
    }

    #[test]
    fn restored_members_must_beat_and_a_silent_old_head_gives_way() {
        let (mut t, start) = (NodeTable::default(), Instant::now());
        t.restore(node("old-head", true), start);
        t.restore(node("w", false), start);
        assert!(t.is_alive("old-head") && t.is_alive("w"));
        assert_eq!(t.heartbeat("w", vec![], vec![], start), Beat::Alive);
        t.register(node("new-head", true), start).unwrap();
        assert!(!t.is_alive("old-head"));
        assert!(t.is_alive("new-head"));
        // A head that has spoken since is not replaced.
        assert!(t.register(node("third", true), start).is_err());
        let dead = t.check_deaths(start + Duration::from_secs(6), Duration::from_secs(5));
        assert_eq!(dead.len(), 2, "{dead:?}");
    }

    #[test]
    fn old_dead_nodes_are_forgotten_beyond_the_bound() {
        let (mut t, now) = (NodeTable::default(), Instant::now());
        for i in 0..DEAD_NODES_KEPT + 5 {
            let id = format!("n{i}");
            t.register(node(&id, false), now).unwrap();
            t.mark_dead(&id, "stopped".into());
        }
        let listed = t.snapshot(now);
        assert_eq!(listed.len(), DEAD_NODES_KEPT);
        assert_eq!(listed[0].node_id, "n5", "the oldest go first");
    }
}
