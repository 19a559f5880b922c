//! The pull policy, as plain logic with no I/O ([`PullBook`]): which pulls
//! are under way and who waits for each (one transfer per object, however
//! many ask), how an object is cut into chunks over a few streams, when a
//! pull that broke off is tried again, and which nodes hold copies of the
//! objects served from here. `crate::transfer` carries out what it
//! decides; the waiters are a type parameter, as the scheduler's are, so
//! that the unit tests below use plain numbers.

use prism_protocol::error::Error;
use prism_protocol::ids::ObjectId;
use std::collections::{HashMap, HashSet};

/// Bytes asked for in one request on a bulk stream.
pub(crate) const CHUNK_BYTES: u64 = 8 << 20;
/// Bulk streams one pull reads over at once.
pub(crate) const STREAMS_PER_PULL: u64 = 4;
/// Times a pull is tried when its streams break (an I/O error or a
/// timeout) while the holder stays alive; a holder that refuses a range,
/// or one that died, ends it at once.
pub(crate) const PULL_ATTEMPTS: u32 = 3;

/// What a caller asking for a pull should do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Joined {
    /// No pull of the object was under way: the caller starts one.
    Start,
    /// One is under way: the caller's waiter is answered when it ends.
    Waits,
}

/// What to do after a pull's streams failed with an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Try again (from the holder's current address), as attempt `n`.
    Again(u32),
    /// Give up with the error.
    GiveUp,
}

/// How an object of `size` bytes is read: `chunks` ranges of
/// [`CHUNK_BYTES`] (the last one shorter) over `streams` streams at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    pub(crate) size: u64,
    pub(crate) chunks: u64,
    pub(crate) streams: u64,
}

impl ChunkPlan {
    pub(crate) fn of(size: u64) -> ChunkPlan {
        let chunks = size.div_ceil(CHUNK_BYTES);
        ChunkPlan {
            size,
            chunks,
            streams: chunks.min(STREAMS_PER_PULL),
        }
    }

    /// The offset and length of chunk `chunk` (`None` past the last).
    pub(crate) fn range(&self, chunk: u64) -> Option<(u64, u64)> {
        (chunk < self.chunks).then(|| {
            let offset = chunk * CHUNK_BYTES;
            (offset, CHUNK_BYTES.min(self.size - offset))
        })
    }
}

/// Decides after a failed attempt: an object its holder cannot serve
/// ([`Error::ObjectLost`]) is not asked for again; a broken stream is,
/// up to [`PULL_ATTEMPTS`] attempts in all.
pub(crate) fn after_failure(attempt: u32, error: &Error) -> AfterFailure {
    match error {
        Error::ObjectLost { .. } => AfterFailure::GiveUp,
        _ if attempt < PULL_ATTEMPTS => AfterFailure::Again(attempt + 1),
        _ => AfterFailure::GiveUp,
    }
}

/// The pulls under way and their waiters, and the copies handed out.
#[derive(Debug)]
pub(crate) struct PullBook<W> {
    pulls: HashMap<ObjectId, Vec<W>>,
    copies: HashMap<ObjectId, HashSet<String>>,
}

impl<W> Default for PullBook<W> {
    fn default() -> Self {
        PullBook {
            pulls: HashMap::new(),
            copies: HashMap::new(),
        }
    }
}

impl<W> PullBook<W> {
    /// `waiter` asks for object `id`: it waits for the pull under way, or
    /// the caller starts one.
    pub(crate) fn join(&mut self, id: ObjectId, waiter: W) -> Joined {
        match self.pulls.get_mut(&id) {
            Some(waiting) => {
                waiting.push(waiter);
                Joined::Waits
            }
            None => {
                self.pulls.insert(id, vec![waiter]);
                Joined::Start
            }
        }
    }

    /// The pull of `id` ended: everyone who waited for it, to answer.
    pub(crate) fn finish(&mut self, id: ObjectId) -> Vec<W> {
        self.pulls.remove(&id).unwrap_or_default()
    }

    /// Pulls under way.
    #[cfg(test)]
    fn under_way(&self) -> usize {
        self.pulls.len()
    }

