//! Which bytes of the segment belong to which object, and who reads them.
//!
//! This type is not thread safe by itself; the raylet keeps it behind one
//! lock. Invariants:
//!
//! 1. An object's range is allocated from `create` until it is deleted *and*
//!    unpinned by every reader.
//! 2. Only sealed objects are handed to readers.
//! 3. `used_bytes` is the sum of the aligned sizes of allocated ranges.

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

#[derive(Debug)]
struct Entry {
    placement: Placement,
    sealed: bool,
    pins: u64,
    deleted: bool,
}

/// The object table of one node's store.
#[derive(Debug)]
pub struct ObjectTable {
    allocator: Allocator,
    objects: HashMap<ObjectId, Entry>,
}

impl ObjectTable {
    /// A table over a segment of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        ObjectTable {
            allocator: Allocator::new(capacity),
            objects: HashMap::new(),
        }
    }

    /// Reserves room for a new object.
    pub fn create(&mut self, id: ObjectId, size: u64) -> Result<Placement, Error> {
        if let Some(existing) = self.objects.get(&id) {
            // Creating twice (a retried request) is harmless until sealed.
            if !existing.sealed && existing.placement.size == size {
                return Ok(existing.placement);
            }
            return Err(Error::Protocol {
                message: format!("object {id} already exists in the store"),
            });
        }
        let Some(offset) = self.allocator.allocate(size) else {
            return Err(Error::ObjectStoreFull {
                requested: size,
                used: self.allocator.used(),
                capacity: self.allocator.capacity(),
                num_objects: self.objects.len() as u64,
            });
        };
        let placement = Placement { offset, size };
        self.objects.insert(
            id,
            Entry {
                placement,
                sealed: false,
                pins: 0,
                deleted: false,
            },
        );
        Ok(placement)
    }

    /// Makes a created object readable.
    pub fn seal(&mut self, id: ObjectId) -> Result<(), Error> {
        match self.objects.get_mut(&id) {
            Some(e) => {
                e.sealed = true;
                Ok(())
            }
            None => Err(Error::ObjectNotFound { object_id: id }),
        }
    }

    /// Pins a sealed object for one more reader.
    pub fn pin(&mut self, id: ObjectId) -> Result<Placement, Error> {
        match self.objects.get_mut(&id) {
            Some(e) if e.sealed && !e.deleted => {
                e.pins += 1;
                Ok(e.placement)
            }
            _ => Err(Error::ObjectNotFound { object_id: id }),
        }
    }

    /// Drops one reader's pin; frees the range if the object was deleted.
    pub fn unpin(&mut self, id: ObjectId) {
        let free = match self.objects.get_mut(&id) {
            Some(e) => {
                e.pins = e.pins.saturating_sub(1);
                e.pins == 0 && e.deleted
            }
            None => false,
        };
        if free {
            self.remove(id);
        }
    }

    /// Deletes an object: freed now, or when its last reader unpins.
    pub fn delete(&mut self, id: ObjectId) {
        let free = match self.objects.get_mut(&id) {
            Some(e) => {
                e.deleted = true;
                e.pins == 0
            }
            None => false,
        };
        if free {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: ObjectId) {
        if let Some(e) = self.objects.remove(&id) {
            self.allocator.free(e.placement.offset, e.placement.size);
        }
    }

    /// Usage figures.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            used_bytes: self.allocator.used(),
            capacity_bytes: self.allocator.capacity(),
            num_objects: self.objects.len() as u64,
            num_pinned: self.objects.values().filter(|e| e.pins > 0).count() as u64,
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
        t.pin(id).unwrap();
        t.delete(id);
        assert_eq!(t.stats().num_objects, 1);
        assert!(t.pin(id).is_err(), "deleted objects must not gain readers");
        t.unpin(id);
        assert_eq!(t.stats().used_bytes, 0);
        assert_eq!(t.stats().num_objects, 0);
    }

    #[test]
    fn a_full_store_says_what_was_asked_and_what_is_used() {
        let mut t = ObjectTable::new(1024);
        t.create(ObjectId::new(), 1000).unwrap();
        let err = t.create(ObjectId::new(), 512).unwrap_err();
        assert_eq!(
            err,
            Error::ObjectStoreFull {
                requested: 512,
                used: 1024,
                capacity: 1024,
                num_objects: 1
            }
        );
        assert!(err.to_string().contains("asked for 512 bytes"));
    }
}
