//! Placement groups over the nodes of a cluster.
//!
//! The raylet a group is created at (its *home*) assigns each bundle to a
//! node by the group's strategy ([`assign()`]), from the free resources its
//! cluster view shows (and its own, current). It then reserves them in two
//! phases: `PrepareBundles` to every node (each reserves its bundles now,
//! or fails), then `CommitBundles`. A failed prepare gives back what the
//! others reserved, and the home tries again a little later: the group
//! stays pending meanwhile, and waits as long as the cluster could ever
//! hold it. A group no node set could ever hold fails at once. The home
//! always keeps a record of the whole group (holding bundles or not), and
//! every node holding a bundle knows the node of every bundle, so a lease
//! or an actor naming a bundle is sent to its node from anywhere.
//!
//! A group whose bundles all land on the home is the single-node group of
//! `scheduler::groups`, unchanged.
//!
//! When a node holding bundles dies, the home places those bundles again
//! ([`Placer::replace_lost_bundles`]; one mover per group): by the group's
//! strategy over the live nodes' free resources (for `STRICT_SPREAD`, only
//! nodes holding none of its bundles), one node at a time with
//! `MoveBundles`, each move recorded at the home at once; then it tells
//! every live holder the new nodes, again until each has answered. The
//! bundles left on live nodes, and what runs in them, stay. A request
//! naming a moved bundle waits for it (at most `MOVE_WAIT`).
//!
//! The home records each group in the head's key-value table as it is
//! created, placed and moved, and drops the record when the group goes
//! ([`records`]). When a home dies, the head's raylet reads the records
//! ([`Placer::adopt_orphan_groups`]): it takes up each group whose job still
//! runs, becoming its home (and moving its bundles off the dead nodes),
//! and gives back the bundles of a group whose job died with its home.
//!
//! The component ([`Placement`]) holds the state of the groups placed from
//! here; the node's scheduler is reached through the [`LocalGroups`] verbs
//! the node hands it for each use ([`Placement::with`] makes the
//! [`Placer`] that does the work).

mod adopt;
pub(crate) mod assign;
pub(crate) mod records;
pub(crate) mod state;

