//! The raylet as a member of a multi-node cluster: it registers with the
//! control store on the head, reports its free resources and waiting
//! demand every heartbeat period, and stops serving when the control store
//! says the node was given up (it missed its heartbeats, so its work was
//! declared lost; a node that comes back joins as a new node).

mod view;

use crate::placement::assign::NodeRoom;
use prism_gcs::pb::{Demand, NodeInfo as WireNode, NodeState};
use prism_gcs::{Exits, GcsClient, Token};
use prism_protocol::ids::{ActorId, NodeId};
use prism_protocol::messages::{ActorInfo, Call, GetActor, NodeInfo, Request, Response};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Handler};
use prism_protocol::Error;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;
use view::{free_of, from_wire_set, to_wire, View};

/// What the membership needs of its node (`crate::node::Node` implements
/// it): what to register, what each heartbeat reports, and what to do when
/// the cluster's view changes.
pub(crate) trait MemberNode: Send + Sync + 'static {
    /// The node's id.
    fn node_id(&self) -> NodeId;
    /// The node's session directory.
    fn session_dir(&self) -> &Path;
    /// The node's total resources and those free now.
    fn resources(self: &Arc<Self>) -> (ResourceSet, ResourceSet);
    /// The node's free resources and the demand waiting here, read at
    /// once.
    fn load(self: &Arc<Self>) -> Load;
    /// The node's membership, once registered.
    fn membership(&self) -> Option<&Membership>;
    /// Node `dead` left the cluster (the head no longer lists it).
    fn node_left(self: &Arc<Self>, dead: &str);
    /// Processes of other nodes at `addresses` exited: what they owned
    /// here is freed.
    fn owners_exited(&self, addresses: &[String]);
    /// Takes out the waiting requests that may go to another node and for
    /// which `place` finds one (its raylet and id), and sends each on there.
    fn spill_waiting(self: &Arc<Self>, place: impl FnMut(&ResourceSet) -> Option<(String, String)>);
    /// Whether work that fits no live node waits for one to join (a
    /// cluster an autoscaler grows): then waiting demand is told to the
    /// head at once and every [`QUICK_BEAT`] while it waits, and a joined
    /// node is seen as soon.
    fn waits_for_nodes(&self) -> bool;
}

/// What a node tells the head of its load with each heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Load {
    /// Its free resources.
    pub(crate) free: ResourceSet,
    /// The shapes waiting here for resources (lease requests, actors and
    /// placement-group bundles waiting for a node), with how many of each.
    pub(crate) demands: Vec<(ResourceSet, u64)>,
    /// Demand whose items each need a node of their own (a strict-spread
    /// group's bundles): a shape and how many, one entry per group.
    pub(crate) spread: Vec<(ResourceSet, u64)>,
}

/// How often a node beats while demand waits in a cluster that grows.
pub(crate) const QUICK_BEAT: Duration = Duration::from_millis(50);
/// How long after waiting demand takes a new shape a node keeps beating
/// every [`QUICK_BEAT`]: long enough for a node launched for it to join,
/// short enough that a cluster busy with the same work for long beats at
/// its period.
const QUICK_WINDOW: Duration = Duration::from_secs(30);

/// How a raylet joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterLink {
    /// The head's control store, `HOST:PORT`.
    pub head: String,
    /// The cluster token.
    pub token: Token,
    /// The address other nodes reach this node at.
    pub node_ip: String,
    /// Whether this node is the head.
    pub is_head: bool,
    /// How long a call to the head keeps trying while the head cannot be
    /// reached (see [`prism_gcs::GcsClient::with_patience`]).
    pub head_patience: Duration,
    /// Where the node serves its metrics (`HOST:PORT`), told to the head
    /// for Prometheus's service discovery.
    pub metrics_address: Option<String>,
}

/// A raylet's membership, once registered.
#[derive(Debug)]
pub(crate) struct Membership {
    node_id: String,
    /// The address other nodes reach this node at.
    node_ip: String,
    /// The live nodes as of the last heartbeat's answer.
    view: parking_lot::Mutex<View>,
    /// Where the next SPREAD request starts looking.
    spread_next: std::sync::atomic::AtomicUsize,
    /// Grows each time a room may have grown: an answer changed the view,
    /// or this node's own free resources grew (placement waits on it).
    room_changes: watch::Sender<u64>,
    /// Connections to other nodes' raylets (actor lookups).
    peers: Peers,
    client: GcsClient,
    cluster_id: String,
    /// Whether this node is the head.
    is_head: bool,
    lost: watch::Receiver<Option<String>>,
    beating: tokio::task::JoinHandle<()>,
    /// Wakes the heartbeat task before its period.
    nudge: Arc<tokio::sync::Notify>,
    /// How many heartbeats' answers were applied to the view.
    beats: watch::Sender<u64>,
    /// This node's processes that exited, for the next heartbeat to tell.
    exited: Exited,
}

