//! Objects from this process's side: the values it owns, the references it
//! holds and lends, and getting any object's bytes, wherever it lives.
//!
//! [`Objects`] owns the reference table ([`RefTable`]) and reaches the store
//! through its [`StoreClient`] and other owners through [`Peers`]. It
//! answers the owner service (`GetObjectStatus`, `AddBorrower`,
//! `RemoveBorrower`), and carries out what a count reaching zero requires
//! (deleting from the store, ending a borrow at its owner).

use super::block_on;
use super::lineage::{Lineage, LineageTable, Resubmit};
use super::local_ref::{LocalRef, RefOwner};
use super::owned_actors::OwnedActors;
use super::peers::Peers;
use super::refs::{Readiness, Rebuild, RefTable, Release, ValueState};
use super::store::{Loaded, StoreClient};
use super::streams::{stream_closed, Held, Offered, Streams};
use super::submission::Submission;
use super::task_counts::TaskCounts;
use crate::codec::{self, Arg};
use crate::config::Config;
use crate::{Error, Result};
use bytes::Bytes;
use prism_protocol::ids::{ActorId, ObjectId};
use prism_protocol::messages::{
    AddBorrower, Address, ArgSpec, DeleteObjects, GetObjectStatus, KillActor, LocateActor,
    ObjectRefInfo, ObjectValue, Ownership, RemoveBorrower, Response, ReturnObject, StreamItem,
    TaskOutcome, WorkerBlocked,
};
use prism_protocol::rpc::Connection;
use prism_protocol::serve::Answer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

impl RefOwner for Objects {
    fn release_local(self: Arc<Self>, id: ObjectId) {
        self.drop_local_ref(id);
    }
}

/// How many times one read makes a lost object again before giving up.
const MAX_REBUILDS_PER_READ: u32 = 3;

/// This process's objects; see the module docs.
#[derive(Debug)]
pub(crate) struct Objects {
    rt: tokio::runtime::Handle,
    pub(crate) config: Arc<Config>,
    /// Workers tell the raylet when they block in `get`; drivers do not.
    is_worker: bool,
    raylet: Connection,
    pub(crate) store: Arc<StoreClient>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) refs: RefTable,
    /// Gets and waits in progress.
    waiting: AtomicUsize,
    /// The lineage of owned objects in a store, by object.
    lineage: parking_lot::Mutex<LineageTable>,
    /// What runs lineage again: the task submitter, which is built around
    /// these objects (`Arc::new_cyclic` in `startup`), so that this is
    /// given at construction and never set later.
    resubmit: Weak<dyn Resubmit>,
    /// The actors this process created on other nodes: told when one's
    /// last handle goes, asked where one is.
    owned_actors: Arc<OwnedActors>,
    /// Tasks this process owned that ended, for the node's metrics.
    task_counts: Arc<TaskCounts>,
    /// The values of this process's streaming calls, not taken yet.
    pub(crate) streams: Streams,
}

/// How a put stores its value.
enum PutPlan<'a> {
    /// Small: kept by the owner, with the references inside it.
    Inline(Bytes, Vec<ObjectRefInfo>),
    /// A large flat buffer: its header and memory image.
    Raw([u8; codec::RAW_HEADER_BYTES], &'a [u8]),
    /// A large encoded value, with the references inside it.
    Encoded(Vec<u8>, Vec<ObjectRefInfo>),
}

impl PutPlan<'_> {
    /// What goes into the store, back to back; `None` for an inline value.
    fn store_parts(&self) -> Option<Vec<&[u8]>> {
        match self {
            PutPlan::Inline(..) => None,
            PutPlan::Raw(header, payload) => Some(vec![&header[..], payload]),
            PutPlan::Encoded(bytes, _) => Some(vec![&bytes[..]]),
        }
    }

    /// The value kept by the owner (for an inline plan), and the
    /// references the value contains.
    fn into_owned(self) -> (Option<Bytes>, Vec<ObjectRefInfo>) {
        match self {
            PutPlan::Inline(bytes, contains) => (Some(bytes), contains),
            PutPlan::Raw(..) => (None, Vec::new()),
            PutPlan::Encoded(_, contains) => (None, contains),
        }
    }
}

