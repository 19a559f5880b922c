//! Placement groups: bundles of resources reserved together, as in Ray.
//!
//! A group is created all at once or waits: every bundle is taken from the
//! node's free resources in one step, and from then on each bundle is a
//! small pool of its own ([`NodeResources::for_bundle`]) that leases naming
//! the group draw from. Removing a group (or ending its job) stops the
//! workers running in it; its bundles go back to the node when the last of
//! its leases ends.
//!
//! With one node, `PACK`, `SPREAD` and `STRICT_PACK` all place every
//! bundle here; `STRICT_SPREAD` with more than one bundle can never be met
//! and is refused at once. A group placed over several nodes
//! (`crate::placement`) is held here as a *shard*: the bundles this node
//! holds, reserved in two phases (`prepare_shard`, `commit_shard`), with
//! the node of every other bundle.
//!
//! [`Groups`] is the table of them, a part of the scheduler with its own
//! state: it is handed the node's resources and the scheduler's decisions
//! where it needs them, and the scheduler carries out what removing a
//! group means for its leases and workers.

use super::decision::Decision;
use crate::resources::{Allocation, NodeResources};
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, PlacementGroupId};
use prism_protocol::messages::{
    BundleRef, PlacementGroupInfo, PlacementGroupSpec, PlacementGroupState, PlacementStrategy,
};
use prism_protocol::resources::ResourceSet;
use std::collections::{HashMap, VecDeque};

/// A group's reservation and who waits for it.
#[derive(Debug)]
struct PlacementGroup<R> {
    spec: PlacementGroupSpec,
    job: JobId,
    state: PlacementGroupState,
    /// Per bundle: what it took from the node, and its own pool (`None`
    /// for a bundle another node holds). Empty while pending.
    bundles: Vec<Option<(Allocation, NodeResources)>>,
    /// The node of each bundle, for a group placed over several nodes
    /// (empty when this node holds it all).
    nodes: Vec<String>,
    /// Callers waiting for it to leave `Pending`, by a token of their own.
    waiters: Vec<(u64, R)>,
}

impl<R> PlacementGroup<R> {
    /// A group not created yet: `bundles` reserved so far (for a shard of a
    /// group over several nodes, `nodes` gives each bundle's node).
    fn pending(
        spec: PlacementGroupSpec,
        job: JobId,
        bundles: Vec<Option<(Allocation, NodeResources)>>,
        nodes: Vec<String>,
    ) -> Self {
        PlacementGroup {
            spec,
            job,
            state: PlacementGroupState::Pending,
            bundles,
            nodes,
            waiters: Vec::new(),
        }
    }

    fn info(&self) -> PlacementGroupInfo {
        PlacementGroupInfo {
            spec: self.spec.clone(),
            state: self.state,
            bundle_gpus: self
                .bundles
                .iter()
                .map(|b| b.as_ref().map(|(a, _)| a.gpu_ids()).unwrap_or_default())
                .collect(),
            bundle_nodes: self.nodes.clone(),
        }
    }

    fn wake(&mut self, out: &mut Vec<Decision<R>>) {
        let info = self.info();
        for (_, reply) in self.waiters.drain(..) {
            out.push(Decision::GroupAnswer {
                reply,
                answer: Ok(info.clone()),
            });
        }
    }
}

/// Removed groups whose resources went back to the node: their last state
/// stays readable (`Removed`), the oldest forgotten first.
#[derive(Debug)]
struct RemovedGroups {
    limit: usize,
    order: VecDeque<PlacementGroupId>,
    info: HashMap<PlacementGroupId, PlacementGroupInfo>,
}

impl RemovedGroups {
    /// Keeps at most `limit` groups (Ray's GCS keeps removed groups too, up
    /// to a bound).
    fn new(limit: usize) -> Self {
        RemovedGroups {
            limit,
            order: VecDeque::new(),
            info: HashMap::new(),
        }
    }

    /// Keeps `info`, forgetting the oldest beyond the limit.
    fn keep(&mut self, id: PlacementGroupId, info: PlacementGroupInfo) {
        if self.info.insert(id, info).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.limit {
            if let Some(old) = self.order.pop_front() {
                self.info.remove(&old);
            }
        }
    }

    fn get(&self, id: &PlacementGroupId) -> Option<&PlacementGroupInfo> {
        self.info.get(id)
    }
}

/// The error for a group that is removed (or never was).
pub(super) fn removed(id: PlacementGroupId) -> Error {
    Error::PlacementGroupRemoved { id }
}

