//! A node's view of the live nodes it schedules with: what the head's
//! heartbeat answers said, applied as changes (`prism_gcs`'s node table,
//! "The nodes' view, as changes"), plus this node's own counts of the
//! requests it sent to other nodes since the last answer.

use prism_gcs::pb::{HeartbeatReply, NodeInfo as WireNode, Resource};
use prism_protocol::resources::{Quantity, ResourceSet};
use std::collections::{BTreeMap, HashMap};

/// The live nodes by id (so in id order), as of the last answer.
#[derive(Debug, Default)]
pub(crate) struct View {
    nodes: BTreeMap<String, WireNode>,
    /// The free resources the head last reported for the nodes whose
    /// count this node lowered since ([`lower`](Self::lower)).
    reported: HashMap<String, Vec<Resource>>,
    epoch: u64,
    version: u64,
}

impl View {
    /// The epoch and version to send with the next heartbeat.
    pub(crate) fn since(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    /// Takes a heartbeat's answer; returns the nodes that left the view.
    pub(crate) fn apply(&mut self, reply: HeartbeatReply) -> Vec<String> {
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
        left
    }

    /// The live nodes, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &WireNode> + Clone {
        self.nodes.values()
    }

    pub(crate) fn get(&self, id: &str) -> Option<&WireNode> {
        self.nodes.get(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
        WireNode {
            node_id: id.into(),
            available: vec![Resource {
                name: "CPU".into(),
                units: cpus * 10_000,
            }],
            ..WireNode::default()
        }
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
}
