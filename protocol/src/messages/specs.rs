//! The data the messages carry: task and actor specs, arguments and
//! values, placement groups, scheduling strategies, and the answers'
//! payloads (leases, registrations, locations, node and store stats).
//! Re-exported whole from [`crate::messages`].

use crate::error::Error;
use crate::ids::{ActorId, JobId, LeaseId, NodeId, ObjectId, PlacementGroupId, TaskId, WorkerId};
use crate::resources::ResourceSet;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Environment variables of a runtime environment (Ray's `env_vars`), in
/// name order: a worker started with one set serves only requests that
/// ask for the same.
pub type EnvVars = std::collections::BTreeMap<String, String>;

/// Where a core worker listens: a Unix socket path.
pub type Address = String;

/// A reference to an object and the process that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectRefInfo {
    /// The object.
    pub id: ObjectId,
    /// Its owner's address.
    pub owner: Address,
}

/// One argument of a task or actor call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ArgSpec {
    /// An encoded value carried in the message.
    Value(Bytes),
    /// An object the executor fetches before running.
    Ref(ObjectRefInfo),
}

/// A task or actor method call ready to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskSpec {
    /// This invocation.
    pub task_id: TaskId,
    /// The registered name (`function` or `Class::method`).
    pub function: String,
    /// The arguments, in order.
    pub args: Vec<ArgSpec>,
    /// The object the result is stored as (the first result, when the
    /// call returns several).
    pub return_id: ObjectId,
    /// The objects its further results are stored as, in order, when the
    /// call returns several (`num_returns`); empty otherwise.
    pub more_returns: Vec<ObjectId>,
    /// The call streams its results (`num_returns = "streaming"`): the
    /// executor sends each value to the caller as it is made
    /// ([`OwnerRequest::StreamItem`]), and `return_id` gets the number of
    /// values once the call ends.
    pub streaming: bool,
    /// For a streaming call with backpressure `n`: the executor waits for
    /// the oldest answer once more than `n` values are unanswered, and the
    /// caller holds its answers back while more than `n` wait unread; 0:
    /// no bound but the executor's own window.
    pub stream_backpressure: u32,
    /// The caller, who owns the results.
    pub caller: Address,
}

impl TaskSpec {
    /// A new call (a fresh task id) of `function` with `args`, made by
    /// `caller`, whose results are stored as `return_id` (which also names
    /// the call) and then `more_returns`. Not streaming; see
    /// [`TaskSpec::streaming`].
    ///
    /// ```
    /// use prism_protocol::ids::ObjectId;
    /// use prism_protocol::messages::TaskSpec;
    /// let first = ObjectId::new();
    /// let spec = TaskSpec::new("add".into(), Vec::new(), first, Vec::new(), "/s/core.sock".into());
    /// assert!(spec.makes(first) && !spec.streaming);
    /// ```
    pub fn new(
        function: String,
        args: Vec<ArgSpec>,
        return_id: ObjectId,
        more_returns: Vec<ObjectId>,
        caller: Address,
    ) -> TaskSpec {
        TaskSpec {
            task_id: TaskId::new(),
            function,
            args,
            return_id,
            more_returns,
            streaming: false,
            stream_backpressure: 0,
            caller,
        }
    }

    /// The same call, streaming its values (`num_returns = "streaming"`),
    /// with `stream_backpressure` (0: no bound but the executor's window).
    pub fn streaming(mut self, streaming: bool, stream_backpressure: u32) -> TaskSpec {
        self.streaming = streaming;
        self.stream_backpressure = stream_backpressure;
        self
    }

    /// Every object the call's results are stored as, first to last.
    pub fn returns(&self) -> impl Iterator<Item = ObjectId> + '_ {
        std::iter::once(self.return_id).chain(self.more_returns.iter().copied())
    }

    /// Whether `id` is one of the call's results.
    pub fn makes(&self, id: ObjectId) -> bool {
        self.return_id == id || self.more_returns.contains(&id)
    }
}

/// A finished value, as its producer hands it to the owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ObjectValue {
    /// Small values travel in the message.
    Inline(Bytes),
    /// Large values were written to a node's shared-memory store.
    InStore {
        /// Encoded size in bytes.
        size: u64,
        /// The node whose store holds it, in a multi-node cluster (`None`
        /// on a single node). A reader on another node pulls a copy into
        /// its own store first (`PullObject`).
        node: Option<String>,
    },
}

