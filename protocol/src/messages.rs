//! Every message Prism's processes exchange.
//!
//! This module is the contract between processes. There are three kinds of
//! connection, all Unix-domain sockets on one node:
//!
//! - core worker (driver or worker) to its raylet: registration, worker
//!   leases, the object store, the actor table;
//! - caller to a leased worker or an actor: task pushes and actor calls,
//!   straight from submitter to executor, never through the raylet;
//! - any process to an object's owner: object status and borrower
//!   bookkeeping for reference counting.
//!
//! Each request is answered by exactly one [`Response`] unless it is sent as
//! a notification.

use crate::error::Error;
use crate::ids::{ActorId, JobId, LeaseId, NodeId, ObjectId, PlacementGroupId, TaskId, WorkerId};
use crate::resources::ResourceSet;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// The object the result is stored as.
    pub return_id: ObjectId,
    /// The caller, who owns the result.
    pub caller: Address,
}

/// A finished value, as its producer hands it to the owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ObjectValue {
    /// Small values travel in the message.
    Inline(Bytes),
    /// Large values were written to the node's shared-memory store.
    InStore {
        /// Encoded size in bytes.
        size: u64,
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
    /// Resources held for the actor's lifetime.
    pub resources: ResourceSet,
    /// The placement-group bundle its resources come from, if any.
    pub placement: Option<BundleRef>,
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
    /// The GPU devices reserved for each bundle.
    pub bundle_gpus: Vec<Vec<u32>>,
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
}

/// An actor's lifecycle state, as the control store knows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ActorState {
    /// Scheduled, constructor not finished.
    Pending,
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
}

