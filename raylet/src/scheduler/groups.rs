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

use super::{Decision, Scheduler, WorkerUse};
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
pub(super) struct PlacementGroup<R> {
    spec: PlacementGroupSpec,
    pub(super) job: JobId,
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
pub(crate) struct RemovedGroups {
    limit: usize,
    order: VecDeque<PlacementGroupId>,
    info: HashMap<PlacementGroupId, PlacementGroupInfo>,
}

impl RemovedGroups {
    /// Keeps at most `limit` groups (Ray's GCS keeps removed groups too, up
    /// to a bound).
    pub(crate) fn new(limit: usize) -> Self {
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

fn removed(id: PlacementGroupId) -> Error {
    Error::PlacementGroupRemoved { id: id.to_string() }
}

/// Rejects a lease naming a bundle that could never hold `shape`.
pub(super) fn check_bundle_fits<R>(
    groups: &HashMap<PlacementGroupId, PlacementGroup<R>>,
    bundle: BundleRef,
    shape: &ResourceSet,
) -> Result<(), Error> {
    let group = groups
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

/// A lease's allocation and the bundle (group, index) it came from.
type Taken = (Allocation, Option<(PlacementGroupId, usize)>);

impl<R> Scheduler<R> {
    /// Takes `shape` from the node or from a bundle of a created group.
    /// `Ok(None)`: not now (no room, or the group is still pending).
    pub(super) fn allocate(
        &mut self,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
    ) -> Result<Option<Taken>, Error> {
        let Some(bundle) = bundle else {
            return Ok(self.resources.try_allocate(shape).map(|a| (a, None)));
        };
        let group = self
            .groups
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

    /// Gives back what [`Scheduler::allocate`] took.
    pub(super) fn release_to(
        &mut self,
        bundle: Option<(PlacementGroupId, usize)>,
        allocation: &Allocation,
    ) {
        let pool = bundle.and_then(|(g, i)| self.groups.get_mut(&g)?.bundles.get_mut(i));
        match pool {
            Some(Some((_, pool))) => pool.release(allocation),
            _ => self.resources.release(allocation),
        }
    }

    /// Once a removed group has no lease left, its bundles go back to the
    /// node and the group is forgotten. Until then they stay reserved, so
    /// nothing new lands on resources (a GPU's memory, say) that a dying
    /// worker of the group may still hold.
    pub(super) fn forget_if_done(&mut self, id: PlacementGroupId) {
        let removed = self
            .groups
            .get(&id)
            .is_some_and(|g| g.state == PlacementGroupState::Removed);
        let in_use = self
            .leases
            .values()
            .any(|l| l.bundle.map(|(g, _)| g) == Some(id));
        if !removed || in_use {
            return;
        }
        if let Some(group) = self.groups.remove(&id) {
            for (allocation, _) in group.bundles.iter().flatten() {
                self.resources.release(allocation);
            }
            self.removed_groups.keep(
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

    /// Accepts a group (it may wait for resources), or refuses one that
    /// could never be placed.
    pub(crate) fn create_group(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
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
            self.resources.check_feasible(bundle)?;
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
        let mut empty = NodeResources::new(self.resources.total().clone());
        if !spec.bundles.iter().all(|b| empty.try_allocate(b).is_some()) {
            return Err(Error::Infeasible {
                shape: format!("{sum} in {} bundles on one node", spec.bundles.len()),
                total: self.resources.total().to_string(),
            });
        }
        let id = spec.id;
        tracing::info!(group = %id, bundles = spec.bundles.len(), strategy = ?spec.strategy, "placement group requested");
        self.groups.insert(
            id,
            PlacementGroup::pending(spec, job, Vec::new(), Vec::new()),
        );
        self.pending_groups.push_back(id);
        self.schedule();
        Ok(())
    }

    /// Reserves every pending group that fits now, all bundles at once, in
    /// arrival order.
    pub(super) fn schedule_groups(&mut self) {
        let pending: Vec<PlacementGroupId> = self.pending_groups.drain(..).collect();
        for id in pending {
            let Some(shapes) = self
                .groups
                .get(&id)
                .filter(|g| g.state == PlacementGroupState::Pending)
                .map(|g| g.spec.bundles.clone())
            else {
                continue;
            };
            let mut taken: Vec<Allocation> = Vec::new();
            for shape in &shapes {
                match self.resources.try_allocate(shape) {
                    Some(a) => taken.push(a),
                    None => break,
                }
            }
            if taken.len() < shapes.len() {
                for a in &taken {
                    self.resources.release(a);
                }
                self.pending_groups.push_back(id);
                continue;
            }
            if let Some(group) = self.groups.get_mut(&id) {
                group.bundles = taken
                    .into_iter()
                    .map(|a| {
                        let pool = NodeResources::for_bundle(&a);
                        Some((a, pool))
                    })
                    .collect();
                group.state = PlacementGroupState::Created;
                tracing::info!(group = %id, "placement group created");
                group.wake(&mut self.out);
            }
        }
    }

    /// First phase of a group placed over several nodes: reserves now the
    /// bundles `nodes` gives to node `here`, or takes nothing and fails.
    /// The group stays pending (its bundles unused) until
    /// [`Scheduler::commit_shard`].
    pub(crate) fn prepare_shard(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
        here: &str,
    ) -> Result<(), Error> {
        if nodes.len() != spec.bundles.len() {
            return Err(Error::invalid(
                "nodes",
                format!("{} nodes for {} bundles", nodes.len(), spec.bundles.len()),
            ));
        }
        if self.groups.contains_key(&spec.id) {
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
            match self.resources.try_allocate(shape) {
                Some(a) => {
                    let pool = NodeResources::for_bundle(&a);
                    bundles.push(Some((a, pool)));
                }
                None => {
                    for (a, _) in bundles.iter().flatten() {
                        self.resources.release(a);
                    }
                    return Err(Error::Infeasible {
                        shape: format!("{shape} for a bundle of {} now", spec.id),
                        total: format!("free here: {}", self.resources.available()),
                    });
                }
            }
        }
        let id = spec.id;
        self.groups
            .insert(id, PlacementGroup::pending(spec, job, bundles, nodes));
        Ok(())
    }

    /// Second phase: the group's bundles here may be used.
    pub(crate) fn commit_shard(&mut self, id: PlacementGroupId) -> Result<(), Error> {
        let group = self
            .groups
            .get_mut(&id)
            .filter(|g| g.state == PlacementGroupState::Pending && !g.nodes.is_empty())
            .ok_or_else(|| removed(id))?;
        group.state = PlacementGroupState::Created;
        tracing::info!(group = %id, "placement group created (its bundles on this node)");
        group.wake(&mut self.out);
        self.schedule();
        Ok(())
    }

    /// Bundles of a group moved off a dead node (see `MoveBundles`):
    /// reserves the bundles `nodes` newly gives `here`, or takes nothing and
    /// fails; a group this node held none of is taken up here. Every bundle
    /// node is `nodes` from now on. Sent again, it takes nothing more.
    pub(crate) fn move_bundles(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
        here: &str,
    ) -> Result<(), Error> {
        let id = spec.id;
        if self.removed_groups.get(&id).is_some() {
            return Err(removed(id));
        }
        let Some(group) = self.groups.get_mut(&id) else {
            self.prepare_shard(job, spec, nodes, here)?;
            return self.commit_shard(id);
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
            match self.resources.try_allocate(&group.spec.bundles[i]) {
                Some(a) => taken.push((i, a)),
                None => {
                    for (_, a) in &taken {
                        self.resources.release(a);
                    }
                    return Err(Error::Infeasible {
                        shape: format!("{} for a moved bundle of {id} now", group.spec.bundles[i]),
                        total: format!("free here: {}", self.resources.available()),
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
            self.schedule();
        }
        Ok(())
    }

    /// The groups held here with a bundle on `node`: each with its job
    /// and every bundle's node.
    pub(crate) fn groups_on_node(
        &self,
        node: &str,
    ) -> Vec<(PlacementGroupSpec, JobId, Vec<String>)> {
        self.groups
            .values()
            .filter(|g| {
                g.state == PlacementGroupState::Created && g.nodes.iter().any(|n| n == node)
            })
            .map(|g| (g.spec.clone(), g.job, g.nodes.clone()))
            .collect()
    }

    /// Whether this node knows group `id` (held, or removed and
    /// remembered).
    /// Whether `id` is held here and not removed.
    pub(crate) fn group_is_live(&self, id: PlacementGroupId) -> bool {
        self.groups
            .get(&id)
            .is_some_and(|g| g.state != PlacementGroupState::Removed)
    }

    pub(crate) fn knows_group(&self, id: PlacementGroupId) -> bool {
        self.groups.contains_key(&id) || self.removed_groups.get(&id).is_some()
    }

    /// The nodes of a group placed over several nodes (empty when this
    /// node holds all of it or does not know it).
    pub(crate) fn group_nodes(&self, id: PlacementGroupId) -> Vec<String> {
        self.groups
            .get(&id)
            .map(|g| g.nodes.clone())
            .unwrap_or_default()
    }

    /// Job `job`'s groups placed over several nodes, with their nodes.
    pub(crate) fn spread_groups_of(&self, job: JobId) -> Vec<(PlacementGroupId, Vec<String>)> {
        self.groups
            .iter()
            .filter(|(_, g)| g.job == job && !g.nodes.is_empty())
            .map(|(id, g)| (*id, g.nodes.clone()))
            .collect()
    }

    /// Where the bundle a lease names lies: `Some(None)` on this node,
    /// `Some(Some(node))` on another, `None` when this node does not know
    /// the group.
    pub(crate) fn bundle_node(&self, bundle: BundleRef) -> Option<Option<String>> {
        let group = self.groups.get(&bundle.group)?;
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

    /// Answers `reply` with a group's state now, or (with `wait`) once it
    /// is not pending. Returns the waiter's token when it waits, for
    /// [`Scheduler::group_deadline`].
    pub(crate) fn watch_group(
        &mut self,
        id: PlacementGroupId,
        wait: bool,
        reply: R,
    ) -> Option<u64> {
        let Some(group) = self.groups.get_mut(&id) else {
            let answer = match self.removed_groups.get(&id) {
                Some(info) => Ok(info.clone()),
                None => Err(removed(id)),
            };
            self.out.push(Decision::GroupAnswer { reply, answer });
            return None;
        };
        if !wait || group.state != PlacementGroupState::Pending {
            let answer = Ok(group.info());
            self.out.push(Decision::GroupAnswer { reply, answer });
            return None;
        }
        let token = self.next_token;
        self.next_token += 1;
        group.waiters.push((token, reply));
        Some(token)
    }

    /// A waiter's time ran out: it is answered with the group's state now
    /// (still pending), so waiters that gave up do not pile up.
    pub(crate) fn group_deadline(&mut self, id: PlacementGroupId, token: u64) {
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        if let Some(i) = group.waiters.iter().position(|(t, _)| *t == token) {
            let (_, reply) = group.waiters.swap_remove(i);
            let answer = Ok(group.info());
            self.out.push(Decision::GroupAnswer { reply, answer });
        }
    }

    /// Removes a group: the actors and tasks running in it are stopped (as
    /// Ray does), queued requests for it fail, and its bundles go back to
    /// the node once its last lease ends.
    pub(crate) fn remove_group(&mut self, id: PlacementGroupId) {
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        if group.state == PlacementGroupState::Removed {
            return;
        }
        group.state = PlacementGroupState::Removed;
        group.wake(&mut self.out);
        let in_group: Vec<_> = self
            .leases
            .values()
            .filter(|l| l.bundle.map(|(g, _)| g) == Some(id))
            .map(|l| l.worker)
            .collect();
        for worker_id in in_group {
            let Some(worker) = self.workers.get(&worker_id) else {
                continue;
            };
            if let WorkerUse::Actor(actor) = worker.usage {
                self.out.push(Decision::ActorLost {
                    actor,
                    reason: format!("its placement group {id} was removed"),
                });
            }
            self.out.push(Decision::StopWorker { pid: worker.pid });
        }
        let (mine, rest): (VecDeque<_>, _) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.bundle.map(|b| b.group) == Some(id));
        self.pending = rest;
        for request in mine {
            self.out.push(Decision::Refused {
                grantee: request.grantee,
                error: removed(id),
            });
        }
        self.forget_if_done(id);
        self.schedule();
        tracing::info!(group = %id, "placement group removed");
    }
}
