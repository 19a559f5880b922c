//! Ownership and reference counting of objects.
//!
//! The process that creates an object (by `put`, or by submitting the task
//! that returns it) owns it: it holds the object's value (small values) or
//! knows it is in the node's store (large ones), and decides when it is
//! freed. Every process keeps one [`RefTable`] entry per object it holds
//! references to. This type is thread safe.
//!
//! An entry counts:
//!
//! - `local`: live `ObjectRef` handles in this process;
//! - `submitted`: tasks in flight that take the object as an argument (kept
//!   until the task's reply, so the executor can fetch it);
//! - `contained_in`: objects owned or borrowed here whose values contain a
//!   reference to this one;
//! - `borrowers` (owned objects only): other processes holding references,
//!   each with the number of times it was registered (below).
//!
//! Invariants:
//!
//! 1. An owned entry is removed, and its store copy deleted, only when all
//!    three counts are zero and it has no borrowers.
//! 2. A borrowed entry is removed when its counts reach zero; if the owner
//!    was told of the borrow, it is then told that the borrow ended.
//! 3. A process registers itself as a borrower with the owner before the
//!    reference that gave it the handle can go away: before it answers the
//!    task that carried the reference, or before `get` returns the value
//!    that contained it.
//! 4. Borrows are counted, not flags. The owner counts every registration
//!    of a borrower (the borrower's own, and each one a task's executor
//!    makes when it returns a value holding the reference to its caller);
//!    the borrower's entry counts the registrations made for it while it
//!    lived (`lent`), and its end-of-borrow message carries that number,
//!    which the owner subtracts. A borrower that dropped the object and was
//!    handed it again before its end-of-borrow arrived therefore stays a
//!    borrower: the stale message takes away only the registrations of the
//!    entry it ended, not the new one's.
//!
//! An actor's handle is counted the same way: an unnamed, non-detached
//! actor's creator owns a value-less *handle object*, which every
//! [`ActorHandle`](crate::ActorHandle) of it refers to (and every call in
//! flight holds as an argument would be). When that entry is removed, the
//! last handle anywhere is gone, and the actor is stopped
//! ([`Release::ActorOutOfScope`]).

use crate::Error;
use parking_lot::Mutex;
use prism_protocol::ids::{ActorId, IdMap, ObjectId};
use prism_protocol::messages::{Address, ObjectRefInfo, ObjectValue};
use std::collections::HashMap;
use tokio::sync::{mpsc, oneshot};

/// What an owner knows of an object's value.
#[derive(Debug, Clone)]
pub(crate) enum ValueState {
    /// The task producing it has not answered yet.
    Pending,
    /// Available.
    Ready(ObjectValue),
    /// The producing task failed; `get` returns this error (boxed: most
    /// entries never fail, and an entry is as large as its largest state).
    Failed(Box<Error>),
}

#[derive(Debug)]
struct Entry {
    /// `None` when this process owns the object.
    owner: Option<Address>,
    local: u64,
    submitted: u64,
    contained_in: u64,
    value: ValueState,
    waiters: Vec<Waiter>,
    /// What only some entries have, kept apart so that the entry of a
    /// plain task result (a million of them for a million queued tasks)
    /// stays small.
    rare: Option<Box<Rare>>,
}

/// The parts of an [`Entry`] that most entries lack.
#[derive(Debug, Default)]
struct Rare {
    /// Registrations per borrowing process (owned objects only).
    borrowers: HashMap<Address, u64>,
    /// Registrations with the owner made for this entry (borrowed objects
    /// only): carried by its end-of-borrow message.
    lent: u64,
    contains: Vec<ObjectRefInfo>,
    /// Owned handle objects only: the actor whose handles it counts.
    actor: Option<ActorId>,
    /// Owned results of actor calls only: the actor called (for
    /// `prism::cancel`).
    call_of: Option<ActorId>,
    /// A further result of a call that returns several: the call's first
    /// result, which names the call (for `prism::cancel`).
    first_return: Option<ObjectId>,
}