/// A request from one Prism process to another.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    // ---- core worker -> raylet ----
    /// A driver joins: its binary is what workers of its job run.
    RegisterDriver {
        /// The driver's core-worker address.
        address: Address,
        /// Process id.
        pid: u32,
        /// The executable workers re-execute.
        executable: PathBuf,
        /// Working directory for workers.
        cwd: PathBuf,
        /// Whether to forward worker output to this driver.
        log_to_driver: bool,
    },
    /// A worker started by the raylet reports in.
    RegisterWorker {
        /// The id the raylet gave it.
        worker_id: WorkerId,
        /// Its address.
        address: Address,
        /// Process id.
        pid: u32,
    },
    /// Lease a worker for one resource shape.
    RequestLease {
        /// The shape.
        shape: ResourceSet,
        /// The placement-group bundle to take it from, if any.
        bundle: Option<BundleRef>,
    },
    /// Give a leased worker back.
    ReturnLease {
        /// The lease.
        lease_id: LeaseId,
    },
    /// Allocate an object in shared memory; the caller writes it, then seals.
    CreateObject {
        /// The object.
        id: ObjectId,
        /// Bytes.
        size: u64,
    },
    /// Make a created object readable.
    SealObject {
        /// The object.
        id: ObjectId,
    },
    /// Locate and pin a sealed object for reading.
    GetObject {
        /// The object.
        id: ObjectId,
    },
    /// Unpin an object (notification).
    ReleaseObject {
        /// The object.
        id: ObjectId,
    },
    /// Owners delete objects no one references any more.
    DeleteObjects {
        /// The objects.
        ids: Vec<ObjectId>,
    },
    /// Current store usage.
    GetStoreStats,
    /// A worker running a task started (`true`) or stopped (`false`)
    /// waiting for objects; while waiting it lends its CPUs back, so the
    /// tasks it waits for can run (notification).
    WorkerBlocked {
        /// Waiting or not.
        blocked: bool,
    },
    /// Schedule an actor.
    CreateActor(ActorSpec),
    /// Look an actor up; with `wait`, answer once it is no longer pending.
    GetActor {
        /// The actor.
        actor_id: ActorId,
        /// Wait until alive or dead.
        wait: bool,
    },
    /// Look a named actor up.
    GetNamedActor {
        /// Its name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// Kill an actor's process.
    KillActor {
        /// The actor.
        actor_id: ActorId,
    },
    /// The cluster's total and available resources.
    GetClusterResources,
    /// Reserve a placement group (answered once accepted; it may still be
    /// pending).
    CreatePlacementGroup(PlacementGroupSpec),
    /// Look a placement group up, now or once it is no longer pending.
    GetPlacementGroup {
        /// The group.
        id: PlacementGroupId,
        /// While it is pending, wait up to this many milliseconds for it to
        /// be created or removed (`u64::MAX`: no limit); `None`: answer now.
        wait_ms: Option<u64>,
    },
    /// Remove a placement group, stopping what runs in it.
    RemovePlacementGroup {
        /// The group.
        id: PlacementGroupId,
    },
    /// Store a value in the control store's key-value table.
    KvPut {
        /// The key.
        key: String,
        /// The value.
        value: Bytes,
        /// Replace an existing value (otherwise keep it).
        overwrite: bool,
    },
    /// Read a value of the key-value table.
    KvGet {
        /// The key.
        key: String,
    },
    /// Delete a key of the key-value table.
    KvDelete {
        /// The key.
        key: String,
    },
    /// The keys of the key-value table that start with `prefix`.
    KvKeys {
        /// The prefix.
        prefix: String,
    },

    // ---- raylet -> worker / driver ----
    /// Run an actor's constructor and serve its calls.
    BecomeActor(ActorSpec),
    /// Lines a worker printed (to the driver that started it; notification).
    WorkerOutput {
        /// Who printed, e.g. `pid=123` or `Counter pid=123`.
        label: String,
        /// Which stream.
        stream: Stream,
        /// The lines.
        lines: Vec<String>,
    },

    // ---- caller -> executor ----
    /// Run a task on a leased worker.
    PushTask(TaskSpec),
    /// Call an actor method; calls from one caller carry increasing `seq`.
    ActorCall {
        /// The actor.
        actor_id: ActorId,
        /// The calling process.
        caller: WorkerId,
        /// Per-caller sequence number, from 0.
        seq: u64,
        /// The call.
        spec: TaskSpec,
    },

    // ---- anyone -> owner ----
    /// Wait for an object's value.
    GetObjectStatus {
        /// The object.
        id: ObjectId,
    },
    /// Register a borrower of objects (answered once recorded).
    AddBorrower {
        /// The objects.
        ids: Vec<ObjectId>,
        /// The borrowing process.
        borrower: Address,
        /// The borrower is the sender itself (not a process it lends to):
        /// if this connection closes, the borrower is gone and its borrows
        /// end with it.
        from_borrower: bool,
    },
    /// A borrower dropped its last references (notification).
    RemoveBorrower {
        /// The objects.
        ids: Vec<ObjectId>,
        /// The borrowing process.
        borrower: Address,
    },
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// Done, nothing to report.
    Ok,
    /// Failed.
    Error(Error),
    /// Registered with the raylet.
    Registered(Registration),
    /// A worker leased.
    Lease {
        /// The lease.
        lease_id: LeaseId,
        /// The worker.
        worker_id: WorkerId,
        /// Its address.
        address: Address,
        /// Its pid.
        pid: u32,
    },
    /// Where an object lies in the shared segment.
    ObjectLocation {
        /// Offset in the segment.
        offset: u64,
        /// Size in bytes.
        size: u64,
    },
    /// Store usage.
    StoreStats(StoreStats),
    /// An actor's state.
    Actor(ActorInfo),
    /// Cluster resources.
    ClusterResources {
        /// Everything the cluster has.
        total: ResourceSet,
        /// What is free now.
        available: ResourceSet,
    },
    /// A task's or an object's value.
    Object(ReturnObject),
    /// A placement group's state.
    PlacementGroup(PlacementGroupInfo),
    /// A key-value lookup: the value, if any.
    KvValue(Option<Bytes>),
    /// Whether a key-value write or delete changed the table.
    KvChanged(bool),
    /// Keys of the key-value table.
    KvKeys(Vec<String>),
}

impl Response {
    /// Turns `Response::Error` into `Err`.
    pub fn into_result(self) -> Result<Response, Error> {
        match self {
            Response::Error(e) => Err(e),
            other => Ok(other),
        }
    }

    /// Builds the error for a reply of the wrong kind.
    pub fn unexpected(&self, request: &str) -> Error {
        Error::Protocol {
            message: format!("unexpected reply to {request}: {self:?}"),
        }
    }
}
