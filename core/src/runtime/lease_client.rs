//! What the task submitter asks of raylets and of the workers they lease
//! it ([`LeaseClient`]), and the implementation that asks them over the
//! network ([`RayletLeases`]). The submitter's leasing, reuse, retry and
//! return logic is written against the trait, so that its unit tests run
//! it with a fake that records each call and answers as the test says.

use super::lessee::Lessee;
use super::peers::Peers;
use crate::Result;
use prism_protocol::messages::{
    CancelLeaseRequests, CancelTask, LeaseReply, PushTask, RequestLease, ReturnLease, ReturnObject,
    WorkerExitReason,
};
use prism_protocol::rpc::Connection;
use std::future::Future;
use std::sync::Arc;

/// The verbs the task submitter needs from its raylets and leased workers.
/// Each carries the wire message it stands for; an implementation sends it
/// as it is and answers what the other side answered.
pub(crate) trait LeaseClient: std::fmt::Debug + Send + Sync + 'static {
    /// A raylet leases are asked of and given back to: this node's, or one
    /// a request was sent on to (spillback).
    type Raylet: Clone + std::fmt::Debug + Send + Sync + 'static;
    /// A granted worker, to push tasks to.
    type Worker: Clone + std::fmt::Debug + Send + Sync + 'static;

    /// This node's raylet.
    fn local(&self) -> &Self::Raylet;

    /// The raylet at `address` (another node's, named by a spillback),
    /// with this process registered there as a lessee.
    fn remote(&self, address: &str) -> impl Future<Output = Result<Self::Raylet>> + Send;

    /// Asks `raylet` for a worker lease (`RequestLease`): granted, sent on
    /// to another raylet, or withdrawn.
    fn request_lease(
        &self,
        raylet: &Self::Raylet,
        request: RequestLease,
    ) -> impl Future<Output = Result<LeaseReply>> + Send;

    /// Gives a lease back to the raylet that granted it (`ReturnLease`).
    fn return_lease(&self, raylet: &Self::Raylet, lease: ReturnLease) -> Result<()>;

    /// Asks this node's raylet to withdraw a shape's queued lease requests
    /// (`CancelLeaseRequests`).
    fn withdraw_requests(&self, request: CancelLeaseRequests) -> Result<()>;

    /// Asks `raylet` why one of its workers exited (`WorkerExitReason`).
    fn worker_exit_reason(
        &self,
        raylet: &Self::Raylet,
        request: WorkerExitReason,
    ) -> impl Future<Output = Result<Option<String>>> + Send;

    /// Connects to the granted worker at `address`.
    fn worker(&self, address: &str) -> impl Future<Output = Result<Self::Worker>> + Send;

    /// Sends `worker` a task (`PushTask`); `on_answer` gets its answer
    /// once, `Err(Disconnected)` if the worker goes away first.
    fn push_task(
        &self,
        worker: &Self::Worker,
        task: PushTask,
        on_answer: impl FnOnce(Result<ReturnObject>) + Send + 'static,
    );

    /// Tells `worker` to cancel a task sent to it (`CancelTask`).
    fn cancel_task(&self, worker: &Self::Worker, cancel: CancelTask) -> Result<()>;
}

/// The submitter's leases over the network: requests to this node's
/// raylet connection, to other nodes' raylets through the [`Lessee`], and
/// to workers over their connections from [`Peers`].
#[derive(Debug)]
pub(crate) struct RayletLeases {
    raylet: Connection,
    lessee: Arc<Lessee>,
    peers: Arc<Peers>,
}

impl RayletLeases {
    /// Leases from `raylet` (this node's), from other nodes' raylets
    /// through `lessee`, and reaches workers through `peers`.
    pub(crate) fn new(raylet: Connection, lessee: Arc<Lessee>, peers: Arc<Peers>) -> Self {
        RayletLeases {
            raylet,
            lessee,
            peers,
        }
    }
}

impl LeaseClient for RayletLeases {
    type Raylet = Connection;
    type Worker = Connection;

    fn local(&self) -> &Connection {
        &self.raylet
    }

    async fn remote(&self, address: &str) -> Result<Connection> {
        self.lessee.connect(address).await
    }

    async fn request_lease(
        &self,
        raylet: &Connection,
        request: RequestLease,
    ) -> Result<LeaseReply> {
        raylet.request(request).await
    }

    fn return_lease(&self, raylet: &Connection, lease: ReturnLease) -> Result<()> {
        raylet.notify(lease)
    }

    fn withdraw_requests(&self, request: CancelLeaseRequests) -> Result<()> {
        self.raylet.notify(request)
    }

    async fn worker_exit_reason(
        &self,
        raylet: &Connection,
        request: WorkerExitReason,
    ) -> Result<Option<String>> {
        raylet.request(request).await
    }

    async fn worker(&self, address: &str) -> Result<Connection> {
        self.peers.get(address).await
    }

    #[inline]
    fn push_task(
        &self,
        worker: &Connection,
        task: PushTask,
        on_answer: impl FnOnce(Result<ReturnObject>) + Send + 'static,
    ) {
        worker.request_with(task, on_answer);
    }

    fn cancel_task(&self, worker: &Connection, cancel: CancelTask) -> Result<()> {
        worker.notify(cancel)
    }
}