/// Addresses of a node's processes that exited, until a heartbeat tells
/// them; at most [`MAX_EXITS_TOLD`] are kept (the oldest go first).
type Exited = Arc<parking_lot::Mutex<std::collections::VecDeque<String>>>;

/// The most exits a node keeps for its next heartbeat (the control store
/// takes no more in one).
const MAX_EXITS_TOLD: usize = 10_000;

impl Membership {
    /// Registers `node` with the head and starts its heartbeats.
    pub(crate) async fn join<N: MemberNode>(
        node: &Arc<N>,
        link: &ClusterLink,
        raylet_address: String,
    ) -> Result<Membership, Error> {
        let mut client = GcsClient::connect(&link.head, &link.token)
            .await
            .map_err(Error::from)?
            .with_patience(link.head_patience);
        let (total, available) = node.resources();
        let info = WireNode {
            node_id: node.node_id().to_string(),
            node_ip: link.node_ip.clone(),
            hostname: hostname(),
            is_head: link.is_head,
            state: NodeState::Alive as i32,
            total: to_wire(&total),
            available: to_wire(&available),
            session_dir: node.session_dir().display().to_string(),
            pid: std::process::id(),
            raylet_address,
            metrics_address: link.metrics_address.clone().unwrap_or_default(),
            ..WireNode::default()
        };
        let reply = client.register_node(info).await.map_err(Error::from)?;
        let period = Duration::from_millis(reply.heartbeat_period_ms.max(10));
        let (tell, lost) = watch::channel(None);
        let nudge = Arc::new(tokio::sync::Notify::new());
        let exited = Exited::default();
        let beating = tokio::spawn(beat(
            Arc::downgrade(node),
            client.clone(),
            period,
            tell,
            nudge.clone(),
            exited.clone(),
        ));
        tracing::info!(head = %link.head, cluster = %reply.cluster_id, "joined the cluster");
        Ok(Membership {
            node_id: node.node_id().to_string(),
            node_ip: link.node_ip.clone(),
            view: parking_lot::Mutex::new(View::new(&node.node_id().to_string())),
            spread_next: std::sync::atomic::AtomicUsize::new(0),
            room_changes: watch::Sender::new(0),
            peers: Peers::default(),
            client,
            cluster_id: reply.cluster_id,
            is_head: link.is_head,
            lost,
            beating,
            nudge,
            beats: watch::Sender::new(0),
            exited,
        })
    }

    /// Waits until a heartbeat sent after this call is answered (bringing
    /// beats forward), for at most a second: the view then holds every
    /// node the head knew of when it was called.
    pub(crate) async fn fresh_view(&self) {
        let mut beats = self.beats.subscribe();
        let start = *beats.borrow_and_update();
        // A beat in flight may have left before the call: the one after
        // it is the first that counts.
        let fresh = async {
            while *beats.borrow_and_update() < start + 2 {
                self.nudge();
                if beats.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), fresh).await;
    }

    /// Asks for a heartbeat now (at most one per [`QUICK_BEAT`]): demand
    /// arrived that the head's autoscaler should see.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// This node's id and address.
    pub(crate) fn node(&self) -> (&str, &str) {
        (&self.node_id, &self.node_ip)
    }

    /// The cluster's id.
    pub(crate) fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Whether this node is the head.
    pub(crate) fn is_head(&self) -> bool {
        self.is_head
    }