/// Marks this worker as waiting for objects while it lives: a worker that
/// waits lends its task's CPUs back to the raylet, so the tasks it waits for
/// can be scheduled even when every CPU is leased (nested `get`s).
pub(crate) struct WaitGuard {
    objects: Option<Arc<Objects>>,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Some(objects) = &self.objects {
            if objects.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
                let _ = objects.raylet.notify(WorkerBlocked { blocked: false });
            }
        }
    }
}

/// The components [`Objects`] is built on, made before it.
pub(crate) struct ObjectsParts {
    pub(crate) store: Arc<StoreClient>,
    pub(crate) peers: Arc<Peers>,
    pub(crate) owned_actors: Arc<OwnedActors>,
    pub(crate) task_counts: Arc<TaskCounts>,
    /// What runs lineage again (the task submitter, built around these
    /// objects: see `startup`).
    pub(crate) resubmit: Weak<dyn Resubmit>,
}

impl Objects {
    pub(crate) fn new(
        rt: tokio::runtime::Handle,
        config: Arc<Config>,
        is_worker: bool,
        raylet: Connection,
        address: Address,
        parts: ObjectsParts,
    ) -> Self {
        let ObjectsParts {
            store,
            peers,
            owned_actors,
            task_counts,
            resubmit,
        } = parts;
        Objects {
            owned_actors,
            task_counts,
            rt,
            config,
            is_worker,
            raylet,
            store,
            peers,
            refs: RefTable::new(address),
            waiting: AtomicUsize::new(0),
            lineage: parking_lot::Mutex::new(LineageTable::default()),
            resubmit,
            streams: Streams::default(),
        }
    }

    /// The counts of this process's ended and waiting tasks.
    pub(crate) fn task_counts(&self) -> &Arc<TaskCounts> {
        &self.task_counts
    }

    /// This process's address: its socket path (and in a multi-node
    /// cluster its TCP address and node, see `rpc::Endpoint`).
    pub(crate) fn address(&self) -> &Address {
        self.refs.me()
    }

    /// A guard for a get or wait that may block.
    pub(crate) fn waiting(self: &Arc<Self>) -> WaitGuard {
        if !self.is_worker {
            return WaitGuard { objects: None };
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = self.raylet.notify(WorkerBlocked { blocked: true });
        }
        WaitGuard {
            objects: Some(self.clone()),
        }
    }

    /// Carries out what a reference count reaching zero requires.
    pub(crate) fn apply_releases(self: &Arc<Self>, releases: Vec<Release>) {
        if releases.is_empty() {
            return;
        }
        let mut deletes: HashMap<Option<String>, Vec<ObjectId>> = HashMap::new();
        let mut ends: HashMap<Address, (Vec<ObjectId>, Vec<u64>)> = HashMap::new();
        for r in releases {
            match r {
                Release::DeleteFromStore(id, holder) => {
                    self.lineage.lock().freed(id);
                    deletes.entry(holder).or_default().push(id)
                }
                Release::EndBorrow { owner, id, count } => {
                    let (ids, counts) = ends.entry(owner).or_default();
                    ids.push(id);
                    counts.push(count);
                }
                Release::ActorOutOfScope(actor_id) => {
                    let Some(node_id) = self.owned_actors.out_of_scope(actor_id) else {
                        tracing::debug!(actor = %actor_id, "every handle to an actor that ended is gone");
                        continue;
                    };
                    tracing::debug!(actor = %actor_id, "every handle to an actor is gone; stopping it");
                    let _ = self.raylet.notify(KillActor {
                        actor_id,
                        no_restart: true,
                        out_of_scope: true,
                        node_id,
                    });
                }
            }
        }
        // The local raylet deletes what its store holds and passes the
        // rest on to the raylets of the nodes that hold them.
        for (node, ids) in deletes {
            let _ = self.raylet.notify(DeleteObjects { ids, node });
        }
        for (owner, (ids, counts)) in ends {
            let borrower = self.address().clone();
            let peers = self.peers.clone();
            self.rt.spawn(async move {
                if let Ok(conn) = peers.get(&owner).await {
                    let _ = conn.notify(RemoveBorrower {
                        ids,
                        borrower,
                        counts,
                    });
                }
            });
        }
    }

