//! Where a group's bundles go: [`assign`] gives each bundle a node by the
//! group's strategy, from each node's room ([`NodeRoom`]).

use prism_protocol::messages::PlacementStrategy;
use prism_protocol::resources::ResourceSet;
use std::collections::HashMap;

/// One node's room, as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeRoom {
    pub(crate) node_id: String,
    pub(crate) room: ResourceSet,
}

/// This node's room first, then the other nodes' (each read in place).
pub(crate) fn here_first<'a>(here: &'a NodeRoom, others: &'a [NodeRoom]) -> Vec<&'a NodeRoom> {
    std::iter::once(here)
        .chain(others.iter().filter(|n| n.node_id != here.node_id))
        .collect()
}

/// The node of each bundle under `strategy`, taking from each node's room
/// (this node, `here`, first, then the others by id); `None` when the
/// strategy cannot be met. The rooms are read, not copied: only a node a
/// bundle is taken from gets a copy of its room to take from.
pub(crate) fn assign(
    bundles: &[ResourceSet],
    strategy: PlacementStrategy,
    nodes: &[&NodeRoom],
    here: &str,
) -> Option<Vec<String>> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    // Stable and linear on rooms already in this order (`here_first`).
    order.sort_by(|&a, &b| {
        let key = |i: usize| (nodes[i].node_id != here, nodes[i].node_id.as_str());
        key(a).cmp(&key(b))
    });
    // What is left of each node's room once bundles are taken from it.
    let mut taken: HashMap<usize, ResourceSet> = HashMap::new();
    fn room_of<'a>(
        taken: &'a HashMap<usize, ResourceSet>,
        nodes: &'a [&NodeRoom],
        i: usize,
    ) -> &'a ResourceSet {
        taken.get(&i).unwrap_or(&nodes[i].room)
    }
    let one_node = || {
        let mut sum = ResourceSet::new();
        bundles.iter().for_each(|b| sum.add(b));
        let i = order
            .iter()
            .copied()
            .find(|&i| nodes[i].room.contains(&sum))?;
        Some(vec![nodes[i].node_id.clone(); bundles.len()])
    };
    match strategy {
        PlacementStrategy::StrictPack => return one_node(),
        PlacementStrategy::Pack => {
            if let Some(all) = one_node() {
                return Some(all);
            }
        }
        _ => {}
    }
    let mut used = vec![0usize; nodes.len()];
    let mut out = Vec::with_capacity(bundles.len());
    for bundle in bundles {
        let mut fitting =
            (order.iter().copied()).filter(|&i| room_of(&taken, nodes, i).contains(bundle));
        let pick = match strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => fitting.next(),
            PlacementStrategy::Spread => fitting.min_by_key(|&i| used[i]),
            PlacementStrategy::StrictSpread => fitting.find(|&i| used[i] == 0),
        }?;
        let mut left = room_of(&taken, nodes, pick).clone();
        left.subtract(bundle);
        taken.insert(pick, left);
        used[pick] += 1;
        out.push(nodes[pick].node_id.clone());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn cpus(n: f64) -> ResourceSet {
        let mut r = ResourceSet::new();
        r.set(
            prism_protocol::resources::CPU,
            prism_protocol::resources::Quantity::from_f64("CPU", n).expect("a quantity"),
        );
        r
    }

    fn refs(rooms: &[NodeRoom]) -> Vec<&NodeRoom> {
        rooms.iter().collect()
    }

    fn nodes(free: &[f64]) -> Vec<NodeRoom> {
        free.iter()
            .enumerate()
            .map(|(i, &n)| NodeRoom {
                node_id: format!("n{i}"),
                room: cpus(n),
            })
            .collect()
    }

    #[test]
    fn each_strategy_places_bundles_as_ray_does() {
        let three = vec![cpus(1.0); 3];
        let owned = nodes(&[2.0, 1.0, 1.0]);
        let rooms = refs(&owned);
        let place = |s| assign(&three, s, &rooms, "n0");
        assert_eq!(
            place(PlacementStrategy::StrictSpread),
            Some(vec!["n0".into(), "n1".into(), "n2".into()])
        );
        assert_eq!(
            place(PlacementStrategy::Pack),
            Some(vec!["n0".into(), "n0".into(), "n1".into()])
        );
        assert_eq!(place(PlacementStrategy::StrictPack), None);
        let spread = place(PlacementStrategy::Spread).expect("placed");
        assert_eq!(spread.iter().collect::<BTreeSet<_>>().len(), 3);
        // Here first: a group that fits here stays here.
        let two = vec![cpus(1.0); 2];
        assert_eq!(
            assign(&two, PlacementStrategy::StrictPack, &rooms, "n0"),
            Some(vec!["n0".into(), "n0".into()])
        );
        // Four bundles, three nodes: STRICT_SPREAD cannot be met.
        let four = vec![cpus(1.0); 4];
        assert_eq!(
            assign(
                &four,
                PlacementStrategy::StrictSpread,
                &refs(&nodes(&[4.0; 3])),
                "n0"
            ),
            None
        );
    }

    #[test]
    fn here_comes_first_and_the_rooms_read_are_left_as_they_were() {
        let others = nodes(&[1.0, 1.0, 1.0]);
        let here = NodeRoom {
            node_id: "n1".into(),
            room: cpus(0.5),
        };
        let rooms = here_first(&here, &others);
        let ids: Vec<&str> = rooms.iter().map(|r| r.node_id.as_str()).collect();
        assert_eq!(
            ids,
            ["n1", "n0", "n2"],
            "here first, once, with its own room"
        );
        assert_eq!(rooms[0].room, cpus(0.5));
        // Two bundles of 0.6: here has no room, n0 holds one, n2 the other.
        let two = vec![cpus(0.6); 2];
        assert_eq!(
            assign(&two, PlacementStrategy::Pack, &rooms, "n1"),
            Some(vec!["n0".into(), "n2".into()])
        );
        assert_eq!(others[0].room, cpus(1.0), "assign takes from copies");
    }
}
