//! Which bytes of the segment belong to which object, who reads them, and
//! which objects are spilled to disk.
//!
//! This type is not thread safe by itself; the raylet keeps it behind one
//! lock. It does no I/O: the raylet writes and reads spill files between
//! [`ObjectTable::pick_spills`] and [`ObjectTable::spill_done`], and between
//! [`ObjectTable::begin_restore`] and [`ObjectTable::restore_done`].
//! Invariants:
//!
//! 1. An object's range is allocated from `create` until it is deleted *and*
//!    unpinned by every reader, until it is spilled, until a later `create`
//!    replaces it (never while it is in use, see 5), or, unsealed, until
//!    its creator is gone.
//! 2. Only sealed objects are handed to readers, and only from memory.
//! 3. An object is spilled only while sealed, not deleted, pinned by no
//!    reader, and not being spilled already; a reader that pins it during
//!    its spill keeps it in memory (the spill is discarded).
//! 4. `used_bytes` is the sum of the aligned sizes of allocated ranges.
//! 5. Only the process that created an object seals it, and a copy is
//!    replaced (by the retry of a task whose attempt died before its
//!    owner heard back) only once its creator is gone: its connection
//!    closed, which also frees what it left unsealed. A request a dead
//!    attempt sent before it died (a create that waited for room, a seal)
//!    can never seal, replace or free the copy a retry writes.
//! 6. Every spill has its own number, and its file is named by the object
//!    and that number ([`SpillFile`]): removing the file of one spill (a
//!    discarded one, a restored one) never removes the file of a later
//!    spill of the same object, whatever order the raylet's threads finish
//!    their I/O in.

use crate::allocator::{aligned_size, Allocator};
use prism_protocol::error::Error;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::StoreStats;
use std::collections::{HashMap, HashSet};

/// Who created an object: the raylet's number for a client connection, or
/// [`Creator::NODE`] for copies the raylet makes itself (pulls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Creator(pub u64);

impl Creator {
    /// The raylet itself.
    pub const NODE: Creator = Creator(0);
}

/// Where an object lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset in the segment.
    pub offset: u64,
    /// Object size in bytes.
    pub size: u64,
}

/// One spill of one object: the file it writes is named by both, so that
/// no two spills share a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpillFile {
    /// The object spilled.
    pub id: ObjectId,
    /// The spill's number, unique in this table.
    pub seq: u64,
}

impl SpillFile {
    /// The file's name in the spill directory.
    pub fn file_name(&self) -> String {
        format!("{}.{}", self.id, self.seq)
    }
}

/// Where an object's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Residence {
    Memory(Placement),
    /// In the file of the spill with this number only.
    Disk(u64),
    /// Being read back from that spill's file into this range.
    Restoring(Placement, u64),
}

#[derive(Debug)]
struct Entry {
    size: u64,
    residence: Residence,
    sealed: bool,
    pins: u64,
    deleted: bool,
    /// The spill of it being written, by number: its range must stay.
    spilling: Option<u64>,
    /// When it was last created, sealed or pinned (the table's clock).
    last_used: u64,
    /// Who writes it; only they may seal it.
    creator: Creator,
    /// Its creator also owns it (a put): freed when the creator is gone.
    owned_by_creator: bool,
    /// The address of its owner when another process owns it (a task's
    /// return value, owned by the caller): freed when that owner is gone.
    owner: Option<std::sync::Arc<str>>,
}

impl Entry {
    /// Pinned by a reader, or its bytes are being moved to or from disk.
    fn busy(&self) -> bool {
        self.pins > 0
            || self.spilling.is_some()
            || matches!(self.residence, Residence::Restoring(..))
    }
}

/// What pinning an object found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// In memory and pinned for the reader.
    Pinned(Placement),
    /// Spilled: restore it, then pin again.
    OnDisk,
    /// Being restored by someone else: wait, then pin again.
    Restoring,
}

/// What became of a spill once its file was written (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillOutcome {
    /// The object now lives in its file; its range is free.
    Spilled,
    /// The object stays in memory (a reader pinned it, or the write
    /// failed), or was deleted meanwhile: remove the file.
    Discard,
}

