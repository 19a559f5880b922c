//! The node table: plain logic over time given by the caller, so that its
//! tests need no clock and no network.
//!
//! # The nodes' view, as changes
//!
//! Every node's heartbeat answer carries the live nodes it schedules with.
//! Sending all of them to each of N nodes every period costs the head N²
//! node records per period (at 200 nodes, 0.4 of a core idle). So each
//! change to a node's record (joined, new free resources or demand, died)
//! takes the next number of a counter, the *version*, and a heartbeat
//! that says which version its view is at gets only the records changed
//! since, plus the ids of the nodes that died since: an idle cluster's
//! answers are empty. A node that knows no version, or one of an earlier
//! control store (`epoch`), or one older than a record the table forgot,
//! gets the whole view.

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
    /// The version of its record's latest change.
    changed: u64,
}

/// What a node's view lacks: see "The nodes' view, as changes".
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ViewUpdate {
    /// Every live node (`nodes` is the whole view), or only changes.
    pub(crate) full: bool,
    /// Live nodes whose records changed (or all of them, when `full`).
    pub(crate) nodes: Vec<NodeInfo>,
    /// Nodes that died since (empty when `full`).
    pub(crate) gone: Vec<String>,
    /// The view's epoch and version after this update.
    pub(crate) epoch: u64,
    pub(crate) version: u64,
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

#[derive(Debug)]
pub(crate) struct NodeTable {
    nodes: BTreeMap<String, Entry>,
    next_seq: u64,
    /// This table's identity among control stores (never 0), so that a
    /// node's version from an earlier one is not taken for one of this.
    epoch: u64,
    /// The latest change's version.
    version: u64,
    /// Each node's latest change, by version: the records a view at some
    /// version lacks are the range after it.
    changes: BTreeMap<u64, String>,
    /// Views older than this lack a change that is no longer in
    /// `changes` (a record forgotten): they get the whole view.
    complete_after: u64,
}

impl Default for NodeTable {
    fn default() -> Self {
        NodeTable {
            nodes: BTreeMap::new(),
            next_seq: 0,
            epoch: new_epoch(),
            version: 0,
            changes: BTreeMap::new(),
            complete_after: 0,
        }
    }
}

/// A number that tells this control store's views from an earlier one's.
fn new_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 32)).max(1)
}

impl NodeTable {
    /// Gives node `id`'s record the next version.
    fn touch(&mut self, id: &str) {
        let Some(entry) = self.nodes.get_mut(id) else {
            return;
        };
        self.version += 1;
        self.changes.remove(&entry.changed);
        entry.changed = self.version;
        self.changes.insert(self.version, id.to_string());
    }

    /// What a view at (`epoch`, `version`) lacks.
    pub(crate) fn view_update(&self, epoch: u64, version: u64) -> ViewUpdate {
        let full = epoch != self.epoch || version > self.version || version < self.complete_after;
        let mut update = ViewUpdate {
            full,
            epoch: self.epoch,
            version: self.version,
            ..ViewUpdate::default()
        };
        if full {
            let mut alive: Vec<&Entry> = self.alive().collect();
            alive.sort_by_key(|e| e.seq);
            update.nodes = alive.into_iter().map(|e| e.info.clone()).collect();
            return update;
        }
        for id in self.changes.range(version + 1..).map(|(_, id)| id) {
            let Some(entry) = self.nodes.get(id) else {
                continue;
            };
            if entry.info.state == NodeState::Alive as i32 {
                update.nodes.push(entry.info.clone());
            } else {
                update.gone.push(id.clone());
            }
        }
        update
    }

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
        let id = info.node_id.clone();
        if let Some(old) = self.nodes.insert(
            id.clone(),
            Entry {
                info,
                last_heartbeat: now,
                seq: self.next_seq,
                confirmed,
                changed: 0,
            },
        ) {
            self.changes.remove(&old.changed);
        }
        self.touch(&id);
    }

    /// Drops a node outright (its registration could not be saved).
    pub(crate) fn forget(&mut self, node_id: &str) {
        self.remove(node_id);
    }

    /// Removes a record; views from before now get the whole view, as
    /// the change log no longer says this node went.
    fn remove(&mut self, node_id: &str) {
        if let Some(old) = self.nodes.remove(node_id) {
            self.changes.remove(&old.changed);
            self.version += 1;
            self.complete_after = self.version;
        }
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
        if entry.info.available != available || entry.info.demands != demands {
            entry.info.available = available;
            entry.info.demands = demands;
            self.touch(node_id);
        }
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
        if marked {
            self.touch(node_id);
        }
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
            self.remove(&id);
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

    /// Applies `u` to a node's view as a raylet does; returns the ids.
    fn apply(view: &mut BTreeMap<String, NodeInfo>, u: ViewUpdate) -> Vec<String> {
        if u.full {
            view.clear();
        }
        for id in u.gone {
            view.remove(&id);
        }
        for n in u.nodes {
            view.insert(n.node_id.clone(), n);
        }
        view.keys().cloned().collect()
    }

    #[test]
    fn a_view_gets_only_what_changed_since_its_version() {
        let (mut t, now) = (NodeTable::default(), Instant::now());
        t.register(node("a", true), now).unwrap();
        t.register(node("b", false), now).unwrap();
        let first = t.view_update(0, 0);
        assert!(first.full);
        assert_eq!(first.nodes.len(), 2);
        let (epoch, mut version) = (first.epoch, first.version);
        let mut view = BTreeMap::new();
        apply(&mut view, first);
        // Beats that change nothing: nothing to send.
        assert_eq!(t.heartbeat("a", vec![], vec![], now), Beat::Alive);
        let free = node("a", true).total;
        assert_eq!(t.heartbeat("a", free.clone(), vec![], now), Beat::Alive);
        let u = t.view_update(epoch, version);
        assert!(!u.full && u.nodes.len() == 1 && u.gone.is_empty(), "{u:?}");
        version = u.version;
        apply(&mut view, u);
        assert_eq!(t.heartbeat("a", free.clone(), vec![], now), Beat::Alive);
        let idle = t.view_update(epoch, version);
        assert!(!idle.full && idle.nodes.is_empty() && idle.gone.is_empty());
        // A node joins, another dies.
        t.register(node("c", false), now).unwrap();
        assert!(t.mark_dead("b", "stopped".into()));
        let u = t.view_update(epoch, version);
        assert_eq!(u.gone, ["b"]);
        assert_eq!(u.nodes.len(), 1);
        version = u.version;
        assert_eq!(apply(&mut view, u), ["a", "c"]);
        // Another control store's version, or one from the future: all.
        assert!(t.view_update(epoch ^ 1, version).full);
        assert!(t.view_update(epoch, version + 5).full);
        // A forgotten record: views from before it get everything.
        t.forget("c");
        let u = t.view_update(epoch, version);
        assert!(u.full);
        assert_eq!(apply(&mut view, u), ["a"]);
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
