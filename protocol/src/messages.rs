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
//! Each service has its own request enum ([`RayletRequest`],
//! [`ExecutorRequest`], [`OwnerRequest`], [`DriverRequest`]), and each
//! request is a struct of its own whose [`Call::Reply`] names the type it is
//! answered with, so a caller gets `Result<ThatReply>` from
//! [`Connection::request`](crate::rpc::Connection::request) and never
//! matches on a [`Response`]. On the wire a request travels as a
//! [`Request`] (service, then request) and is answered by exactly one
//! [`Response`] unless it is sent as a notification.
//!
//! ```no_run
//! # async fn demo(raylet: prism_protocol::rpc::Connection) -> prism_protocol::Result<()> {
//! use prism_protocol::messages::{KvGet, KvKeys};
//! // The reply's type follows from the request: Option<Bytes>, then Vec<String>.
//! let value = raylet.request(KvGet { key: "model/epoch".into() }).await?;
//! let keys: Vec<String> = raylet.request(KvKeys { prefix: "model/".into() }).await?;
//! # let _ = (value, keys);
//! # Ok(()) }
//! ```
//!
//! Messages that may cross nodes (executor and owner services) carry ids
//! and addresses only; paths appear only in the raylet's registration
//! messages, which stay on one node.

use crate::error::Error;
use crate::ids::{ActorId, JobId, LeaseId, ObjectId, PlacementGroupId, WorkerId};
use crate::program::Program;
use crate::resources::ResourceSet;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

mod bounds;
mod specs;

pub use bounds::{FrameBound, MAX_FRAME_BYTES};
pub use specs::*;

/// How many times a lease request may be sent on from node to node: its
/// own node's raylet sends it on once when it does not fit there; a raylet
/// it waits at may send it on again, to a node with room, while it has
/// been sent on fewer times than this. Bounds a request's travels when
/// nodes' views of each other lag.
pub const MAX_LEASE_HOPS: u32 = 3;

/// A request: its struct is its name on the wire, and `Reply` is what it is
/// answered with.
pub trait Call: Into<Request> {
    /// What a successful call returns.
    type Reply: Reply;
    /// The request's name, for errors.
    const NAME: &'static str;
    /// How large its frame may be (see [`FrameBound`]).
    const FRAME_BOUND: FrameBound;
}

/// A type a [`Response`] carries.
pub trait Reply: Sized {
    /// Takes the value out of `response`, or describes the response when
    /// it carries something else.
    fn from_response(response: Response) -> Result<Self, String>;
    /// Wraps the value for the wire.
    fn into_response(self) -> Response;
}

macro_rules! replies {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl Reply for $ty {
            fn from_response(response: Response) -> Result<Self, String> {
                match response {
                    Response::$variant(value) => Ok(value),
                    other => Err(format!("{other:?}")),
                }
            }
            fn into_response(self) -> Response {
                Response::$variant(self)
            }
        }
    )*};
}

replies! {
    Registration => Registered,
    ActorPlacement => ActorPlaced,
    LeaseReply => Lease,
    ObjectLocation => ObjectLocation,
    StoreStats => StoreStats,
    ActorInfo => Actor,
    ClusterResources => ClusterResources,
    Vec<NodeInfo> => Nodes,
    ReturnObject => Object,
    PlacementGroupInfo => PlacementGroup,
    Option<Bytes> => KvValue,
    bool => KvChanged,
    Vec<String> => KvKeys,
    Option<String> => WorkerExit,
    OwnedActor => OwnedActor,
    Vec<PlacementGroupId> => PlacementGroupIds,
    Bytes => Chunk,
}