use crate::membership::Membership;
use crate::reply::ReplyTo;
use assign::{assign, here_first, NodeRoom};
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, NodeId, PlacementGroupId};
use prism_protocol::messages::{
    BundleRef, CommitBundles, GetPlacementGroup, GroupRecord, ListPlacementGroups, MoveBundles,
    PlacementGroupInfo, PlacementGroupSpec, PlacementGroupState, PlacementStrategy, PrepareBundles,
    RemovePlacementGroup, Response,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::serve::Answer;
use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How soon a pending group is tried again when nothing changed (the
/// first pause; it doubles up to `RETRY_MAX`), and how often a request
/// naming a bundle of a pending group looks again.
const RETRY: Duration = Duration::from_millis(100);
/// The longest pause between two tries of a pending group when no change
/// is heard: a bound on how late a room that grew unseen (another node's
/// resources given back between two heartbeats) is used.
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a request naming a bundle on a dead node waits for the bundle
/// to be placed again.
const MOVE_WAIT: Duration = Duration::from_secs(60);
/// How long one node is given to take moved bundles.
const MOVE_LIMIT: Duration = Duration::from_secs(10);

/// What placing groups needs of this node's scheduler: its groups and
/// resources. The node takes its lock for each verb and carries out what
/// the scheduler decided meanwhile (freed resources granted, waiters
/// answered).
pub(crate) trait LocalGroups: Send + Sync + 'static {
    /// Whether the scheduler knows group `id` (held, or remembered).
    fn knows_group(&self, id: PlacementGroupId) -> bool;
    /// Whether group `id` holds bundles here and is not removed.
    fn group_is_live(&self, id: PlacementGroupId) -> bool;
    /// Which of `ids` are live here, under one lock.
    fn live_groups(&self, ids: &[PlacementGroupId]) -> BTreeSet<PlacementGroupId>;
    /// Creates a group held here whole.
    fn create_group(&self, job: JobId, spec: PlacementGroupSpec) -> Result<(), Error>;
    /// This node's resources in all, and free now.
    fn total(&self) -> ResourceSet;
    fn available(&self) -> ResourceSet;
    /// Reserves this node's bundles of a group over `nodes` (phase one).
    fn prepare_shard(
        &self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error>;
    /// Starts using the bundles reserved (phase two).
    fn commit_shard(&self, id: PlacementGroupId) -> Result<(), Error>;
    /// Removes a group here; returns the nodes its bundles were on.
    fn remove_group(&self, id: PlacementGroupId) -> Vec<String>;
    /// The groups with bundles on `node`.
    fn groups_on_node(&self, node: &str) -> Vec<(PlacementGroupSpec, JobId, Vec<String>)>;
    /// The node of each bundle of group `id`.
    fn group_nodes(&self, id: PlacementGroupId) -> Vec<String>;
    /// Takes the group's bundles assigned here by `nodes` (after a move).
    fn move_bundles(
        &self,
        job: JobId,
        spec: PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error>;
    /// Where a bundle lies: `Some(None)` here, `Some(Some(node))` on
    /// another node, `None` when the group is not known here.
    fn bundle_node(&self, bundle: BundleRef) -> Option<Option<String>>;
    /// Answers `reply` with a group's state now, or (with `wait`) once it
    /// is not pending; returns the waiter's token when it waits.
    fn watch_group(&self, id: PlacementGroupId, wait: bool, reply: ReplyTo) -> Option<u64>;
    /// A waiter's time ran out: it is answered with the state now.
    fn group_deadline(&self, id: PlacementGroupId, token: u64);
}

/// The writer of this node's records in the head's table (its groups',
/// and its detached actors'), started once the node is in a cluster.
#[derive(Debug)]
pub(crate) struct HeadRecords {
    membership: Arc<OnceLock<Membership>>,
    writer: OnceLock<records::GroupRecords>,
}

impl HeadRecords {
    pub(crate) fn new(membership: Arc<OnceLock<Membership>>) -> HeadRecords {
        HeadRecords {
            membership,
            writer: OnceLock::new(),
        }
    }

    /// The writer, once the node is in a cluster.
    pub(crate) fn get(&self) -> Option<&records::GroupRecords> {
        let m = self.membership.get()?;
        Some(
            self.writer
                .get_or_init(|| records::GroupRecords::start(m.gcs())),
        )
    }
}

/// The placement groups placed from this node: their state, and what
/// placing them reaches (the node's membership, the head's records).
#[derive(Debug)]
pub(crate) struct Placement {
    node_id: NodeId,
    membership: Arc<OnceLock<Membership>>,
    records: Arc<HeadRecords>,
    state: state::PendingGroups,
    /// Whether a group no live nodes can hold waits for nodes to join (a
    /// cluster that may grow, `infeasible_wait_ms`) instead of failing.
    waits_for_nodes: bool,
}

impl Placement {
    pub(crate) fn new(
        node_id: NodeId,
        membership: Arc<OnceLock<Membership>>,
        records: Arc<HeadRecords>,
        waits_for_nodes: bool,
    ) -> Placement {
        Placement {
            node_id,
            membership,
            records,
            state: state::PendingGroups::default(),
            waits_for_nodes,
        }
    }

    /// Adds the bundles of the groups waiting to be placed from here to
    /// `demands` (this node's, which heartbeats tell the head and its
    /// autoscaler): a strict-pack group as one shape (it needs one node
    /// holding all of it), a strict-spread group to `spread` as one entry
    /// of as many shapes as it has bundles, each needing a node of its own
    /// (the shape holds each resource's largest amount over the bundles),
    /// others bundle by bundle.
    pub(crate) fn add_demands(
        &self,
        demands: &mut Vec<(ResourceSet, u64)>,
        spread: &mut Vec<(ResourceSet, u64)>,
    ) {
        let groups = self.state.groups.lock();
        let mut add = |shape: ResourceSet| match demands.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, n)) => *n += 1,
            None => demands.push((shape, 1)),
        };
        for (spec, _) in groups.values() {
            match spec.strategy {
                PlacementStrategy::StrictPack => {
                    let mut all = ResourceSet::new();
                    for b in &spec.bundles {
                        all.add(b);
                    }
                    add(all);
                }
                PlacementStrategy::StrictSpread => {
                    let mut widest = ResourceSet::new();
                    for (name, amount) in spec.bundles.iter().flat_map(|b| b.iter()) {
                        if amount > widest.get(name) {
                            widest.set(name, amount);
                        }
                    }
                    spread.push((widest, spec.bundles.len() as u64));
                }
                _ => spec.bundles.iter().cloned().for_each(&mut add),
            }
        }
    }

    /// The placer working with `local`, this node's scheduler.
    pub(crate) fn with(self: &Arc<Self>, local: Arc<dyn LocalGroups>) -> Placer {
        Placer {
            parts: self.clone(),
            local,
        }
    }
}