/// A value plus the object references serialized inside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReturnObject {
    /// The value.
    pub value: ObjectValue,
    /// References nested in the value; the producer registered the receiver
    /// as their borrower before answering.
    pub contained: Vec<ObjectRefInfo>,
    /// A call's further results (see [`TaskSpec::more_returns`]), in
    /// order; empty for one object.
    pub more: Vec<ReturnObject>,
}

/// The options an actor is created with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActorOptions {
    /// A name to find it by, unique in its namespace.
    pub name: Option<String>,
    /// The namespace of the name.
    pub namespace: String,
    /// How many calls may run at once.
    pub max_concurrency: u32,
    /// An actor with async methods left at its default concurrency (Ray's
    /// async actor): its calls start one at a time in arrival order; a
    /// synchronous one runs to its end before the next starts, an async
    /// one runs on (past its first suspension) while later calls start, up
    /// to `max_concurrency` at once. `false`: `max_concurrency` 1 runs one
    /// call at a time, more runs synchronous calls on that many threads.
    pub async_actor: bool,
    /// Resources held for the actor's lifetime.
    pub resources: ResourceSet,
    /// The placement-group bundle its resources come from, if any.
    pub placement: Option<BundleRef>,
    /// Which node of a cluster it is placed on.
    pub strategy: SchedulingStrategy,
    /// How many times its process is restarted after it dies (-1: no
    /// limit).
    pub max_restarts: i64,
    /// How many times a call that was running when the process died is
    /// sent again to the restarted actor (-1: no limit).
    pub max_task_retries: i64,
    /// Outlives its job's driver (Ray's `lifetime="detached"`).
    pub detached: bool,
    /// Save its state after every this many calls (0: not by count).
    pub checkpoint_every: u32,
    /// Save its state after a call once this long has passed since the
    /// last save (0: not by time).
    pub checkpoint_interval_ms: u64,
    /// Environment variables of its process, beyond its job's.
    #[serde(default)]
    pub env_vars: EnvVars,
}

/// The key-value table key under which an actor's latest checkpoint is
/// kept (removed when the actor is dead for good).
pub fn actor_checkpoint_key(actor: ActorId) -> String {
    format!("{ACTOR_CHECKPOINT_PREFIX}{actor}")
}

/// What every actor checkpoint's key begins with.
pub const ACTOR_CHECKPOINT_PREFIX: &str = "prism/actor-checkpoint/";

/// The key-value table prefix under which each driver of a cluster is
/// recorded ([`DriverRecord`], JSON) by the raylet it registered with: the
/// head lists them as jobs of type DRIVER.
pub const DRIVER_RECORD_PREFIX: &str = "prism/driver/";

/// A driver as the head's job list shows it, kept in the key-value table
/// under [`DRIVER_RECORD_PREFIX`] and its job id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverRecord {
    /// The job id the raylet gave it.
    pub job_id: String,
    /// The submission it runs for, when the Jobs API started it.
    pub submission_id: Option<String>,
    /// Its process id.
    pub pid: u32,
    /// The node it runs on.
    pub node_id: String,
    /// That node's address.
    pub node_ip: String,
    /// Its command line.
    pub entrypoint: String,
    /// When it registered, in Unix milliseconds.
    pub start_time: u64,
    /// When its connection closed, in Unix milliseconds.
    pub end_time: Option<u64>,
}

/// The key-value table prefix under which each placement group of a
/// cluster is recorded ([`GroupRecord`], JSON) by its home raylet, so that
/// the head can place it again when its home dies.
pub const GROUP_RECORD_PREFIX: &str = "prism/pg/";

/// The key-value table key of a placement group's record.
pub fn group_record_key(id: PlacementGroupId) -> String {
    format!("{GROUP_RECORD_PREFIX}{id}")
}

/// A placement group as its home raylet records it in the head's
/// key-value table (under [`group_record_key`]) while it is not removed:
/// its spec, its job, the node that places it, and where each bundle is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The group's spec.
    pub spec: PlacementGroupSpec,
    /// The job it belongs to (it ends with the job).
    pub job: JobId,
    /// The node that places it and moves its bundles (its home).
    pub home: String,
    /// Each bundle's node; empty while the group is not placed yet.
    pub nodes: Vec<String>,
}

/// The key-value table prefix under which each detached actor of a
/// cluster is recorded ([`DetachedRecord`], JSON) by the node that runs it,
/// so that the head can create it again when that node dies.
pub const DETACHED_RECORD_PREFIX: &str = "prism/detached/";

