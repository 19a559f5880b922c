//! The one error type of Prism.
//!
//! Errors cross process boundaries (a task's failure travels from the worker
//! to its caller, a full store answers a remote `put`), so the enum is
//! serializable and carries structured fields rather than wrapped source
//! errors. The facade crate re-exports it as `prism::Error`.

use crate::ids::{ActorId, ObjectId, PlacementGroupId, WorkerId};
use serde::{Deserialize, Serialize};

/// How a remote function failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The function panicked.
    Panic,
    /// The function returned `Err`.
    Error,
}

/// Everything that can go wrong in Prism.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Error {
    /// The runtime was used before `prism::init`.
    #[error("prism is not initialized; call prism::init(prism::Config::default()) first")]
    NotInitialized,
    /// `prism::init` was called twice.
    #[error("prism is already initialized; call prism::shutdown() first, or set Config::ignore_reinit_error(true)")]
    AlreadyInitialized,
    /// A configuration value did not parse.
    #[error("config {key}: {value:?} is not {expected}")]
    Config {
        /// The key, as its environment variable (`PRISM_...`).
        key: String,
        /// The value given.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// Bad input to a public API.
    #[error("invalid argument: {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: String,
        /// What was wrong with it and what to do.
        reason: String,
    },
    /// A remote function or actor method panicked or returned `Err`.
    #[error("task {function} failed on {worker} (pid {pid}): {kind:?}: {message}")]
    TaskFailed {
        /// The function or `Class::method` that failed.
        function: String,
        /// The panic message or the `Display` of the returned error.
        message: String,
        /// Panic or returned error.
        kind: FailureKind,
        /// The worker it ran on.
        worker: WorkerId,
        /// That worker's process id.
        pid: u32,
    },
    /// No function or actor of that name is registered in the worker's binary.
    #[error("no remote function or actor named {name:?} is registered in {binary}; is it annotated with #[prism::remote] or #[prism::actor], and is the worker running the same binary as the caller?")]
    UnknownFunction {
        /// The name asked for.
        name: String,
        /// The worker's executable.
        binary: String,
    },
    /// An actor's constructor failed; every call on it gives this error.
    #[error("actor {class} ({actor_id}) could not be created: {message}")]
    ActorCreationFailed {
        /// The actor.
        actor_id: ActorId,
        /// Its class name.
        class: String,
        /// Why its constructor failed.
        message: String,
    },
    /// An actor is dead (killed, or its process exited).
    #[error("actor {class} ({actor_id}) is dead: {reason}")]
    ActorDied {
        /// The actor.
        actor_id: ActorId,
        /// Its class name.
        class: String,
        /// Why it died.
        reason: String,
    },
    /// An actor's process died while a call was running on it, and the
    /// call was not sent again (`max_task_retries` used up); the actor
    /// itself is restarting, and later calls wait for it (Ray's
    /// `ActorUnavailableError`).
    #[error("actor {class} ({actor_id}) was unavailable for this call: {reason}")]
    ActorUnavailable {
        /// The actor.
        actor_id: ActorId,
        /// Its class name.
        class: String,
        /// What happened to the call.
        reason: String,
    },
    /// No live actor has that name in that namespace.
    #[error("no actor named {name:?} in namespace {namespace:?}")]
    ActorNotFound {
        /// The name asked for.
        name: String,
        /// The namespace searched.
        namespace: String,
    },
    /// No live actor has the name, and the last actor that held it died
    /// for good.
    #[error(
        "the actor named {name:?} in namespace {namespace:?} ({}) died at {} on node {}: {}",
        death.actor_id, crate::clock::utc_text(death.died_at_ms), death.node, death.cause
    )]
    NamedActorDied {
        /// The name asked for.
        name: String,
        /// The namespace searched.
        namespace: String,
        /// Which actor died, where, when and why.
        death: Box<ActorDeath>,
    },
    /// An actor name is already taken in the namespace.
    #[error("an actor named {name:?} already exists in namespace {namespace:?}; pick another name, or get it with prism::get_actor")]
    ActorNameTaken {
        /// The name.
        name: String,
        /// The namespace.
        namespace: String,
    },
    /// A named actor was fetched as the wrong type.
    #[error("actor {name:?} is a {actual}, not a {expected}")]
    ActorClassMismatch {
        /// The name.
        name: String,
        /// The class asked for.
        expected: String,
        /// The class it is.
        actual: String,
    },
    /// The worker process running a task died before answering.
    #[error(
        "the worker running {function} ({worker}, pid {pid}) died before it answered: {reason}"
    )]
    WorkerDied {
        /// The function that was running.
        function: String,
        /// The worker.
        worker: WorkerId,
        /// Its process id (0 when unknown).
        pid: u32,
        /// What was observed.
        reason: String,
    },
    /// The task was cancelled (`prism::cancel`) before it finished, or it
    /// ran to its end after a cancel without `force` and its result was
    /// dropped.
    #[error("task {function} was cancelled (prism::cancel{how})")]
    TaskCancelled {
        /// The function.
        function: String,
        /// `", force"` when its worker was stopped, else empty.
        how: String,
    },
    /// A worker handed back a task it had queued but not started, because
    /// the task ahead of it ran long. The submitter sends it to a worker
    /// again (no retry is counted), so a caller sees this only from a
    /// worker of another Prism version.
    #[error("worker {worker} handed {function} back unstarted: {reason}")]
    TaskHandedBack {
        /// The function.
        function: String,
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: String,
    },
    /// Worker processes for the request could not be started, several
    /// times in a row.
    #[error("could not start a worker process ({executable}) after {attempts} attempts: {reason}; the request that needed it failed")]
    WorkerStartFailed {
        /// The executable the workers run (the driver's own).
        executable: String,
        /// Attempts made, in a row, before giving up.
        attempts: u32,
        /// What went wrong at the last attempt.
        reason: String,
    },
    /// No node of the cluster could ever satisfy a resource request.
    #[error(
        "no node can ever satisfy the resource request {shape}: the cluster has {total} in all"
    )]
    Infeasible {
        /// The requested shape.
        shape: String,
        /// The cluster's total resources.
        total: String,
    },
    /// A placement group was removed (or its job ended) before or while
    /// something was scheduled in it.
    #[error("placement group {id} was removed; tasks and actors placed in it are stopped. Create a new group to schedule there")]
    PlacementGroupRemoved {
        /// The group.
        id: PlacementGroupId,
    },
    /// The object store has no room left.
    #[error("object store full: asked for {requested} bytes, {used} of {capacity} bytes in use by {num_objects} objects; free some ObjectRefs or raise Config::object_store_memory")]
    ObjectStoreFull {
        /// Bytes asked for.
        requested: u64,
        /// Bytes in use.
        used: u64,
        /// Capacity in bytes.
        capacity: u64,
        /// Objects held.
        num_objects: u64,
    },
    /// An object is not known to its owner or store (freed or never created).
    #[error("object {object_id} was not found: it was freed or never created")]
    ObjectNotFound {
        /// The object.
        object_id: ObjectId,
    },
    /// Every copy of an object is gone (its spill file was deleted, say),
    /// and it is not rebuilt.
    #[error("object {object_id} is lost: {cause}")]
    ObjectLost {
        /// The object.
        object_id: ObjectId,
        /// What happened to its copies.
        cause: String,
    },
    /// The process that owns an object is gone, and the object with it.
    #[error("the owner of object {object_id} ({owner}) is unreachable; the object is lost")]
    OwnerDied {
        /// The object.
        object_id: ObjectId,
        /// The owner's address.
        owner: String,
    },
    /// `get` or `wait` ran out of time.
    #[error("timed out after {waited_ms} ms with {pending} of {total} objects not ready")]
    GetTimeout {
        /// How long was waited.
        waited_ms: u64,
        /// How many objects were not ready.
        pending: usize,
        /// How many were asked for.
        total: usize,
    },
    /// A value could not be encoded or decoded.
    #[error("cannot (de)serialize a {type_name}: {message}")]
    Serialization {
        /// The Rust type.
        type_name: String,
        /// What serde said.
        message: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {message}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        message: String,
    },
    /// The cluster's head (its control store) could not be reached, or
    /// did not answer in time: it is down, restarting, or cut off.
    #[error("{message}")]
    HeadUnreachable {
        /// What was tried, for how long, and what to do.
        message: String,
    },
    /// The head refused this process: a wrong or missing cluster token,
    /// or the head's state belongs to another cluster.
    #[error("{message}")]
    HeadRefused {
        /// Why, and what to do.
        message: String,
    },
    /// The head answered a call with a failure of its own (its state, a
    /// bad address given to it).
    #[error("{message}")]
    HeadFailed {
        /// The call and the failure.
        message: String,
    },
    /// Another Prism process refused a connection from this one (a wrong
    /// token).
    #[error("{peer} refused this connection: {reason}")]
    ConnectionRefused {
        /// Who refused.
        peer: String,
        /// What it said.
        reason: String,
    },
    /// This process has no cluster token, and so cannot reach another
    /// node.
    #[error("this process has no cluster token to reach another node with: give it with --token-file or PRISM_AUTH_TOKEN")]
    NoClusterToken,
    /// TLS with another Prism process failed.
    #[error("TLS with {peer} failed: {reason}")]
    TlsFailed {
        /// The other side.
        peer: String,
        /// What went wrong, and what to check.
        reason: String,
    },
    /// A node that work was sent to is not a live node of the cluster.
    #[error("node {node_id} is not alive in the cluster (prism::nodes() lists the live ones)")]
    NodeNotAlive {
        /// The node.
        node_id: String,
    },
    /// Node affinity named a node that is not alive, without `soft`.
    #[error("node affinity names node {node_id}, which is not a live node of this cluster (prism::nodes() lists them); with soft: true the work runs elsewhere instead")]
    AffinityNodeNotAlive {
        /// The node named.
        node_id: String,
    },
    /// A node sent on work that another node had sent to it: work goes to
    /// one other node at most.
    #[error("node {node_id} sent {what} on again; it goes to one other node at most")]
    SentOnAgain {
        /// The node.
        node_id: String,
        /// What it sent on (`a lease request`, `an actor`).
        what: String,
    },
    /// A node did not answer a request in time.
    #[error("node {node_id} did not answer within {waited_ms} ms")]
    NodeTimeout {
        /// The node.
        node_id: String,
        /// How long was waited.
        waited_ms: u64,
    },
    /// A placement-group bundle on a dead node was not placed again in
    /// time.
    #[error("bundle {bundle:?} of placement group {group} is on node {node_id}, which is not alive, and was not placed again within {waited_ms} ms (its group's home node died too, or no live node has room for it)")]
    BundleNotPlacedAgain {
        /// The group.
        group: PlacementGroupId,
        /// The bundle's index (`None`: any bundle of the group).
        bundle: Option<u32>,
        /// The dead node.
        node_id: String,
        /// How long was waited.
        waited_ms: u64,
    },
    /// A job's program (the driver's binary) could not be had from the
    /// process or node asked, or cannot run here.
    #[error("{holder} cannot provide the job's program: {reason}")]
    ProgramUnavailable {
        /// Who was asked (a node, the head, a driver).
        holder: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A driver found no node of its cluster running on its machine.
    #[error("no Prism node of the cluster at {address} runs on this machine (looked in {looked_in}): start one here with `prism start --address {address}`, then run the driver again")]
    NoLocalNode {
        /// The head's address.
        address: String,
        /// The folder of node records searched.
        looked_in: String,
    },
    /// A node record on this machine is unreadable.
    #[error("the node record of pid {pid} {reason}")]
    BadNodeRecord {
        /// The node process the record is of.
        pid: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// An object-store request came from a process whose connection had
    /// already closed.
    #[error("object {object_id} was asked for by a process whose connection has closed")]
    CreatorGone {
        /// The object.
        object_id: ObjectId,
    },
    /// An object was created again while its copy is in use.
    #[error("object {object_id} already exists in the store and is in use: being written or answered for by another process, read, spilled or restored")]
    ObjectInUse {
        /// The object.
        object_id: ObjectId,
    },
    /// A process sealed an object that another process created again
    /// since.
    #[error("object {object_id} was created again by another process since this one created it: only the new copy's writer seals it")]
    ObjectCreatedAgain {
        /// The object.
        object_id: ObjectId,
    },
    /// A spilled object could not be read back from disk.
    #[error("object {object_id} could not be read back from disk after {attempts} attempts")]
    RestoreFailed {
        /// The object.
        object_id: ObjectId,
        /// Attempts made.
        attempts: u32,
    },
    /// A range outside the object store's shared segment was asked for.
    #[error("range {offset}+{len} lies outside the {segment_len} byte object segment")]
    OutsideSegment {
        /// Where the range starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The segment's length.
        segment_len: u64,
    },
    /// An actor's instance is not of the type a method was compiled for
    /// (a worker running another build of the program).
    #[error("this actor is not a {expected}: is the worker running the same build as the caller?")]
    WrongActorInstance {
        /// The type the method expects.
        expected: String,
    },
    /// A call was stopped before it finished because its process is
    /// shutting down.
    #[error("the call was stopped before it finished: its process is shutting down")]
    CallAborted,
    /// A connection to another Prism process closed.
    #[error("connection to {peer} closed")]
    Disconnected {
        /// Who was on the other side.
        peer: String,
    },
    /// A peer answered a request with a reply of another request.
    #[error("protocol error: {request} was answered with {reply}; are both processes built from the same Prism version?")]
    UnexpectedReply {
        /// The request made.
        request: String,
        /// The reply received.
        reply: String,
    },
    /// A request reached a process that does not serve it.
    #[error("protocol error: {service} does not serve {request}; are both processes built from the same Prism version?")]
    NotServed {
        /// The service that got it (raylet, executor, owner, driver).
        service: String,
        /// The request.
        request: String,
    },
    /// A connection used the raylet before registering as a driver or a
    /// worker.
    #[error("register with the raylet (as a driver or a worker) before using it")]
    NotRegistered,
    /// A worker registered that this raylet did not start.
    #[error("{worker} was not started by this raylet; a worker must connect to the raylet that started it")]
    UnknownWorker {
        /// The worker.
        worker: WorkerId,
    },
    /// A message was larger than a message of its kind may be (see
    /// [`FrameBound`](crate::messages::FrameBound)); it was not sent, or
    /// its receiver skipped it unread.
    #[error("the {kind} message is {bytes} bytes, over the {limit} bytes a message of its kind may have; pass large values by reference (prism::put) rather than inline")]
    FrameTooLarge {
        /// The message, as `Service/Request` or `response <Answer>`.
        kind: String,
        /// Its size.
        bytes: u64,
        /// Its kind's bound.
        limit: u64,
    },
    /// A peer sent a message that makes no sense here.
    #[error("protocol error: {message}")]
    Protocol {
        /// What was wrong.
        message: String,
    },
}

/// How an actor that held a name died (see [`Error::NamedActorDied`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorDeath {
    /// The actor.
    pub actor_id: ActorId,
    /// The node it ran on.
    pub node: String,
    /// When it died, in milliseconds since the Unix epoch.
    pub died_at_ms: u64,
    /// Why.
    pub cause: String,
}

impl Error {
    /// An `Io` error with the context it happened in.
    pub fn io(context: impl Into<String>, err: impl std::fmt::Display) -> Error {
        Error::Io {
            context: context.into(),
            message: err.to_string(),
        }
    }

    /// An `InvalidArgument` error.
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

/// Prism's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