/// Who waits for an owned object's value (or its failure, or its end).
#[derive(Debug)]
enum Waiter {
    /// A `get` of this object.
    One(oneshot::Sender<()>),
    /// A `wait` over many objects, told this one's index in its list.
    Among(mpsc::UnboundedSender<usize>, usize),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::One(tx) => {
                let _ = tx.send(());
            }
            Waiter::Among(tx, i) => {
                let _ = tx.send(i);
            }
        }
    }

    /// Whoever waited has stopped waiting.
    fn gone(&self) -> bool {
        match self {
            Waiter::One(tx) => tx.is_closed(),
            Waiter::Among(tx, _) => tx.is_closed(),
        }
    }
}

/// Adds a waiter, first dropping those that stopped waiting once there are
/// many (a `wait` with a timeout, called again and again on objects that
/// stay pending, would otherwise pile them up).
fn add_waiter(waiters: &mut Vec<Waiter>, w: Waiter) {
    if waiters.len() >= 16 {
        waiters.retain(|w| !w.gone());
    }
    waiters.push(w);
}

impl Entry {
    fn new(owner: Option<Address>, value: ValueState) -> Entry {
        Entry {
            owner,
            local: 0,
            submitted: 0,
            contained_in: 0,
            value,
            waiters: Vec::new(),
            rare: None,
        }
    }

    fn unused(&self) -> bool {
        self.local == 0
            && self.submitted == 0
            && self.contained_in == 0
            && self.rare.as_ref().is_none_or(|r| r.borrowers.is_empty())
    }

    /// The rare parts, made when first written.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Default::default)
    }

    fn contains(&self) -> &[ObjectRefInfo] {
        self.rare.as_ref().map_or(&[], |r| &r.contains)
    }
}

/// Side effects of a count reaching zero, carried out by the caller after
/// the table's lock is released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Delete an owned object from the store of the node that holds it
    /// (`None`: this one), with the copies other nodes pulled.
    DeleteFromStore(ObjectId, Option<String>),
    /// Tell an owner this process no longer borrows an object, undoing
    /// `count` registrations.
    EndBorrow {
        owner: Address,
        id: ObjectId,
        count: u64,
    },
    /// Every handle to an actor this process created is gone: stop it.
    ActorOutOfScope(ActorId),
}

/// Whether an owned object whose copy was lost can be made again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rebuild {
    /// It is pending again: run its task.
    Start,
    /// It is being made again, or has another copy now: read it again.
    Wait,
    /// It cannot be (freed, failed, not owned here, or its value holds
    /// references).
    Gone,
}

/// What waiting for an owned object's value gives.
#[derive(Debug)]
pub(crate) enum Readiness {
    /// The value, with the references it contains.
    Ready(ObjectValue, Vec<ObjectRefInfo>),
    /// Failed.
    Failed(Error),
    /// Not yet: await the receiver and ask again.
    Wait(oneshot::Receiver<()>),
}

/// The reference table of one process.
#[derive(Debug)]
pub(crate) struct RefTable {
    me: Address,
    entries: Mutex<IdMap<ObjectId, Entry>>,
    unregistered: Mutex<Vec<ObjectRefInfo>>,
}

impl RefTable {
    pub(crate) fn new(me: Address) -> Self {
        RefTable {
            me,
            entries: Mutex::new(IdMap::default()),
            unregistered: Mutex::new(Vec::new()),
        }
    }

    /// This process's address.
    pub(crate) fn me(&self) -> &Address {
        &self.me
    }

    /// Whether `owner` is this process.
    pub(crate) fn is_mine(&self, owner: &str) -> bool {
        owner == self.me
    }

    /// A new handle object counting the handles of `actor`, with one local
    /// count (the creator's first handle).
    pub(crate) fn add_actor_handle(&self, id: ObjectId, actor: ActorId) {
        let mut e = Entry::new(
            None,
            ValueState::Ready(ObjectValue::Inline(Default::default())),
        );
        e.local = 1;
        e.rare().actor = Some(actor);
        self.entries.lock().insert(id, e);
    }