/// A lease's allocation and the bundle (group, index) it came from.
pub(super) type Taken = (Allocation, Option<(PlacementGroupId, usize)>);

/// The placement groups this node holds (whole, or a shard of a group
/// over several nodes), the removed ones still readable, and the groups
/// waiting for resources. `R` answers a caller waiting for a group.
#[derive(Debug)]
pub(super) struct Groups<R> {
    held: HashMap<PlacementGroupId, PlacementGroup<R>>,
    /// Groups removed and forgotten, still answered as `Removed`.
    removed: RemovedGroups,
    /// Groups waiting for resources, in arrival order.
    pending: VecDeque<PlacementGroupId>,
    /// The token of the next caller to wait for a group.
    next_token: u64,
}

impl<R> Groups<R> {
    /// No groups; at most `removed_kept` removed ones stay readable.
    pub(super) fn new(removed_kept: usize) -> Self {
        Groups {
            held: HashMap::new(),
            removed: RemovedGroups::new(removed_kept),
            pending: VecDeque::new(),
            next_token: 0,
        }
    }

    /// Rejects a lease naming a bundle that could never hold `shape`.
    pub(super) fn check_bundle_fits(
        &self,
        bundle: BundleRef,
        shape: &ResourceSet,
    ) -> Result<(), Error> {
        let group = self
            .held
            .get(&bundle.group)
            .filter(|g| g.state != PlacementGroupState::Removed)
            .ok_or_else(|| removed(bundle.group))?;
        let shapes = &group.spec.bundles;
        let candidates: Vec<(usize, &ResourceSet)> = match bundle.index {
            Some(i) => {
                let i = i as usize;
                let one = shapes.get(i).ok_or_else(|| {
                    Error::invalid(
                        "placement_group_bundle_index",
                        format!("{i}: the group has {} bundles", shapes.len()),
                    )
                })?;
                vec![(i, one)]
            }
            None => shapes.iter().enumerate().collect(),
        };
        if candidates.iter().any(|(_, b)| b.contains(shape)) {
            return Ok(());
        }
        Err(Error::Infeasible {
            shape: shape.to_string(),
            total: candidates
                .iter()
                .map(|(i, b)| format!("bundle {i} of {}: {b}", bundle.group))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }

    /// Takes `shape` from a bundle of a created group. `Ok(None)`: not now
    /// (no room, or the group is still pending).
    pub(super) fn allocate(
        &mut self,
        bundle: BundleRef,
        shape: &ResourceSet,
    ) -> Result<Option<Taken>, Error> {
        let group = self
            .held
            .get_mut(&bundle.group)
            .filter(|g| g.state != PlacementGroupState::Removed)
            .ok_or_else(|| removed(bundle.group))?;
        if group.state == PlacementGroupState::Pending {
            return Ok(None);
        }
        let indices: Vec<usize> = match bundle.index {
            Some(i) => vec![i as usize],
            None => (0..group.bundles.len()).collect(),
        };
        for i in indices {
            if let Some(Some((_, pool))) = group.bundles.get_mut(i) {
                if let Some(allocation) = pool.try_allocate(shape) {
                    return Ok(Some((allocation, Some((bundle.group, i)))));
                }
            }
        }
        Ok(None)
    }

    /// The pool of bundle `index` of group `id`, when this node holds it.
    pub(super) fn pool(
        &mut self,
        (id, index): (PlacementGroupId, usize),
    ) -> Option<&mut NodeResources> {
        match self.held.get_mut(&id)?.bundles.get_mut(index) {
            Some(Some((_, pool))) => Some(pool),
            _ => None,
        }
    }

    /// A removed group that no lease uses any more: its bundles go back
    /// to the node's `resources` and the group is forgotten, its last
    /// state kept readable. A group not removed stays.
    pub(super) fn forget_if_removed(
        &mut self,
        id: PlacementGroupId,
        resources: &mut NodeResources,
    ) {
        let removed = self
            .held
            .get(&id)
            .is_some_and(|g| g.state == PlacementGroupState::Removed);
        if !removed {
            return;
        }
        if let Some(group) = self.held.remove(&id) {
            for (allocation, _) in group.bundles.iter().flatten() {
                resources.release(allocation);
            }
            self.removed.keep(
                id,
                PlacementGroupInfo {
                    spec: group.spec,
                    state: PlacementGroupState::Removed,
                    bundle_gpus: Vec::new(),
                    bundle_nodes: group.nodes,
                },
            );
        }
    }

    /// Accepts a group (it waits for [`Groups::place_pending`]), or
    /// refuses one that could never be placed on a node of `resources`.
    pub(super) fn create_group(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
        resources: &NodeResources,
    ) -> Result<(), Error> {
        if spec.bundles.is_empty() {
            return Err(Error::invalid(
                "bundles",
                "a placement group needs at least one bundle",
            ));
        }
        let mut sum = ResourceSet::new();
        for (i, bundle) in spec.bundles.iter().enumerate() {
            if bundle.iter().all(|(_, q)| q.is_zero()) {
                return Err(Error::invalid(
                    "bundles",
                    format!("bundle {i} is empty: give it at least one resource"),
                ));
            }
            resources.check_feasible(bundle)?;
            sum.add(bundle);
        }
        if spec.strategy == PlacementStrategy::StrictSpread && spec.bundles.len() > 1 {
            return Err(Error::Infeasible {
                shape: format!(
                    "STRICT_SPREAD of {} bundles (one node each)",
                    spec.bundles.len()
                ),
                total: "1 node".into(),
            });
        }
        // Every bundle must fit an empty node at once, GPU shares packed
        // onto devices (three 0.6-GPU bundles do not fit two GPUs).
        let mut empty = NodeResources::new(resources.total().clone());
        if !spec.bundles.iter().all(|b| empty.try_allocate(b).is_some()) {
            return Err(Error::Infeasible {
                shape: format!("{sum} in {} bundles on one node", spec.bundles.len()),
                total: resources.total().to_string(),
            });
        }
        let id = spec.id;
        tracing::info!(group = %id, bundles = spec.bundles.len(), strategy = ?spec.strategy, "placement group requested");
        self.held.insert(
            id,
            PlacementGroup::pending(spec, job, Vec::new(), Vec::new()),
        );
        self.pending.push_back(id);
        Ok(())
    }

    /// Reserves every pending group that fits in `resources` now, all
    /// bundles at once, in arrival order; its waiters are answered in
    /// `out`.
    pub(super) fn place_pending(
        &mut self,
        resources: &mut NodeResources,
        out: &mut Vec<Decision<R>>,
    ) {
        let pending: Vec<PlacementGroupId> = self.pending.drain(..).collect();
        for id in pending {
            let Some(shapes) = self
                .held
                .get(&id)
                .filter(|g| g.state == PlacementGroupState::Pending)
                .map(|g| g.spec.bundles.clone())
            else {
                continue;
            };
            let mut taken: Vec<Allocation> = Vec::new();
            for shape in &shapes {
                match resources.try_allocate(shape) {
                    Some(a) => taken.push(a),
                    None => break,
                }
            }
            if taken.len() < shapes.len() {
                for a in &taken {
                    resources.release(a);
                }
                self.pending.push_back(id);
                continue;
            }
            if let Some(group) = self.held.get_mut(&id) {
                group.bundles = taken
                    .into_iter()
                    .map(|a| {
                        let pool = NodeResources::for_bundle(&a);
                        Some((a, pool))
                    })
                    .collect();
                group.state = PlacementGroupState::Created;
                tracing::info!(group = %id, "placement group created");
                group.wake(out);
            }
        }
    }

    /// First phase of a group placed over several nodes: reserves now,
    /// from `resources`, the bundles `nodes` gives to node `here`, or
    /// takes nothing and fails. The group stays pending (its bundles
    /// unused) until [`Groups::commit_shard`].
    pub(super) fn prepare_shard(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
        here: &str,
        resources: &mut NodeResources,
    ) -> Result<(), Error> {
        if nodes.len() != spec.bundles.len() {
            return Err(Error::invalid(
                "nodes",
                format!("{} nodes for {} bundles", nodes.len(), spec.bundles.len()),
            ));
        }
        if self.held.contains_key(&spec.id) {
            return Err(Error::invalid(
                "placement group",
                format!("{} is already placed here", spec.id),
            ));
        }
        let mut bundles = Vec::with_capacity(spec.bundles.len());
        for (shape, node) in spec.bundles.iter().zip(&nodes) {
            if node != here {
                bundles.push(None);
                continue;
            }
            match resources.try_allocate(shape) {
                Some(a) => {
                    let pool = NodeResources::for_bundle(&a);
                    bundles.push(Some((a, pool)));
                }
                None => {
                    for (a, _) in bundles.iter().flatten() {
                        resources.release(a);
                    }
                    return Err(Error::Infeasible {
                        shape: format!("{shape} for a bundle of {} now", spec.id),
                        total: format!("free here: {}", resources.available()),
                    });
                }
            }
        }
        let id = spec.id;
        self.held
            .insert(id, PlacementGroup::pending(spec, job, bundles, nodes));
        Ok(())
    }

    /// Second phase: the group's bundles here may be used; its waiters
    /// are answered in `out`.
    pub(super) fn commit_shard(
        &mut self,
        id: PlacementGroupId,
        out: &mut Vec<Decision<R>>,
    ) -> Result<(), Error> {
        let group = self
            .held
            .get_mut(&id)
            .filter(|g| g.state == PlacementGroupState::Pending && !g.nodes.is_empty())
            .ok_or_else(|| removed(id))?;
        group.state = PlacementGroupState::Created;
        tracing::info!(group = %id, "placement group created (its bundles on this node)");
        group.wake(out);
        Ok(())
    }

    /// Bundles of a group moved off a dead node (see `MoveBundles`):
    /// reserves, from `resources`, the bundles `nodes` newly gives `here`,
    /// or takes nothing and fails; a group this node held none of is taken
    /// up here. Every bundle node is `nodes` from now on. Sent again, it
    /// takes nothing more. True when bundles came here (or the group was
    /// taken up): the scheduler has new room to schedule.
    pub(super) fn move_bundles(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
        here: &str,
        resources: &mut NodeResources,
        out: &mut Vec<Decision<R>>,
    ) -> Result<bool, Error> {
        let id = spec.id;
        if self.removed.get(&id).is_some() {
            return Err(removed(id));
        }
        let Some(group) = self.held.get_mut(&id) else {
            self.prepare_shard(job, spec, nodes, here, resources)?;
            self.commit_shard(id, out)?;
            return Ok(true);
        };
        if group.state == PlacementGroupState::Removed {
            return Err(removed(id));
        }
        if nodes.len() != group.bundles.len() {
            return Err(Error::invalid(
                "nodes",
                format!("{} nodes for {} bundles", nodes.len(), group.bundles.len()),
            ));
        }
        let mut taken = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            if node != here || group.bundles[i].is_some() {
                continue;
            }
            match resources.try_allocate(&group.spec.bundles[i]) {
                Some(a) => taken.push((i, a)),
                None => {
                    for (_, a) in &taken {
                        resources.release(a);
                    }
                    return Err(Error::Infeasible {
                        shape: format!("{} for a moved bundle of {id} now", group.spec.bundles[i]),
                        total: format!("free here: {}", resources.available()),
                    });
                }
            }
        }
        let moved_here = taken.len();
        for (i, a) in taken {
            let pool = NodeResources::for_bundle(&a);
            group.bundles[i] = Some((a, pool));
        }
        group.nodes = nodes;
        if moved_here > 0 {
            tracing::info!(group = %id, bundles = moved_here, "bundles of a placement group moved here from a dead node");
        }
        Ok(moved_here > 0)
    }

    /// The groups held here with a bundle on `node`: each with its job
    /// and every bundle's node.
    pub(super) fn groups_on_node(
        &self,
        node: &str,
    ) -> Vec<(PlacementGroupSpec, JobId, Vec<String>)> {
        self.held
            .values()
            .filter(|g| {
                g.state == PlacementGroupState::Created && g.nodes.iter().any(|n| n == node)
            })
            .map(|g| (g.spec.clone(), g.job, g.nodes.clone()))
            .collect()
    }

    /// The groups held here (not the removed ones already forgotten), as
    /// the state API lists them.
    pub(super) fn rows(&self) -> Vec<serde_json::Value> {
        self.held
            .values()
            .map(|g| {
                let info = g.info();
                let state = match info.state {
                    PlacementGroupState::Pending => "PENDING",
                    PlacementGroupState::Created => "CREATED",
                    PlacementGroupState::Removed => "REMOVED",
                };
                let bundles: Vec<serde_json::Value> = info
                    .spec
                    .bundles
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        serde_json::json!({
                            "bundle_index": i,
                            "unit_resources": b.to_f64_map(),
                            "node_id": info.bundle_nodes.get(i),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "placement_group_id": info.spec.id.to_string(),
                    "name": info.spec.name.clone().unwrap_or_default(),
                    "state": state,
                    "job_id": g.job.to_string(),
                    "strategy": format!("{:?}", info.spec.strategy).to_uppercase(),
                    "bundles": bundles,
                })
            })
            .collect()
    }

    /// Whether `id` is held here and not removed.
    pub(super) fn group_is_live(&self, id: PlacementGroupId) -> bool {
        self.held
            .get(&id)
            .is_some_and(|g| g.state != PlacementGroupState::Removed)
    }

    /// Whether this node knows group `id` (held, or removed and
    /// remembered).
    pub(super) fn knows_group(&self, id: PlacementGroupId) -> bool {
        self.held.contains_key(&id) || self.removed.get(&id).is_some()
    }

    /// The nodes of a group placed over several nodes (empty when this
    /// node holds all of it or does not know it).
    pub(super) fn group_nodes(&self, id: PlacementGroupId) -> Vec<String> {
        self.held
            .get(&id)
            .map(|g| g.nodes.clone())
            .unwrap_or_default()
    }

    /// Job `job`'s groups held here, removed or not.
    pub(super) fn groups_of(&self, job: JobId) -> Vec<PlacementGroupId> {
        self.held
            .iter()
            .filter(|(_, g)| g.job == job)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Job `job`'s groups placed over several nodes, with their nodes.
    pub(super) fn spread_groups_of(&self, job: JobId) -> Vec<(PlacementGroupId, Vec<String>)> {
        self.held
            .iter()
            .filter(|(_, g)| g.job == job && !g.nodes.is_empty())
            .map(|(id, g)| (*id, g.nodes.clone()))
            .collect()
    }

    /// Where the bundle a lease names lies: `Some(None)` on this node,
    /// `Some(Some(node))` on another, `None` when this node does not know
    /// the group.
    pub(super) fn bundle_node(&self, bundle: BundleRef) -> Option<Option<String>> {
        let group = self.held.get(&bundle.group)?;
        if group.nodes.is_empty() || group.state == PlacementGroupState::Removed {
            return Some(None);
        }
        let here = |i: usize| group.bundles.get(i).is_some_and(|b| b.is_some());
        Some(match bundle.index {
            Some(i) if here(i as usize) => None,
            Some(i) => group.nodes.get(i as usize).cloned(),
            None if (0..group.bundles.len()).any(here) => None,
            None => group.nodes.first().cloned(),
        })
    }

    /// Answers `reply` (in `out`) with a group's state now, or (with
    /// `wait`) once it is not pending. Returns the waiter's token when it
    /// waits, for [`Groups::group_deadline`].
    pub(super) fn watch_group(
        &mut self,
        id: PlacementGroupId,
        wait: bool,
        reply: R,
        out: &mut Vec<Decision<R>>,
    ) -> Option<u64> {
        let Some(group) = self.held.get_mut(&id) else {
            let answer = match self.removed.get(&id) {
                Some(info) => Ok(info.clone()),
                None => Err(removed(id)),
            };
            out.push(Decision::GroupAnswer { reply, answer });
            return None;
        };
        if !wait || group.state != PlacementGroupState::Pending {
            let answer = Ok(group.info());
            out.push(Decision::GroupAnswer { reply, answer });
            return None;
        }
        let token = self.next_token;
        self.next_token += 1;
        group.waiters.push((token, reply));
        Some(token)
    }

    /// A waiter's time ran out: it is answered (in `out`) with the group's
    /// state now (still pending), so waiters that gave up do not pile up.
    pub(super) fn group_deadline(
        &mut self,
        id: PlacementGroupId,
        token: u64,
        out: &mut Vec<Decision<R>>,
    ) {
        let Some(group) = self.held.get_mut(&id) else {
            return;
        };
        if let Some(i) = group.waiters.iter().position(|(t, _)| *t == token) {
            let (_, reply) = group.waiters.swap_remove(i);
            let answer = Ok(group.info());
            out.push(Decision::GroupAnswer { reply, answer });
        }
    }

    /// Marks a group removed and answers its waiters (in `out`). False
    /// when it is not held here or was removed already: nothing more to
    /// do.
    pub(super) fn mark_removed(
        &mut self,
        id: PlacementGroupId,
        out: &mut Vec<Decision<R>>,
    ) -> bool {
        let Some(group) = self.held.get_mut(&id) else {
            return false;
        };
        if group.state == PlacementGroupState::Removed {
            return false;
        }
        group.state = PlacementGroupState::Removed;
        group.wake(out);
        true
    }
}
