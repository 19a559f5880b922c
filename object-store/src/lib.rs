//! Prism's per-node shared-memory object store.
//!
//! One shared-memory file (a `memfd`) holds every large object on a node.
//! The raylet creates it and owns the [`ObjectTable`] (which bytes belong to which
//! object, who is reading what); every process on the node maps the same
//! file with [`Segment::open`] and reads or writes object bytes in place, so
//! a value is written once and read without a copy.
//!
//! # Lifecycle of an object
//!
//! 1. `create(id, size)` reserves space (or fails with `ObjectStoreFull`).
//! 2. The creator writes the bytes through its own mapping.
//! 3. `seal(id)` makes it readable; it is immutable from then on.
//! 4. `pin(id)` hands a reader its offset and counts the reader; `unpin`
//!    undoes that.
//! 5. `delete(id)`, sent by the owner once no reference remains, frees the
//!    space at once, or when the last reader unpins.
//!
//! Between seal and delete, an object nobody has pinned may be spilled: the
//! raylet writes its bytes to a file and its range is freed; a later `pin`
//! finds it on disk, and the raylet reads it back into a new range first.
#![warn(missing_docs, missing_debug_implementations)]

mod allocator;
mod segment;
mod table;

pub use allocator::Allocator;
pub use segment::Segment;
pub use table::{Creator, ObjectSummary, ObjectTable, Pin, Placement, SpillFile, SpillOutcome};