    pub(crate) fn drop_local_ref(self: &Arc<Self>, id: ObjectId) {
        let releases = self.refs.remove_local(id);
        self.apply_releases(releases);
    }

    /// Records a task's outcome on its result objects and releases what
    /// it held.
    pub(crate) fn finish_task(
        self: &Arc<Self>,
        submission: &Submission,
        result: Result<ReturnObject>,
    ) {
        let spec = &submission.spec;
        let (outcome, error) = match &result {
            Ok(_) => (TaskOutcome::Finished, None),
            Err(e) => (TaskOutcome::Failed, Some(e.to_string())),
        };
        self.task_counts.record(
            spec.task_id,
            &spec.function,
            submission.actor_handle.is_some(),
            submission.submitted_us,
            outcome,
            submission.failures.len() as u32,
            error,
        );
        let mut releases = match result {
            Ok(first) if spec.more_returns.is_empty() && first.more.is_empty() => {
                self.set_result(spec.return_id, Ok(first))
            }
            Ok(mut first) => {
                let mut values = std::mem::take(&mut first.more).into_iter();
                let mut releases = self.set_result(spec.return_id, Ok(first));
                for id in spec.more_returns.iter().copied() {
                    let value = values.next().ok_or_else(|| {
                        let reason = format!(
                            "`{}` answered fewer values than the {} it returns",
                            spec.function,
                            spec.more_returns.len() + 1
                        );
                        Error::invalid("num_returns", reason)
                    });
                    releases.extend(self.set_result(id, value));
                }
                releases
            }
            Err(e) => {
                let mut releases = Vec::new();
                for id in spec.more_returns.iter().copied() {
                    releases.extend(self.set_result(id, Err(e.clone())));
                }
                releases.extend(self.set_result(spec.return_id, Err(e)));
                releases
            }
        };
        releases.extend(self.refs.remove_submitted(&submission.held));
        self.apply_releases(releases);
    }

    /// Records one result of a task. A result still set from before is
    /// kept: the task ran again to make another of its results, lost with
    /// its node, and this one's value stands (only the borrows the new
    /// answer registered end).
    fn set_result(&self, id: ObjectId, result: Result<ReturnObject>) -> Vec<Release> {
        let (value, contained) = match result {
            Ok(ret) => (ValueState::Ready(ret.value), ret.contained),
            Err(e) => (ValueState::Failed(Box::new(e)), Vec::new()),
        };
        let in_store = matches!(value, ValueState::Ready(ObjectValue::InStore { .. }));
        let (set, releases) = self.refs.set_result(id, value, contained);
        if set && !in_store {
            self.lineage.lock().forget(id);
        }
        releases
    }

    /// Drops the `submitted` counts in `held`.
    pub(crate) fn release_held(self: &Arc<Self>, held: &[ObjectId]) {
        let releases = self.refs.remove_submitted(held);
        self.apply_releases(releases);
    }

    /// Tells owners about references this process deserialized.
    pub(crate) async fn register_borrows(self: &Arc<Self>) -> Result<()> {
        let pending = self.refs.take_unregistered();
        if pending.is_empty() {
            return Ok(());
        }
        let mut by_owner: HashMap<Address, Vec<ObjectRefInfo>> = HashMap::new();
        for info in pending {
            by_owner.entry(info.owner.clone()).or_default().push(info);
        }
        for (owner, infos) in by_owner {
            let ids = infos.iter().map(|i| i.id).collect();
            let conn = self.peers.get(&owner).await?;
            conn.request(AddBorrower {
                ids,
                borrower: self.address().clone(),
                from_borrower: true,
            })
            .await?;
            let late = self.refs.registered(&infos);
            self.apply_releases(late);
        }
        Ok(())
    }