    /// Node `node` pulled a copy of `id` from here.
    pub(crate) fn copied(&mut self, id: ObjectId, node: String) {
        self.copies.entry(id).or_default().insert(node);
    }

    /// The nodes that pulled copies of `ids`, forgetting them: each with
    /// the ids it holds.
    pub(crate) fn take_copies(&mut self, ids: &[ObjectId]) -> HashMap<String, Vec<ObjectId>> {
        let mut by_node: HashMap<String, Vec<ObjectId>> = HashMap::new();
        for id in ids {
            for node in self.copies.remove(id).into_iter().flatten() {
                by_node.entry(node).or_default().push(*id);
            }
        }
        by_node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same fresh id for the same `n` within a test thread.
    fn id(n: usize) -> ObjectId {
        thread_local! {
            static IDS: Vec<ObjectId> = (0..4).map(|_| ObjectId::new()).collect();
        }
        IDS.with(|ids| ids[n])
    }

    #[test]
    fn one_transfer_per_object_however_many_ask() {
        let mut book = PullBook::default();
        assert_eq!(book.join(id(1), 10), Joined::Start);
        assert_eq!(book.join(id(1), 11), Joined::Waits);
        assert_eq!(book.join(id(2), 12), Joined::Start);
        assert_eq!(book.under_way(), 2);
        assert_eq!(book.finish(id(1)), vec![10, 11]);
        // Finished: the next ask starts a new pull.
        assert_eq!(book.join(id(1), 13), Joined::Start);
        assert_eq!(book.finish(id(2)), vec![12]);
        assert_eq!(book.finish(id(2)), Vec::<i32>::new());
        assert_eq!(book.under_way(), 1);
    }

    #[test]
    fn chunks_cover_the_object_exactly_over_at_most_four_streams() {
        assert_eq!(ChunkPlan::of(0).chunks, 0);
        assert_eq!(ChunkPlan::of(0).range(0), None);
        let small = ChunkPlan::of(5);
        assert_eq!((small.chunks, small.streams), (1, 1));
        assert_eq!(small.range(0), Some((0, 5)));
        let big = ChunkPlan::of(5 * CHUNK_BYTES + 3);
        assert_eq!((big.chunks, big.streams), (6, STREAMS_PER_PULL));
        let mut covered = 0;
        for c in 0..big.chunks {
            let (offset, len) = big.range(c).expect("a chunk inside the object");
            assert_eq!(offset, covered, "chunks are contiguous");
            covered += len;
        }
        assert_eq!(covered, big.size);
        assert_eq!(big.range(big.chunks), None);
        assert_eq!(
            ChunkPlan::of(2 * CHUNK_BYTES).range(1),
            Some((CHUNK_BYTES, CHUNK_BYTES))
        );
    }

    #[test]
    fn a_broken_stream_is_tried_again_a_refusal_is_not() {
        let broken = Error::io("pull", "connection reset");
        assert_eq!(after_failure(1, &broken), AfterFailure::Again(2));
        assert_eq!(after_failure(2, &broken), AfterFailure::Again(3));
        assert_eq!(after_failure(PULL_ATTEMPTS, &broken), AfterFailure::GiveUp);
        let refused = Error::ObjectLost {
            object_id: id(1),
            cause: "its holder could not serve it".into(),
        };
        assert_eq!(after_failure(1, &refused), AfterFailure::GiveUp);
    }

    #[test]
    fn copies_are_handed_back_per_node_once() {
        let mut book: PullBook<u32> = PullBook::default();
        book.copied(id(1), "a".into());
        book.copied(id(1), "b".into());
        book.copied(id(1), "a".into());
        book.copied(id(2), "a".into());
        let mut taken = book.take_copies(&[id(1), id(2), id(3)]);
        for ids in taken.values_mut() {
            ids.sort();
        }
        assert_eq!(taken.len(), 2);
        assert_eq!(taken["a"], vec![id(1), id(2)]);
        assert_eq!(taken["b"], vec![id(1)]);
        assert!(book.take_copies(&[id(1), id(2)]).is_empty());
    }
}