    /// A new pending result of a call of `actor`, with one local handle.
    pub(crate) fn add_actor_call(&self, id: ObjectId, actor: ActorId) {
        let mut e = Entry::new(None, ValueState::Pending);
        e.local = 1;
        e.rare().call_of = Some(actor);
        self.entries.lock().insert(id, e);
    }

    /// Notes `more` as the further results of the call whose first result
    /// is `first`.
    pub(crate) fn add_more_returns(&self, first: ObjectId, more: &[ObjectId]) {
        let mut entries = self.entries.lock();
        for id in more {
            if let Some(e) = entries.get_mut(id) {
                e.rare().first_return = Some(first);
            }
        }
    }

    /// What makes the owned object `id`, for `prism::cancel`: the first
    /// result of its call (which names the call), and the actor called if
    /// it is an actor call.
    pub(crate) fn made_by(&self, id: ObjectId) -> (ObjectId, Option<ActorId>) {
        match self.entries.lock().get(&id) {
            Some(e) => match &e.rare {
                Some(r) => (r.first_return.unwrap_or(id), r.call_of),
                None => (id, None),
            },
            None => (id, None),
        }
    }

    /// Records a new owned object with one local handle. Objects it contains
    /// gain a `contained_in` count.
    pub(crate) fn add_owned(&self, id: ObjectId, value: ValueState, contains: Vec<ObjectRefInfo>) {
        let mut entries = self.entries.lock();
        for c in &contains {
            self.bump_contained(&mut entries, c, false);
        }
        let mut e = Entry::new(None, value);
        e.local = 1;
        if !contains.is_empty() {
            e.rare().contains = contains;
        }
        entries.insert(id, e);
    }

    /// A value held here contains `c`. `lent`: the value came in a task's
    /// reply, whose executor registered this process with `c`'s owner
    /// before answering (invariant 3), which this entry must undo when it
    /// ends (invariant 4).
    fn bump_contained(&self, entries: &mut IdMap<ObjectId, Entry>, c: &ObjectRefInfo, lent: bool) {
        let owner = (!self.is_mine(&c.owner)).then(|| c.owner.clone());
        let borrowed = owner.is_some();
        let entry = entries
            .entry(c.id)
            .or_insert_with(|| Entry::new(owner, ValueState::Pending));
        entry.contained_in += 1;
        if lent && borrowed {
            entry.rare().lent += 1;
        }
    }

    /// A handle was created (deserialized) for `info`.
    pub(crate) fn add_local(&self, info: &ObjectRefInfo) {
        let mut entries = self.entries.lock();
        if let Some(e) = entries.get_mut(&info.id) {
            e.local += 1;
            return;
        }
        let mut e = if self.is_mine(&info.owner) {
            // A handle to an owned object that was already freed.
            Entry::new(
                None,
                ValueState::Failed(Box::new(Error::ObjectNotFound { object_id: info.id })),
            )
        } else {
            self.unregistered.lock().push(info.clone());
            Entry::new(Some(info.owner.clone()), ValueState::Pending)
        };
        e.local = 1;
        entries.insert(info.id, e);
    }

    /// A handle was dropped.
    pub(crate) fn remove_local(&self, id: ObjectId) -> Vec<Release> {
        self.update(id, |e| e.local = e.local.saturating_sub(1))
    }

    /// Tasks in flight take these objects as arguments.
    pub(crate) fn add_submitted(&self, ids: &[ObjectId]) {
        let mut entries = self.entries.lock();
        for id in ids {
            if let Some(e) = entries.get_mut(id) {
                e.submitted += 1;
            }
        }
    }

    /// A task run again takes `id` as an argument: one more `submitted`
    /// count if the entry is there (false if it is gone).
    pub(crate) fn hold(&self, id: ObjectId) -> bool {
        match self.entries.lock().get_mut(&id) {
            Some(e) => {
                e.submitted += 1;
                true
            }
            None => false,
        }
    }

    /// An owned object whose entry was removed is being made again for a
    /// task run again that takes it: pending, held by that task.
    pub(crate) fn add_remade(&self, id: ObjectId) {
        let mut entries = self.entries.lock();
        let e = entries
            .entry(id)
            .or_insert_with(|| Entry::new(None, ValueState::Pending));
        e.submitted += 1;
    }

