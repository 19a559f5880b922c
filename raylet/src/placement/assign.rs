//! Where a group's bundles go: [`assign`] gives each bundle a node by the
//! group's strategy, from each node's room ([`NodeRoom`]).

use prism_protocol::messages::PlacementStrategy;
use prism_protocol::resources::ResourceSet;

/// One node's room, as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeRoom {
    pub(crate) node_id: String,
    pub(crate) room: ResourceSet,
}

/// The node of each bundle under `strategy`, taking from each node's room
/// (this node, `here`, first, then the others by id); `None` when the
/// strategy cannot be met.
pub(crate) fn assign(
    bundles: &[ResourceSet],
    strategy: PlacementStrategy,
    nodes: &[NodeRoom],
    here: &str,
) -> Option<Vec<String>> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| (nodes[i].node_id != here, nodes[i].node_id.clone()));
    let mut room: Vec<ResourceSet> = nodes.iter().map(|n| n.room.clone()).collect();
    let mut used = vec![0usize; nodes.len()];
    let one_node = || {
        let mut sum = ResourceSet::new();
        bundles.iter().for_each(|b| sum.add(b));
        let i = order.iter().copied().find(|&i| room[i].contains(&sum))?;
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
    let mut out = Vec::with_capacity(bundles.len());
    for bundle in bundles {
        let fits = order.iter().copied().filter(|&i| room[i].contains(bundle));
        let pick = match strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => fits.into_iter().next(),
            PlacementStrategy::Spread => fits.min_by_key(|&i| used[i]),
            PlacementStrategy::StrictSpread => fits.into_iter().find(|&i| used[i] == 0),
        }?;
        room[pick].subtract(bundle);
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
        let rooms = nodes(&[2.0, 1.0, 1.0]);
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
                &nodes(&[4.0; 3]),
                "n0"
            ),
            None
        );
    }
}
