//! Reading a dataset batch by batch: [`Batches`] for one pass, and
//! [`DataIterator`] for a training worker's epochs over its shard.

use super::batch::{Batch, Schema};
use super::dataset::Dataset;
use super::error::{positive, Result};
use super::rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An iterator of batches of rows, in order: what
/// [`Dataset::iter_batches`] and [`DataIterator::iter_batches`] return.
///
/// It owns its rows (shared with the dataset), so it borrows nothing.
#[derive(Clone, Debug)]
pub struct Batches {
    blocks: Arc<Vec<Batch>>,
    /// The block the next row comes from, and the row within it.
    block: usize,
    offset: usize,
    batch_size: usize,
    /// Rows still to be yielded, all batches together.
    rows_left: usize,
}

impl Batches {
    pub(crate) fn new(
        blocks: Arc<Vec<Batch>>,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Batches> {
        positive("batch_size", batch_size)?;
        let total: usize = blocks.iter().map(Batch::num_rows).sum();
        let rows_left = if drop_last {
            total - total % batch_size
        } else {
            total
        };
        Ok(Batches {
            blocks,
            block: 0,
            offset: 0,
            batch_size,
            rows_left,
        })
    }
}

impl Iterator for Batches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let want = self.batch_size.min(self.rows_left);
        if want == 0 {
            return None;
        }
        self.rows_left -= want;
        let mut out: Option<Batch> = None;
        let mut have = 0;
        while have < want {
            let block = &self.blocks[self.block];
            let n = (want - have).min(block.num_rows() - self.offset);
            if n == 0 {
                self.block += 1;
                self.offset = 0;
                continue;
            }
            let rows = self.offset..self.offset + n;
            match &mut out {
                // The whole batch from one block: a slice, or the block itself.
                None if n == want && n == block.num_rows() => out = Some(block.clone()),
                None if n == want => out = Some(block.slice(rows)),
                None => {
                    let mut batch = block.empty_like();
                    batch.extend_from(block, rows);
                    out = Some(batch);
                }
                Some(batch) => batch.extend_from(block, rows),
            }
            have += n;
            self.offset += n;
        }
        out
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rows_left.div_ceil(self.batch_size);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches {}

impl std::iter::FusedIterator for Batches {}

/// One training worker's view of its shard: batches for any number of
/// epochs, each optionally in a fresh random order (Ray's `DataIterator`,
/// what `get_dataset_shard` returns).
///
/// Each call to [`DataIterator::iter_batches`] is one epoch and advances
/// the epoch counter. With [`DataIterator::local_shuffle_seed`], epoch `e`
/// reads the shard's rows in an order derived from the seed and `e`: the
/// same on every run, different from epoch to epoch. It serializes (rows,
/// seed and epoch), so the driver can send shards to workers.
///
/// ```
/// use prism_data::Dataset;
///
/// let shards = Dataset::range(10).streaming_split(2, true)?;
/// let shard = shards[1].clone().local_shuffle_seed(7);
/// for _epoch in 0..3 {
///     let mut seen: Vec<i64> = Vec::new();
///     for batch in shard.iter_batches(2, false)? {
///         seen.extend(batch.i64("id")?);
///     }
///     seen.sort();
///     assert_eq!(seen, [5, 6, 7, 8, 9]);
/// }
/// # Ok::<(), prism_data::DataError>(())
/// ```
#[derive(Debug)]
pub struct DataIterator {
    dataset: Dataset,
    shuffle_seed: Option<u64>,
    /// The epoch the next `iter_batches` reads.
    epoch: AtomicU64,
}

impl Clone for DataIterator {
    fn clone(&self) -> Self {
        DataIterator {
            dataset: self.dataset.clone(),
            shuffle_seed: self.shuffle_seed,
            epoch: AtomicU64::new(self.epoch()),
        }
    }
}

/// The serialized form of a [`DataIterator`].
#[derive(Serialize, Deserialize)]
struct Wire {
    dataset: Dataset,
    shuffle_seed: Option<u64>,
    epoch: u64,
}

impl Serialize for DataIterator {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        Wire {
            dataset: self.dataset.clone(),
            shuffle_seed: self.shuffle_seed,
            epoch: self.epoch(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for DataIterator {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        Ok(DataIterator {
            dataset: wire.dataset,
            shuffle_seed: wire.shuffle_seed,
            epoch: AtomicU64::new(wire.epoch),
        })
    }
}

impl DataIterator {
    pub(crate) fn new(dataset: Dataset) -> DataIterator {
        DataIterator {
            dataset,
            shuffle_seed: None,
            epoch: AtomicU64::new(0),
        }
    }

    /// Shuffles the shard's rows at each epoch, in an order derived from
    /// `seed` and the epoch number.
    pub fn local_shuffle_seed(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self
    }

    /// One epoch: the shard's rows in batches of `batch_size` (shuffled if
    /// a seed was set), the last one short unless `drop_last`. Advances
    /// the epoch counter.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for `batch_size = 0`.
    pub fn iter_batches(&self, batch_size: usize, drop_last: bool) -> Result<Batches> {
        positive("batch_size", batch_size)?;
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
        match self.shuffle_seed {
            None => self.dataset.iter_batches(batch_size, drop_last),
            Some(seed) => {
                let all = self.dataset.concat_all();
                let order = rng::permutation(all.num_rows(), rng::epoch_seed(seed, epoch));
                Batches::new(Arc::new(vec![all.gather(&order)]), batch_size, drop_last)
            }
        }
    }

    /// The epoch the next [`DataIterator::iter_batches`] reads (0 at first).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Sets the epoch the next [`DataIterator::iter_batches`] reads, as
    /// when resuming from a checkpoint.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The number of rows in the shard.
    pub fn count(&self) -> usize {
        self.dataset.count()
    }

    /// The shard's schema.
    pub fn schema(&self) -> Schema {
        self.dataset.schema()
    }

    /// The shard's rows, unshuffled.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }
}