    /// Why the control store gave this node up, once it did.
    pub(crate) fn given_up(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Waits until the control store gives this node up; returns why.
    pub(crate) async fn lost(&self) -> String {
        let mut lost = self.lost.clone();
        let cause = match lost.wait_for(Option::is_some).await {
            Ok(cause) => cause.clone().unwrap_or_default(),
            Err(_) => "the heartbeat task ended".into(),
        };
        cause
    }

    /// Leaves the cluster on purpose (`prism stop`).
    pub(crate) async fn leave(&self, reason: &str) {
        self.beating.abort();
        // A head that is down is not waited for long: the node leaves
        // anyway, and the head marks it dead when it is back.
        let mut client = self.client.clone().with_patience(LEAVE_PATIENCE);
        if let Err(e) = client.unregister_node(&self.node_id, reason).await {
            tracing::warn!(error = %e, "could not tell the head that this node leaves");
        }
    }

    /// Where to send a lease request that does not fit here now: the live
    /// node (other than this one) with the most CPUs free among those that
    /// have `shape` free; failing that, when this node could never hold
    /// it, the first whose total holds it. `Err(Infeasible)` when no node's
    /// total holds it and this node's does not either.
    pub(crate) fn spill_target(
        &self,
        shape: &ResourceSet,
        fits_here_ever: bool,
        here_total: &ResourceSet,
    ) -> Result<Option<(String, String)>, Error> {
        let mut view = self.view.lock();
        let is_other = |n: &&WireNode| n.node_id != self.node_id && !n.raylet_address.is_empty();
        let free_cpus = |n: &WireNode| {
            n.available
                .iter()
                .find(|r| r.name == prism_protocol::resources::CPU)
                .map(|r| r.units)
                .unwrap_or(0)
        };
        let best = view
            .iter()
            .filter(is_other)
            .filter(|n| free_of(n).contains(shape))
            .max_by_key(|n| free_cpus(n))
            .map(|n| (n.raylet_address.clone(), n.node_id.clone()));
        if let Some((raylet, id)) = best {
            // Count the request against that node until the next answer.
            view.lower(&id, shape);
            return Ok(Some((raylet, id)));
        }
        let others = view.iter().filter(is_other);
        if fits_here_ever {
            return Ok(None);
        }
        if let Some(n) = others
            .clone()
            .find(|n| from_wire_set(&n.total).contains(shape))
        {
            return Ok(Some((n.raylet_address.clone(), n.node_id.clone())));
        }
        let mut totals = vec![format!("{} (here): {here_total}", self.node_id)];
        totals.extend(others.map(|n| format!("{}: {}", n.node_id, from_wire_set(&n.total))));
        Err(Error::Infeasible {
            shape: shape.to_string(),
            total: totals.join("; "),
        })
    }

    /// The other live nodes' rooms for placement (see [`view::Rooms`]):
    /// their total resources (`totals`) or their free ones as of the last
    /// heartbeat, less this node's own counts since, in id order. Shared
    /// with the view until it changes: nothing is copied.
    pub(crate) fn rooms(&self, totals: bool) -> Arc<Vec<NodeRoom>> {
        let rooms = self.view.lock().rooms();
        if totals {
            rooms.total
        } else {
            rooms.free
        }
    }

    /// Counts bundles placed on other nodes (`nodes[i]` holds
    /// `bundles[i]`) against their free resources until the next answer
    /// says what they really have free, so that placements made before
    /// it do not all pick the same node.
    pub(crate) fn count_placed(&self, bundles: &[ResourceSet], nodes: &[String]) {
        let mut view = self.view.lock();
        for (bundle, node) in bundles.iter().zip(nodes) {
            if *node != self.node_id {
                view.lower(node, bundle);
            }
        }
    }

    /// A receiver told each time a room may have grown (see
    /// [`room_may_have_grown`](Self::room_may_have_grown)).
    pub(crate) fn room_changes(&self) -> watch::Receiver<u64> {
        self.room_changes.subscribe()
    }

    /// Some node's room may have grown (resources were given back): a
    /// placement waiting for room tries again. Heartbeats call it when an
    /// answer changed the view or this node's free resources grew.
    pub(crate) fn room_may_have_grown(&self) {
        self.room_changes.send_modify(|n| *n += 1);
    }

    /// The other live nodes' ids.
    pub(crate) fn other_nodes(&self) -> Vec<String> {
        self.view
            .lock()
            .iter()
            .filter(|n| n.node_id != self.node_id)
            .map(|n| n.node_id.clone())
            .collect()
    }

    /// A client of the head's control store.
    pub(crate) fn gcs(&self) -> GcsClient {
        self.client.clone()
    }

    /// The raylet of a live node.
    pub(crate) fn raylet_of(&self, node_id: &str) -> Option<String> {
        self.view
            .lock()
            .get(node_id)
            .filter(|n| !n.raylet_address.is_empty())
            .map(|n| n.raylet_address.clone())
    }

    /// The next node in turn (by id) that has `shape` free, or failing
    /// that whose total holds it ([`View::spread_pick`]): `Some(None)` for
    /// this one, `Some(Some(raylet, node))` for another; `None` when no
    /// node could ever hold it.
    pub(crate) fn spread_target(&self, shape: &ResourceSet) -> Option<Option<(String, String)>> {
        let mut view = self.view.lock();
        let start = self
            .spread_next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (node, free) = view.spread_pick(start, shape)?;
        let (raylet, id) = (node.raylet_address.clone(), node.node_id.clone());
        if id == self.node_id {
            return Some(None);
        }
        if free {
            view.lower(&id, shape);
        }
        Some(Some((raylet, id)))
    }

    /// The connection to live node `node_id`'s raylet (opened once).
    pub(crate) fn raylet_conn(
        &self,
        node_id: &str,
    ) -> impl std::future::Future<Output = Result<Connection, Error>> + Send + 'static {
        let raylet = self.raylet_of(node_id);
        let (target, node, peers) = (
            node_id.to_string(),
            self.node_id.clone(),
            self.peers.clone(),
        );
        async move {
            let raylet = raylet.ok_or_else(|| Error::NodeNotAlive {
                node_id: target.to_string(),
            })?;
            peer(&peers, &raylet, &node).await
        }
    }