/// One object of the table, as listings show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSummary {
    /// The object.
    pub id: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// Whether it is complete and readable.
    pub sealed: bool,
    /// Readers pinning it now.
    pub pins: u64,
    /// Where its bytes are: `MEMORY`, `SPILLED` or `RESTORING`.
    pub location: &'static str,
    /// Its owner's address, when another process than its writer owns it.
    pub owner: Option<String>,
    /// Its writer owns it (a put).
    pub owned_by_creator: bool,
}

/// The object table of one node's store.
#[derive(Debug)]
pub struct ObjectTable {
    allocator: Allocator,
    objects: HashMap<ObjectId, Entry>,
    clock: u64,
    spilled_total: u64,
    spilled_bytes_total: u64,
    restored_total: u64,
    restored_bytes_total: u64,
    /// Objects whose every copy is gone, with why, until deleted.
    lost: HashMap<ObjectId, String>,
    /// The number of the next spill.
    next_spill: u64,
    /// Spill files of copies that `create` replaced, for the raylet to
    /// remove ([`ObjectTable::take_orphan_files`]).
    orphans: Vec<SpillFile>,
    /// Creators whose connection closed: their late requests are refused.
    gone: HashSet<Creator>,
}

impl ObjectTable {
    /// A table over a segment of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        ObjectTable {
            allocator: Allocator::new(capacity),
            objects: HashMap::new(),
            clock: 0,
            spilled_total: 0,
            spilled_bytes_total: 0,
            restored_total: 0,
            restored_bytes_total: 0,
            lost: HashMap::new(),
            next_spill: 0,
            orphans: Vec::new(),
            gone: HashSet::new(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn full(&self, requested: u64) -> Error {
        Error::ObjectStoreFull {
            requested,
            used: self.allocator.used(),
            capacity: self.allocator.capacity(),
            num_objects: self.objects.len() as u64,
        }
    }

    /// Whether a copy of `id` is here and `creator` must wait before
    /// replacing it: it is pinned by a reader, being spilled or restored,
    /// or it belongs to another creator that is still connected (one that
    /// is writing it, or that sealed it and is answering its caller). A
    /// gone creator never waits: its `create` is refused.
    pub fn busy(&self, id: ObjectId, creator: Creator) -> bool {
        if self.gone.contains(&creator) {
            return false;
        }
        self.objects
            .get(&id)
            .is_some_and(|e| e.busy() || self.held_by_other(e, creator))
    }

    /// A copy another live creator still answers for. The node's own
    /// copies (pulls) are held only while written.
    fn held_by_other(&self, e: &Entry, creator: Creator) -> bool {
        let other = e.creator != creator && !self.gone.contains(&e.creator);
        other && (!e.sealed || e.creator != Creator::NODE)
    }

    /// Reserves room for a new object, which `creator` writes and seals.
    pub fn create(
        &mut self,
        id: ObjectId,
        size: u64,
        creator: Creator,
    ) -> Result<Placement, Error> {
        if self.gone.contains(&creator) {
            return Err(Error::CreatorGone { object_id: id });
        }
        if let Some(existing) = self.objects.get(&id) {
            if self.busy(id, creator) {
                return Err(Error::ObjectInUse { object_id: id });
            }
            // An earlier attempt of the task that makes this object died
            // before its owner heard back, leaving a copy (written or not)
            // that nobody has read: the new attempt replaces it, and the
            // file of its spill, if it was spilled, goes.
            if let Residence::Disk(seq) = existing.residence {
                self.orphans.push(SpillFile { id, seq });
            }
            self.remove(id);
        }
        let Some(offset) = self.allocator.allocate(size) else {
            return Err(self.full(size));
        };
        let placement = Placement { offset, size };
        let last_used = self.tick();
        self.objects.insert(
            id,
            Entry {
                size,
                residence: Residence::Memory(placement),
                sealed: false,
                pins: 0,
                deleted: false,
                spilling: None,
                last_used,
                creator,
                owned_by_creator: false,
                owner: None,
            },
        );
        Ok(placement)
    }

    /// Makes an object readable; only its creator may.
    pub fn seal(&mut self, id: ObjectId, creator: Creator) -> Result<(), Error> {
        let now = self.tick();
        match self.objects.get_mut(&id) {
            Some(e) if e.creator == creator => {
                e.sealed = true;
                e.last_used = now;
                Ok(())
            }
            Some(_) => Err(Error::ObjectCreatedAgain { object_id: id }),
            None => Err(Error::ObjectNotFound { object_id: id }),
        }
    }

    /// Marks a created object as owned by its creator (a put, not a
    /// task's return value): [`ObjectTable::creator_gone`] frees it.
    pub fn owned_by_creator(&mut self, id: ObjectId) {
        if let Some(e) = self.objects.get_mut(&id) {
            e.owned_by_creator = true;
        }
    }

    /// Records the process that owns a created object (another than its
    /// creator): [`ObjectTable::owners_gone`] frees it.
    pub fn owned_by(&mut self, id: ObjectId, owner: &str) {
        if let Some(e) = self.objects.get_mut(&id) {
            e.owner = Some(owner.into());
        }
    }

    /// The owner recorded for `id` (a task's result, or a copy pulled
    /// from another node), if any.
    pub fn owner_of(&self, id: ObjectId) -> Option<&str> {
        self.objects.get(&id).and_then(|e| e.owner.as_deref())
    }

    /// The owners for which `gone` is true exited (or their node died):
    /// the sealed objects they owned are freed, since no one can reach
    /// them through their owner any more (readers get `OwnerDied`).
    /// Returns the spill files to remove.
    pub fn owners_gone(&mut self, gone: impl Fn(&str) -> bool) -> Vec<SpillFile> {
        let owned: Vec<ObjectId> = self
            .objects
            .iter()
            .filter(|(_, e)| e.sealed && !e.deleted && e.owner.as_deref().is_some_and(&gone))
            .map(|(id, _)| *id)
            .collect();
        owned.into_iter().filter_map(|id| self.delete(id)).collect()
    }

    /// `creator`'s connection closed: what it left unsealed is freed, and
    /// so is what it owns (no one can reach that through its owner any
    /// more: readers get `OwnerDied`); its later requests (still on their
    /// way) are refused. Returns the spill files to remove.
    pub fn creator_gone(&mut self, creator: Creator) -> Vec<SpillFile> {
        if creator == Creator::NODE {
            return Vec::new();
        }
        self.gone.insert(creator);
        let (unsealed, owned): (Vec<_>, Vec<_>) = self
            .objects
            .iter()
            .filter(|(_, e)| e.creator == creator && (!e.sealed || e.owned_by_creator))
            .map(|(id, e)| (*id, e.sealed))
            .partition(|(_, sealed)| !sealed);
        for (id, _) in unsealed {
            self.remove(id);
        }
        owned
            .into_iter()
            .filter_map(|(id, _)| self.delete(id))
            .collect()
    }

    /// Whether a sealed, not deleted object `id` is here (in memory or
    /// spilled).
    pub fn has(&self, id: ObjectId) -> bool {
        self.objects
            .get(&id)
            .is_some_and(|e| e.sealed && !e.deleted)
    }

    /// Pins a sealed object in memory for one more reader, or says why it
    /// cannot be yet.
    pub fn pin(&mut self, id: ObjectId) -> Result<Pin, Error> {
        let now = self.tick();
        match self.objects.get_mut(&id) {
            Some(e) if e.sealed && !e.deleted => match e.residence {
                Residence::Memory(p) => {
                    e.pins += 1;
                    e.last_used = now;
                    Ok(Pin::Pinned(p))
                }
                Residence::Disk(_) => Ok(Pin::OnDisk),
                Residence::Restoring(..) => Ok(Pin::Restoring),
            },
            None if self.lost.contains_key(&id) => Err(Error::ObjectLost {
                object_id: id,
                cause: self.lost[&id].clone(),
            }),
            _ => Err(Error::ObjectNotFound { object_id: id }),
        }
    }

    /// Drops one reader's pin; frees the range if the object was deleted.
    pub fn unpin(&mut self, id: ObjectId) {
        let free = match self.objects.get_mut(&id) {
            Some(e) => {
                e.pins = e.pins.saturating_sub(1);
                e.deleted && !e.busy()
            }
            None => false,
        };
        if free {
            self.remove(id);
        }
    }

    /// Deletes an object: freed now, or when its last reader unpins (or its
    /// spill or restore ends). The spill file to remove now, if it has one.
    pub fn delete(&mut self, id: ObjectId) -> Option<SpillFile> {
        self.lost.remove(&id);
        let e = self.objects.get_mut(&id)?;
        e.deleted = true;
        let on_disk = match e.residence {
            Residence::Disk(seq) => Some(SpillFile { id, seq }),
            _ => None,
        };
        if !e.busy() {
            self.remove(id);
        }
        on_disk
    }

    /// The spill files of copies that `create` replaced since the last
    /// call: the raylet removes them.
    pub fn take_orphan_files(&mut self) -> Vec<SpillFile> {
        std::mem::take(&mut self.orphans)
    }

    fn remove(&mut self, id: ObjectId) {
        if let Some(e) = self.objects.remove(&id) {
            if let Residence::Memory(p) | Residence::Restoring(p, _) = e.residence {
                self.allocator.free(p.offset, p.size);
            }
        }
    }

    /// Chooses objects to spill until at least `need` bytes would be freed
    /// (fewer if not enough can be), least recently used first, and marks
    /// them as being spilled. Each one's bytes stay where they are until
    /// [`ObjectTable::spill_done`].
    pub fn pick_spills(&mut self, need: u64) -> Vec<(SpillFile, Placement)> {
        let mut candidates: Vec<(u64, ObjectId, Placement)> = self
            .objects
            .iter()
            .filter(|(_, e)| e.sealed && !e.deleted && e.pins == 0 && e.spilling.is_none())
            .filter_map(|(id, e)| match e.residence {
                Residence::Memory(p) => Some((e.last_used, *id, p)),
                _ => None,
            })
            .collect();
        candidates.sort_unstable_by_key(|c| c.0);
        let mut freed = 0;
        let mut picked = Vec::new();
        for (_, id, p) in candidates {
            if freed >= need {
                break;
            }
            freed += aligned_size(p.size);
            let seq = self.next_spill;
            self.next_spill += 1;
            if let Some(e) = self.objects.get_mut(&id) {
                e.spilling = Some(seq);
            }
            picked.push((SpillFile { id, seq }, p));
        }
        picked
    }

    /// A spill's file was written (`written`) or could not be.
    pub fn spill_done(&mut self, file: SpillFile, written: bool) -> SpillOutcome {
        let id = file.id;
        let Some(e) = self.objects.get_mut(&id) else {
            return SpillOutcome::Discard;
        };
        if e.spilling != Some(file.seq) {
            return SpillOutcome::Discard;
        }
        e.spilling = None;
        if e.deleted && e.pins == 0 {
            self.remove(id);
            return SpillOutcome::Discard;
        }
        if !written || e.pins > 0 || e.deleted {
            return SpillOutcome::Discard;
        }
        let Residence::Memory(p) = e.residence else {
            return SpillOutcome::Discard;
        };
        e.residence = Residence::Disk(file.seq);
        let size = e.size;
        self.allocator.free(p.offset, p.size);
        self.spilled_total += 1;
        self.spilled_bytes_total += size;
        SpillOutcome::Spilled
    }

    /// Reserves memory to read a spilled object back into, with the file
    /// to read it from, or says the store is full (spill something else
    /// first). `None` if the object is not on disk (in memory already, or
    /// being restored).
    pub fn begin_restore(&mut self, id: ObjectId) -> Result<Option<(Placement, SpillFile)>, Error> {
        let (size, seq) = match self.objects.get(&id) {
            Some(e) if !e.deleted => match e.residence {
                Residence::Disk(seq) => (e.size, seq),
                _ => return Ok(None),
            },
            Some(_) => return Ok(None),
            None => return Err(Error::ObjectNotFound { object_id: id }),
        };
        let Some(offset) = self.allocator.allocate(size) else {
            return Err(self.full(size));
        };
        let placement = Placement { offset, size };
        if let Some(e) = self.objects.get_mut(&id) {
            e.residence = Residence::Restoring(placement, seq);
        }
        Ok(Some((placement, SpillFile { id, seq })))
    }

    /// The bytes of a restoring object were read back from `file`
    /// (`read`), or could not be (it stays on disk). True if the file
    /// should be removed.
    pub fn restore_done(&mut self, file: SpillFile, read: bool) -> bool {
        let now = self.tick();
        let id = file.id;
        let Some(e) = self.objects.get_mut(&id) else {
            return true;
        };
        let p = match e.residence {
            Residence::Restoring(p, seq) if seq == file.seq => p,
            // Still that spill's copy: its file stays.
            Residence::Disk(seq) if seq == file.seq => return false,
            // A copy no longer held in that file.
            _ => return true,
        };
        if !read {
            e.residence = Residence::Disk(file.seq);
            self.allocator.free(p.offset, p.size);
            let deleted = e.deleted;
            if deleted {
                self.objects.remove(&id);
            }
            return deleted;
        }
        e.residence = Residence::Memory(p);
        e.last_used = now;
        self.restored_total += 1;
        self.restored_bytes_total += e.size;
        if e.deleted && e.pins == 0 {
            self.remove(id);
        }
        true
    }

    /// A spilled object whose spill file is gone (`cause`): it is lost,
    /// and every later `pin` says so, until its owner deletes it. Returns
    /// the error.
    pub fn lost(&mut self, file: SpillFile, cause: String) -> Error {
        let id = file.id;
        if self.objects.get(&id).map(|e| e.residence) == Some(Residence::Disk(file.seq)) {
            self.objects.remove(&id);
            self.lost.insert(id, cause.clone());
        }
        Error::ObjectLost {
            object_id: id,
            cause,
        }
    }

    /// Whether `used + extra` bytes pass `fraction` of the capacity.
    pub fn above(&self, fraction: f64, extra: u64) -> bool {
        (self.allocator.used() + extra) as f64 > fraction * self.allocator.capacity() as f64
    }

    /// Bytes to free so that usage falls to `fraction` of the capacity.
    pub fn excess_over(&self, fraction: f64) -> u64 {
        let target = (fraction * self.allocator.capacity() as f64) as u64;
        self.allocator.used().saturating_sub(target)
    }

    /// Usage figures.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            used_bytes: self.allocator.used(),
            capacity_bytes: self.allocator.capacity(),
            num_objects: self.objects.len() as u64,
            num_pinned: self.objects.values().filter(|e| e.pins > 0).count() as u64,
            num_spilled: self
                .objects
                .values()
                .filter(|e| matches!(e.residence, Residence::Disk(_)))
                .count() as u64,
            spilled_total: self.spilled_total,
            spilled_bytes_total: self.spilled_bytes_total,
            restored_total: self.restored_total,
            restored_bytes_total: self.restored_bytes_total,
            // Timed by whoever does the I/O.
            spill_write_nanos: 0,
            restore_read_nanos: 0,
            // Counted by the node's transfers.
            pulled_bytes_total: 0,
            served_bytes_total: 0,
        }
    }

    /// The objects held (not deleted), at most `limit` of them, and how
    /// many there are in all.
    pub fn summaries(&self, limit: usize) -> (Vec<ObjectSummary>, usize) {
        let live = self.objects.iter().filter(|(_, e)| !e.deleted);
        let total = live.clone().count();
        let rows = live
            .take(limit)
            .map(|(id, e)| ObjectSummary {
                id: *id,
                size: e.size,
                sealed: e.sealed,
                pins: e.pins,
                location: match e.residence {
                    Residence::Memory(_) => "MEMORY",
                    Residence::Disk(_) => "SPILLED",
                    Residence::Restoring(..) => "RESTORING",
                },
                owner: e.owner.as_deref().map(str::to_string),
                owned_by_creator: e.owned_by_creator,
            })
            .collect();
        (rows, total)
    }

    /// The aligned size a request of `size` bytes takes.
    pub fn footprint(size: u64) -> u64 {
        aligned_size(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer in tests that have one.
    const W: Creator = Creator(1);

    #[test]
    fn a_pinned_object_is_freed_only_when_its_last_reader_unpins() {
        let mut t = ObjectTable::new(1 << 20);
        let id = ObjectId::new();
        t.create(id, 1000, W).unwrap();
        assert!(t.pin(id).is_err(), "unsealed objects must not be readable");
        t.seal(id, W).unwrap();
        assert!(matches!(t.pin(id).unwrap(), Pin::Pinned(_)));
        t.delete(id);
        assert_eq!(t.stats().num_objects, 1);
        assert!(t.pin(id).is_err(), "deleted objects must not gain readers");
        t.unpin(id);
        assert_eq!(t.stats().used_bytes, 0);
        assert_eq!(t.stats().num_objects, 0);
    }

    #[test]
    fn a_full_store_says_what_was_asked_and_what_is_used() {
        let mut t = ObjectTable::new(8192);
        t.create(ObjectId::new(), 5000, W).unwrap();
        let err = t.create(ObjectId::new(), 512, W).unwrap_err();
        assert_eq!(
            err,
            Error::ObjectStoreFull {
                requested: 512,
                used: 8192,
                capacity: 8192,
                num_objects: 1
            }
        );
        assert!(err.to_string().contains("asked for 512 bytes"));
    }

    fn sealed(t: &mut ObjectTable, size: u64) -> ObjectId {
        let id = ObjectId::new();
        t.create(id, size, W).unwrap();
        t.seal(id, W).unwrap();
        id
    }

    #[test]
    fn the_least_recently_used_unpinned_objects_are_spilled_and_restored() {
        let mut t = ObjectTable::new(4 << 20);
        let (a, b, c) = (
            sealed(&mut t, 1000),
            sealed(&mut t, 1000),
            sealed(&mut t, 1000),
        );
        // a is read (pinned, then released): b is now the least recent.
        assert!(matches!(t.pin(a).unwrap(), Pin::Pinned(_)));
        t.unpin(a);
        assert!(matches!(t.pin(c).unwrap(), Pin::Pinned(_)));
        let picked = t.pick_spills(1);
        assert_eq!(picked.iter().map(|p| p.0.id).collect::<Vec<_>>(), vec![b]);
        let b_file = picked[0].0;
        let rest = t.pick_spills(u64::MAX);
        assert!(
            rest.iter().all(|p| p.0.id == a),
            "c is pinned, b is spilling"
        );
        t.spill_done(rest[0].0, false);
        assert_eq!(t.spill_done(b_file, true), SpillOutcome::Spilled);
        assert_eq!(t.pin(b).unwrap(), Pin::OnDisk);
        assert_eq!(t.stats().num_spilled, 1);
        let (range, file) = t.begin_restore(b).unwrap().expect("b is on disk");
        assert_eq!(file, b_file, "read back from the file its spill wrote");
        assert_eq!(t.pin(b).unwrap(), Pin::Restoring);
        assert_eq!(t.begin_restore(b).unwrap(), None, "one restore at a time");
        assert!(t.restore_done(file, true), "its file goes");
        assert_eq!(t.pin(b).unwrap(), Pin::Pinned(range));
        let s = t.stats();
        assert_eq!(
            (s.spilled_total, s.restored_total, s.num_spilled),
            (1, 1, 0)
        );
    }

    #[test]
    fn a_reader_or_a_delete_during_a_spill_keeps_the_store_consistent() {
        let mut t = ObjectTable::new(4 << 20);
        let read = sealed(&mut t, 1000);
        let gone = sealed(&mut t, 1000);
        let picked = t.pick_spills(u64::MAX);
        assert_eq!(picked.len(), 2);
        let file = |id| picked.iter().find(|p| p.0.id == id).unwrap().0;
        assert!(matches!(t.pin(read).unwrap(), Pin::Pinned(_)));
        assert_eq!(
            t.spill_done(file(read), true),
            SpillOutcome::Discard,
            "pinned: stays"
        );
        assert_eq!(t.delete(gone), None, "no file yet");
        assert_eq!(t.spill_done(file(gone), true), SpillOutcome::Discard);
        assert_eq!(t.stats().num_objects, 1);
        // Deleting a spilled object removes it and asks for its file to go.
        t.unpin(read);
        let again = t.pick_spills(u64::MAX)[0].0;
        assert_ne!(again, file(read), "each spill has its own file");
        assert_eq!(t.spill_done(again, true), SpillOutcome::Spilled);
        assert_eq!(t.delete(read), Some(again));
        assert_eq!((t.stats().num_objects, t.stats().used_bytes), (0, 0));
    }

    #[test]
    fn a_restore_that_does_not_fit_says_the_store_is_full() {
        let mut t = ObjectTable::new(16384);
        let a = sealed(&mut t, 9000);
        let file = t.pick_spills(u64::MAX)[0].0;
        t.spill_done(file, true);
        let _b = sealed(&mut t, 9000);
        assert!(matches!(
            t.begin_restore(a),
            Err(Error::ObjectStoreFull { .. })
        ));
        assert!(t.above(0.5, 0) && !t.above(0.9, 0));
    }

    #[test]
    fn a_retried_task_replaces_the_copy_its_dead_attempt_left() {
        let mut t = ObjectTable::new(1 << 20);
        let id = ObjectId::new();
        let dead = Creator(5);
        t.create(id, 5000, dead).unwrap();
        // The first attempt sealed and died before its owner heard back;
        // the retry's output has another size.
        t.seal(id, dead).unwrap();
        t.creator_gone(dead);
        let p = t.create(id, 9000, W).unwrap();
        assert_eq!(p.size, 9000);
        assert_eq!(t.stats().num_objects, 1);
        assert_eq!(t.stats().used_bytes, ObjectTable::footprint(9000));
        t.seal(id, W).unwrap();
        assert!(matches!(t.pin(id).unwrap(), Pin::Pinned(_)));
        assert!(
            t.create(id, 10, W).is_err(),
            "a copy being read is not replaced"
        );
    }

    #[test]
    fn a_spilled_object_whose_file_is_gone_is_reported_lost_until_deleted() {
        let mut t = ObjectTable::new(1 << 20);
        let id = sealed(&mut t, 5000);
        let file = t.pick_spills(u64::MAX)[0].0;
        t.spill_done(file, true);
        let err = t.lost(file, "its file is gone".into());
        assert!(matches!(err, Error::ObjectLost { .. }));
        let again = t.pin(id).unwrap_err();
        assert!(again.to_string().contains("its file is gone"), "{again}");
        t.delete(id);
        assert!(matches!(t.pin(id), Err(Error::ObjectNotFound { .. })));
    }

    #[test]
    fn a_replaced_spilled_copy_hands_its_file_over_and_a_busy_one_is_kept() {
        let mut t = ObjectTable::new(1 << 20);
        let id = sealed(&mut t, 5000);
        let file = t.pick_spills(u64::MAX)[0].0;
        assert!(t.busy(id, W), "being spilled");
        assert!(t.create(id, 5000, W).is_err(), "a copy being spilled stays");
        assert_eq!(t.spill_done(file, true), SpillOutcome::Spilled);
        assert!(!t.busy(id, W));
        t.create(id, 5000, W).unwrap();
        assert_eq!(
            t.take_orphan_files(),
            vec![file],
            "the old copy's file goes"
        );
        assert!(t.take_orphan_files().is_empty());
        t.seal(id, W).unwrap();
        // A late report about the old spill changes nothing.
        assert_eq!(t.spill_done(file, true), SpillOutcome::Discard);
        assert!(t.restore_done(file, true), "that file holds no live copy");
        assert!(matches!(t.pin(id).unwrap(), Pin::Pinned(_)));
    }

    #[test]
    fn a_stray_release_during_a_restore_leaves_its_range_reserved() {
        let mut t = ObjectTable::new(1 << 20);
        let id = sealed(&mut t, 5000);
        let file = t.pick_spills(u64::MAX)[0].0;
        t.spill_done(file, true);
        let (range, _) = t.begin_restore(id).unwrap().unwrap();
        assert_eq!(
            t.delete(id),
            None,
            "restoring: its file goes when the read ends"
        );
        t.unpin(id);
        assert_eq!(
            t.stats().used_bytes,
            ObjectTable::footprint(5000),
            "the restore still writes into {range:?}"
        );
        assert!(t.restore_done(file, true));
        assert_eq!((t.stats().num_objects, t.stats().used_bytes), (0, 0));
    }

    #[test]
    fn a_dead_attempts_late_messages_cannot_touch_the_copy_a_retry_writes() {
        let mut t = ObjectTable::new(1 << 20);
        let id = ObjectId::new();
        let (dead, retry) = (Creator(7), Creator(8));
        t.create(id, 5000, dead).unwrap();
        // The first attempt's process dies unsealed; until the raylet sees
        // its connection close, a retry's create waits.
        assert!(t.busy(id, retry));
        assert!(t.create(id, 5000, retry).is_err());
        t.creator_gone(dead);
        assert_eq!(t.stats().used_bytes, 0, "what it left unsealed is freed");
        let p = t.create(id, 5000, retry).unwrap();
        // Its messages still on their way are refused.
        assert!(t.create(id, 5000, dead).is_err());
        assert!(t.seal(id, dead).is_err());
        assert!(t.pin(id).is_err(), "not sealed by the stale message");
        t.seal(id, retry).unwrap();
        assert_eq!(t.pin(id).unwrap(), Pin::Pinned(p));
        // A sealed copy outlives its creator.
        t.creator_gone(retry);
        assert_eq!(t.stats().num_objects, 1);
    }

    #[test]
    fn a_live_writers_copy_is_not_replaced_until_it_is_sealed() {
        let mut t = ObjectTable::new(1 << 20);
        let id = ObjectId::new();
        let (first, second) = (Creator(3), Creator(4));
        t.create(id, 5000, first).unwrap();
        assert!(t.busy(id, second) && !t.busy(id, first));
        t.seal(id, first).unwrap();
        assert!(
            t.busy(id, second),
            "sealed, but its creator may still be answering its caller"
        );
        t.creator_gone(first);
        assert!(!t.busy(id, second));
        t.create(id, 6000, second).unwrap();
        assert!(t.seal(id, first).is_err(), "the new copy is the second's");
        t.seal(id, second).unwrap();
        // A late create of a creator that is gone is refused, and does not
        // wait: the retry's sealed copy stays.
        assert!(!t.busy(id, first));
        assert!(t.create(id, 5000, first).is_err());
        assert!(matches!(t.pin(id).unwrap(), Pin::Pinned(_)));
    }

    #[test]
    fn a_task_result_goes_with_its_owner_even_when_read_or_spilled() {
        let mut t = ObjectTable::new(1 << 20);
        let worker = Creator(5);
        let (read, spilled, other) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        for (id, owner) in [(read, "a"), (spilled, "a"), (other, "b")] {
            t.create(id, 5000, worker).unwrap();
            t.seal(id, worker).unwrap();
            t.owned_by(id, owner);
        }
        assert!(matches!(t.pin(read).unwrap(), Pin::Pinned(_)));
        let files = t.pick_spills(u64::MAX);
        let file = files.iter().find(|f| f.0.id == spilled).unwrap().0;
        for f in &files {
            t.spill_done(f.0, f.0.id == spilled);
        }
        let removed = t.owners_gone(|owner| owner == "a");
        assert_eq!(removed, vec![file], "the spilled result's file goes");
        assert!(!t.has(read) && !t.has(spilled) && t.has(other));
        // The read copy's memory is freed once its reader lets go.
        assert_eq!(t.stats().num_objects, 2);
        t.unpin(read);
        assert_eq!(t.stats().num_objects, 1);
    }

    #[test]
    fn a_gone_creator_s_puts_go_with_it_but_task_results_stay() {
        let mut t = ObjectTable::new(1 << 20);
        let creator = Creator(9);
        let (put, spilled_put, result) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        for id in [put, spilled_put, result] {
            t.create(id, 5000, creator).unwrap();
            t.seal(id, creator).unwrap();
        }
        t.owned_by_creator(put);
        t.owned_by_creator(spilled_put);
        // One put is spilled, the other is being read.
        let files = t.pick_spills(u64::MAX);
        let file = files.iter().find(|f| f.0.id == spilled_put).unwrap().0;
        for f in &files {
            let written = f.0.id == spilled_put;
            t.spill_done(f.0, written);
        }
        assert!(matches!(t.pin(put).unwrap(), Pin::Pinned(_)));
        assert_eq!(
            t.creator_gone(creator),
            vec![file],
            "the spilled put's file goes"
        );
        assert!(t.pin(spilled_put).is_err());
        assert!(t.pin(put).is_err(), "no new readers for the read one");
        t.unpin(put);
        assert!(
            matches!(t.pin(result).unwrap(), Pin::Pinned(_)),
            "a task's result belongs to its caller: it stays"
        );
        assert_eq!(t.stats().num_objects, 1);
    }
}
