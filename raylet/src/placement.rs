//! Placement groups: bundles of resources reserved together, as in Ray.
//!
//! A group is created all at once or waits: every bundle is taken from the
//! node's free resources in one step, and from then on each bundle is a
//! small pool of its own ([`NodeResources::for_bundle`]) that leases naming
//! the group draw from. Removing a group (or ending its job) gives the
//! bundles back and stops the workers running in it.
//!
//! With one node, `PACK`, `SPREAD` and `STRICT_PACK` all place every
//! bundle here; `STRICT_SPREAD` with more than one bundle can never be met
//! and is refused at once. Multi-node placement extends `schedule_groups`.

use crate::node::{LeaseFor, Node, PendingLease, State};
use crate::resources::{Allocation, NodeResources};
use crate::workers::kill_pid;
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, PlacementGroupId};
use prism_protocol::messages::{
    BundleRef, PlacementGroupInfo, PlacementGroupSpec, PlacementGroupState, PlacementStrategy,
    Response,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A group's reservation and who waits for it.
#[derive(Debug)]
pub(crate) struct PlacementGroup {
    spec: PlacementGroupSpec,
    job: JobId,
    state: PlacementGroupState,
    /// Per bundle: what it took from the node, and its own pool. Empty
    /// while pending.
    bundles: Vec<(Allocation, NodeResources)>,
    /// Callers waiting for it to leave `Pending`, by a token of their own.
    waiters: Vec<(u64, Connection, Option<u64>)>,
}

/// Removed groups whose resources went back to the node: their last state
/// stays readable (`Removed`), the oldest forgotten first.
#[derive(Debug)]
pub(crate) struct RemovedGroups {
    limit: usize,
    order: std::collections::VecDeque<PlacementGroupId>,
    info: std::collections::HashMap<PlacementGroupId, PlacementGroupInfo>,
}

impl RemovedGroups {
    /// Keeps at most `limit` groups (Ray's GCS keeps removed groups too, up
    /// to a bound).
    pub(crate) fn new(limit: usize) -> Self {
        RemovedGroups {
            limit,
            order: Default::default(),
            info: Default::default(),
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

impl PlacementGroup {
    fn info(&self) -> PlacementGroupInfo {
        PlacementGroupInfo {
            spec: self.spec.clone(),
            state: self.state,
            bundle_gpus: self.bundles.iter().map(|(a, _)| a.gpu_ids()).collect(),
        }
    }

    fn wake(&mut self) {
        let info = self.info();
        for (_, conn, request) in self.waiters.drain(..) {
            conn.respond(request, Response::PlacementGroup(info.clone()));
        }
    }
}

fn removed(id: PlacementGroupId) -> Error {
    Error::PlacementGroupRemoved { id: id.to_string() }
}

/// The pool a lease draws from: its bundle's, or the node's.
pub(crate) fn pool_of<'a>(
    node: &'a mut NodeResources,
    groups: &'a mut HashMap<PlacementGroupId, PlacementGroup>,
    bundle: Option<(PlacementGroupId, usize)>,
) -> &'a mut NodeResources {
    match bundle.and_then(|(g, i)| groups.get_mut(&g)?.bundles.get_mut(i)) {
        Some((_, pool)) => pool,
        None => node,
    }
}

impl State {
    /// Rejects a lease that could never be granted, naming why.
    pub(crate) fn check_lease_feasible(
        &self,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
    ) -> Result<(), Error> {
        self.resources.check_feasible(shape)?;
        let Some(bundle) = bundle else {
            return Ok(());
        };
        let group = self
            .placement_groups
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

    /// Takes `shape` from the node or from a bundle of a created group.
    /// `Ok(None)`: not now (no room, or the group is still pending).
    #[allow(clippy::type_complexity)]
    pub(crate) fn allocate(
        &mut self,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
    ) -> Result<Option<(Allocation, Option<(PlacementGroupId, usize)>)>, Error> {
        let Some(bundle) = bundle else {
            return Ok(self.resources.try_allocate(shape).map(|a| (a, None)));
        };
        let group = self
            .placement_groups
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

    /// Once a removed group has no lease left, its bundles go back to the
    /// node and the group is forgotten. Until then they stay reserved, so
    /// nothing new lands on resources (a GPU's memory, say) that a dying
    /// worker of the group may still hold.
    pub(crate) fn forget_if_done(&mut self, id: PlacementGroupId) {
        let removed = self
            .placement_groups
            .get(&id)
            .is_some_and(|g| g.state == PlacementGroupState::Removed);
        let in_use = self
            .leases
            .values()
            .any(|l| l.bundle.map(|(g, _)| g) == Some(id));
        if !removed || in_use {
            return;
        }
        if let Some(group) = self.placement_groups.remove(&id) {
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

    /// Gives back what [`State::allocate`] took.
    pub(crate) fn release_to(
        &mut self,
        bundle: Option<(PlacementGroupId, usize)>,
        allocation: &Allocation,
    ) {
        pool_of(&mut self.resources, &mut self.placement_groups, bundle).release(allocation);
    }
}

impl Node {
    /// Accepts a group (it may wait for resources), or refuses one that
    /// could never be placed.
    pub(crate) fn create_placement_group(
        self: &Arc<Self>,
        job: JobId,
        spec: PlacementGroupSpec,
    ) -> Result<(), Error> {
        if spec.bundles.is_empty() {
            return Err(Error::invalid(
                "bundles",
                "a placement group needs at least one bundle",
            ));
        }
        let mut state = self.state.lock();
        let mut sum = ResourceSet::new();
        for (i, bundle) in spec.bundles.iter().enumerate() {
            if bundle.iter().all(|(_, q)| q.is_zero()) {
                return Err(Error::invalid(
                    "bundles",
                    format!("bundle {i} is empty: give it at least one resource"),
                ));
            }
            state.resources.check_feasible(bundle)?;
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
        let mut empty = NodeResources::new(state.resources.total().clone());
        if !spec.bundles.iter().all(|b| empty.try_allocate(b).is_some()) {
            return Err(Error::Infeasible {
                shape: format!("{sum} in {} bundles on one node", spec.bundles.len()),
                total: state.resources.total().to_string(),
            });
        }
        let id = spec.id;
        tracing::info!(group = %id, bundles = spec.bundles.len(), strategy = ?spec.strategy, "placement group requested");
        state.placement_groups.insert(
            id,
            PlacementGroup {
                spec,
                job,
                state: PlacementGroupState::Pending,
                bundles: Vec::new(),
                waiters: Vec::new(),
            },
        );
        state.pending_groups.push_back(id);
        self.schedule(&mut state);
        Ok(())
    }

    /// Reserves every pending group that fits now, all bundles at once.
    pub(crate) fn schedule_groups(&self, state: &mut State) {
        let pending: Vec<PlacementGroupId> = state.pending_groups.drain(..).collect();
        for id in pending {
            let Some(shapes) = state
                .placement_groups
                .get(&id)
                .filter(|g| g.state == PlacementGroupState::Pending)
                .map(|g| g.spec.bundles.clone())
            else {
                continue;
            };
            let mut taken: Vec<Allocation> = Vec::new();
            for shape in &shapes {
                match state.resources.try_allocate(shape) {
                    Some(a) => taken.push(a),
                    None => break,
                }
            }
            if taken.len() < shapes.len() {
                for a in &taken {
                    state.resources.release(a);
                }
                state.pending_groups.push_back(id);
                continue;
            }
            if let Some(group) = state.placement_groups.get_mut(&id) {
                group.bundles = taken
                    .into_iter()
                    .map(|a| {
                        let pool = NodeResources::for_bundle(&a);
                        (a, pool)
                    })
                    .collect();
                group.state = PlacementGroupState::Created;
                tracing::info!(group = %id, "placement group created");
                group.wake();
            }
        }
    }

    /// Answers with a group's state: now, or once it is not pending, or
    /// when `wait_ms` runs out (still pending), whichever comes first.
    pub(crate) fn get_placement_group(
        self: &Arc<Self>,
        id: PlacementGroupId,
        wait_ms: Option<u64>,
        conn: &Connection,
        request: Option<u64>,
    ) {
        static TOKENS: AtomicU64 = AtomicU64::new(0);
        let mut state = self.state.lock();
        let Some(group) = state.placement_groups.get_mut(&id) else {
            let response = match state.removed_groups.get(&id) {
                Some(info) => Response::PlacementGroup(info.clone()),
                None => Response::Error(removed(id)),
            };
            return conn.respond(request, response);
        };
        let Some(ms) = wait_ms.filter(|_| group.state == PlacementGroupState::Pending) else {
            return conn.respond(request, Response::PlacementGroup(group.info()));
        };
        let token = TOKENS.fetch_add(1, Ordering::Relaxed);
        group.waiters.push((token, conn.clone(), request));
        if ms == u64::MAX {
            return;
        }
        // Answer "still pending" at the deadline, so waiters that gave up
        // do not pile up on a group that stays pending.
        let node = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            let mut state = node.state.lock();
            if let Some(group) = state.placement_groups.get_mut(&id) {
                if let Some(i) = group.waiters.iter().position(|(t, _, _)| *t == token) {
                    let (_, conn, request) = group.waiters.swap_remove(i);
                    conn.respond(request, Response::PlacementGroup(group.info()));
                }
            }
        });
    }

    /// Removes a group: its bundles go back to the node, and the actors and
    /// tasks running in it are stopped (as Ray does).
    pub(crate) fn remove_placement_group(self: &Arc<Self>, id: PlacementGroupId) {
        let mut state = self.state.lock();
        let Some(group) = state.placement_groups.get_mut(&id) else {
            return;
        };
        if group.state == PlacementGroupState::Removed {
            return;
        }
        group.state = PlacementGroupState::Removed;
        group.wake();
        // Stop what runs in it; its bundles go back to the node when the
        // last of their leases ends (State::forget_if_done).
        let mut pids = Vec::new();
        let in_group: Vec<_> = state
            .leases
            .values()
            .filter(|l| l.bundle.map(|(g, _)| g) == Some(id))
            .map(|l| l.worker)
            .collect();
        for worker_id in in_group {
            let Some(worker) = state.workers.get(&worker_id) else {
                continue;
            };
            pids.push(worker.pid);
            if let crate::node::WorkerUse::Actor(actor_id) = worker.usage {
                self.actor_died(
                    &mut state,
                    actor_id,
                    format!("its placement group {id} was removed"),
                );
            }
        }
        // Queued requests for it fail now.
        let queued: std::collections::VecDeque<PendingLease> = {
            let (mine, rest) = std::mem::take(&mut state.pending)
                .into_iter()
                .partition(|p| p.bundle.map(|b| b.group) == Some(id));
            state.pending = rest;
            mine
        };
        for p in queued {
            self.refuse(&mut state, p, removed(id));
        }
        state.forget_if_done(id);
        self.schedule(&mut state);
        drop(state);
        for pid in pids {
            kill_pid(pid);
        }
        tracing::info!(group = %id, "placement group removed");
    }

    /// Removes every group of a job that ended.
    pub(crate) fn remove_groups_of(self: &Arc<Self>, job: JobId) {
        let ids: Vec<PlacementGroupId> = self
            .state
            .lock()
            .placement_groups
            .iter()
            .filter(|(_, g)| g.job == job)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.remove_placement_group(id);
        }
    }

    /// Answers a queued lease that can never be granted.
    pub(crate) fn refuse(&self, state: &mut State, pending: PendingLease, error: Error) {
        match pending.lease_for {
            LeaseFor::Client { conn, request, .. } => conn.respond(request, Response::Error(error)),
            LeaseFor::Actor(actor_id) => self.actor_died(state, actor_id, error.to_string()),
        }
    }
}