/// Places, moves, removes and answers for groups: the [`Placement`]
/// component's state with the node's scheduler verbs, cheap to clone into
/// the background tasks it starts.
#[derive(Clone)]
pub(crate) struct Placer {
    parts: Arc<Placement>,
    local: Arc<dyn LocalGroups>,
}

impl Placer {
    /// Creates a group. On one node, or when every bundle goes to this
    /// node, it is a local group; otherwise it is placed over the cluster
    /// in the background (see the module docs).
    pub(crate) fn create_group(&self, job: JobId, spec: PlacementGroupSpec) -> Result<(), Error> {
        let id = spec.id;
        self.create_group_here_or_over(job, spec.clone())?;
        self.parts.state.home.lock().push(id);
        // Placed here alone, every bundle is here; over the cluster, it is
        // recorded again once placed.
        let here = self.local.knows_group(id);
        let nodes = if here {
            vec![self.parts.node_id.to_string(); spec.bundles.len()]
        } else {
            Vec::new()
        };
        self.record_group(job, &spec, nodes);
        Ok(())
    }

    /// Records a group whose home is this node in the head's table, with
    /// its bundles' nodes (empty while not placed). The receiver is told
    /// once the write was tried; `None` when nothing was written.
    fn record_group(
        &self,
        job: JobId,
        spec: &PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let records = self.parts.records.get()?;
        // Under the home list's lock, as removal's delete is: a group
        // removed meanwhile is not recorded again.
        let home = self.parts.state.home.lock();
        home.contains(&spec.id).then(|| {
            records.put(&GroupRecord {
                spec: spec.clone(),
                job,
                home: self.parts.node_id.to_string(),
                nodes,
            })
        })
    }

    /// Forgets the groups whose home is this node that ended with their
    /// job (the scheduler removed them), and their records.
    pub(crate) fn forget_ended_groups(&self) {
        // One lock at a time: the home list, the pending groups, the
        // scheduler's groups.
        let home = self.parts.state.home.lock().clone();
        let pending: BTreeSet<PlacementGroupId> = {
            let groups = self.parts.state.groups.lock();
            home.iter()
                .filter(|id| groups.contains_key(id))
                .copied()
                .collect()
        };
        let ended: BTreeSet<PlacementGroupId> = {
            let live = self.local.live_groups(&home);
            home.iter()
                .filter(|id| !pending.contains(id) && !live.contains(id))
                .copied()
                .collect()
        };
        if ended.is_empty() {
            return;
        }
        let records = self.parts.records.get();
        let mut home = self.parts.state.home.lock();
        home.retain(|id| !ended.contains(id));
        for id in ended {
            if let Some(records) = records {
                records.forget(id);
            }
        }
    }

