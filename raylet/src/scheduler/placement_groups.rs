//! The scheduler's placement-group calls: the group table is
//! [`Groups`](groups::Groups) (groups.rs); the [`Scheduler`] hands it the
//! node's resources, takes a lease's shape from the node or from a
//! bundle, schedules once a group's bundles are ready, and carries out
//! what removing a group means for leases and workers.

use super::groups::{self, Taken};
use super::{Decision, Scheduler, WorkerUse};
use crate::resources::Allocation;
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, PlacementGroupId};
use prism_protocol::messages::{BundleRef, PlacementGroupSpec};
use prism_protocol::resources::ResourceSet;
use std::collections::VecDeque;

/// Placement groups: their table is [`Groups`](groups::Groups); the
/// scheduler hands it the node's resources, schedules once a group's
/// bundles are ready, and carries out what removing a group means for
/// leases and workers.
impl<R> Scheduler<R> {
    /// Takes `shape` from the node or from a bundle of a created group.
    /// `Ok(None)`: not now (no room, or the group is still pending).
    pub(super) fn allocate(
        &mut self,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
    ) -> Result<Option<Taken>, Error> {
        match bundle {
            None => Ok(self.resources.try_allocate(shape).map(|a| (a, None))),
            Some(bundle) => self.groups.allocate(bundle, shape),
        }
    }

    /// Gives back what [`Scheduler::allocate`] took.
    pub(super) fn release_to(
        &mut self,
        bundle: Option<(PlacementGroupId, usize)>,
        allocation: &Allocation,
    ) {
        match bundle.and_then(|b| self.groups.pool(b)) {
            Some(pool) => pool.release(allocation),
            None => self.resources.release(allocation),
        }
    }

    /// Once a removed group has no lease left, its bundles go back to the
    /// node and the group is forgotten. Until then they stay reserved, so
    /// nothing new lands on resources (a GPU's memory, say) that a dying
    /// worker of the group may still hold.
    pub(super) fn forget_if_done(&mut self, id: PlacementGroupId) {
        let in_use = self
            .leases
            .values()
            .any(|l| l.bundle.map(|(g, _)| g) == Some(id));
        if !in_use {
            self.groups.forget_if_removed(id, &mut self.resources);
        }
    }

    /// Accepts a group (it may wait for resources), or refuses one that
    /// could never be placed.
    pub(crate) fn create_group(
        &mut self,
        job: JobId,
        spec: PlacementGroupSpec,
    ) -> Result<(), Error> {
        self.groups.create_group(job, spec, &self.resources)?;
        self.schedule();
        Ok(())
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
        self.groups
            .prepare_shard(job, spec, nodes, here, &mut self.resources)
    }

    /// Second phase: the group's bundles here may be used.
    pub(crate) fn commit_shard(&mut self, id: PlacementGroupId) -> Result<(), Error> {
        self.groups.commit_shard(id, &mut self.out)?;
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
        let moved_here =
            self.groups
                .move_bundles(job, spec, nodes, here, &mut self.resources, &mut self.out)?;
        if moved_here {
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
        self.groups.groups_on_node(node)
    }

    /// Whether `id` is held here and not removed.
    pub(crate) fn group_is_live(&self, id: PlacementGroupId) -> bool {
        self.groups.group_is_live(id)
    }

    /// Whether this node knows group `id` (held, or removed and
    /// remembered).
    pub(crate) fn knows_group(&self, id: PlacementGroupId) -> bool {
        self.groups.knows_group(id)
    }

    /// The nodes of a group placed over several nodes (empty when this
    /// node holds all of it or does not know it).
    pub(crate) fn group_nodes(&self, id: PlacementGroupId) -> Vec<String> {
        self.groups.group_nodes(id)
    }

    /// Job `job`'s groups placed over several nodes, with their nodes.
    pub(crate) fn spread_groups_of(&self, job: JobId) -> Vec<(PlacementGroupId, Vec<String>)> {
        self.groups.spread_groups_of(job)
    }

    /// Where the bundle a lease names lies: `Some(None)` on this node,
    /// `Some(Some(node))` on another, `None` when this node does not know
    /// the group.
    pub(crate) fn bundle_node(&self, bundle: BundleRef) -> Option<Option<String>> {
        self.groups.bundle_node(bundle)
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
        self.groups.watch_group(id, wait, reply, &mut self.out)
    }

    /// A waiter's time ran out: it is answered with the group's state now
    /// (still pending), so waiters that gave up do not pile up.
    pub(crate) fn group_deadline(&mut self, id: PlacementGroupId, token: u64) {
        self.groups.group_deadline(id, token, &mut self.out);
    }

    /// Removes a group: the actors and tasks running in it are stopped (as
    /// Ray does), queued requests for it fail, and its bundles go back to
    /// the node once its last lease ends.
    pub(crate) fn remove_group(&mut self, id: PlacementGroupId) {
        if !self.groups.mark_removed(id, &mut self.out) {
            return;
        }
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
                error: groups::removed(id),
            });
        }
        self.forget_if_done(id);
        self.schedule();
        tracing::info!(group = %id, "placement group removed");
    }
}
