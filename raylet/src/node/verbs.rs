//! The verbs the node offers its components: each takes the node's lock
//! once (through `Node::control`, which carries out what the scheduler
//! decided meanwhile) and hands back plain values, so that a component
//! reaches the scheduler only through these and not through closures.

use super::{Node, Verbs};
use crate::detached::LocalResources;
use crate::membership::Load;
use crate::metrics::Tables;
use crate::names::LocalActors;
use crate::placement::LocalGroups;
use crate::reply::ReplyTo;
use crate::scheduler::LeaseRequest;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, PlacementGroupId, WorkerId};
use prism_protocol::messages::{ActorInfo, BundleRef, PlacementGroupSpec};
use prism_protocol::resources::ResourceSet;
use std::collections::BTreeSet;

impl LocalGroups for Verbs {
    fn knows_group(&self, id: PlacementGroupId) -> bool {
        self.0.control(|c| c.scheduler.knows_group(id))
    }

    fn group_is_live(&self, id: PlacementGroupId) -> bool {
        self.0.control(|c| c.scheduler.group_is_live(id))
    }

    fn live_groups(&self, ids: &[PlacementGroupId]) -> BTreeSet<PlacementGroupId> {
        self.0.control(|c| {
            ids.iter()
                .filter(|id| c.scheduler.group_is_live(**id))
                .copied()
                .collect()
        })
    }

    fn create_group(&self, job: JobId, spec: PlacementGroupSpec) -> Result<(), Error> {
        self.0.control(|c| c.scheduler.create_group(job, spec))
    }

    fn total(&self) -> ResourceSet {
        self.0.control(|c| c.scheduler.resources().total().clone())
    }

    fn available(&self) -> ResourceSet {
        self.0.control(|c| c.scheduler.resources().available())
    }

    fn prepare_shard(
        &self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.0.node_id.to_string();
        self.0
            .control(|c| c.scheduler.prepare_shard(job, spec, nodes, &here))
    }

    fn commit_shard(&self, id: PlacementGroupId) -> Result<(), Error> {
        self.0.control(|c| c.scheduler.commit_shard(id))
    }

    fn remove_group(&self, id: PlacementGroupId) -> Vec<String> {
        self.0.control(|c| {
            let nodes = c.scheduler.group_nodes(id);
            c.scheduler.remove_group(id);
            nodes
        })
    }

    fn groups_on_node(&self, node: &str) -> Vec<(PlacementGroupSpec, JobId, Vec<String>)> {
        self.0.control(|c| c.scheduler.groups_on_node(node))
    }

    fn group_nodes(&self, id: PlacementGroupId) -> Vec<String> {
        self.0.control(|c| c.scheduler.group_nodes(id))
    }

    fn move_bundles(
        &self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.0.node_id.to_string();
        self.0
            .control(|c| c.scheduler.move_bundles(job, spec, nodes, &here))
    }

    fn bundle_node(&self, bundle: BundleRef) -> Option<Option<String>> {
        self.0.control(|c| c.scheduler.bundle_node(bundle))
    }

    fn watch_group(&self, id: PlacementGroupId, wait: bool, reply: ReplyTo) -> Option<u64> {
        self.0.control(|c| c.scheduler.watch_group(id, wait, reply))
    }

    fn group_deadline(&self, id: PlacementGroupId, token: u64) {
        self.0.control(|c| c.scheduler.group_deadline(id, token))
    }
}

impl LocalResources for Verbs {
    fn free_and_total(&self) -> (ResourceSet, ResourceSet) {
        self.0.control(|c| {
            let r = c.scheduler.resources();
            (r.available(), r.total().clone())
        })
    }
}

impl LocalActors for Node {
    fn actor_info(&self, actor: ActorId) -> Option<ActorInfo> {
        Node::actor_info(self, actor)
    }
}

/// The scheduler's verbs the node's server and views use: each one lock,
/// with the scheduler's decisions carried out after it.
impl Verbs {
    /// Queues a lease request (granted, spilled or refused by the
    /// scheduler's decisions).
    pub(crate) fn request_lease(&self, request: LeaseRequest<ReplyTo>) {
        self.0.control(|c| c.scheduler.request_lease(request));
        // In a cluster that grows, the head's autoscaler hears of demand
        // with the next beat, which this brings forward.
        if !self.0.config.infeasible_wait.is_zero() {
            if let Some(m) = self.0.membership.get() {
                m.nudge();
            }
        }
    }

    /// A lease comes back (its worker `unreachable` from its holder).
    pub(crate) fn return_lease(&self, lease: LeaseId, unreachable: bool) {
        self.0
            .control(|c| c.scheduler.return_lease(lease, unreachable))
    }

    /// Withdraws client `holder`'s queued requests of a shape; returns the
    /// waiters to answer that their request was withdrawn.
    pub(crate) fn cancel_requests(
        &self,
        holder: u64,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
        env: &prism_protocol::messages::EnvVars,
    ) -> Vec<ReplyTo> {
        self.0
            .control(|c| c.scheduler.cancel_requests(holder, shape, bundle, env))
    }

    /// A worker blocks in a `get` (its CPUs lent out) or resumes.
    pub(crate) fn set_blocked(&self, worker: WorkerId, blocked: bool) {
        self.0.control(|c| c.scheduler.set_blocked(worker, blocked))
    }

    /// Client connection `holder` closed: its leases and requests go.
    pub(crate) fn client_gone(&self, holder: u64) {
        self.0.control(|c| {
            c.lease_holders.remove(&holder);
            c.scheduler.client_gone(holder)
        })
    }

    /// This node's free resources and its demand: the lease requests
    /// waiting for resources, the actors waiting for a node to join, and
    /// the bundles of groups waiting to be placed from here, each shape
    /// with how many.
    pub(crate) fn load(&self) -> Load {
        let (free, mut demands) = self
            .0
            .control(|c| (c.scheduler.resources().available(), c.scheduler.demands()));
        self.0.awaiting.add_to(&mut demands);
        let mut spread = Vec::new();
        self.0.placement.add_demands(&mut demands, &mut spread);
        Load {
            free,
            demands,
            spread,
        }
    }

    /// This node's resources: in all, and free now.
    pub(crate) fn resources(&self) -> (ResourceSet, ResourceSet) {
        self.0.control(|c| {
            let r = c.scheduler.resources();
            (r.total().clone(), r.available())
        })
    }

    /// Rows of the actor table, at most `limit`, and how many there are.
    pub(crate) fn actor_rows(&self, limit: usize) -> (Vec<serde_json::Value>, usize) {
        self.0.control(|c| c.actors.rows(limit))
    }

    /// Rows of the workers, at most `limit`, and how many there are.
    pub(crate) fn worker_rows(&self, limit: usize) -> (Vec<serde_json::Value>, usize) {
        self.0.control(|c| c.scheduler.worker_rows(limit))
    }

    /// One row per placement group this node holds.
    pub(crate) fn group_rows(&self) -> Vec<serde_json::Value> {
        self.0.control(|c| c.scheduler.group_rows())
    }

    /// The control state's figures for the node's metrics.
    pub(crate) fn metric_tables(&self) -> Tables {
        self.0.control(|c| {
            let resources = c.scheduler.resources();
            let (workers, waiting_leases) = c.scheduler.worker_counts();
            Tables {
                total: resources.total().clone(),
                available: resources.available(),
                actors: c.actors.counts(),
                workers,
                waiting_leases,
                running_tasks: Default::default(),
                pending_tasks: Default::default(),
                lease_waits: c.scheduler.lease_waits().clone(),
                gpus: Vec::new(),
            }
        })
    }
}
