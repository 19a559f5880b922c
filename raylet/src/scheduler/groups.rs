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
//! and is refused at once. Multi-node placement extends `schedule_groups`.

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
    /// Per bundle: what it took from the node, and its own pool. Empty
    /// while pending.
    bundles: Vec<(Allocation, NodeResources)>,
    /// Callers waiting for it to leave `Pending`, by a token of their own.
    waiters: Vec<(u64, R)>,
}

impl<R> PlacementGroup<R> {
    fn info(&self) -> PlacementGroupInfo {
        PlacementGroupInfo {
            spec: self.spec.clone(),
            state: self.state,
            bundle_gpus: self.bundles.iter().map(|(a, _)| a.gpu_ids()).collect(),
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
            if let Some((_, pool)) = group.bundles.get_mut(i) {
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
            Some((_, pool)) => pool.release(allocation),
            None => self.resources.release(allocation),
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
            for (allocation, _) in &group.bundles {
                self.resources.release(allocation);
            }
            self.removed_groups.keep(
                id,
                PlacementGroupInfo {
                    spec: group.spec,
                    state: PlacementGroupState::Removed,
                    bundle_gpus: Vec::new(),
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
            PlacementGroup {
                spec,
                job,
                state: PlacementGroupState::Pending,
                bundles: Vec::new(),
                waiters: Vec::new(),
            },
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
                        (a, pool)
                    })
                    .collect();
                group.state = PlacementGroupState::Created;
                tracing::info!(group = %id, "placement group created");
                group.wake(&mut self.out);
            }
        }
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
