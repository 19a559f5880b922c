//! A node's view of the live nodes it schedules with: what the head's
//! heartbeat answers said, applied as changes (`prism_gcs`'s node table,
//! "The nodes' view, as changes"), plus this node's own counts of the
//! requests it sent to other nodes since the last answer.
//!
//! # Rooms
//!
//! Placement reads every other node's total and free resources on each
//! try ([`Rooms`]). The view keeps them parsed beside the nodes: rebuilt
//! when an answer changes the view, lowered in place by this node's own
//! counts, and shared (an `Arc` clone) with every reader between changes,
//! so a try costs no parsing and no copy of the nodes' resources.

use crate::placement::assign::NodeRoom;
use prism_gcs::pb::{HeartbeatReply, NodeInfo as WireNode, Resource};
use prism_protocol::resources::{Quantity, ResourceSet};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The live nodes by id (so in id order), as of the last answer.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// This node's id, left out of the rooms (its own room is current
    /// where it is read); empty: none left out.
    here: String,
    nodes: BTreeMap<String, WireNode>,
    /// The free resources the head last reported for the nodes whose
    /// count this node lowered since ([`lower`](Self::lower)).
    reported: HashMap<String, Vec<Resource>>,
    rooms: Rooms,
    /// How many times the rooms changed other than by this node's own
    /// counts (see [`changes`](Self::changes)).
    changes: u64,
    epoch: u64,
    version: u64,
}

/// The other live nodes' rooms for placement, in id order: the nodes that
/// serve requests (have a raylet), each with its total resources and its
/// free ones (as the head last reported them, less this node's own counts
/// since). Cheap to clone: both lists are shared until the view changes.
#[derive(Debug, Default, Clone)]
pub(crate) struct Rooms {
    pub(crate) total: Arc<Vec<NodeRoom>>,
    pub(crate) free: Arc<Vec<NodeRoom>>,
}

impl View {
    /// An empty view of the node `here`.
    pub(crate) fn new(here: &str) -> View {
        View {
            here: here.to_string(),
            ..View::default()
        }
    }

    /// The other live nodes' rooms (see [`Rooms`]).
    pub(crate) fn rooms(&self) -> Rooms {
        self.rooms.clone()
    }

    /// A count that grows each time an answer changes the view (a node
    /// joined or left, or the head reported other free resources, or this
    /// node's own counts were dropped for the head's): a placement that
    /// did not fit may fit once it moved.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Parses the rooms again from the nodes.
    fn rebuild_rooms(&mut self) {
        let serving = || {
            self.nodes
                .values()
                .filter(|n| n.node_id != self.here && !n.raylet_address.is_empty())
        };
        let room = |n: &WireNode, list: &[Resource]| NodeRoom {
            node_id: n.node_id.clone(),
            room: from_wire_set(list),
        };
        self.rooms = Rooms {
            total: Arc::new(serving().map(|n| room(n, &n.total)).collect()),
            free: Arc::new(serving().map(|n| room(n, &n.available)).collect()),
        };
        self.changes += 1;
    }

    /// The epoch and version to send with the next heartbeat.
    pub(crate) fn since(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    /// Takes a heartbeat's answer; returns the nodes that left the view.
    pub(crate) fn apply(&mut self, reply: HeartbeatReply) -> Vec<String> {
        let changed = reply.full_view
            || reply.view_epoch == 0
            || !reply.nodes.is_empty()
            || !reply.gone.is_empty()
            || !self.reported.is_empty();
        // The answer is newer than this node's own counts.
        for (id, available) in self.reported.drain() {
            if let Some(n) = self.nodes.get_mut(&id) {
                n.available = available;
            }
        }
        // A control store that does not speak in changes sends it all.
        let full = reply.full_view || reply.view_epoch == 0;
        let mut left = Vec::new();
        if full {
            let now: BTreeMap<String, WireNode> = reply
                .nodes
                .into_iter()
                .map(|n| (n.node_id.clone(), n))
                .collect();
            left = self
                .nodes
                .keys()
                .filter(|id| !now.contains_key(*id))
                .cloned()
                .collect();
            self.nodes = now;
        } else {
            for id in reply.gone {
                if self.nodes.remove(&id).is_some() {
                    left.push(id);
                }
            }
            for n in reply.nodes {
                self.nodes.insert(n.node_id.clone(), n);
            }
        }
        self.epoch = reply.view_epoch;
        self.version = reply.view_version;
        if changed {
            self.rebuild_rooms();
        }
        left
    }

    /// The live nodes, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &WireNode> + Clone {
        self.nodes.values()
    }

