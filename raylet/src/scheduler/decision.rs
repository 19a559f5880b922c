//! The scheduler's vocabulary, shared by its parts: who a lease is for
//! ([`Grantee`]) and what the scheduler decided ([`Decision`]), for the
//! caller to carry out.

use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, WorkerId};
use prism_protocol::messages::{EnvVars, PlacementGroupInfo};

/// Who a lease is for.
#[derive(Debug)]
pub(crate) enum Grantee<R> {
    /// A client waiting for an answer through `reply`; `holder` names its
    /// connection, so its leases go when it does.
    Client { holder: u64, reply: R },
    /// An actor's lifetime.
    Actor(ActorId),
}

/// What the scheduler decided; the caller carries it out.
#[derive(Debug)]
pub(crate) enum Decision<R> {
    /// A lease was granted on `worker` (at `address`, process `pid`).
    Granted {
        grantee: Grantee<R>,
        lease: LeaseId,
        worker: WorkerId,
        address: String,
        pid: u32,
        /// Requests of other holders still wait after this round.
        contended: bool,
    },
    /// A request can never be granted.
    Refused { grantee: Grantee<R>, error: Error },
    /// Start a worker process; it is already recorded as starting.
    StartWorker {
        worker: WorkerId,
        job: JobId,
        gpu_ids: Vec<u32>,
        /// Environment variables beyond the job's.
        env: EnvVars,
    },
    /// Kill a worker process.
    StopWorker { pid: u32 },
    /// An actor's worker is gone (or will be): the actor is dead.
    ActorLost { actor: ActorId, reason: String },
    /// Tell client connection `holder` that requests wait for what these
    /// leases hold: it gives each back once its worker is idle.
    LeasesWanted { holder: u64, leases: Vec<LeaseId> },
    /// Answer a caller asking about a placement group.
    GroupAnswer {
        reply: R,
        answer: Result<PlacementGroupInfo, Error>,
    },
}