/// A detached actor as the node running it records it in the head's
/// key-value table (under [`DETACHED_RECORD_PREFIX`] and its id) while it
/// lives: what the head needs to create it again on another node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DetachedRecord {
    /// Its spec, with the restarts counted so far.
    pub spec: ActorSpec,
    /// The node running it.
    pub node: String,
    /// The job's program as that node runs it (a path there).
    pub executable: PathBuf,
    /// The program's identity, so another node finds or fetches the same.
    pub program: Option<crate::program::Program>,
    /// The job's namespace.
    pub namespace: String,
    /// The job's environment variables for its workers.
    pub env_vars: EnvVars,
}

/// The most bytes one `ReadProgram` asks for.
pub const PROGRAM_CHUNK: u64 = 8 << 20;

/// Where a task may run in a multi-node cluster (Ray's
/// `scheduling_strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SchedulingStrategy {
    /// The caller's node while it has room, then the least loaded node
    /// that has.
    #[default]
    Default,
    /// Over every node with room, in turn (Ray's `"SPREAD"`).
    Spread,
    /// On one node (Ray's `NodeAffinitySchedulingStrategy`): with `soft`,
    /// elsewhere when that node is dead or unknown; without, such a task
    /// fails.
    NodeAffinity {
        /// The node, as `prism::nodes()` lists it.
        node_id: NodeId,
        /// Whether another node may run it when that one cannot.
        soft: bool,
    },
}

/// A bundle of a placement group that a task or actor is scheduled into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BundleRef {
    /// The group.
    pub group: PlacementGroupId,
    /// The bundle's index, or `None` for any bundle of the group with room.
    pub index: Option<u32>,
}

/// How a placement group's bundles are spread over nodes (Ray's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PlacementStrategy {
    /// As few nodes as possible; spread when one node cannot hold them all.
    Pack,
    /// As many nodes as possible, several bundles per node when needed.
    Spread,
    /// All bundles on one node, or none.
    StrictPack,
    /// Every bundle on a different node, or none.
    StrictSpread,
}

/// A request to reserve bundles of resources together.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlacementGroupSpec {
    /// The group.
    pub id: PlacementGroupId,
    /// An optional name, for tools and logs.
    pub name: Option<String>,
    /// The bundles, in index order.
    pub bundles: Vec<ResourceSet>,
    /// The strategy.
    pub strategy: PlacementStrategy,
}

/// Where a placement group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementGroupState {
    /// Waiting for resources.
    Pending,
    /// Every bundle reserved.
    Created,
    /// Removed; its resources went back to the node.
    Removed,
}

/// What the control store says about a placement group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlacementGroupInfo {
    /// The request it was created from.
    pub spec: PlacementGroupSpec,
    /// Its state.
    pub state: PlacementGroupState,
    /// The GPU devices reserved for each bundle (empty for a bundle held
    /// by another node).
    pub bundle_gpus: Vec<Vec<u32>>,
    /// The node holding each bundle, in a multi-node cluster (empty on a
    /// single node).
    pub bundle_nodes: Vec<String>,
}

/// Everything needed to start an actor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActorSpec {
    /// The actor.
    pub actor_id: ActorId,
    /// Its registered class name.
    pub class: String,
    /// Constructor arguments.
    pub args: Vec<ArgSpec>,
    /// Options.
    pub options: ActorOptions,
    /// The creator's address (owner of constructor argument refs).
    pub owner: Address,
    /// The job it belongs to.
    pub job: JobId,
    /// How many times it was restarted before this creation: more than 0
    /// when its owner creates it again on another node because the node
    /// it ran on died.
    pub restarts: u32,
}

/// An actor's lifecycle state, as the control store knows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ActorState {
    /// Scheduled, constructor not finished.
    Pending,
    /// Its process died and a new one is being started (constructor not
    /// finished).
    Restarting,
    /// Running at this address.
    Alive {
        /// The actor worker's address.
        address: Address,
        /// The worker.
        worker: WorkerId,
        /// Its pid.
        pid: u32,
    },
    /// Gone, with the error callers get.
    Dead(Error),
}

/// What the control store says about an actor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActorInfo {
    /// The actor.
    pub actor_id: ActorId,
    /// Its class.
    pub class: String,
    /// Its state.
    pub state: ActorState,
    /// How many times its process was restarted.
    pub num_restarts: u32,
    /// Its `max_task_retries` option, which every caller applies.
    pub max_task_retries: i64,
    /// Its `max_concurrency` option (1: calls run one at a time, in
    /// order, so of the calls a dead process had, only the first can have
    /// been running).
    pub max_concurrency: u32,
    /// Its `max_restarts` option (-1: without limit).
    pub max_restarts: i64,
    /// The process that created it (and, in a cluster, creates it again
    /// on another node if its node dies and it has restarts left).
    pub owner: Address,
    /// Whether it outlives its driver: in a cluster the head, not its
    /// owner, creates it again when its node dies.
    #[serde(default)]
    pub detached: bool,
}