impl Reply for () {
    fn from_response(response: Response) -> Result<Self, String> {
        match response {
            Response::Ok => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }
    fn into_response(self) -> Response {
        Response::Ok
    }
}

/// The size class a request declares (`, Batch` or `, Payload` after its
/// reply type), [`FrameBound::Control`] when it declares none.
macro_rules! frame_bound {
    () => {
        FrameBound::Control
    };
    ($bound:ident) => {
        FrameBound::$bound
    };
}

/// Declares each service's request enum, one struct per request with its
/// reply type and size class, and the wire [`Request`] over all services.
macro_rules! services {
    ($(
        $(#[$service_doc:meta])*
        $variant:ident: $service:ident, $server:ident {$(
            $(#[$doc:meta])*
            $name:ident { $($(#[$field_doc:meta])* $field:ident: $ty:ty),* $(,)? } => $reply:ty $(, $bound:ident)?;
        )*}
    )*) => {
        $(
            $(#[$service_doc])*
            #[derive(Debug, Clone, Serialize, Deserialize)]
            pub enum $service {
                $($(#[$doc])* $name($name),)*
            }
            $(
                $(#[$doc])*
                #[derive(Debug, Clone, Serialize, Deserialize)]
                pub struct $name {
                    $($(#[$field_doc])* pub $field: $ty,)*
                }
                impl Call for $name {
                    type Reply = $reply;
                    const NAME: &'static str = stringify!($name);
                    const FRAME_BOUND: FrameBound = frame_bound!($($bound)?);
                }
                impl From<$name> for Request {
                    fn from(request: $name) -> Request {
                        Request::$variant($service::$name(request))
                    }
                }
            )*
        )*
        /// A request on the wire: the service it is for, then the request.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub enum Request {
            $($(#[$service_doc])* $variant($service),)*
        }

        impl Request {
            /// The request's service and name on the wire.
            pub fn wire_name(&self) -> (&'static str, &'static str) {
                match self {
                    $($(Request::$variant($service::$name(_)) => (stringify!($variant), stringify!($name)),)*)*
                }
            }

            /// The request's size class.
            pub fn frame_bound(&self) -> FrameBound {
                match self {
                    $($(Request::$variant($service::$name(_)) => <$name as Call>::FRAME_BOUND,)*)*
                }
            }

            /// The size class of the request named `name` of `service` on
            /// the wire, or `None` for a name no request has.
            pub fn frame_bound_of(service: &str, name: &str) -> Option<FrameBound> {
                match (service, name) {
                    $($((stringify!($variant), stringify!($name)) => Some(<$name as Call>::FRAME_BOUND),)*)*
                    _ => None,
                }
            }
        }
    };
}

/// The message list: every service, with the trait its server implements
/// (see [`crate::serve`]), and every request of it, with its reply type and
/// size class. It is handed to the macro named `then`, which declares
/// from it what it declares (the messages here, the server traits in
/// `serve`).
macro_rules! service_list {
    ($then:ident) => {
        $then! {
            /// Requests a core worker (driver or worker) makes of its node's raylet:
            /// registration, worker leases, the object store, the actor table,
            /// placement groups and the key-value table.
            Raylet: RayletRequest, RayletServer {
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
                    /// The job's namespace for named actors; its workers use it
                    /// too, so a name given by the driver is found from a task.
                    namespace: String,
                    /// Set when a process of a job started on another node leases
                    /// workers here: the job to run them for.
                    job_id: Option<JobId>,
                    /// The program `executable` holds, sent by a process leasing
                    /// workers on another node: a node whose file at that path is
                    /// not this program fetches it from the process
                    /// (`ReadProgram`) and runs its copy.
                    program: Option<Program>,
                    /// Environment variables for every worker of the job (its
                    /// runtime environment's `env_vars`).
                    #[serde(default)]
                    env_vars: std::collections::BTreeMap<String, String>,
                    /// The Jobs API submission the driver runs for, if any
                    /// (`PRISM_JOB_SUBMISSION_ID`).
                    #[serde(default)]
                    submission_id: Option<String>,
                } => Registration;
                /// A worker started by the raylet reports in.
                RegisterWorker {
                    /// The id the raylet gave it.
                    worker_id: WorkerId,
                    /// Its address.
                    address: Address,
                    /// Process id.
                    pid: u32,
                } => Registration;
                /// Lease a worker with these resources; answered when granted.
                RequestLease {
                    /// Resources the lease holds.
                    shape: ResourceSet,
                    /// The placement-group bundle to draw from, if any.
                    bundle: Option<BundleRef>,
                    /// Where in the cluster it may run.
                    strategy: SchedulingStrategy,
                    /// Environment variables the worker must have, beyond its
                    /// job's (the task's runtime environment).
                    #[serde(default)]
                    env_vars: EnvVars,
                    /// How many raylets sent this request on before it came
                    /// here: 0 from the holder's own node. A raylet may send a
                    /// request that waits there on to a node with room while
                    /// this is under [`MAX_LEASE_HOPS`].
                    #[serde(default)]
                    hops: u32,
                } => LeaseReply;
                /// Give a leased worker back.
                ReturnLease {
                    /// The lease.
                    lease_id: LeaseId,
                    /// The holder could not reach the worker (it died between its
                    /// grant and the holder's connect, or does not listen): the
                    /// raylet stops it and never grants it again.
                    unreachable: bool,
                } => ();
                /// Withdraw this connection's queued requests for leases of this
                /// shape (its tasks ran out before they were granted); each is
                /// answered [`LeaseReply::Cancelled`]. Requests already granted,
                /// or sent on to another node, are not affected.
                CancelLeaseRequests {
                    /// Resources the leases would hold.
                    shape: ResourceSet,
                    /// The placement-group bundle they would draw from, if any.
                    bundle: Option<BundleRef>,
                    /// The environment variables they ask for.
                    #[serde(default)]
                    env_vars: EnvVars,
                } => ();
                /// Allocate space for an object in the store.
                CreateObject {
                    /// The object.
                    id: ObjectId,
                    /// Its size in bytes.
                    size: u64,
                    /// Who owns it. Once its owner is gone no one can reach the
                    /// copy through it, so the copy is freed.
                    owner: Ownership,
                } => ObjectLocation;
                /// Mark a created object complete and readable.
                SealObject {
                    /// The object.
                    id: ObjectId,
                } => ();
                /// Locate a sealed object and pin it for the caller.
                GetObject {
                    /// The object.
                    id: ObjectId,
                } => ObjectLocation;
                /// Drop one pin taken by `GetObject`.
                ReleaseObject {
                    /// The object.
                    id: ObjectId,
                } => ();
                /// Delete objects from the store (their owner freed them), and the
                /// copies other nodes pulled of them.
                DeleteObjects {
                    /// The objects.
                    ids: Vec<ObjectId>,
                    /// The node whose store holds them (`None`: this one); the
                    /// raylet passes the request on to that node's raylet.
                    node: Option<String>,
                } => (), Batch;
                /// Copy an object from another node's store into this node's
                /// store; answered once the copy is sealed and readable here.
                /// Concurrent pulls of one object share one transfer.
                PullObject {
                    /// The object.
                    id: ObjectId,
                    /// The node whose store holds it.
                    node: String,
                    /// Its size in bytes.
                    size: u64,
                    /// Its owner: the copy is freed when the owner exits, as the
                    /// object is.
                    owner: Address,
                } => ();
                /// Store usage.
                GetStoreStats {} => StoreStats;
                /// Tasks this process owned that ended since its last report, for
                /// the node's metrics (sent about once a second while any ended,
                /// and when the process stops).
                ReportTaskCounts {
                    /// The counts, one per function, outcome and retry.
                    counts: Vec<TaskCount>,
                    /// The tasks that ended, oldest first.
                    #[serde(default)]
                    events: Vec<TaskEvent>,
                    /// Tasks that ended but are not in `events`: more ended between
                    /// two reports than a process keeps.
                    #[serde(default)]
                    dropped: u64,
                    /// Runs of tasks and actor calls this process executed that
                    /// ended since its last report, oldest first.
                    #[serde(default)]
                    runs: Vec<TaskRun>,
                    /// What this process runs now, when it changed since its last
                    /// report (`Some(empty)`: nothing any more).
                    #[serde(default)]
                    running: Option<Vec<TaskRun>>,
                    /// The reporting worker (empty for a driver, which runs
                    /// nothing).
                    #[serde(default)]
                    worker_id: String,
                    /// Latencies of the tasks (first) and actor calls (second)
                    /// that ended, from submission to result.
                    #[serde(default)]
                    latencies: [Latencies; 2],
                    /// Attempts made again since the last report: tasks, then
                    /// actor calls.
                    #[serde(default)]
                    retries: [u64; 2],
                    /// Objects made again from their lineage since the last report.
                    #[serde(default)]
                    rebuilt: u64,
                    /// The tasks this process owns that wait for a worker (the
                    /// oldest, at most 1,000), when that changed since its last
                    /// report (`Some(empty)`: none any more).
                    #[serde(default)]
                    pending: Option<Vec<PendingTask>>,
                } => (), Batch;
                /// The calling worker started (or stopped) waiting in `get`.
                WorkerBlocked {
                    /// True when it starts waiting.
                    blocked: bool,
                } => ();
                /// Create an actor; answered once accepted.
                CreateActor {
                    /// What to create.
                    spec: ActorSpec,
                } => ActorPlacement, Payload;
                /// An actor's state, now or (with `wait`) once it is neither
                /// pending nor restarting.
                GetActor {
                    /// The actor.
                    actor_id: ActorId,
                    /// Wait while it is pending.
                    wait: bool,
                    /// The node the caller knows it on (it placed it there,
                    /// or last found it there): a raylet that does not hold
                    /// the actor asks that node first, and every other node
                    /// only if it does not hold it either.
                    #[serde(default)]
                    node_id: Option<String>,
                } => ActorInfo;
                /// Look an actor up by name.
                GetNamedActor {
                    /// Its name.
                    name: String,
                    /// Its namespace.
                    namespace: String,
                } => ActorInfo;
                /// Why a worker process of this node exited, if the node knows yet.
                WorkerExitReason {
                    /// The worker.
                    worker_id: WorkerId,
                } => Option<String>;
                /// Kill an actor's process.
                KillActor {
                    /// The actor.
                    actor_id: ActorId,
                    /// False: restart it if it has restarts left (Ray's
                    /// `no_restart=False`).
                    no_restart: bool,
                    /// Its owner saw the last handle to it dropped (with
                    /// `no_restart`): the reason its callers see says so.
                    out_of_scope: bool,
                    /// The node the caller knows it on (it placed it there,
                    /// or last found it there): a raylet that does not hold
                    /// the actor asks that node first, and every other node
                    /// only if it does not hold it either.
                    #[serde(default)]
                    node_id: Option<String>,
                } => ();
                /// The calling actor is ending itself (`prism::exit_actor`): mark
                /// it dead for good; its process exits by itself.
                ExitActor {
                    /// The actor.
                    actor_id: ActorId,
                } => ();
                /// The cluster's total and free resources.
                GetClusterResources {} => ClusterResources;
                /// Every node of the cluster, alive or dead (the local node alone
                /// when the raylet is not part of a cluster).
                GetNodes {} => Vec<NodeInfo>;
                /// Reserve a placement group; answered once accepted.
                CreatePlacementGroup {
                    /// What to reserve.
                    spec: PlacementGroupSpec,
                } => ();
                /// A group's state, now or once created (up to `wait_ms`).
                GetPlacementGroup {
                    /// The group.
                    id: PlacementGroupId,
                    /// How long to wait while it is pending (`None`: answer now).
                    wait_ms: Option<u64>,
                } => PlacementGroupInfo;
                /// The groups created at this raylet (in a cluster, with
                /// `everywhere`, at every live node's raylet) that are not
                /// removed, by id.
                ListPlacementGroups {
                    /// Ask the other nodes too (set by drivers and workers; a
                    /// raylet asking another clears it).
                    everywhere: bool,
                } => Vec<PlacementGroupId>;
                /// Remove a placement group (in a cluster, from every node holding
                /// a bundle of it).
                RemovePlacementGroup {
                    /// The group.
                    id: PlacementGroupId,
                } => ();
                /// First phase of placing a group over several nodes: reserve now
                /// the bundles `nodes` assigns to this node, or fail; they are not
                /// used until `CommitBundles`, and `RemovePlacementGroup` gives
                /// them back.
                PrepareBundles {
                    /// The whole group.
                    spec: PlacementGroupSpec,
                    /// The job it belongs to.
                    job: JobId,
                    /// The node of each bundle.
                    nodes: Vec<String>,
                } => ();
                /// Second phase: every node reserved its bundles; use them.
                CommitBundles {
                    /// The group.
                    id: PlacementGroupId,
                } => ();
                /// Bundles of a group moved off a node that died: reserve now the
                /// bundles `nodes` newly gives this node (taking up the group here
                /// if this node held none of it) or fail taking nothing, and know
                /// `nodes` as every bundle's node from now on.
                MoveBundles {
                    /// The whole group.
                    spec: PlacementGroupSpec,
                    /// The job it belongs to.
                    job: JobId,
                    /// The node of each bundle, the moved ones included.
                    nodes: Vec<String>,
                } => ();
                /// Store a value in the key-value table; answers whether the key is new.
                KvPut {
                    /// The key.
                    key: String,
                    /// The value.
                    value: Bytes,
                    /// Replace an existing value.
                    overwrite: bool,
                } => bool, Payload;
                /// Read a value.
                KvGet {
                    /// The key.
                    key: String,
                } => Option<Bytes>;
                /// Delete a key; answers whether it existed.
                KvDelete {
                    /// The key.
                    key: String,
                } => bool;
                /// The keys with a prefix, sorted.
                KvKeys {
                    /// The prefix.
                    prefix: String,
                } => Vec<String>;
            }

            /// Requests to a worker's executor: tasks and actor calls (straight from
            /// the caller, never through the raylet), and the raylet's order to
            /// become an actor.
            Executor: ExecutorRequest, ExecutorServer {
                /// Run a task.
                PushTask {
                    /// The task.
                    spec: TaskSpec,
                } => ReturnObject, Payload;
                /// The task or actor call whose result is `return_id` was
                /// cancelled by its caller: if it waits here unstarted it is
                /// answered [`Error::TaskCancelled`](crate::error::Error::TaskCancelled)
                /// and never runs; if a task runs and `force` is set, this worker
                /// process exits (its other tasks are retried elsewhere). Sent on
                /// the connection the task or call came on, after it.
                CancelTask {
                    /// The task's result object.
                    return_id: ObjectId,
                    /// Stop this worker if the task is running.
                    force: bool,
                } => ();
                /// Call a method of the actor this worker hosts.
                ActorCall {
                    /// The actor.
                    actor_id: ActorId,
                    /// The calling worker (calls from one caller run in `seq` order).
                    caller: WorkerId,
                    /// The call's number in the caller's sequence.
                    seq: u64,
                    /// The call.
                    spec: TaskSpec,
                } => ReturnObject, Payload;
                /// Run an actor's constructor and host the actor from now on.
                BecomeActor {
                    /// The actor.
                    spec: ActorSpec,
                } => (), Payload;
                /// Every thread's stack of this worker, and what it runs, as JSON
                /// (`prism stack`); the threads stop only while each walks its
                /// own stack.
                DumpStacks {} => Bytes;
            }

            /// Requests to an object's owner: its status and who borrows it.
            Owner: OwnerRequest, OwnerServer {
                /// An owned object's value (inline or in the store), once ready.
                GetObjectStatus {
                    /// The object.
                    id: ObjectId,
                    /// Set when the asker found the copy on this node lost (the
                    /// node died): the owner runs the task that made it again, if
                    /// it can, and answers with the new value.
                    lost_at: Option<String>,
                } => ReturnObject;
                /// These processes now hold references to these objects.
                AddBorrower {
                    /// The objects.
                    ids: Vec<ObjectId>,
                    /// The borrower's address.
                    borrower: Address,
                    /// Sent by a borrower passing the reference on.
                    from_borrower: bool,
                } => (), Batch;
                /// A borrower dropped its references.
                RemoveBorrower {
                    /// The objects.
                    ids: Vec<ObjectId>,
                    /// The borrower's address.
                    borrower: Address,
                    /// Per object, the registrations (`AddBorrower`s, by the
                    /// borrower or for it) that its dropped reference accounted
                    /// for; the owner keeps the borrower for any others. Missing
                    /// counts end the borrow outright.
                    counts: Vec<u64>,
                } => (), Batch;
                /// The next value of a streaming call (`TaskSpec::streaming`) is
                /// stored as `id`: the caller takes it as its own object, the
                /// `index`-th of the stream. Sent by the executor in order, a
                /// bounded number unanswered at once, all answered before the call
                /// itself answers, so a stream's values are all known here when
                /// its call ends. A run again (a retry) sends the values from the
                /// first again; the caller keeps one copy of each index (the
                /// newest of those it has not handed out yet).
                StreamItem {
                    /// The call's `return_id`, which names the stream.
                    generator: ObjectId,
                    /// The value's place in the stream, from 0.
                    index: u64,
                    /// The object the value is stored as.
                    id: ObjectId,
                    /// The value.
                    item: ReturnObject,
                } => (), Payload;
                /// Where an actor this process created stands, asked by a caller
                /// that found no live node holding it.
                LocateActor {
                    /// The actor.
                    actor_id: ActorId,
                } => OwnedActor;
            }

            /// Notices the raylet sends its drivers and workers.
            Driver: DriverRequest, DriverServer {
                /// A node of the cluster died: connections to its processes will
                /// never answer (a node cut off from the network does not even
                /// close them), so they are given up.
                NodeDied {
                    /// The node.
                    node_id: String,
                } => ();
                /// An actor this process created on this (other) node is dead for
                /// good: its owner must not create it again if the node dies.
                ActorEnded {
                    /// The actor.
                    actor_id: ActorId,
                } => ();
                /// An actor this process created on this (other) node was
                /// restarted here: its owner counts the restart if it creates the
                /// actor again after the node dies.
                ActorRestarted {
                    /// The actor.
                    actor_id: ActorId,
                    /// Its restarts so far.
                    num_restarts: u32,
                } => ();
                /// Requests of other clients (or of this one, for leases of another
                /// shape) wait for what these leases hold: give each back as soon
                /// as its worker is idle, at once if it is idle now, instead of
                /// keeping it for back-to-back calls. Sent once per lease.
                LeasesWanted {
                    /// Leases this process holds from the sending raylet.
                    leases: Vec<LeaseId>,
                } => (), Batch;
                /// A chunk of this process's own executable, read by another node's
                /// raylet that runs the job's workers and lacks the program.
                ReadProgram {
                    /// The program asked for: the process refuses if it runs
                    /// another.
                    id: String,
                    /// Where the chunk starts.
                    offset: u64,
                    /// Its length (at most [`PROGRAM_CHUNK`] bytes).
                    len: u64,
                } => Bytes;
                /// Lines a worker printed, for the driver's terminal.
                WorkerOutput {
                    /// Who printed, e.g. `pid=123` or `Counter pid=123`.
                    label: String,
                    /// Which stream.
                    stream: Stream,
                    /// The lines, without newlines.
                    lines: Vec<String>,
                } => (), Batch;
            }
        }
    };
}

pub(crate) use service_list;

service_list!(services);

/// An answer on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// Done, nothing to return.
    Ok,
    /// The request failed.
    Error(Error),
    /// Registration accepted.
    Registered(Registration),
    /// A lease was granted.
    Lease(LeaseReply),
    /// Where an actor goes.
    ActorPlaced(ActorPlacement),
    /// Where an object is in the store.
    ObjectLocation(ObjectLocation),
    /// Store usage.
    StoreStats(StoreStats),
    /// An actor's state.
    Actor(ActorInfo),
    /// The cluster's resources.
    ClusterResources(ClusterResources),
    /// The cluster's nodes.
    Nodes(Vec<NodeInfo>),
    /// A task's or object's value.
    Object(ReturnObject),
    /// A placement group's state.
    PlacementGroup(PlacementGroupInfo),
    /// A value from the key-value table.
    KvValue(Option<Bytes>),
    /// Whether a key-value change took (new key, or deleted).
    KvChanged(bool),
    /// Keys of the key-value table.
    KvKeys(Vec<String>),
    /// Why a worker exited (`None`: not known yet).
    WorkerExit(Option<String>),
    /// What an actor's owner says about it.
    OwnedActor(OwnedActor),
    /// Placement groups, by id.
    PlacementGroupIds(Vec<PlacementGroupId>),
    /// A chunk of a file.
    Chunk(Bytes),
}

impl Response {
    /// The answer to a call: its value, or its error.
    pub fn from_result<T: Reply>(result: Result<T, Error>) -> Response {
        match result {
            Ok(value) => value.into_response(),
            Err(e) => Response::Error(e),
        }
    }

    /// Turns `Response::Error` into `Err`.
    pub fn into_result(self) -> Result<Response, Error> {
        match self {
            Response::Error(e) => Err(e),
            other => Ok(other),
        }
    }

    /// Takes the reply to `C` out of the response, naming both when the
    /// peer answered with something else.
    pub fn into_reply<C: Call>(self) -> Result<C::Reply, Error> {
        match self {
            Response::Error(e) => Err(e),
            other => C::Reply::from_response(other).map_err(|reply| Error::UnexpectedReply {
                request: C::NAME.to_string(),
                reply,
            }),
        }
    }
}

/// Declares each answer's size class once: the methods below follow, and
/// an answer added to [`Response`] without one does not compile.
macro_rules! response_bounds {
    ($($variant:ident => $bound:ident,)*) => {
        impl Response {
            /// The size class of the answer named `variant` on the wire,
            /// or `None` for a name no answer has.
            pub fn frame_bound_of(variant: &str) -> Option<FrameBound> {
                match variant {
                    $(stringify!($variant) => Some(FrameBound::$bound),)*
                    _ => None,
                }
            }

            /// The size class of this answer.
            pub fn frame_bound(&self) -> FrameBound {
                match self {
                    $(Response::$variant { .. } => FrameBound::$bound,)*
                }
            }

            /// The answer's name on the wire (its variant).
            pub fn wire_name(&self) -> &'static str {
                match self {
                    $(Response::$variant { .. } => stringify!($variant),)*
                }
            }
        }
    };
}

response_bounds! {
    Ok => Control,
    Error => Batch,
    Registered => Control,
    Lease => Control,
    ActorPlaced => Control,
    ObjectLocation => Control,
    StoreStats => Control,
    Actor => Control,
    ClusterResources => Control,
    Nodes => Batch,
    Object => Payload,
    PlacementGroup => Control,
    KvValue => Payload,
    KvChanged => Control,
    KvKeys => Batch,
    WorkerExit => Control,
    OwnedActor => Control,
    PlacementGroupIds => Batch,
    Chunk => Payload,
}