    pub(crate) fn get(&self, id: &str) -> Option<&WireNode> {
        self.nodes.get(id)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node a SPREAD request for `shape` goes to, looking from the
    /// `start`th node in id order: the first with `shape` free, and
    /// whether it has; or, when none has (this node's own counts may have
    /// lowered them all until the next answer), the first whose total
    /// holds it, where the request waits for room. Taking turns either
    /// way keeps a burst spread when every node looks full, instead of
    /// queueing it all on one node. `None` when no node could ever hold
    /// it.
    pub(crate) fn spread_pick(
        &self,
        start: usize,
        shape: &ResourceSet,
    ) -> Option<(&WireNode, bool)> {
        let n = self.nodes.len().max(1);
        let start = start % n;
        let in_turn = || (self.nodes.values().skip(start)).chain(self.nodes.values().take(start));
        if let Some(free) = in_turn().find(|node| free_of(node).contains(shape)) {
            return Some((free, true));
        }
        in_turn()
            .filter(|node| !node.raylet_address.is_empty())
            .find(|node| from_wire_set(&node.total).contains(shape))
            .map(|node| (node, false))
    }

    /// Counts a request for `shape` sent to node `id` against its free
    /// resources until the next answer says what it really has free, so
    /// that a burst spreads over the nodes instead of all going to one.
    pub(crate) fn lower(&mut self, id: &str, shape: &ResourceSet) {
        let Some(n) = self.nodes.get_mut(id) else {
            return;
        };
        self.reported
            .entry(id.to_string())
            .or_insert_with(|| n.available.clone());
        let mut free = free_of(n);
        free.subtract(shape);
        n.available = to_wire(&free);
        let free = Arc::make_mut(&mut self.rooms.free);
        if let Ok(i) = free.binary_search_by(|r| r.node_id.as_str().cmp(id)) {
            free[i].room.subtract(shape);
        }
    }
}

/// A node's free resources.
pub(crate) fn free_of(n: &WireNode) -> ResourceSet {
    from_wire_set(&n.available)
}

pub(crate) fn to_wire(set: &ResourceSet) -> Vec<Resource> {
    set.iter()
        .map(|(name, q)| Resource {
            name: name.to_string(),
            units: q.units() as i64,
        })
        .collect()
}

pub(crate) fn from_wire_set(list: &[Resource]) -> ResourceSet {
    let mut set = ResourceSet::new();
    for r in list {
        set.set(r.name.clone(), Quantity::from_units(r.units.max(0) as u64));
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, cpus: i64) -> WireNode {
        let cpu = vec![Resource {
            name: "CPU".into(),
            units: cpus * 10_000,
        }];
        WireNode {
            node_id: id.into(),
            raylet_address: format!("{id}:1"),
            total: cpu.clone(),
            available: cpu,
            ..WireNode::default()
        }
    }

    fn room_ids(rooms: &[NodeRoom]) -> Vec<&str> {
        rooms.iter().map(|r| r.node_id.as_str()).collect()
    }

    fn answer(full: bool, nodes: Vec<WireNode>, gone: &[&str], version: u64) -> HeartbeatReply {
        HeartbeatReply {
            alive: true,
            nodes,
            full_view: full,
            gone: gone.iter().map(|g| g.to_string()).collect(),
            view_epoch: 9,
            view_version: version,
            ..HeartbeatReply::default()
        }
    }

    fn cpus(n: u64) -> ResourceSet {
        let mut set = ResourceSet::new();
        set.set("CPU", Quantity::from_units(n * 10_000));
        set
    }

    fn ids(v: &View) -> Vec<&str> {
        v.iter().map(|n| n.node_id.as_str()).collect()
    }

    #[test]
    fn changes_apply_over_the_last_full_view_and_report_who_left() {
        let mut v = View::default();
        assert_eq!(v.since(), (0, 0));
        let left = v.apply(answer(true, vec![node("b", 2), node("a", 2)], &[], 3));
        assert!(left.is_empty());
        assert_eq!(ids(&v), ["a", "b"], "in id order");
        assert_eq!(v.since(), (9, 3));
        // Nothing changed: nothing sent, the view stays.
        assert!(v.apply(answer(false, vec![], &[], 3)).is_empty());
        assert_eq!(ids(&v), ["a", "b"]);
        // c joined, a left.
        let left = v.apply(answer(false, vec![node("c", 1)], &["a"], 5));
        assert_eq!(left, ["a"]);
        assert_eq!(ids(&v), ["b", "c"]);
        // A full view drops whoever it lacks.
        let left = v.apply(answer(true, vec![node("c", 1)], &[], 1));
        assert_eq!(left, ["b"]);
        // A control store that does not send changes (epoch 0): all of it.
        let mut old = answer(false, vec![node("d", 1)], &[], 0);
        old.view_epoch = 0;
        assert_eq!(v.apply(old), ["c"]);
    }

    #[test]
    fn own_counts_last_until_the_next_answer() {
        let mut v = View::default();
        v.apply(answer(true, vec![node("a", 2), node("b", 2)], &[], 1));
        let one = cpus(1);
        v.lower("a", &one);
        v.lower("a", &one);
        assert!(!free_of(v.get("a").expect("a")).contains(&one));
        // The head reports no change for a: its last report stands again.
        v.apply(answer(false, vec![], &[], 1));
        assert!(free_of(v.get("a").expect("a")).contains(&cpus(2)));
        // A change reported for a wins over the restored count.
        v.lower("a", &one);
        v.apply(answer(false, vec![node("a", 0)], &[], 2));
        assert!(!free_of(v.get("a").expect("a")).contains(&one));
    }

    #[test]
    fn rooms_are_kept_with_the_view_and_shared_until_it_changes() {
        let mut v = View::new("a");
        let mut no_raylet = node("d", 8);
        no_raylet.raylet_address.clear();
        v.apply(answer(
            true,
            vec![node("a", 2), node("c", 4), node("b", 1), no_raylet],
            &[],
            1,
        ));
        let rooms = v.rooms();
        assert_eq!(
            room_ids(&rooms.free),
            ["b", "c"],
            "the other nodes that serve, in id order"
        );
        assert_eq!(rooms.total[1].room, cpus(4));
        // An answer with nothing in it changes nothing: the same lists.
        let changes = v.changes();
        v.apply(answer(false, vec![], &[], 1));
        assert_eq!(v.changes(), changes, "nothing changed");
        assert!(Arc::ptr_eq(&v.rooms().free, &rooms.free), "not rebuilt");
        // Own counts lower the free room in place, not the total, and
        // leave a reader's copy as it was.
        v.lower("c", &cpus(3));
        assert_eq!(v.rooms().free[1].room, cpus(1));
        assert_eq!(v.rooms().total[1].room, cpus(4));
        assert_eq!(rooms.free[1].room, cpus(4), "a reader's copy stays");
        assert_eq!(v.changes(), changes, "a count is no change to wait for");
        // The next answer puts the head's report back, and is a change.
        v.apply(answer(false, vec![], &[], 1));
        assert_eq!(v.rooms().free[1].room, cpus(4));
        assert!(v.changes() > changes);
        // A node that leaves leaves the rooms; one that joins is added.
        let changes = v.changes();
        v.apply(answer(false, vec![node("e", 2)], &["b"], 2));
        assert_eq!(room_ids(&v.rooms().free), ["c", "e"]);
        assert!(v.changes() > changes);
    }

    #[test]
    fn spread_takes_turns_even_when_every_node_looks_full() {
        let mut v = View::new("a");
        v.apply(answer(
            true,
            vec![node("a", 1), node("b", 1), node("c", 1)],
            &[],
            1,
        ));
        let one = cpus(1);
        let pick = |v: &View, start| {
            v.spread_pick(start, &one)
                .map(|(n, free)| (n.node_id.clone(), free))
        };
        assert_eq!(pick(&v, 1), Some(("b".into(), true)));
        assert_eq!(pick(&v, 4), Some(("b".into(), true)), "turns wrap around");
        // Only c has room left: every turn finds it.
        v.lower("a", &one);
        v.lower("b", &one);
        assert_eq!(pick(&v, 0), Some(("c".into(), true)));
        // None has: each turn still goes to its own node, to wait there.
        v.lower("c", &one);
        assert_eq!(pick(&v, 0), Some(("a".into(), false)));
        assert_eq!(pick(&v, 1), Some(("b".into(), false)));
        assert_eq!(pick(&v, 2), Some(("c".into(), false)));
        // No node could ever hold it.
        assert_eq!(
            v.spread_pick(0, &cpus(2)).map(|(n, _)| n.node_id.clone()),
            None
        );
    }
}
