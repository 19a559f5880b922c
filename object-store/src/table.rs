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
//!    unpinned by every reader, or until it is spilled.
//! 2. Only sealed objects are handed to readers, and only from memory.
//! 3. An object is spilled only while sealed, not deleted, pinned by no
//!    reader, and not being spilled already; a reader that pins it during
//!    its spill keeps it in memory (the spill is discarded).
//! 4. `used_bytes` is the sum of the aligned sizes of allocated ranges.

use crate::allocator::{aligned_size, Allocator};
use prism_protocol::error::Error;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::StoreStats;
use std::collections::HashMap;

/// Where an object lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset in the segment.
    pub offset: u64,
    /// Object size in bytes.
    pub size: u64,
}

/// Where an object's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Residence {
    Memory(Placement),
    /// In its spill file only.
    Disk,
    /// Being read back from its spill file into this range.
    Restoring(Placement),
}

#[derive(Debug)]
struct Entry {
    size: u64,
    residence: Residence,
    sealed: bool,
    pins: u64,
    deleted: bool,
    /// A spill of it is being written: its range must stay.
    spilling: bool,
    /// When it was last created, sealed or pinned (the table's clock).
    last_used: u64,
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

    /// Reserves room for a new object.
    pub fn create(&mut self, id: ObjectId, size: u64) -> Result<Placement, Error> {
        if let Some(existing) = self.objects.get(&id) {
            let busy = existing.pins > 0
                || existing.spilling
                || matches!(existing.residence, Residence::Restoring(_));
            if busy {
                return Err(Error::Protocol {
                    message: format!("object {id} already exists in the store and is being read"),
                });
            }
            // An earlier attempt of the task that makes this object died
            // before its owner heard back, leaving a copy (written or not)
            // that nobody has read: the new attempt replaces it. (A spill
            // file it left is overwritten if the new copy spills, and
            // removed at shutdown otherwise.)
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
                spilling: false,
                last_used,
            },
        );
        Ok(placement)
    }

    /// Makes a created object readable.
    pub fn seal(&mut self, id: ObjectId) -> Result<(), Error> {
        let now = self.tick();
        match self.objects.get_mut(&id) {
            Some(e) => {
                e.sealed = true;
                e.last_used = now;
                Ok(())
            }
            None => Err(Error::ObjectNotFound { object_id: id }),
        }
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
                Residence::Disk => Ok(Pin::OnDisk),
                Residence::Restoring(_) => Ok(Pin::Restoring),
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
                e.pins == 0 && e.deleted && !e.spilling
            }
            None => false,
        };
        if free {
            self.remove(id);
        }
    }

    /// Deletes an object: freed now, or when its last reader unpins (or its
    /// spill or restore ends). True if its spill file should be removed
    /// now.
    pub fn delete(&mut self, id: ObjectId) -> bool {
        self.lost.remove(&id);
        let Some(e) = self.objects.get_mut(&id) else {
            return false;
        };
        e.deleted = true;
        let busy = e.pins > 0 || e.spilling || matches!(e.residence, Residence::Restoring(_));
        let on_disk = e.residence == Residence::Disk;
        if !busy {
            self.remove(id);
        }
        on_disk
    }

    fn remove(&mut self, id: ObjectId) {
        if let Some(e) = self.objects.remove(&id) {
            if let Residence::Memory(p) | Residence::Restoring(p) = e.residence {
                self.allocator.free(p.offset, p.size);
            }
        }
    }

    /// Chooses objects to spill until at least `need` bytes would be freed
    /// (fewer if not enough can be), least recently used first, and marks
    /// them as being spilled. Each one's bytes stay where they are until
    /// [`ObjectTable::spill_done`].
    pub fn pick_spills(&mut self, need: u64) -> Vec<(ObjectId, Placement)> {
        let mut candidates: Vec<(u64, ObjectId, Placement)> = self
            .objects
            .iter()
            .filter(|(_, e)| e.sealed && !e.deleted && e.pins == 0 && !e.spilling)
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
            if let Some(e) = self.objects.get_mut(&id) {
                e.spilling = true;
            }
            picked.push((id, p));
        }
        picked
    }

    /// A spill's file was written (`written`) or could not be.
    pub fn spill_done(&mut self, id: ObjectId, written: bool) -> SpillOutcome {
        let Some(e) = self.objects.get_mut(&id) else {
            return SpillOutcome::Discard;
        };
        e.spilling = false;
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
        e.residence = Residence::Disk;
        let size = e.size;
        self.allocator.free(p.offset, p.size);
        self.spilled_total += 1;
        self.spilled_bytes_total += size;
        SpillOutcome::Spilled
    }

    /// Reserves memory to read a spilled object back into, or says the
    /// store is full (spill something else first). `None` if the object is
    /// not on disk (in memory already, or being restored).
    pub fn begin_restore(&mut self, id: ObjectId) -> Result<Option<Placement>, Error> {
        let size = match self.objects.get(&id) {
            Some(e) if e.residence == Residence::Disk && !e.deleted => e.size,
            Some(_) => return Ok(None),
            None => return Err(Error::ObjectNotFound { object_id: id }),
        };
        let Some(offset) = self.allocator.allocate(size) else {
            return Err(self.full(size));
        };
        let placement = Placement { offset, size };
        if let Some(e) = self.objects.get_mut(&id) {
            e.residence = Residence::Restoring(placement);
        }
        Ok(Some(placement))
    }

    /// The bytes of a restoring object were read back (`read`), or could
    /// not be (it stays on disk). True if the spill file should be removed.
    pub fn restore_done(&mut self, id: ObjectId, read: bool) -> bool {
        let now = self.tick();
        let Some(e) = self.objects.get_mut(&id) else {
            return true;
        };
        let Residence::Restoring(p) = e.residence else {
            return false;
        };
        if !read {
            e.residence = Residence::Disk;
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

    /// A spilled object whose file is gone (`cause`): it is lost, and
    /// every later `pin` says so, until its owner deletes it. Returns the
    /// error.
    pub fn lost(&mut self, id: ObjectId, cause: String) -> Error {
        if matches!(
            self.objects.get(&id).map(|e| e.residence),
            Some(Residence::Disk)
        ) {
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
                .filter(|e| e.residence == Residence::Disk)
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

    /// The aligned size a request of `size` bytes takes.
    pub fn footprint(size: u64) -> u64 {
        aligned_size(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_object_is_freed_only_when_its_last_reader_unpins() {
        let mut t = ObjectTable::new(1 << 20);
        let id = ObjectId::new();
        t.create(id, 1000).unwrap();
        assert!(t.pin(id).is_err(), "unsealed objects must not be readable");
        t.seal(id).unwrap();
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
        t.create(ObjectId::new(), 5000).unwrap();
        let err = t.create(ObjectId::new(), 512).unwrap_err();
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
        t.create(id, size).unwrap();
        t.seal(id).unwrap();
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
        assert_eq!(picked.iter().map(|p| p.0).collect::<Vec<_>>(), vec![b]);
        assert!(
            t.pick_spills(u64::MAX).iter().all(|p| p.0 == a),
            "c is pinned, b is spilling"
        );
        t.spill_done(a, false);
        assert_eq!(t.spill_done(b, true), SpillOutcome::Spilled);
        assert_eq!(t.pin(b).unwrap(), Pin::OnDisk);
        assert_eq!(t.stats().num_spilled, 1);
        let range = t.begin_restore(b).unwrap().expect("b is on disk");
        assert_eq!(t.pin(b).unwrap(), Pin::Restoring);
        assert_eq!(t.begin_restore(b).unwrap(), None, "one restore at a time");
        assert!(t.restore_done(b, true), "its file goes");
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
        assert_eq!(t.pick_spills(u64::MAX).len(), 2);
        assert!(matches!(t.pin(read).unwrap(), Pin::Pinned(_)));
        assert_eq!(
            t.spill_done(read, true),
            SpillOutcome::Discard,
            "pinned: stays"
        );
        assert!(!t.delete(gone), "no file yet");
        assert_eq!(t.spill_done(gone, true), SpillOutcome::Discard);
        assert_eq!(t.stats().num_objects, 1);
        // Deleting a spilled object removes it and asks for its file to go.
        t.unpin(read);
        t.pick_spills(u64::MAX);
        assert_eq!(t.spill_done(read, true), SpillOutcome::Spilled);
        assert!(t.delete(read));
        assert_eq!((t.stats().num_objects, t.stats().used_bytes), (0, 0));
    }

    #[test]
    fn a_restore_that_does_not_fit_says_the_store_is_full() {
        let mut t = ObjectTable::new(16384);
        let a = sealed(&mut t, 9000);
        t.pick_spills(u64::MAX);
        t.spill_done(a, true);
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
        t.create(id, 5000).unwrap();
        // The first attempt sealed (or not) and died; the retry's output
        // has another size.
        t.seal(id).unwrap();
        let p = t.create(id, 9000).unwrap();
        assert_eq!(p.size, 9000);
        assert_eq!(t.stats().num_objects, 1);
        assert_eq!(t.stats().used_bytes, ObjectTable::footprint(9000));
        t.seal(id).unwrap();
        assert!(matches!(t.pin(id).unwrap(), Pin::Pinned(_)));
        assert!(
            t.create(id, 10).is_err(),
            "a copy being read is not replaced"
        );
    }

    #[test]
    fn a_spilled_object_whose_file_is_gone_is_reported_lost_until_deleted() {
        let mut t = ObjectTable::new(1 << 20);
        let id = sealed(&mut t, 5000);
        t.pick_spills(u64::MAX);
        t.spill_done(id, true);
        let err = t.lost(id, "its file is gone".into());
        assert!(matches!(err, Error::ObjectLost { .. }));
        let again = t.pin(id).unwrap_err();
        assert!(again.to_string().contains("its file is gone"), "{again}");
        t.delete(id);
        assert!(matches!(t.pin(id), Err(Error::ObjectNotFound { .. })));
    }
}