    /// Those tasks answered.
    pub(crate) fn remove_submitted(&self, ids: &[ObjectId]) -> Vec<Release> {
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.update(*id, |e| e.submitted = e.submitted.saturating_sub(1)));
        }
        out
    }

    /// Another process borrows owned objects: one more registration each.
    pub(crate) fn add_borrower(&self, ids: &[ObjectId], borrower: &Address) {
        let mut entries = self.entries.lock();
        for id in ids {
            if let Some(e) = entries.get_mut(id) {
                *e.rare().borrowers.entry(borrower.clone()).or_default() += 1;
            }
        }
    }

    /// A borrower ended borrows that `counts` registrations made (one
    /// count per id; a missing count ends the borrow whatever its count).
    pub(crate) fn remove_borrower(
        &self,
        ids: &[ObjectId],
        counts: &[u64],
        borrower: &Address,
    ) -> Vec<Release> {
        let mut out = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let count = counts.get(i).copied();
            out.extend(self.update(*id, |e| {
                let Some(rare) = e.rare.as_mut() else {
                    return;
                };
                if let Some(n) = rare.borrowers.get_mut(borrower) {
                    *n = count.map_or(0, |c| n.saturating_sub(c));
                    if *n == 0 {
                        rare.borrowers.remove(borrower);
                    }
                }
            }));
        }
        out
    }

    /// A borrowing process is gone: its borrows end, however many.
    pub(crate) fn drop_borrower(&self, ids: &[ObjectId], borrower: &Address) -> Vec<Release> {
        self.remove_borrower(ids, &[], borrower)
    }

    /// An owned object's value arrived (a task answered).
    pub(crate) fn set_value(
        &self,
        id: ObjectId,
        value: ValueState,
        contains: Vec<ObjectRefInfo>,
    ) -> Vec<Release> {
        self.set(id, value, contains, true).1
    }

    /// A task's result arrived: as [`set_value`](Self::set_value), unless
    /// the object's value is set already (the task ran again to make
    /// another of its results), which stands; then only the borrows the
    /// new answer registered end. Returns whether it was set.
    pub(crate) fn set_result(
        &self,
        id: ObjectId,
        value: ValueState,
        contains: Vec<ObjectRefInfo>,
    ) -> (bool, Vec<Release>) {
        self.set(id, value, contains, false)
    }

    fn set(
        &self,
        id: ObjectId,
        value: ValueState,
        contains: Vec<ObjectRefInfo>,
        overwrite: bool,
    ) -> (bool, Vec<Release>) {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(&id) else {
            // Freed while the task ran.
            return (true, self.discard(id, value, &contains));
        };
        if !overwrite && !matches!(e.value, ValueState::Pending) {
            drop(entries);
            return (false, self.discard(id, ValueState::Pending, &contains));
        }
        e.value = value;
        for w in e.waiters.drain(..) {
            w.wake();
        }
        if !contains.is_empty() || e.rare.is_some() {
            e.rare().contains = contains.clone();
        }
        for c in &contains {
            self.bump_contained(&mut entries, c, true);
        }
        (true, Vec::new())
    }

    /// The state of an owned object, or a receiver to wait on.
    pub(crate) fn readiness(&self, id: ObjectId) -> Readiness {
        let mut entries = self.entries.lock();
        match entries.get_mut(&id) {
            None => Readiness::Failed(Error::ObjectNotFound { object_id: id }),
            Some(e) => match &e.value {
                ValueState::Ready(v) => Readiness::Ready(v.clone(), e.contains().to_vec()),
                ValueState::Failed(err) => Readiness::Failed((**err).clone()),
                ValueState::Pending => {
                    let (tx, rx) = oneshot::channel();
                    add_waiter(&mut e.waiters, Waiter::One(tx));
                    Readiness::Wait(rx)
                }
            },
        }
    }

    /// Marks an owned object whose only copy, on node `lost_node`, is
    /// gone as pending again, so that its task can make it again.
    pub(crate) fn rebuild(&self, id: ObjectId, lost_node: &str) -> Rebuild {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(&id) else {
            return Rebuild::Gone;
        };
        if e.owner.is_some() || !e.contains().is_empty() {
            return Rebuild::Gone;
        }
        match &e.value {
            ValueState::Ready(ObjectValue::InStore {
                node: Some(node), ..
            }) if node == lost_node => {
                e.value = ValueState::Pending;
                Rebuild::Start
            }
            ValueState::Failed(_) => Rebuild::Gone,
            _ => Rebuild::Wait,
        }
    }

    /// An owned object's value if it is there now (`None` while pending).
    pub(crate) fn value_now(&self, id: ObjectId) -> Option<Result<ObjectValue, Error>> {
        match self.entries.lock().get(&id).map(|e| &e.value) {
            None => Some(Err(Error::ObjectNotFound { object_id: id })),
            Some(ValueState::Ready(v)) => Some(Ok(v.clone())),
            Some(ValueState::Failed(e)) => Some(Err((**e).clone())),
            Some(ValueState::Pending) => None,
        }
    }

    /// Under one lock: which of `infos` are owned here and ready, marking
    /// at most `need` of them (the first in order); `None` if fewer than
    /// `need` are ready.
    pub(crate) fn ready_now<'a>(
        &self,
        infos: impl Iterator<Item = &'a ObjectRefInfo>,
        need: usize,
    ) -> Option<Vec<bool>> {
        let entries = self.entries.lock();
        let mut count = 0;
        let flags: Vec<bool> = infos
            .map(|info| {
                let ready = count < need
                    && self.is_mine(&info.owner)
                    && matches!(
                        entries.get(&info.id).map(|e| &e.value),
                        Some(ValueState::Ready(_) | ValueState::Failed(_))
                    );
                count += ready as usize;
                ready
            })
            .collect();
        (count >= need).then_some(flags)
    }

    /// Under one lock, for each `(index, id)` of `owned` (objects owned
    /// here): marks `ready[index]` when its value is there, it failed or it
    /// is gone, and otherwise has `tx` told `index` when that happens.
    /// Returns how many it marked.
    pub(crate) fn ready_or_tell(
        &self,
        owned: &[(usize, ObjectId)],
        ready: &mut [bool],
        tx: &mpsc::UnboundedSender<usize>,
    ) -> usize {
        let mut entries = self.entries.lock();
        let mut count = 0;
        for &(i, id) in owned {
            match entries.get_mut(&id) {
                Some(e) if matches!(e.value, ValueState::Pending) => {
                    add_waiter(&mut e.waiters, Waiter::Among(tx.clone(), i));
                }
                _ => {
                    ready[i] = true;
                    count += 1;
                }
            }
        }
        count
    }

    /// What to release for a task's answer that is not kept (its object
    /// was freed while it ran, or the task was cancelled): its stored
    /// value, and the borrows its executor registered for this process.
    pub(crate) fn discard(
        &self,
        id: ObjectId,
        value: ValueState,
        contains: &[ObjectRefInfo],
    ) -> Vec<Release> {
        let mut out: Vec<Release> = contains
            .iter()
            .filter(|c| !self.is_mine(&c.owner))
            .map(|c| Release::EndBorrow {
                owner: c.owner.clone(),
                id: c.id,
                count: 1,
            })
            .collect();
        if let ValueState::Ready(ObjectValue::InStore { node, .. }) = value {
            out.push(Release::DeleteFromStore(id, node));
        }
        out
    }

    /// Whether an owned object is still waiting for its value (false for
    /// one ready, failed or no longer referenced).
    pub(crate) fn is_pending(&self, id: ObjectId) -> bool {
        matches!(
            self.entries.lock().get(&id).map(|e| &e.value),
            Some(ValueState::Pending)
        )
    }

    /// Whether an owned object's value is ready (or failed), without waiting.
    pub(crate) fn is_ready(&self, id: ObjectId) -> bool {
        matches!(
            self.entries.lock().get(&id).map(|e| &e.value),
            Some(ValueState::Ready(_) | ValueState::Failed(_))
        )
    }

    /// Borrows not yet registered with their owners; the caller registers
    /// them and then calls [`RefTable::registered`].
    pub(crate) fn take_unregistered(&self) -> Vec<ObjectRefInfo> {
        std::mem::take(&mut *self.unregistered.lock())
    }

    /// Whether some deserialized borrows still await registration.
    pub(crate) fn has_unregistered(&self) -> bool {
        !self.unregistered.lock().is_empty()
    }

    /// Marks borrows as known to their owners. Returns those whose entries
    /// were already dropped meanwhile: their borrow must be ended at once.
    pub(crate) fn registered(&self, infos: &[ObjectRefInfo]) -> Vec<Release> {
        let mut entries = self.entries.lock();
        let mut out = Vec::new();
        for info in infos {
            match entries.get_mut(&info.id) {
                Some(e) => e.rare().lent += 1,
                None => out.push(Release::EndBorrow {
                    owner: info.owner.clone(),
                    id: info.id,
                    count: 1,
                }),
            }
        }
        out
    }

    /// Number of objects this process owns (for tests and metrics).
    pub(crate) fn num_owned(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| e.owner.is_none())
            .count()
    }

    fn update(&self, id: ObjectId, change: impl FnOnce(&mut Entry)) -> Vec<Release> {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(&id) else {
            return Vec::new();
        };
        change(e);
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let unused = entries.get(&id).is_some_and(|e| e.unused());
            if !unused {
                continue;
            }
            let Some(e) = entries.remove(&id) else {
                continue;
            };
            let (actor, lent, contains) = match e.rare {
                Some(r) => (r.actor, r.lent, r.contains),
                None => (None, 0, Vec::new()),
            };
            match (&e.owner, &e.value) {
                (None, _) if actor.is_some() => {
                    out.extend(actor.map(Release::ActorOutOfScope));
                }
                (None, ValueState::Ready(ObjectValue::InStore { node, .. })) => {
                    out.push(Release::DeleteFromStore(id, node.clone()))
                }
                (Some(owner), _) if lent > 0 => out.push(Release::EndBorrow {
                    owner: owner.clone(),
                    id,
                    count: lent,
                }),
                _ => {}
            }
            for w in e.waiters {
                w.wake();
            }
            for c in contains {
                if let Some(inner) = entries.get_mut(&c.id) {
                    inner.contained_in = inner.contained_in.saturating_sub(1);
                    stack.push(c.id);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_entry_stays_small() {
        // One per queued task's result: a million queued tasks hold a
        // million of these (and a table of twice as many slots).
        assert!(
            std::mem::size_of::<Entry>() <= 128,
            "{} bytes",
            std::mem::size_of::<Entry>()
        );
    }
    use bytes::Bytes;

    fn info(id: ObjectId, owner: &str) -> ObjectRefInfo {
        ObjectRefInfo {
            id,
            owner: owner.to_string(),
        }
    }

    #[test]
    fn an_owned_object_lives_while_a_task_uses_it_and_a_borrower_holds_it() {
        let t = RefTable::new("me".into());
        let id = ObjectId::new();
        t.add_owned(
            id,
            ValueState::Ready(ObjectValue::InStore {
                size: 10,
                node: Some("node-b".into()),
            }),
            vec![],
        );
        t.add_submitted(&[id]);
        assert!(
            t.remove_local(id).is_empty(),
            "a submitted task still needs it"
        );
        t.add_borrower(&[id], &"other".to_string());
        assert!(
            t.remove_submitted(&[id]).is_empty(),
            "a borrower still holds it"
        );
        assert_eq!(
            t.remove_borrower(&[id], &[1], &"other".to_string()),
            vec![Release::DeleteFromStore(id, Some("node-b".into()))]
        );
        assert_eq!(t.num_owned(), 0);
    }

    #[test]
    fn objects_contained_in_a_put_value_live_as_long_as_it() {
        let t = RefTable::new("me".into());
        let inner = ObjectId::new();
        let outer = ObjectId::new();
        t.add_owned(
            inner,
            ValueState::Ready(ObjectValue::InStore {
                size: 1,
                node: None,
            }),
            vec![],
        );
        t.add_owned(
            outer,
            ValueState::Ready(ObjectValue::Inline(Bytes::new())),
            vec![info(inner, "me")],
        );
        assert!(t.remove_local(inner).is_empty());
        assert_eq!(
            t.remove_local(outer),
            vec![Release::DeleteFromStore(inner, None)]
        );
        assert_eq!(t.num_owned(), 0);
    }

    #[test]
    fn a_registered_borrow_is_ended_when_the_last_handle_drops() {
        let t = RefTable::new("me".into());
        let id = ObjectId::new();
        t.add_local(&info(id, "owner"));
        let pending = t.take_unregistered();
        assert_eq!(pending.len(), 1);
        assert!(t.registered(&pending).is_empty());
        assert_eq!(
            t.remove_local(id),
            vec![Release::EndBorrow {
                owner: "owner".into(),
                id,
                count: 1
            }]
        );
    }

    fn stored() -> ValueState {
        ValueState::Ready(ObjectValue::InStore {
            size: 1,
            node: None,
        })
    }

    #[test]
    fn a_stale_end_of_borrow_does_not_free_an_object_lent_again_meanwhile() {
        // The owner lends its object to a process, which drops it and is
        // lent it again before its end-of-borrow arrives.
        let owner = RefTable::new("owner".into());
        let id = ObjectId::new();
        owner.add_owned(id, stored(), vec![]);
        let borrower = "borrower".to_string();
        owner.add_borrower(&[id], &borrower);
        assert!(owner.remove_local(id).is_empty(), "lent out");
        owner.add_borrower(&[id], &borrower);
        assert!(
            owner.remove_borrower(&[id], &[1], &borrower).is_empty(),
            "the stale end undoes one registration; the second lend still holds"
        );
        assert_eq!(
            owner.remove_borrower(&[id], &[1], &borrower),
            vec![Release::DeleteFromStore(id, None)]
        );
    }

    #[test]
    fn a_borrowers_entry_ends_with_every_registration_made_for_it() {
        // Twice in replies (each registered by the task's executor) and
        // once by itself: its end undoes all three.
        let t = RefTable::new("me".into());
        let inner = info(ObjectId::new(), "owner");
        let (a, b) = (ObjectId::new(), ObjectId::new());
        for outer in [a, b] {
            t.add_owned(outer, ValueState::Pending, vec![]);
            assert!(t.set_value(outer, stored(), vec![inner.clone()]).is_empty());
        }
        t.add_local(&inner);
        let pending = t.take_unregistered();
        assert!(pending.is_empty(), "the entry was made by a reply");
        assert!(t.registered(std::slice::from_ref(&inner)).is_empty());
        assert!(t.remove_local(inner.id).is_empty());
        assert!(!t.remove_local(a).contains(&Release::EndBorrow {
            owner: "owner".into(),
            id: inner.id,
            count: 3
        }));
        assert!(t.remove_local(b).contains(&Release::EndBorrow {
            owner: "owner".into(),
            id: inner.id,
            count: 3
        }));
    }

    #[test]
    fn a_gone_borrower_ends_every_registration_and_a_dropped_reply_its_lends() {
        let owner = RefTable::new("owner".into());
        let id = ObjectId::new();
        owner.add_owned(id, stored(), vec![]);
        let borrower = "borrower".to_string();
        for _ in 0..3 {
            owner.add_borrower(&[id], &borrower);
        }
        assert!(owner.remove_local(id).is_empty());
        assert_eq!(
            owner.drop_borrower(&[id], &borrower),
            vec![Release::DeleteFromStore(id, None)]
        );

        // A reply for an object freed while its task ran: the borrows the
        // executor registered for it are ended at once.
        let t = RefTable::new("me".into());
        let gone = ObjectId::new();
        let inner = info(ObjectId::new(), "owner");
        assert_eq!(
            t.set_value(gone, stored(), vec![inner.clone()]),
            vec![
                Release::EndBorrow {
                    owner: "owner".into(),
                    id: inner.id,
                    count: 1
                },
                Release::DeleteFromStore(gone, None)
            ]
        );
    }
}
