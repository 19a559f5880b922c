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
//! ([`Node::replace_lost_bundles`]; one mover per group): by the group's
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
//! ([`Node::adopt_orphan_groups`]): it takes up each group whose job still
//! runs, becoming its home (and moving its bundles off the dead nodes),
//! and gives back the bundles of a group whose job died with its home.

pub(crate) mod assign;
pub(crate) mod records;
pub(crate) mod state;

use crate::node::Node;
use crate::reply::ReplyTo;
use assign::assign;
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, PlacementGroupId};
use prism_protocol::messages::{
    BundleRef, CommitBundles, DriverRecord, GetPlacementGroup, GroupRecord, ListPlacementGroups,
    MoveBundles, NodeInfo, PlacementGroupInfo, PlacementGroupSpec, PlacementGroupState,
    PlacementStrategy, PrepareBundles, RemovePlacementGroup, Response, DRIVER_RECORD_PREFIX,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::serve::Answer;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often a pending group is tried again, and a request naming a
/// bundle of a pending group looks again.
const RETRY: Duration = Duration::from_millis(100);
/// How long a request naming a bundle on a dead node waits for the bundle
/// to be placed again.
const MOVE_WAIT: Duration = Duration::from_secs(60);
/// How long one node is given to take moved bundles.
const MOVE_LIMIT: Duration = Duration::from_secs(10);

impl Node {
    /// Creates a group. On one node, or when every bundle goes to this
    /// node, it is a local group; otherwise it is placed over the cluster
    /// in the background (see the module docs).
    pub(crate) fn create_group(
        self: &Arc<Self>,
        job: JobId,
        spec: PlacementGroupSpec,
    ) -> Result<(), Error> {
        let id = spec.id;
        self.create_group_here_or_over(job, spec.clone())?;
        self.pending_groups.home.lock().push(id);
        // Placed here alone, every bundle is here; over the cluster, it is
        // recorded again once placed.
        let here = self.control(|c| c.scheduler.knows_group(id));
        let nodes = if here {
            vec![self.node_id.to_string(); spec.bundles.len()]
        } else {
            Vec::new()
        };
        self.record_group(job, &spec, nodes);
        Ok(())
    }

    /// The writer of this node's records in the head's table (its groups',
    /// and its detached actors'), once it is in a cluster.
    pub(crate) fn group_records(&self) -> Option<&records::GroupRecords> {
        let m = self.membership.get()?;
        Some(
            self.pending_groups
                .records
                .get_or_init(|| records::GroupRecords::start(m.gcs())),
        )
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
        let records = self.group_records()?;
        // Under the home list's lock, as removal's delete is: a group
        // removed meanwhile is not recorded again.
        let home = self.pending_groups.home.lock();
        home.contains(&spec.id).then(|| {
            records.put(&GroupRecord {
                spec: spec.clone(),
                job,
                home: self.node_id.to_string(),
                nodes,
            })
        })
    }

    /// Forgets the groups whose home is this node that ended with their
    /// job (the scheduler removed them), and their records.
    pub(crate) fn forget_ended_groups(self: &Arc<Self>) {
        // One lock at a time: the home list, the pending groups, the
        // scheduler's groups.
        let home = self.pending_groups.home.lock().clone();
        let pending: BTreeSet<PlacementGroupId> = {
            let groups = self.pending_groups.groups.lock();
            home.iter()
                .filter(|id| groups.contains_key(id))
                .copied()
                .collect()
        };
        let ended: BTreeSet<PlacementGroupId> = self.control(|c| {
            home.iter()
                .filter(|id| !pending.contains(id) && !c.scheduler.group_is_live(**id))
                .copied()
                .collect()
        });
        if ended.is_empty() {
            return;
        }
        let records = self.group_records();
        let mut home = self.pending_groups.home.lock();
        home.retain(|id| !ended.contains(id));
        for id in ended {
            if let Some(records) = records {
                records.forget(id);
            }
        }
    }

    /// The groups created here that are not removed. With `everywhere`,
    /// in a cluster, those of every other live node too.
    pub(crate) fn list_groups(
        self: &Arc<Self>,
        everywhere: bool,
        answer: Answer<ListPlacementGroups>,
    ) {
        // Groups gone by other ways (their job ended) are forgotten first.
        self.forget_ended_groups();
        // One lock at a time: the home list, the pending groups, the
        // scheduler's groups.
        let home = self.pending_groups.home.lock().clone();
        let placing: BTreeSet<PlacementGroupId> = {
            let pending = self.pending_groups.groups.lock();
            home.iter()
                .filter(|id| pending.contains_key(id))
                .copied()
                .collect()
        };
        let ids: Vec<PlacementGroupId> = self.control(|c| {
            home.iter()
                .filter(|id| placing.contains(id) || c.scheduler.group_is_live(**id))
                .copied()
                .collect()
        });
        match self.membership.get().filter(|_| everywhere) {
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

    fn create_group_here_or_over(
        self: &Arc<Self>,
        job: JobId,
        spec: PlacementGroupSpec,
    ) -> Result<(), Error> {
        let Some(m) = self.membership.get() else {
            return self.control(|c| c.scheduler.create_group(job, spec));
        };
        let here = self.node_id.to_string();
        let totals = m.rooms(
            &here,
            self.control(|c| c.scheduler.resources().total().clone()),
            true,
        );
        let ever = assign(&spec.bundles, spec.strategy, &totals, &here);
        match ever {
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
                return self.control(|c| c.scheduler.create_group(job, spec));
            }
            Some(_) => {}
        }
        let id = spec.id;
        self.pending_groups
            .groups
            .lock()
            .insert(id, (spec.clone(), Vec::new()));
        let node = self.clone();
        tokio::spawn(async move { node.place_in_background(job, spec).await });
        tracing::info!(group = %id, "placement group requested over the cluster");
        Ok(())
    }

    /// Places a pending group, trying again until it is placed or removed.
    async fn place_in_background(self: Arc<Self>, job: JobId, spec: PlacementGroupSpec) {
        let id = spec.id;
        let here = self.node_id.to_string();
        loop {
            if !self.pending_groups.groups.lock().contains_key(&id) {
                return; // removed while pending
            }
            let Some(m) = self.membership.get() else {
                return;
            };
            let free = self.control(|c| c.scheduler.resources().available());
            let rooms = m.rooms(&here, free, false);
            if let Some(nodes) = assign(&spec.bundles, spec.strategy, &rooms, &here) {
                match self.reserve(job, &spec, nodes).await {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::debug!(group = %id, error = %e, "placement not reserved; trying again")
                    }
                }
            }
            tokio::time::sleep(RETRY).await;
        }
        // Where the bundles are reaches the head before anyone hears the
        // group is placed (askers wait meanwhile, as the group is still
        // pending here): a home that dies right after leaves the head what
        // it needs to place the group again.
        let nodes = self.control(|c| c.scheduler.group_nodes(id));
        if let Some(written) = self.record_group(job, &spec, nodes) {
            let _ = written.await;
        }
        let waiting = self
            .pending_groups
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
        self: &Arc<Self>,
        job: JobId,
        spec: &PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.node_id.to_string();
        let m = self.membership.get().ok_or(Error::NotRegistered)?;
        let id = spec.id;
        self.control(|c| {
            c.scheduler
                .prepare_shard(job, spec.clone(), nodes.clone(), &here)
        })?;
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
            self.control(|c| c.scheduler.remove_group(id));
            for node in prepared {
                self.tell_node_remove(node, id);
            }
            return Err(e);
        }
        self.control(|c| c.scheduler.commit_shard(id))
    }

    /// A node died: the groups created here with bundles on it get those
    /// bundles placed again on live nodes, in the background.
    pub(crate) fn replace_lost_bundles(self: &Arc<Self>, dead: &str) {
        let home: BTreeSet<PlacementGroupId> =
            self.pending_groups.home.lock().iter().copied().collect();
        let lost = self.control(|c| c.scheduler.groups_on_node(dead));
        for (spec, job, _) in lost.into_iter().filter(|(s, _, _)| home.contains(&s.id)) {
            tracing::warn!(group = %spec.id, node = %dead, "a node holding bundles of a placement group died; placing them again");
            self.start_moving(job, spec);
        }
    }

    /// Starts moving a group's bundles off dead nodes, unless a mover of
    /// that group runs already.
    fn start_moving(self: &Arc<Self>, job: JobId, spec: PlacementGroupSpec) {
        if !self.pending_groups.moving.lock().insert(spec.id) {
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
    async fn replace_group(self: Arc<Self>, job: JobId, spec: PlacementGroupSpec) {
        let id = spec.id;
        let here = self.node_id.to_string();
        let Some(m) = self.membership.get() else {
            self.pending_groups.moving.lock().remove(&id);
            return;
        };
        // Live holders not yet told the current nodes.
        let mut untold: BTreeSet<String> = BTreeSet::new();
        let mut moved_any = false;
        loop {
            let nodes = self.control(|c| c.scheduler.group_nodes(id));
            let lost: Vec<usize> = {
                // Under the movers' lock: a node that dies after this look
                // finds this mover gone and starts another.
                let mut moving = self.pending_groups.moving.lock();
                let lost: Vec<usize> = (0..nodes.len())
                    .filter(|&i| nodes[i] != here && m.raylet_of(&nodes[i]).is_none())
                    .collect();
                untold.retain(|n| m.raylet_of(n).is_some());
                let live = self.control(|c| c.scheduler.group_is_live(id));
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
            let current = self.control(|c| c.scheduler.group_nodes(id));
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
        self: &Arc<Self>,
        m: &crate::membership::Membership,
        job: JobId,
        spec: &PlacementGroupSpec,
        mut nodes: Vec<String>,
        lost: &[usize],
    ) -> Option<Vec<String>> {
        let (id, here) = (spec.id, self.node_id.to_string());
        let free = self.control(|c| c.scheduler.resources().available());
        let mut rooms = m.rooms(&here, free, false);
        if spec.strategy == PlacementStrategy::StrictSpread {
            rooms.retain(|r| !nodes.contains(&r.node_id));
        }
        let shapes: Vec<ResourceSet> = lost.iter().map(|&i| spec.bundles[i].clone()).collect();
        let targets = assign(&shapes, spec.strategy, &rooms, &here)?;
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
            let recorded = self.control(|c| {
                c.scheduler
                    .move_bundles(job, spec.clone(), next.clone(), &here)
            });
            if recorded.is_err() || !self.control(|c| c.scheduler.group_is_live(id)) {
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
        self: &Arc<Self>,
        m: &crate::membership::Membership,
        node: &str,
        job: JobId,
        spec: &PlacementGroupSpec,
        nodes: Vec<String>,
    ) -> Result<(), Error> {
        let here = self.node_id.to_string();
        if node == here {
            return self.control(|c| c.scheduler.move_bundles(job, spec.clone(), nodes, &here));
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
    pub(crate) fn tell_node_remove(self: &Arc<Self>, node: String, id: PlacementGroupId) {
        let Some(m) = self.membership.get() else {
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
    pub(crate) fn remove_group(self: &Arc<Self>, id: PlacementGroupId, tell_others: bool) {
        let records = self.group_records();
        {
            let mut home = self.pending_groups.home.lock();
            if home.contains(&id) {
                home.retain(|g| *g != id);
                if let Some(records) = records {
                    records.forget(id);
                }
            }
        }
        let pending = self.pending_groups.groups.lock().remove(&id);
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
        let nodes = self.control(|c| {
            let nodes = c.scheduler.group_nodes(id);
            c.scheduler.remove_group(id);
            nodes
        });
        if !tell_others {
            return;
        }
        let here = self.node_id.to_string();
        let mut others: BTreeSet<String> = nodes.into_iter().filter(|n| *n != here).collect();
        if others.is_empty() {
            // Not held here: any live node may hold a bundle of it.
            if let Some(m) = self.membership.get() {
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
        self: &Arc<Self>,
        id: PlacementGroupId,
        wait_ms: Option<u64>,
        ask_others: bool,
        reply: ReplyTo,
    ) {
        {
            let mut pending = self.pending_groups.groups.lock();
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
        let known = self.control(|c| c.scheduler.knows_group(id));
        match self.membership.get().filter(|_| ask_others && !known) {
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

    /// Answers the waiters of a pending group whose wait ran out (all of
    /// them: a waiter that gave up must not pile up).
    fn pending_deadline(&self, id: PlacementGroupId, info: PlacementGroupInfo) {
        let waiting = match self.pending_groups.groups.lock().get_mut(&id) {
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
        self: &Arc<Self>,
        bundle: BundleRef,
    ) -> Result<Option<(String, String)>, Error> {
        let Some(m) = self.membership.get() else {
            return Ok(None);
        };
        let mut waited = Duration::ZERO;
        loop {
            let node = match self.control(|c| c.scheduler.bundle_node(bundle)) {
                Some(None) => return Ok(None),
                Some(Some(node)) => node,
                None if self
                    .pending_groups
                    .groups
                    .lock()
                    .contains_key(&bundle.group) =>
                {
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
            if node == self.node_id.to_string() {
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

    /// At the head: looks for groups whose home node is dead (from their
    /// records in the head's table) and places each again from here when
    /// its job still runs, or removes it from the nodes still holding its
    /// bundles when its job is over. Run when a node dies and once when the
    /// head starts (a head started again finds the groups its earlier self
    /// was home to). One look at a time; a death during a look asks for
    /// another, and a look that could not decide about a group is made
    /// again a little later (at most `ADOPT_RETRIES` times).
    pub(crate) fn adopt_orphan_groups(self: &Arc<Self>) {
        let Some(m) = self.membership.get() else {
            return;
        };
        if !m.is_head() {
            return;
        }
        {
            let mut looking = self.pending_groups.adopting.lock();
            if looking.0 {
                looking.1 = true;
                return;
            }
            *looking = (true, false);
        }
        let node = self.clone();
        tokio::spawn(async move {
            // Should a look panic, the next node death may look again.
            struct Reset(Arc<Node>);
            impl Drop for Reset {
                fn drop(&mut self) {
                    self.0.pending_groups.adopting.lock().0 = false;
                }
            }
            let _reset = Reset(node.clone());
            let mut retries = 0;
            loop {
                let undecided = node.adopt_round().await;
                {
                    let mut looking = node.pending_groups.adopting.lock();
                    if looking.1 {
                        looking.1 = false;
                        continue;
                    }
                    if !undecided || retries == ADOPT_RETRIES {
                        looking.0 = false;
                        break;
                    }
                }
                retries += 1;
                tokio::time::sleep(ADOPT_RETRY).await;
            }
        });
    }

    /// One look over the group records (see [`Node::adopt_orphan_groups`]).
    /// Returns whether a group was left undecided (its job's state could
    /// not be read).
    async fn adopt_round(self: &Arc<Self>) -> bool {
        let Some(m) = self.membership.get() else {
            return false;
        };
        // A head that just started has no view of the live nodes until its
        // first heartbeat's answer: without one, every holder would look
        // dead.
        let view_by = std::time::Instant::now() + VIEW_WAIT;
        while m.cluster_resources().is_none() && std::time::Instant::now() < view_by {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut gcs = m.gcs();
        let records = match records::load(&mut gcs).await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "the placement groups' records could not be read");
                return true;
            }
        };
        if records.is_empty() {
            return false;
        }
        let nodes = match m.nodes().await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "the cluster's nodes could not be read");
                return true;
            }
        };
        let here = self.node_id.to_string();
        let mut undecided = false;
        for record in records {
            if record.home == here || !is_dead(&nodes, &record.home) {
                continue;
            }
            match job_runs(&mut gcs, record.job, &nodes).await {
                Ok(true) if !record.nodes.is_empty() => self.adopt_group(record),
                // Never placed: the dead home may have left prepared
                // bundles anywhere, which a new placement of the same group
                // would find in its way. It is removed everywhere; its
                // creator's wait answers that it was removed.
                Ok(true) => {
                    tracing::warn!(group = %record.spec.id, home = %record.home, "a placement group's home died before placing it; the group is removed");
                    self.end_orphan_group(record)
                }
                Ok(false) => self.end_orphan_group(record),
                Err(why) => {
                    undecided = true;
                    tracing::warn!(group = %record.spec.id, %why, "could not tell whether a placement group's job still runs; looking again later")
                }
            }
        }
        undecided
    }

    /// Becomes the home of a group whose home died while its job runs:
    /// takes it up (holding the bundles it already held here, if any),
    /// records it, moves its bundles off dead nodes, and removes it when
    /// its job ends.
    fn adopt_group(self: &Arc<Self>, record: GroupRecord) {
        let GroupRecord {
            spec,
            job,
            home,
            nodes,
        } = record;
        let id = spec.id;
        if !self.pending_groups.adopted.lock().insert(id) {
            return;
        }
        tracing::warn!(group = %id, %home, "a placement group's home node died while its job runs; the head places it again");
        let here = self.node_id.to_string();
        let taken = self.control(|c| {
            c.scheduler
                .move_bundles(job, spec.clone(), nodes.clone(), &here)
        });
        if let Err(e) = taken {
            tracing::warn!(group = %id, error = %e, "a placement group whose home died could not be taken up; it is removed");
            self.end_orphan_group(GroupRecord {
                spec,
                job,
                home,
                nodes,
            });
            return;
        }
        // Home only once it is held here: a group in the home list that the
        // scheduler does not hold counts as ended.
        self.pending_groups.home.lock().push(id);
        self.record_group(job, &spec, nodes);
        self.start_moving(job, spec);
        let node = self.clone();
        tokio::spawn(async move { node.end_with_job(job, id).await });
    }

    /// Removes an adopted group once its job is over (its driver left, or
    /// its driver's node died), checking every `JOB_CHECK`; returns when
    /// the group is removed otherwise.
    async fn end_with_job(self: Arc<Self>, job: JobId, id: PlacementGroupId) {
        let Some(m) = self.membership.get() else {
            return;
        };
        loop {
            tokio::time::sleep(JOB_CHECK).await;
            if !self.control(|c| c.scheduler.group_is_live(id)) {
                return;
            }
            let Ok(nodes) = m.nodes().await else {
                continue;
            };
            if let Ok(false) = job_runs(&mut m.gcs(), job, &nodes).await {
                tracing::info!(group = %id, %job, "the job of an adopted placement group ended; the group is removed");
                self.remove_group(id, true);
                return;
            }
        }
    }

    /// A group whose home died after its job ended (or before placing
    /// it): its bundles on live nodes are given back, and its record goes.
    fn end_orphan_group(self: &Arc<Self>, record: GroupRecord) {
        let id = record.spec.id;
        let here = self.node_id.to_string();
        let mut holders: BTreeSet<String> = record.nodes.into_iter().collect();
        if holders.is_empty() {
            // Not placed: any live node may hold a prepared bundle of it.
            if let Some(m) = self.membership.get() {
                holders = m.other_nodes().into_iter().collect();
            }
            holders.insert(here.clone());
        }
        tracing::info!(group = %id, home = %record.home, "a placement group's home node died with its job, or before placing it; its bundles are given back");
        for node in holders {
            if node == here {
                self.remove_group(id, false);
            } else if node != record.home {
                self.tell_node_remove(node, id);
            }
        }
        if let Some(records) = self.group_records() {
            records.forget(id);
        }
    }
}

/// How long a look for groups whose home died waits for the head's first
/// view of the live nodes.
const VIEW_WAIT: Duration = Duration::from_secs(10);
/// How often, and how long after, a look that left a group undecided is
/// made again.
const ADOPT_RETRIES: u32 = 60;
const ADOPT_RETRY: Duration = Duration::from_secs(5);

/// How often the head looks whether an adopted group's job still runs.
const JOB_CHECK: Duration = Duration::from_secs(1);

/// Whether `node` is dead: the head lists it dead, or no longer lists it
/// (every live node is registered with the head, and the head keeps its
/// members across its restarts, while it forgets long-dead ones).
fn is_dead(nodes: &[NodeInfo], node: &str) -> bool {
    !nodes.iter().any(|n| n.node_id == node && n.alive)
}

/// Whether job `job`'s driver still runs: its record says it has not
/// left, and its node is alive. `Err` when that cannot be read.
async fn job_runs(
    gcs: &mut prism_gcs::GcsClient,
    job: JobId,
    nodes: &[NodeInfo],
) -> Result<bool, String> {
    let key = format!("{DRIVER_RECORD_PREFIX}{job}");
    let raw = gcs.kv_get(key).await.map_err(|e| e.to_string())?;
    // Written in the background as the driver registered: a missing one is
    // not yet known, not a job without a driver.
    let Some(raw) = raw else {
        return Err(format!("no record of job {job}'s driver"));
    };
    let driver: DriverRecord = serde_json::from_slice(&raw).map_err(|e| e.to_string())?;
    Ok(driver.end_time.is_none() && nodes.iter().any(|n| n.node_id == driver.node_id && n.alive))
}