    /// Asks live node `node_id`'s raylet `request`, bounded like every
    /// question between nodes. A raylet asked this way answers from what it
    /// holds itself and never asks on.
    pub(crate) fn ask_node<C>(
        &self,
        node_id: &str,
        request: C,
    ) -> impl std::future::Future<Output = Result<C::Reply, Error>> + Send + 'static
    where
        C: Call + Send + 'static,
        C::Reply: Send,
    {
        let conn = self.raylet_conn(node_id);
        let node_id = node_id.to_string();
        async move {
            let asked = async { conn.await?.request(request).await };
            tokio::time::timeout(ASK_LIMIT, asked)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::NodeTimeout {
                        node_id,
                        waited_ms: ASK_LIMIT.as_millis() as u64,
                    })
                })
        }
    }

    /// Asks the other live nodes' raylets `request`, one after another,
    /// and gives the first answer that is not an error (`None` when none
    /// gives one). A raylet asked this way answers from what it holds
    /// itself and never asks on.
    pub(crate) fn ask_others<C>(
        &self,
        request: C,
    ) -> impl std::future::Future<Output = Option<C::Reply>> + Send + 'static
    where
        C: Call + Clone + Send + 'static,
        C::Reply: Send,
    {
        let asking = self.ask_each(request, true);
        async move { asking.await.into_iter().next() }
    }

    /// Asks every other live node's raylet `request` and gives every
    /// answer that is not an error (a node that cannot be reached is left
    /// out).
    pub(crate) fn ask_all<C>(
        &self,
        request: C,
    ) -> impl std::future::Future<Output = Vec<C::Reply>> + Send + 'static
    where
        C: Call + Clone + Send + 'static,
        C::Reply: Send,
    {
        self.ask_each(request, false)
    }

    /// The answers of the other live nodes' raylets to `request`, asked
    /// one after another (stopping at the first with `first_only`).
    fn ask_each<C>(
        &self,
        request: C,
        first_only: bool,
    ) -> impl std::future::Future<Output = Vec<C::Reply>> + Send + 'static
    where
        C: Call + Clone + Send + 'static,
        C::Reply: Send,
    {
        let raylets = self.other_raylets();
        let (node, peers) = (self.node_id.clone(), self.peers.clone());
        async move {
            let mut answers = Vec::new();
            for raylet in raylets {
                let one = request.clone();
                let asked = async {
                    let conn = peer(&peers, &raylet, &node).await?;
                    conn.request(one).await
                };
                // Bounded: a node cut off but not yet declared dead does
                // not answer at all.
                match tokio::time::timeout(ASK_LIMIT, asked).await {
                    Ok(Ok(answer)) => {
                        answers.push(answer);
                        if first_only {
                            break;
                        }
                    }
                    Ok(Err(e)) => tracing::debug!(%raylet, error = %e, "a node could not be asked"),
                    Err(_) => tracing::debug!(%raylet, "a node did not answer in time"),
                }
            }
            answers
        }
    }

    /// A process of this node at `address` exited: the other nodes hear
    /// of it with their next heartbeats' answers, after this node's next
    /// heartbeat tells the head, and free what it owned there.
    pub(crate) fn owner_exited(&self, address: String) {
        static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut exited = self.exited.lock();
        if exited.len() >= MAX_EXITS_TOLD {
            exited.pop_front();
            let dropped = DROPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "exits wait for a heartbeat that does not reach the head; the oldest are \
                     not told (copies of their objects on other nodes stay until evicted)"
                );
            }
        }
        exited.push_back(address);
    }

    /// The raylets of the other live nodes.
    fn other_raylets(&self) -> Vec<String> {
        self.view
            .lock()
            .iter()
            .filter(|n| n.node_id != self.node_id && !n.raylet_address.is_empty())
            .map(|n| n.raylet_address.clone())
            .collect()
    }

    /// Looks an actor up on the other live nodes (it was started by one
    /// of them): the first that knows it answers.
    pub(crate) fn find_actor(
        &self,
        actor_id: ActorId,
        wait: bool,
    ) -> impl std::future::Future<Output = Result<ActorInfo, Error>> + Send + 'static {
        let asking = self.ask_others(GetActor {
            actor_id,
            wait,
            node_id: None,
        });
        async move {
            asking.await.ok_or_else(|| Error::ActorDied {
                actor_id,
                class: "?".into(),
                reason: "no live node of the cluster knows this actor; the node it ran on may \
                         have died"
                    .into(),
            })
        }
    }

    /// Sends the local requests waiting here on to nodes that now have
    /// their resources free (the view just changed): a request queued
    /// behind long tasks does not wait for them while another node idles.
    fn respill<N: MemberNode>(&self, node: &Arc<N>) {
        let none = ResourceSet::new();
        node.spill_waiting(|shape| self.spill_target(shape, true, &none).ok().flatten());
    }

    /// The live nodes' total and free resources, summed.
    pub(crate) fn cluster_resources(&self) -> Option<(ResourceSet, ResourceSet)> {
        let view = self.view.lock();
        if view.is_empty() {
            return None;
        }
        let (mut total, mut available) = (ResourceSet::new(), ResourceSet::new());
        for n in view.iter() {
            total.add(&from_wire_set(&n.total));
            available.add(&from_wire_set(&n.available));
        }
        Some((total, available))
    }

    /// Every node of the cluster, from the head.
    pub(crate) async fn nodes(&self) -> Result<Vec<NodeInfo>, Error> {
        let mut client = self.client.clone();
        let nodes = client.get_nodes().await.map_err(Error::from)?;
        Ok(nodes.into_iter().map(from_wire).collect())
    }
}