/// What an actor's owner says about an actor it created, for a caller
/// that no live node knows it on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum OwnedActor {
    /// The owner keeps it: it runs on a node not yet known dead, or the
    /// owner is creating it again elsewhere. Look again.
    Kept,
    /// It will not come back, for this reason.
    Gone(String),
}

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// The raylet's answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registration {
    /// The node.
    pub node_id: NodeId,
    /// The job of the registering process.
    pub job_id: JobId,
    /// The shared-memory segment to map.
    pub store_path: PathBuf,
    /// Its size in bytes.
    pub store_capacity: u64,
    /// The session directory (logs, sockets).
    pub session_dir: PathBuf,
    /// Whether a request no live node holds waits at the node for one
    /// that can (a cluster an autoscaler may grow), rather than failing:
    /// then the registering process does not refuse it itself.
    #[serde(default)]
    pub infeasible_waits: bool,
}

/// How a task attempt ended, as its owner counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskOutcome {
    /// It answered its result.
    Finished,
    /// It failed for good (no retry left, cancelled, or its error is not
    /// retried).
    Failed,
}

impl TaskOutcome {
    /// Ray's name of the state (`FINISHED`, `FAILED`).
    pub fn ray_state(self) -> &'static str {
        match self {
            TaskOutcome::Finished => "FINISHED",
            TaskOutcome::Failed => "FAILED",
        }
    }
}

/// Tasks (and actor calls) of one function that ended one way since the
/// owner last reported: what a node's metrics count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCount {
    /// The function (or `Class.method`).
    pub name: String,
    /// How they ended.
    pub outcome: TaskOutcome,
    /// Whether they ended on a retry.
    pub is_retry: bool,
    /// How many.
    pub count: u64,
}

/// One task (or actor call) that ended, as its owner saw it: what the
/// state API lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// The task.
    pub task_id: String,
    /// The function (or `Class.method`).
    pub name: String,
    /// How it ended.
    pub outcome: TaskOutcome,
    /// How many attempts failed before the last one.
    pub retries: u32,
    /// The error it failed with.
    pub error: Option<String>,
    /// The job of the process that owned it.
    pub job_id: String,
    /// When its owner submitted it, in microseconds since the Unix epoch.
    pub submitted_us: u64,
    /// When its owner learned how it ended, in microseconds since the
    /// Unix epoch.
    pub returned_us: u64,
}

/// The upper bounds, in seconds, of the buckets of task latencies (from
/// submission to the owner's learning of the result), Prometheus's
/// `le` values; one more bucket holds the rest.
pub const LATENCY_BOUNDS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Task latencies an owner saw between two reports: how many fell in
/// each bucket of [`LATENCY_BOUNDS_SECONDS`] (and one more, above the
/// last bound), and their sum.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Latencies {
    /// Per bucket, not cumulative.
    pub counts: Vec<u64>,
    /// The sum, in microseconds.
    pub sum_us: u64,
}

impl Latencies {
    /// Adds one latency.
    pub fn observe(&mut self, us: u64) {
        if self.counts.len() != LATENCY_BOUNDS_SECONDS.len() + 1 {
            self.counts = vec![0; LATENCY_BOUNDS_SECONDS.len() + 1];
        }
        let seconds = us as f64 / 1e6;
        let at = LATENCY_BOUNDS_SECONDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(LATENCY_BOUNDS_SECONDS.len());
        self.counts[at] += 1;
        self.sum_us += us;
    }

    /// Adds another's observations.
    pub fn merge(&mut self, other: &Latencies) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum_us += other.sum_us;
    }

    /// Whether none were observed.
    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|c| *c == 0)
    }
}

/// A task its owner submitted that waits for a worker (Ray's
/// `PENDING_NODE_ASSIGNMENT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTask {
    /// The task.
    pub task_id: String,
    /// The function.
    pub name: String,
    /// The owner's job.
    pub job_id: String,
    /// When it was submitted, in microseconds since the Unix epoch.
    pub submitted_us: u64,
}

/// What a worker runs: a task, or a method call on the actor it hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunKind {
    /// A task.
    Task,
    /// An actor's constructor.
    ActorCreation,
    /// A method call on an actor.
    ActorCall,
}