    /// The groups created here that are not removed. With `everywhere`,
    /// in a cluster, those of every other live node too.
    pub(crate) fn list_groups(&self, everywhere: bool, answer: Answer<ListPlacementGroups>) {
        // Groups gone by other ways (their job ended) are forgotten first.
        self.forget_ended_groups();
        // One lock at a time: the home list, the pending groups, the
        // scheduler's groups.
        let home = self.parts.state.home.lock().clone();
        let placing: BTreeSet<PlacementGroupId> = {
            let pending = self.parts.state.groups.lock();
            home.iter()
                .filter(|id| pending.contains_key(id))
                .copied()
                .collect()
        };
        let ids: Vec<PlacementGroupId> = {
            let live = self.local.live_groups(&home);
            home.iter()
                .filter(|id| placing.contains(id) || live.contains(id))
                .copied()
                .collect()
        };
        match self.parts.membership.get().filter(|_| everywhere) {
            None => answer.send(Ok(ids)),
            Some(m) => {
                let asking = m.ask_all(ListPlacementGroups { everywhere: false });
                tokio::spawn(async move {
                    let mut all = ids;
                    for more in asking.await {
                        all.extend(more);
                    }
                    answer.send(Ok(all));
                });
            }
        }
    }

    fn create_group_here_or_over(&self, job: JobId, spec: PlacementGroupSpec) -> Result<(), Error> {
        let Some(m) = self.parts.membership.get() else {
            return self.local.create_group(job, spec);
        };
        let here = self.parts.node_id.to_string();
        let here_total = NodeRoom {
            node_id: here.clone(),
            room: self.local.total(),
        };
        let others = m.rooms(true);
        let totals = here_first(&here_total, &others);
        let ever = assign(&spec.bundles, spec.strategy, &totals, &here);
        match ever {
            // In a cluster that may grow, it waits for nodes to join (its
            // bundles counted as this node's demand meanwhile).
            None if self.parts.waits_for_nodes => {
                tracing::info!(group = %spec.id, "no live nodes can hold the placement group; it waits for nodes to join");
            }
            None => {
                return Err(Error::Infeasible {
                    shape: format!(
                        "{:?} of {} bundles: {}",
                        spec.strategy,
                        spec.bundles.len(),
                        spec.bundles
                            .iter()
                            .map(|b| b.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    total: totals
                        .iter()
                        .map(|n| format!("{}: {}", n.node_id, n.room))
                        .collect::<Vec<_>>()
                        .join("; "),
                })
            }
            Some(nodes) if nodes.iter().all(|n| *n == here) => {
                return self.local.create_group(job, spec);
            }
            Some(_) => {}
        }
        let id = spec.id;
        self.parts
            .state
            .groups
            .lock()
            .insert(id, (spec.clone(), Vec::new()));
        let node = self.clone();
        tokio::spawn(async move { node.place_in_background(job, spec).await });
        tracing::info!(group = %id, "placement group requested over the cluster");
        Ok(())
    }

    /// Places a pending group, trying again until it is placed or removed:
    /// at once after a try whose reservation failed (a node took the room
    /// meanwhile), and otherwise when some room may have grown (an answer
    /// changed this node's view, or resources were given back here), or
    /// after a pause that doubles from `RETRY` to `RETRY_MAX` when nothing
    /// is heard. A group that does not fit costs nothing while the cluster
    /// stays as it is.
    async fn place_in_background(self, job: JobId, spec: PlacementGroupSpec) {
        let id = spec.id;
        let here = self.parts.node_id.to_string();
        let Some(m) = self.parts.membership.get() else {
            return;
        };
        let mut room_changes = m.room_changes();
        let mut pause = RETRY;
        loop {
            if !self.parts.state.groups.lock().contains_key(&id) {
                return; // removed while pending
            }
            // Changes from here on wake the wait below.
            room_changes.borrow_and_update();
            let here_free = NodeRoom {
                node_id: here.clone(),
                room: self.local.available(),
            };
            let others = m.rooms(false);
            let nodes = assign(
                &spec.bundles,
                spec.strategy,
                &here_first(&here_free, &others),
                &here,
            );
            drop(others);
            if let Some(nodes) = nodes {
                m.count_placed(&spec.bundles, &nodes);
                match self.reserve(job, &spec, nodes).await {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::debug!(group = %id, error = %e, "placement not reserved; trying again")
                    }
                }
            }
            tokio::select! {
                _ = room_changes.changed() => pause = RETRY,
                _ = tokio::time::sleep(pause) => pause = (pause * 2).min(RETRY_MAX),
            }
        }
        // Where the bundles are reaches the head before anyone hears the
        // group is placed (askers wait meanwhile, as the group is still
        // pending here): a home that dies right after leaves the head what
        // it needs to place the group again.
        let nodes = self.local.group_nodes(id);
        if let Some(written) = self.record_group(job, &spec, nodes) {
            let _ = written.await;
        }
        let waiting = self
            .parts
            .state
            .groups
            .lock()
            .remove(&id)
            .map(|(_, w)| w)
            .unwrap_or_default();
        for reply in waiting {
            self.get_placement_group(id, None, false, reply);
        }
        // A node that died while the group was being reserved left its
        // bundles on a dead node: they are moved like any others.
        self.start_moving(job, spec);
    }

    /// The two phases: every node reserves its bundles, then uses them;
    /// on a failure, what was reserved is given back.
    async fn reserve(
        &self,
        job: JobId,
        spec: &PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.parts.node_id.to_string();
        let m = self.parts.membership.get().ok_or(Error::NotRegistered)?;
        let id = spec.id;
        self.local.prepare_shard(job, spec.clone(), nodes.clone())?;
        let others: BTreeSet<String> = nodes.iter().filter(|n| **n != here).cloned().collect();
        let mut prepared = Vec::new();
        let mut failed = None;
        for node in &others {
            let asked = async {
                m.raylet_conn(node)
                    .await?
                    .request(PrepareBundles {
                        spec: spec.clone(),
                        job,
                        nodes: nodes.clone(),
                    })
                    .await
            };
            match asked.await {
                Ok(()) => prepared.push(node.clone()),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_none() {
            for node in &prepared {
                let committed = async {
                    m.raylet_conn(node)
                        .await?
                        .request(CommitBundles { id })
                        .await
                };
                if let Err(e) = committed.await {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            self.local.remove_group(id);
            for node in prepared {
                self.tell_node_remove(node, id);
            }
            return Err(e);
        }
        self.local.commit_shard(id)
    }

    /// A node died: the groups created here with bundles on it get those
    /// bundles placed again on live nodes, in the background.
    pub(crate) fn replace_lost_bundles(&self, dead: &str) {
        let home: BTreeSet<PlacementGroupId> =
            self.parts.state.home.lock().iter().copied().collect();
        let lost = self.local.groups_on_node(dead);
        for (spec, job, _) in lost.into_iter().filter(|(s, _, _)| home.contains(&s.id)) {
            tracing::warn!(group = %spec.id, node = %dead, "a node holding bundles of a placement group died; placing them again");
            self.start_moving(job, spec);
        }
    }

    /// Starts moving a group's bundles off dead nodes, unless a mover of
    /// that group runs already.
    fn start_moving(&self, job: JobId, spec: PlacementGroupSpec) {
        if !self.parts.state.moving.lock().insert(spec.id) {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move { node.replace_group(job, spec).await });
    }

    /// Moves the bundles of a group whose nodes are not alive to live nodes
    /// (by the group's strategy over the live nodes' free resources; for
    /// `STRICT_SPREAD`, only to nodes holding none of its bundles), one
    /// node at a time, until none is left on a dead node and every live
    /// holder knows the bundles' nodes, or the group is removed.
    async fn replace_group(self, job: JobId, spec: PlacementGroupSpec) {
        let id = spec.id;
        let here = self.parts.node_id.to_string();
        let Some(m) = self.parts.membership.get() else {
            self.parts.state.moving.lock().remove(&id);
            return;
        };
        // Live holders not yet told the current nodes.
        let mut untold: BTreeSet<String> = BTreeSet::new();
        let mut moved_any = false;
        loop {
            let nodes = self.local.group_nodes(id);
            let lost: Vec<usize> = {
                // Under the movers' lock: a node that dies after this look
                // finds this mover gone and starts another.
                let mut moving = self.parts.state.moving.lock();
                let lost: Vec<usize> = (0..nodes.len())
                    .filter(|&i| nodes[i] != here && m.raylet_of(&nodes[i]).is_none())
                    .collect();
                untold.retain(|n| m.raylet_of(n).is_some());
                let live = self.local.group_is_live(id);
                if !live || (lost.is_empty() && untold.is_empty()) {
                    moving.remove(&id);
                    break;
                }
                lost
            };
            if !lost.is_empty() {
                if let Some(next) = self.move_lost(m, job, &spec, nodes, &lost).await {
                    moved_any = true;
                    untold = next
                        .iter()
                        .filter(|n| **n != here && m.raylet_of(n).is_some())
                        .cloned()
                        .collect();
                }
            }
            let current = self.local.group_nodes(id);
            for holder in untold.clone() {
                match self.move_to(m, &holder, job, &spec, current.clone()).await {
                    Ok(()) => {
                        untold.remove(&holder);
                    }
                    Err(e) => {
                        tracing::debug!(group = %id, node = %holder, error = %e, "a holder was not told the bundles' new nodes; telling it again")
                    }
                }
            }
            tokio::time::sleep(RETRY).await;
        }
        if moved_any {
            tracing::info!(group = %id, "placement group whole again on live nodes");
        }
    }

    /// One round of moving: assigns the `lost` bundles to live nodes and
    /// moves them there, node by node. Each move is recorded here at once;
    /// a group removed meanwhile is removed from the node just given
    /// bundles too. Returns the nodes after the moves that took, if any.
    async fn move_lost(
        &self,
        m: &crate::membership::Membership,
        job: JobId,
        spec: &PlacementGroupSpec,
        mut nodes: Vec<String>,
        lost: &[usize],
    ) -> Option<Vec<String>> {
        let (id, here) = (spec.id, self.parts.node_id.to_string());
        let shapes: Vec<ResourceSet> = lost.iter().map(|&i| spec.bundles[i].clone()).collect();
        let targets = {
            let here_free = NodeRoom {
                node_id: here.clone(),
                room: self.local.available(),
            };
            let others = m.rooms(false);
            let mut rooms = here_first(&here_free, &others);
            if spec.strategy == PlacementStrategy::StrictSpread {
                rooms.retain(|r| !nodes.contains(&r.node_id));
            }
            assign(&shapes, spec.strategy, &rooms, &here)?
        };
        m.count_placed(&shapes, &targets);
        let mut moved = false;
        let distinct: BTreeSet<String> = targets.iter().cloned().collect();
        for target in distinct {
            let mut next = nodes.clone();
            for (k, &i) in lost.iter().enumerate() {
                if targets[k] == target {
                    next[i] = target.clone();
                }
            }
            if let Err(e) = self.move_to(m, &target, job, spec, next.clone()).await {
                tracing::debug!(group = %id, node = %target, error = %e, "bundles not moved there; trying again");
                break;
            }
            let recorded = self.local.move_bundles(job, spec.clone(), next.clone());
            if recorded.is_err() || !self.local.group_is_live(id) {
                // Removed while this move was on its way.
                if target != here {
                    self.tell_node_remove(target, id);
                }
                return None;
            }
            self.record_group(job, spec, next.clone());
            nodes = next;
            moved = true;
        }
        moved.then_some(nodes)
    }

    /// Sends `MoveBundles` to `node` (or applies it here), bounded in time.
    async fn move_to(
        &self,
        m: &crate::membership::Membership,
        node: &str,
        job: JobId,
        spec: &PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.parts.node_id.to_string();
        if node == here {
            return self.local.move_bundles(job, spec.clone(), nodes);
        }
        let asked = async {
            m.raylet_conn(node)
                .await?
                .request(MoveBundles {
                    spec: spec.clone(),
                    job,
                    nodes,
                })
                .await
        };
        tokio::time::timeout(MOVE_LIMIT, asked)
            .await
            .unwrap_or_else(|_| {
                Err(Error::NodeTimeout {
                    node_id: node.to_string(),
                    waited_ms: MOVE_LIMIT.as_millis() as u64,
                })
            })
    }

    /// Asks node `node`'s raylet to remove group `id`.
    pub(crate) fn tell_node_remove(&self, node: String, id: PlacementGroupId) {
        let Some(m) = self.parts.membership.get() else {
            return;
        };
        let asking = m.raylet_conn(&node);
        tokio::spawn(async move {
            match asking.await {
                Ok(conn) => {
                    let _ = conn.notify(RemovePlacementGroup { id });
                }
                Err(e) => tracing::debug!(%node, error = %e, "could not remove a group there"),
            }
        });
    }

    /// Removes a group here and, for a request from this node's own
    /// processes, from every node holding a bundle of it.
    pub(crate) fn remove_group(&self, id: PlacementGroupId, tell_others: bool) {
        let records = self.parts.records.get();
        {
            let mut home = self.parts.state.home.lock();
            if home.contains(&id) {
                home.retain(|g| *g != id);
                if let Some(records) = records {
                    records.forget(id);
                }
            }
        }
        let pending = self.parts.state.groups.lock().remove(&id);
        if let Some((spec, waiting)) = pending {
            let info = PlacementGroupInfo {
                spec,
                state: PlacementGroupState::Removed,
                bundle_gpus: Vec::new(),
                bundle_nodes: Vec::new(),
            };
            for reply in waiting {
                reply.send(Response::PlacementGroup(info.clone()));
            }
        }
        let nodes = self.local.remove_group(id);
        if let Some(m) = self.parts.membership.get() {
            // Its bundles here were given back: a pending group may fit.
            m.room_may_have_grown();
        }
        if !tell_others {
            return;
        }
        let here = self.parts.node_id.to_string();
        let mut others: BTreeSet<String> = nodes.into_iter().filter(|n| *n != here).collect();
        if others.is_empty() {
            // Not held here: any live node may hold a bundle of it.
            if let Some(m) = self.parts.membership.get() {
                others = m.other_nodes().into_iter().collect();
            }
        }
        for node in others {
            self.tell_node_remove(node, id);
        }
    }

    /// Answers with a group's state now, or (with `wait_ms`) once it is
    /// not pending. With `ask_others`, a group this node does not know is
    /// asked of the other nodes.
    pub(crate) fn get_placement_group(
        &self,
        id: PlacementGroupId,
        wait_ms: Option<u64>,
        ask_others: bool,
        reply: ReplyTo,
    ) {
        {
            let mut pending = self.parts.state.groups.lock();
            if let Some((spec, waiting)) = pending.get_mut(&id) {
                let info = PlacementGroupInfo {
                    spec: spec.clone(),
                    state: PlacementGroupState::Pending,
                    bundle_gpus: Vec::new(),
                    bundle_nodes: Vec::new(),
                };
                match wait_ms {
                    None | Some(0) => reply.send(Response::PlacementGroup(info)),
                    Some(ms) => {
                        waiting.push(reply);
                        if ms != u64::MAX {
                            let node = self.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                node.pending_deadline(id, info);
                            });
                        }
                    }
                }
                return;
            }
        }
        let known = self.local.knows_group(id);
        match self.parts.membership.get().filter(|_| ask_others && !known) {
            Some(m) => {
                let asking = m.ask_others(GetPlacementGroup { id, wait_ms });
                let node = self.clone();
                tokio::spawn(async move {
                    match asking.await {
                        Some(info) => reply.send(Response::PlacementGroup(info)),
                        None => node.watch_group_here(id, None, reply),
                    }
                });
            }
            None => self.watch_group_here(id, wait_ms, reply),
        }
    }

    /// Answers with the state of a group this node holds or remembers
    /// (see [`LocalGroups::watch_group`]), bounding a wait to `wait_ms`.
    fn watch_group_here(&self, id: PlacementGroupId, wait_ms: Option<u64>, reply: ReplyTo) {
        let token = self.local.watch_group(id, wait_ms.is_some(), reply);
        let (Some(token), Some(ms)) = (token, wait_ms) else {
            return;
        };
        if ms == u64::MAX {
            return;
        }
        let local = self.local.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            local.group_deadline(id, token);
        });
    }

    /// Answers the waiters of a pending group whose wait ran out (all of
    /// them: a waiter that gave up must not pile up).
    fn pending_deadline(&self, id: PlacementGroupId, info: PlacementGroupInfo) {
        let waiting = match self.parts.state.groups.lock().get_mut(&id) {
            Some((_, waiting)) => std::mem::take(waiting),
            None => return,
        };
        for reply in waiting {
            reply.send(Response::PlacementGroup(info.clone()));
        }
    }

    /// Where a request naming `bundle` should go: `None` here, or the
    /// raylet and node holding it. Waits while the group is being placed.
    pub(crate) async fn route_bundle(
        &self,
        bundle: BundleRef,
    ) -> Result<Option<(String, String)>, Error> {
        let Some(m) = self.parts.membership.get() else {
            return Ok(None);
        };
        let mut waited = Duration::ZERO;
        loop {
            let node = match self.local.bundle_node(bundle) {
                Some(None) => return Ok(None),
                Some(Some(node)) => node,
                None if self.parts.state.groups.lock().contains_key(&bundle.group) => {
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
                None => {
                    let asking = m.ask_others(GetPlacementGroup {
                        id: bundle.group,
                        wait_ms: None,
                    });
                    match asking.await {
                        Some(info) if info.state == PlacementGroupState::Pending => {
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                        // Removed: the local scheduler says so.
                        Some(info) if info.state == PlacementGroupState::Removed => {
                            return Ok(None)
                        }
                        Some(info) => {
                            let i = bundle.index.unwrap_or(0) as usize;
                            match info.bundle_nodes.get(i) {
                                Some(node) => node.clone(),
                                // Unknown or removed: the local scheduler says so.
                                None => return Ok(None),
                            }
                        }
                        None => return Ok(None),
                    }
                }
            };
            if node == self.parts.node_id.to_string() {
                return Ok(None);
            }
            match m.raylet_of(&node) {
                Some(raylet) => return Ok(Some((raylet, node))),
                // The group's home places it again on a live node.
                None if waited < MOVE_WAIT => {
                    tokio::time::sleep(RETRY).await;
                    waited += RETRY;
                }
                None => {
                    return Err(Error::BundleNotPlacedAgain {
                        group: bundle.group,
                        bundle: bundle.index,
                        node_id: node,
                        waited_ms: MOVE_WAIT.as_millis() as u64,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::resources::{Quantity, CPU};

    fn shape(cpu: f64, accel: f64) -> ResourceSet {
        let mut s = ResourceSet::new();
        s.set(CPU, Quantity::from_f64(CPU, cpu).expect("a quantity"));
        if accel > 0.0 {
            s.set(
                "accel",
                Quantity::from_f64("accel", accel).expect("a quantity"),
            );
        }
        s
    }

    fn pending(p: &Placement, strategy: PlacementStrategy, bundles: Vec<ResourceSet>) {
        let spec = PlacementGroupSpec {
            id: PlacementGroupId::new(),
            name: None,
            bundles,
            strategy,
        };
        p.state.groups.lock().insert(spec.id, (spec, Vec::new()));
    }

    #[test]
    fn pending_groups_count_as_demand_a_strict_pack_as_one_shape_a_strict_spread_apart() {
        let membership = Arc::new(OnceLock::new());
        let records = Arc::new(HeadRecords::new(membership.clone()));
        let p = Placement::new(NodeId::new(), membership, records, true);
        pending(
            &p,
            PlacementStrategy::StrictPack,
            vec![shape(1.0, 1.0), shape(2.0, 0.0)],
        );
        pending(
            &p,
            PlacementStrategy::Spread,
            vec![shape(1.0, 0.0), shape(1.0, 0.0)],
        );
        pending(
            &p,
            PlacementStrategy::StrictSpread,
            vec![shape(2.0, 0.0), shape(1.0, 1.0), shape(1.0, 0.0)],
        );
        let (mut demands, mut spread) = (vec![(shape(1.0, 0.0), 3)], Vec::new());
        p.add_demands(&mut demands, &mut spread);
        demands.sort_by_key(|(_, n)| *n);
        assert_eq!(demands, vec![(shape(3.0, 1.0), 1), (shape(1.0, 0.0), 5)]);
        assert_eq!(
            spread,
            vec![(shape(2.0, 1.0), 3)],
            "a strict-spread group: three nodes of their own, each for its widest bundle"
        );
    }
}