type Peers = Arc<tokio::sync::Mutex<std::collections::HashMap<String, Connection>>>;

/// How long a node that leaves waits for a head that does not answer.
const LEAVE_PATIENCE: Duration = Duration::from_secs(2);

/// How long one node is given to answer a question another node asks it.
const ASK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The open connection to another node's raylet, made once.
async fn peer(peers: &Peers, raylet: &str, node: &str) -> Result<Connection, Error> {
    let mut open = peers.lock().await;
    if let Some(c) = open.get(raylet).filter(|c| !c.is_closed()) {
        return Ok(c.clone());
    }
    let conn = Connection::connect_to(raylet, Some(node), Arc::new(AsksOnly)).await?;
    open.insert(raylet.to_string(), conn.clone());
    Ok(conn)
}

/// This side of a raylet-to-raylet connection serves nothing.
struct AsksOnly;

impl Handler for AsksOnly {
    fn handle(&self, conn: &Connection, id: Option<u64>, _request: Request) {
        conn.respond(
            id,
            Response::Error(Error::NotServed {
                service: "a raylet's lookup connection".into(),
                request: "any request".into(),
            }),
        );
    }
}

/// Sends a heartbeat every `period` until the node is gone or the head
/// says it was given up. A head that does not answer is logged once per
/// outage and tried again: the node keeps serving its local work.
async fn beat<N: MemberNode>(
    node_ref: Weak<N>,
    mut client: GcsClient,
    period: Duration,
    tell: watch::Sender<Option<String>>,
    nudge: Arc<tokio::sync::Notify>,
    exited: Exited,
) {
    let mut unreachable = false;
    // Where the next beat goes on in the head's log of other nodes' exits.
    let mut exits_from = 0;
    let mut first = true;
    let mut quick = false;
    // The shapes of the demand last told, and when they changed.
    let mut told: Vec<ResourceSet> = Vec::new();
    let mut changed_at = tokio::time::Instant::now();
    // This node's free resources at the last beat: ones that grew wake
    // the placements waiting for room.
    let mut free_before = ResourceSet::new();
    loop {
        if !first {
            // Beats are QUICK_BEAT apart at least; while demand waits in a
            // cluster that grows, that often; else every period, or
            // sooner when nudged.
            let started = tokio::time::Instant::now();
            tokio::time::sleep(QUICK_BEAT.min(period)).await;
            if !quick {
                tokio::select! {
                    _ = tokio::time::sleep_until(started + period) => {}
                    _ = nudge.notified() => {}
                }
            }
        }
        first = false;
        let Some(node) = node_ref.upgrade() else {
            return;
        };
        let id = node.node_id().to_string();
        let Load {
            free: available,
            demands,
            spread,
        } = node.load();
        if node.waits_for_nodes() {
            let shapes: Vec<ResourceSet> = (demands.iter().chain(&spread))
                .map(|(s, _)| s.clone())
                .collect();
            if shapes != told {
                told = shapes;
                changed_at = tokio::time::Instant::now();
            }
            quick = !told.is_empty() && changed_at.elapsed() < QUICK_WINDOW;
        }
        let grew_here = !free_before.contains(&available);
        free_before = available.clone();
        // Until the membership is set (the first beats of a join), the
        // node holds no view and asks for all of it.
        let since = node.membership().map_or((0, 0), |m| m.view.lock().since());
        drop(node);
        let demands = (demands.into_iter().map(|d| (d, false)))
            .chain(spread.into_iter().map(|d| (d, true)))
            .map(|((shape, count), spread)| Demand {
                shape: to_wire(&shape),
                count,
                spread,
            })
            .collect::<Vec<_>>();
        let available = to_wire(&available);
        let telling: Vec<String> = exited.lock().drain(..).collect();
        let exits = Exits {
            exited: telling.clone(),
            from: exits_from,
        };
        let answer = client.heartbeat_since(&id, available, demands, since, exits);
        let answer = answer.await;
        if answer.is_err() {
            // Told with the next beat that reaches the head.
            let mut left = exited.lock();
            for address in telling.into_iter().rev() {
                left.push_front(address);
            }
            left.truncate(MAX_EXITS_TOLD);
        }
        match answer {
            Ok(reply) if reply.alive => {
                exits_from = reply.exits_next;
                if !reply.exited.is_empty() {
                    if let Some(node) = node_ref.upgrade() {
                        node.owners_exited(&reply.exited);
                    }
                }
                if let Some(node) = node_ref.upgrade() {
                    if let Some(m) = node.membership() {
                        let (died, changed) = {
                            let mut view = m.view.lock();
                            let before = view.changes();
                            let died = view.apply(reply);
                            (died, view.changes() != before)
                        };
                        m.beats.send_modify(|n| *n += 1);
                        if changed || grew_here {
                            m.room_may_have_grown();
                        }
                        for dead in died {
                            tracing::warn!(node = %dead, "a node left the cluster; telling this node's processes");
                            node.node_left(&dead);
                        }
                        m.respill(&node);
                    }
                }
                if unreachable {
                    tracing::info!("the head answers heartbeats again");
                    unreachable = false;
                }
            }
            Ok(reply) => {
                tracing::error!(cause = %reply.death_cause, "the head gave this node up; it stops");
                let _ = tell.send(Some(reply.death_cause));
                return;
            }
            Err(e) => {
                if !unreachable {
                    tracing::warn!(error = %e, "a heartbeat did not reach the head; trying again");
                    unreachable = true;
                }
            }
        }
    }
}

fn from_wire(n: WireNode) -> NodeInfo {
    NodeInfo {
        alive: n.state == NodeState::Alive as i32,
        total: from_wire_set(&n.total),
        available: from_wire_set(&n.available),
        node_id: n.node_id,
        node_ip: n.node_ip,
        hostname: n.hostname,
        is_head: n.is_head,
        death_cause: n.death_cause,
    }
}

/// This machine's host name.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::resources::Quantity;

    #[test]
    fn resources_cross_the_wire_unchanged() {
        let mut set = ResourceSet::new();
        set.set("CPU", Quantity::whole(2));
        set.set("GPU", Quantity::from_units(5_000));
        set.set("disk", Quantity::whole(1));
        assert_eq!(from_wire_set(&to_wire(&set)), set);
    }
}
