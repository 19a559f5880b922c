//! Best-fit allocation of byte ranges in the segment.
//!
//! Free ranges are kept twice: by offset (to merge neighbours on free) and
//! by (size, offset) (to find the smallest range that fits, lowest offset
//! first). Preferring low offsets reuses pages that are already mapped in,
//! which matters: writing into fresh shared pages is several times slower
//! than into pages touched before.

use std::collections::{BTreeMap, BTreeSet};

/// Every allocation starts on this boundary and takes a multiple of it: a
/// page. Typed views of any primitive element type are aligned, and an
/// object's whole footprint can be written to and read from a spill file
/// with direct I/O (which moves whole aligned blocks). An object above the
/// inline limit (100 KiB) loses under 4% to it.
pub const ALIGNMENT: u64 = 4096;

/// A best-fit range allocator with coalescing.
#[derive(Debug)]
pub struct Allocator {
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    capacity: u64,
    used: u64,
}

/// Rounds a request up to the alignment (zero-byte objects take one unit so
/// that every object has a distinct offset).
pub fn aligned_size(size: u64) -> u64 {
    size.max(1).div_ceil(ALIGNMENT) * ALIGNMENT
}

impl Allocator {
    /// An allocator over `capacity` bytes, all free.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity / ALIGNMENT * ALIGNMENT;
        let mut a = Allocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            capacity,
            used: 0,
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    fn insert_free(&mut self, offset: u64, size: u64) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
    }

    fn remove_free(&mut self, offset: u64, size: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
    }

    /// Reserves `size` bytes (already aligned by [`aligned_size`]); `None`
    /// when no free range is large enough.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        let size = aligned_size(size);
        let &(free_size, offset) = self.by_size.range((size, 0)..).next()?;
        self.remove_free(offset, free_size);
        if free_size > size {
            self.insert_free(offset + size, free_size - size);
        }
        self.used += size;
        Some(offset)
    }

    /// Returns a range given out by [`Allocator::allocate`] with the same size.
    pub fn free(&mut self, offset: u64, size: u64) {
        let size = aligned_size(size);
        self.used -= size;
        let mut start = offset;
        let mut len = size;
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back() {
            if prev_off + prev_len == offset {
                self.remove_free(prev_off, prev_len);
                start = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&(offset + size)) {
            self.remove_free(offset + size, next_len);
            len += next_len;
        }
        self.insert_free(start, len);
    }

    /// Bytes given out.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_neighbours_merge_back_into_one_range() {
        let mut a = Allocator::new(16 * ALIGNMENT);
        let x = a.allocate(100).unwrap();
        let y = a.allocate(ALIGNMENT + 1).unwrap();
        let z = a.allocate(100).unwrap();
        assert_eq!((x, y, z), (0, ALIGNMENT, 3 * ALIGNMENT));
        a.free(y, ALIGNMENT + 1);
        a.free(x, 100);
        a.free(z, 100);
        assert_eq!(a.used(), 0);
        assert_eq!(
            a.allocate(16 * ALIGNMENT),
            Some(0),
            "the whole space must be one range again"
        );
    }

    #[test]
    fn allocation_fails_when_no_range_fits() {
        let mut a = Allocator::new(4 * ALIGNMENT);
        assert!(a.allocate(3 * ALIGNMENT + 1).is_some());
        assert!(a.allocate(64).is_none());
    }

    #[test]
    fn best_fit_reuses_the_lowest_hole_that_fits() {
        let mut a = Allocator::new(4 * ALIGNMENT);
        let x = a.allocate(64).unwrap();
        let _y = a.allocate(64).unwrap();
        a.free(x, 64);
        assert_eq!(a.allocate(64), Some(x));
    }
}