    /// Registers `borrower` for `refs` with their owners (before handing a
    /// value that contains them to `borrower`).
    pub(crate) async fn lend(&self, refs: &[ObjectRefInfo], borrower: &Address) -> Result<()> {
        let mut by_owner: HashMap<&Address, Vec<ObjectId>> = HashMap::new();
        for r in refs {
            if &r.owner != borrower {
                by_owner.entry(&r.owner).or_default().push(r.id);
            }
        }
        for (owner, ids) in by_owner {
            if self.refs.is_mine(owner) {
                self.refs.add_borrower(&ids, borrower);
            } else {
                self.peers
                    .get(owner)
                    .await?
                    .request(AddBorrower {
                        ids,
                        borrower: borrower.clone(),
                        from_borrower: false,
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// Waits for an object's value, wherever it is. A stored object whose
    /// node died is made again from its lineage by its owner (this process
    /// or, when asked, the owner of a borrowed one), a bounded number of
    /// times.
    pub(crate) async fn fetch(self: &Arc<Self>, info: &ObjectRefInfo) -> Result<Loaded> {
        let mut lost: Option<(String, Error)> = None;
        for _ in 0..=MAX_REBUILDS_PER_READ {
            let value = if self.refs.is_mine(&info.owner) {
                if let Some((node, error)) = lost.take() {
                    if !self.rebuild(info.id, &node) {
                        return Err(error);
                    }
                }
                self.wait_owned(info.id).await?.0
            } else {
                self.ask_owner(info, lost.take().map(|(node, _)| node))
                    .await?
            };
            let holder = match &value {
                ObjectValue::InStore { node, .. } => node.clone(),
                ObjectValue::Inline(_) => None,
            };
            match (self.load(info.id, &info.owner, value).await, holder) {
                (Err(e @ Error::ObjectLost { .. }), Some(node)) => lost = Some((node, e)),
                (other, _) => return other,
            }
        }
        Err(Error::ObjectLost {
            object_id: info.id,
            cause: format!(
                "its node died, and it was lost again each of the {MAX_REBUILDS_PER_READ} times \
                 it was made again"
            ),
        })
    }

    /// The value of a borrowed object, from its owner (told that the copy
    /// on `lost_at` is gone, if it is).
    async fn ask_owner(
        &self,
        info: &ObjectRefInfo,
        lost_at: Option<String>,
    ) -> Result<ObjectValue> {
        let owner_died = || Error::OwnerDied {
            object_id: info.id,
            owner: info.owner.clone(),
        };
        let conn = self
            .peers
            .get(&info.owner)
            .await
            .map_err(|_| owner_died())?;
        match conn
            .request(GetObjectStatus {
                id: info.id,
                lost_at,
            })
            .await
        {
            Ok(ret) => Ok(ret.value),
            Err(Error::Disconnected { .. }) => Err(owner_died()),
            Err(e) => Err(e),
        }
    }

    /// Keeps how an object is being made, for [`Objects::rebuild`].
    pub(crate) fn record_lineage(&self, lineage: Lineage) {
        if lineage.max_retries == 0 {
            return;
        }
        self.lineage.lock().record(lineage);
    }

    /// Makes an owned object whose copy on node `lost_node` is gone again,
    /// by running its task again; false when it cannot be.
    pub(crate) fn rebuild(self: &Arc<Self>, id: ObjectId, lost_node: &str) -> bool {
        let lineage = self.lineage.lock().get(id);
        let submitter = self.resubmit.upgrade();
        let (Some(lineage), Some(submitter)) = (lineage, submitter) else {
            return false;
        };
        match self.refs.rebuild(id, lost_node) {
            Rebuild::Start => {
                tracing::warn!(
                    object = %id,
                    node = %lost_node,
                    function = %lineage.spec.function,
                    "an object was lost with its node; running its task again to make it"
                );
                // The task's other results stored on that node went with
                // it: this run makes them again too.
                let siblings: Vec<ObjectId> = (lineage.spec.returns())
                    .filter(|s| *s != id)
                    .filter(|s| matches!(self.refs.rebuild(*s, lost_node), Rebuild::Start))
                    .collect();
                if self.rerun(lineage, &submitter) {
                    return true;
                }
                let error = |object_id| Error::ObjectLost {
                    object_id,
                    cause: format!(
                        "its only copy was on node {lost_node}, which is gone, and an object \
                         its task took by reference is gone too and cannot be made again (it \
                         was put, or freed without a lineage)"
                    ),
                };
                // It will not be made again: its lineage goes (and with
                // it what only it kept).
                let mut releases = Vec::new();
                for lost in siblings.into_iter().chain([id]) {
                    self.lineage.lock().forget(lost);
                    let failed = ValueState::Failed(Box::new(error(lost)));
                    releases.extend(self.refs.set_value(lost, failed, Vec::new()));
                }
                self.apply_releases(releases);
                true
            }
            Rebuild::Wait => true,
            Rebuild::Gone => false,
        }
    }

    /// Runs `first`'s task again. Each object it took by reference is
    /// held for the run; one whose value was freed since is made again
    /// first, from its own lineage (and so on down). False, with nothing
    /// run or held, when one of them is gone for good.
    fn rerun(self: &Arc<Self>, first: Lineage, submitter: &Arc<dyn Resubmit>) -> bool {
        let mut runs = Vec::new();
        let mut held: Vec<ObjectId> = Vec::new();
        let mut remade: Vec<ObjectId> = Vec::new();
        let mut ok = true;
        {
            let mut table = self.lineage.lock();
            let mut stack = vec![first];
            'plan: while let Some(lineage) = stack.pop() {
                for &d in &lineage.deps {
                    if self.refs.hold(d) {
                        held.push(d);
                        continue;
                    }
                    // Freed: made again from its lineage, if kept.
                    let Some(dep) = table.get(d) else {
                        ok = false;
                        break 'plan;
                    };
                    table.revive(d);
                    self.refs.add_remade(d);
                    remade.push(d);
                    held.push(d);
                    stack.push(dep);
                }
                runs.push(lineage);
            }
        }
        if !ok {
            // Nothing runs: what was remade for it is freed again (its
            // entry ends pending, so no delete reaches the lineage table).
            {
                let mut table = self.lineage.lock();
                for d in &remade {
                    table.freed(*d);
                }
            }
            let releases = self.refs.remove_submitted(&held);
            self.apply_releases(releases);
            return false;
        }
        for lineage in runs {
            tracing::debug!(object = %lineage.spec.return_id, function = %lineage.spec.function, "running a task again");
            super::submission::note_rebuilt();
            let deps = lineage.deps.clone();
            submitter.clone().resubmit(lineage, deps);
        }
        true
    }

    /// The bytes of a ready value: carried inline, in this node's store, or
    /// pulled from the node whose store holds it into this one first.
    pub(crate) async fn load(
        &self,
        id: ObjectId,
        owner: &str,
        value: ObjectValue,
    ) -> Result<Loaded> {
        match value {
            ObjectValue::Inline(bytes) => Ok(Loaded::Inline(bytes)),
            ObjectValue::InStore {
                node: Some(holder),
                size,
            } if !self.store.holds(Some(&holder)) => {
                self.store.pull(id, holder, size, owner).await?;
                self.store.load(id).await
            }
            ObjectValue::InStore { .. } => self.store.load(id).await,
        }
    }

    /// Waits until an owned object is ready.
    pub(crate) async fn wait_owned(
        &self,
        id: ObjectId,
    ) -> Result<(ObjectValue, Vec<ObjectRefInfo>)> {
        loop {
            match self.refs.readiness(id) {
                Readiness::Ready(v, contains) => return Ok((v, contains)),
                Readiness::Failed(e) => return Err(e),
                Readiness::Wait(rx) => {
                    let _ = rx.await;
                }
            }
        }
    }

    /// Stores an encoded value as a new owned object (inline or in the store).
    pub(crate) async fn store_value(
        &self,
        id: ObjectId,
        encoded: codec::Encoded,
        caller: &Address,
    ) -> Result<ObjectValue> {
        if encoded.len() as u64 <= self.config.max_direct_call_object_size_bytes {
            return Ok(ObjectValue::Inline(Bytes::from(encoded.into_bytes())));
        }
        // A task's return value: its caller owns it.
        let owner = Ownership::Caller(caller.clone());
        self.store.write(id, &encoded.parts(), owner).await
    }

    /// [`StoreClient::write`] from synchronous code: the copy runs on the
    /// calling thread, only the two store requests go through the runtime.
    fn write_to_store_blocking(&self, id: ObjectId, parts: &[&[u8]]) -> Result<ObjectValue> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let store = self.store.clone();
        let offset = block_on(&self.rt, async move {
            store.create(id, size, Ownership::Creator).await
        })?;
        self.store.write_parts(offset, parts)?;
        let store = self.store.clone();
        block_on(&self.rt, async move { store.seal(id).await })?;
        Ok(ObjectValue::InStore {
            size,
            node: self.store.node().cloned(),
        })
    }

    /// Decides how a value is stored: inline, or as store parts (a raw
    /// buffer is not copied here; it is written straight into the store).
    fn plan_put<'a, T: serde::Serialize + 'static>(&self, value: &'a T) -> Result<PutPlan<'a>> {
        let threshold = self.config.max_direct_call_object_size_bytes as usize;
        Ok(match codec::raw_parts(value) {
            Some((tag, payload)) if payload.len() + codec::RAW_HEADER_BYTES > threshold => {
                PutPlan::Raw(codec::raw_header(tag, payload.len()), payload)
            }
            _ => {
                let mut encoded = codec::encode(value)?;
                let contained = std::mem::take(&mut encoded.contained);
                if encoded.len() <= threshold {
                    PutPlan::Inline(Bytes::from(encoded.into_bytes()), contained)
                } else {
                    PutPlan::Encoded(encoded.into_bytes(), contained)
                }
            }
        })
    }

    /// Records a put as an owned object: stored as `in_store`, or inline.
    fn record_put(
        &self,
        id: ObjectId,
        in_store: Option<ObjectValue>,
        plan: PutPlan<'_>,
    ) -> ObjectRefInfo {
        let (inline, contains) = plan.into_owned();
        let stored = in_store
            .or(inline.map(ObjectValue::Inline))
            .unwrap_or(ObjectValue::Inline(Bytes::new()));
        self.refs.add_owned(id, ValueState::Ready(stored), contains);
        ObjectRefInfo {
            id,
            owner: self.address().clone(),
        }
    }

    /// Creates an owned object from a value and returns its reference.
    pub(crate) fn put_object<T: serde::Serialize + 'static>(
        &self,
        value: &T,
    ) -> Result<ObjectRefInfo> {
        let id = ObjectId::new();
        let plan = self.plan_put(value)?;
        let in_store = match plan.store_parts() {
            Some(parts) => Some(self.write_to_store_blocking(id, &parts)?),
            None => None,
        };
        Ok(self.record_put(id, in_store, plan))
    }

    /// The async form of [`Objects::put_object`].
    pub(crate) async fn put_object_async<T: serde::Serialize + 'static>(
        &self,
        value: &T,
    ) -> Result<ObjectRefInfo> {
        let id = ObjectId::new();
        let plan = self.plan_put(value)?;
        let in_store = match plan.store_parts() {
            Some(parts) => Some(self.store.write(id, &parts, Ownership::Creator).await?),
            None => None,
        };
        Ok(self.record_put(id, in_store, plan))
    }

    /// A new handle object for an actor this process creates, with one
    /// local count: the actor lives while it (or a borrow of it) does.
    pub(crate) fn new_actor_handle(&self, actor: ActorId) -> ObjectRefInfo {
        let id = ObjectId::new();
        self.refs.add_actor_handle(id, actor);
        ObjectRefInfo {
            id,
            owner: self.address().clone(),
        }
    }

    /// A pending owned object with one local count, for a call's return.
    pub(crate) fn new_pending(&self, id: ObjectId) -> ObjectRefInfo {
        self.refs.add_owned(id, ValueState::Pending, Vec::new());
        ObjectRefInfo {
            id,
            owner: self.address().clone(),
        }
    }

    /// As [`new_pending`](Self::new_pending), for the result of a call
    /// of `actor`.
    pub(crate) fn new_pending_call(&self, id: ObjectId, actor: ActorId) -> ObjectRefInfo {
        self.refs.add_actor_call(id, actor);
        ObjectRefInfo {
            id,
            owner: self.address().clone(),
        }
    }

    /// Turns call arguments into wire arguments. Large values are put in the
    /// store first; every object the call refers to (directly or nested in
    /// a value) gains a `submitted` count, returned as `held`, that the
    /// caller drops when the call answers.
    pub(crate) fn prepare_args(&self, args: Vec<Arg>) -> Result<(Vec<ArgSpec>, Vec<ObjectId>)> {
        let threshold = self.config.max_direct_call_object_size_bytes as usize;
        let mut specs = Vec::with_capacity(args.len());
        let mut held = Vec::new();
        let mut large = Vec::new();
        let mut keep_alive = Vec::new();
        for arg in args {
            match arg {
                Arg::Ref(info) => {
                    held.push(info.id);
                    specs.push(ArgSpec::Ref(info));
                }
                Arg::Value(mut encoded) if encoded.len() > threshold => {
                    let id = ObjectId::new();
                    let contained = std::mem::take(&mut encoded.contained);
                    keep_alive.extend(std::mem::take(&mut encoded.keep_alive));
                    let store = self.store.clone();
                    let value = block_on(&self.rt, async move {
                        store.write(id, &encoded.parts(), Ownership::Creator).await
                    })?;
                    // Owned with one count, which the task takes over from
                    // the (never created) handle.
                    self.refs.add_owned(id, ValueState::Ready(value), contained);
                    large.push(id);
                    specs.push(ArgSpec::Ref(ObjectRefInfo {
                        id,
                        owner: self.address().clone(),
                    }));
                }
                Arg::Value(mut encoded) => {
                    held.extend(encoded.contained.iter().map(|c| c.id));
                    keep_alive.extend(std::mem::take(&mut encoded.keep_alive));
                    specs.push(ArgSpec::Value(Bytes::from(encoded.into_bytes())));
                }
            }
        }
        self.refs.add_submitted(&held);
        for id in large {
            self.refs.add_submitted(&[id]);
            let _ = self.refs.remove_local(id);
            held.push(id);
        }
        drop(keep_alive);
        Ok((specs, held))
    }

    /// Inlines arguments whose objects are ready here; `Ok(false)` if some
    /// are still being computed (nothing is changed then).
    pub(crate) fn resolve_args_now(&self, args: &mut [ArgSpec]) -> Result<bool> {
        let mut resolved = Vec::new();
        for (i, arg) in args.iter().enumerate() {
            let ArgSpec::Ref(info) = arg else { continue };
            if !self.refs.is_mine(&info.owner) {
                continue; // the executor asks the owner
            }
            match self.refs.value_now(info.id) {
                Some(Ok(ObjectValue::Inline(bytes))) => resolved.push((i, bytes)),
                Some(Ok(ObjectValue::InStore { .. })) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(false),
            }
        }
        for (i, bytes) in resolved {
            args[i] = ArgSpec::Value(bytes);
        }
        Ok(true)
    }

    /// Waits for every reference argument and inlines the small ones.
    pub(crate) async fn resolve_args(&self, args: Vec<ArgSpec>) -> Result<Vec<ArgSpec>> {
        let mut out = Vec::with_capacity(args.len());
        for arg in args {
            let resolved = match arg {
                ArgSpec::Ref(info) if self.refs.is_mine(&info.owner) => {
                    match self.wait_owned(info.id).await? {
                        (ObjectValue::Inline(bytes), _) => ArgSpec::Value(bytes),
                        (ObjectValue::InStore { .. }, _) => ArgSpec::Ref(info),
                    }
                }
                other => other,
            };
            out.push(resolved);
        }
        Ok(out)
    }

    /// Sends value `item.index` of a streaming call to its caller, `owner`:
    /// the receiver of the caller's answer, or `None` when this process is
    /// the caller and took it in already.
    pub(crate) async fn send_stream_item(
        self: &Arc<Self>,
        owner: &Address,
        item: StreamItem,
    ) -> Result<Option<tokio::sync::oneshot::Receiver<Response>>> {
        if self.refs.is_mine(owner) {
            // No answer to hold back: this caller reads on this side.
            return match self.take_stream_item(item, None) {
                Offered::Closed => Err(stream_closed()),
                Offered::Taken | Offered::Held => Ok(None),
            };
        }
        Ok(Some(self.peers.get(owner).await?.start_call(item.into())?))
    }

    /// A value of one of this process's streaming calls arrived: it
    /// becomes an owned object, as a call's result does, kept for the
    /// call's generator (or freed, if the generator is gone or has it
    /// already). `answer`: where the answer goes, if it may be held back.
    fn take_stream_item(self: &Arc<Self>, item: StreamItem, answer: Option<Held>) -> Offered {
        let StreamItem {
            generator,
            index,
            id,
            item,
        } = item;
        let owner: Weak<dyn RefOwner> = Arc::downgrade(self) as Weak<dyn RefOwner>;
        let handle = LocalRef::counted(self.new_pending(id), owner);
        let releases = self.set_result(id, Ok(item));
        self.apply_releases(releases);
        self.streams.offer(generator, index, handle, answer)
    }

    /// Answers with an owned object's value once it is ready; one lost
    /// with a node (`lost_at`) is made again first, if it can be.
    pub(crate) fn serve_status(
        self: &Arc<Self>,
        request: GetObjectStatus,
        answer: Answer<GetObjectStatus>,
    ) {
        let GetObjectStatus {
            id: object_id,
            lost_at,
        } = request;
        let objects = self.clone();
        self.rt.spawn(async move {
            if let Some(node) = lost_at {
                if !objects.rebuild(object_id, &node) {
                    return answer.send(Err(Error::ObjectLost {
                        object_id,
                        cause: format!(
                            "its only copy was on node {node}, which is gone, and it \
                             cannot be made again: it was put, or its task took \
                             objects owned by another process by reference, may not \
                             be retried (max_retries 0), made a value holding \
                             references, or streamed it (the values of a streaming \
                             call are not made again)"
                        ),
                    }));
                }
            }
            answer.send(
                objects
                    .wait_owned(object_id)
                    .await
                    .map(|(value, contained)| ReturnObject {
                        value,
                        contained,
                        more: Vec::new(),
                    }),
            );
        });
    }

    /// Records borrowers of owned objects.
    pub(crate) fn serve_add_borrower(&self, request: AddBorrower, answer: Answer<AddBorrower>) {
        self.refs.add_borrower(&request.ids, &request.borrower);
        answer.send(Ok(()));
    }

    /// Drops borrowers of owned objects, freeing what no one holds.
    pub(crate) fn serve_remove_borrower(
        self: &Arc<Self>,
        request: RemoveBorrower,
        answer: Answer<RemoveBorrower>,
    ) {
        let RemoveBorrower {
            ids,
            borrower,
            counts,
        } = request;
        let releases = self.refs.remove_borrower(&ids, &counts, &borrower);
        self.apply_releases(releases);
        answer.send(Ok(()));
    }

    /// Takes a streamed value: answered now, or once the stream's reader
    /// has room for it (backpressure).
    pub(crate) fn serve_stream_item(
        self: &Arc<Self>,
        item: StreamItem,
        answer: Answer<StreamItem>,
    ) {
        let (conn, id) = answer.into_parts();
        match self.take_stream_item(item, Some((conn.clone(), id))) {
            Offered::Taken => conn.respond(id, Response::Ok),
            Offered::Held => {}
            Offered::Closed => conn.respond(id, Response::Error(stream_closed())),
        }
    }

    /// Says where an actor this process owns is.
    pub(crate) fn serve_locate_actor(&self, request: LocateActor, answer: Answer<LocateActor>) {
        answer.send(Ok(self.owned_actors.locate(request.actor_id)));
    }
}