impl RunKind {
    /// Ray's name of the task type (`NORMAL_TASK`, `ACTOR_CREATION_TASK`,
    /// `ACTOR_TASK`).
    pub fn ray_type(self) -> &'static str {
        match self {
            RunKind::Task => "NORMAL_TASK",
            RunKind::ActorCreation => "ACTOR_CREATION_TASK",
            RunKind::ActorCall => "ACTOR_TASK",
        }
    }
}

/// One run of a task or actor call, as the worker that ran it saw it:
/// where and when it ran (the state API's `RUNNING` rows, and the
/// timeline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRun {
    /// The task.
    pub task_id: String,
    /// The function (or `Class.method`).
    pub name: String,
    /// A task, a constructor or a method call.
    pub kind: RunKind,
    /// The actor it ran on (actor calls and constructors).
    pub actor_id: Option<String>,
    /// The job of the worker that ran it.
    pub job_id: String,
    /// The worker that ran it.
    pub worker_id: String,
    /// Its process id.
    pub pid: u32,
    /// When it started, in microseconds since the Unix epoch.
    pub start_us: u64,
    /// When it ended (`None`: it runs still).
    pub end_us: Option<u64>,
    /// Whether it ended with an error or a panic.
    pub failed: bool,
}

/// Object-store usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Bytes allocated to objects.
    pub used_bytes: u64,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Objects held.
    pub num_objects: u64,
    /// Objects pinned by at least one reader.
    pub num_pinned: u64,
    /// Objects whose bytes are in spill files now.
    pub num_spilled: u64,
    /// Objects spilled since the node started.
    pub spilled_total: u64,
    /// Bytes spilled since the node started.
    pub spilled_bytes_total: u64,
    /// Objects read back from spill files since the node started.
    pub restored_total: u64,
    /// Bytes read back from spill files since the node started.
    pub restored_bytes_total: u64,
    /// Time spent writing spill files since the node started.
    pub spill_write_nanos: u64,
    /// Time spent reading spill files back since the node started.
    pub restore_read_nanos: u64,
    /// Bytes of objects pulled from other nodes' stores since the node
    /// started.
    pub pulled_bytes_total: u64,
    /// Bytes of objects served to other nodes since the node started.
    pub served_bytes_total: u64,
}

/// Who owns an object being created in a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ownership {
    /// The creating process (a put): freed when its connection closes.
    Creator,
    /// The process at this address (a task's return value, owned by the
    /// task's caller): freed when that process exits on this node, or
    /// its node dies.
    Caller(Address),
}

/// Where an actor the raylet was asked to create goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ActorPlacement {
    /// This node took it.
    Accepted,
    /// Another node should: ask the raylet at `raylet` (on node
    /// `node_id`), chosen by the actor's scheduling strategy.
    Elsewhere {
        /// The other raylet's address.
        raylet: Address,
        /// Its node.
        node_id: String,
    },
}

/// The answer to a lease request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LeaseReply {
    /// A worker here.
    Granted(LeaseGrant),
    /// None here soon: ask the raylet at `raylet` (on node `node_id`),
    /// which has the resources free.
    Spillback {
        /// The other raylet's address.
        raylet: Address,
        /// Its node.
        node_id: String,
    },
    /// Withdrawn by its client (`CancelLeaseRequests`) before a worker
    /// was free.
    Cancelled,
}

/// A worker leased.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// The lease, to return it.
    pub lease_id: LeaseId,
    /// The worker leased.
    pub worker_id: WorkerId,
    /// Its address.
    pub address: Address,
    /// Its process id.
    pub pid: u32,
    /// Other requests were left waiting when it was granted: once idle,
    /// the worker should go back at once rather than be held for reuse.
    pub contended: bool,
}

/// Where an object lies in the store segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectLocation {
    /// Byte offset in the segment.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The cluster's resources.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterResources {
    /// Everything.
    pub total: ResourceSet,
    /// Free now.
    pub available: ResourceSet,
}

/// A node of the cluster, as `prism::nodes()` and `prism status` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its id, `node-<32 hex digits>`.
    pub node_id: String,
    /// The address other nodes reach it at.
    pub node_ip: String,
    /// Its machine's host name.
    pub hostname: String,
    /// Whether it runs the control store.
    pub is_head: bool,
    /// Whether it is a live member.
    pub alive: bool,
    /// Why a dead node is dead (empty while alive).
    pub death_cause: String,
    /// Everything it offers.
    pub total: ResourceSet,
    /// Free at its last heartbeat.
    pub available: ResourceSet,
}
