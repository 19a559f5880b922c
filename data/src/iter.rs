//! Reading a dataset batch by batch: [`Batches`] for one pass, and
//! [`DataIterator`] for a training worker's epochs over its shard.

use super::batch::{Batch, Schema};
use super::dataset::Dataset;
use super::error::{positive, Result};
use super::exec::StageStats;
use super::rng;
use super::split::SplitHandle;
use super::stream::{Chunk, StreamBatches};
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
/// epochs (Ray's `DataIterator`, what `get_dataset_shard` returns).
///
/// A shard is either rows in memory (a split of a [`Dataset`]) or one
/// split of a streaming pipeline ([`LazyDataset::streaming_split`]), whose
/// blocks are computed on the cluster while the worker trains.
///
/// Each call to [`DataIterator::iter_batches`] is one epoch and advances
/// the epoch counter. With [`DataIterator::local_shuffle_seed`], epoch `e`
/// of an in-memory shard reads its rows in an order derived from the seed
/// and `e`: the same on every run, different from epoch to epoch; a
/// streaming shard shuffles within a buffer
/// ([`DataIterator::local_shuffle_buffer`]). It serializes, so the driver
/// can send shards to workers.
///
/// ```
/// use prism_data::Dataset;
///
/// let shards = Dataset::range(10).streaming_split(2, true)?;
/// let shard = shards[1].clone().local_shuffle_seed(7);
/// for _epoch in 0..3 {
///     let mut seen: Vec<i64> = Vec::new();
///     for batch in shard.iter_batches(2, false)? {
///         seen.extend(batch?.i64("id")?);
///     }
///     seen.sort();
///     assert_eq!(seen, [5, 6, 7, 8, 9]);
/// }
/// # Ok::<(), prism_data::DataError>(())
/// ```
///
/// [`LazyDataset::streaming_split`]: super::LazyDataset::streaming_split
#[derive(Debug)]
pub struct DataIterator {
    shard: Shard,
    shuffle_seed: Option<u64>,
    /// Rows of the local shuffle buffer of a streaming shard.
    shuffle_buffer: Option<usize>,
    /// The epoch the next `iter_batches` reads.
    epoch: AtomicU64,
}

/// Where a shard's rows are.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Shard {
    Memory(Dataset),
    Streaming(SplitHandle),
}

impl Clone for DataIterator {
    fn clone(&self) -> Self {
        DataIterator {
            shard: self.shard.clone(),
            shuffle_seed: self.shuffle_seed,
            shuffle_buffer: self.shuffle_buffer,
            epoch: AtomicU64::new(self.epoch()),
        }
    }
}

/// The serialized form of a [`DataIterator`].
#[derive(Serialize, Deserialize)]
struct Wire {
    shard: Shard,
    shuffle_seed: Option<u64>,
    shuffle_buffer: Option<usize>,
    epoch: u64,
}

impl Serialize for DataIterator {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        Wire {
            shard: self.shard.clone(),
            shuffle_seed: self.shuffle_seed,
            shuffle_buffer: self.shuffle_buffer,
            epoch: self.epoch(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for DataIterator {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        Ok(DataIterator {
            shard: wire.shard,
            shuffle_seed: wire.shuffle_seed,
            shuffle_buffer: wire.shuffle_buffer,
            epoch: AtomicU64::new(wire.epoch),
        })
    }
}

impl DataIterator {
    pub(crate) fn new(dataset: Dataset) -> DataIterator {
        DataIterator::with_shard(Shard::Memory(dataset))
    }

    pub(crate) fn streaming(split: SplitHandle) -> DataIterator {
        DataIterator::with_shard(Shard::Streaming(split))
    }

    fn with_shard(shard: Shard) -> DataIterator {
        DataIterator {
            shard,
            shuffle_seed: None,
            shuffle_buffer: None,
            epoch: AtomicU64::new(0),
        }
    }

    /// Shuffles the shard's rows at each epoch, in an order derived from
    /// `seed` and the epoch number: the whole shard for one in memory,
    /// within a buffer (1,000 rows unless
    /// [`DataIterator::local_shuffle_buffer`] says otherwise) for a
    /// streaming one.
    pub fn local_shuffle_seed(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self
    }

    /// The rows a streaming shard shuffles among (Ray's
    /// `local_shuffle_buffer_size`); it also turns shuffling on, with seed
    /// 0 unless [`DataIterator::local_shuffle_seed`] set one.
    pub fn local_shuffle_buffer(mut self, rows: usize) -> Self {
        self.shuffle_buffer = Some(rows.max(1));
        self
    }

    /// Whether the shard streams from a pipeline (rather than being held
    /// in memory).
    pub fn is_streaming(&self) -> bool {
        matches!(self.shard, Shard::Streaming(_))
    }

    /// One epoch: the shard's rows in batches of `batch_size` (shuffled if
    /// asked), the last one short unless `drop_last`. Advances the epoch
    /// counter. Items are `Err` when a streaming shard's pipeline fails.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for `batch_size = 0`.
    pub fn iter_batches(&self, batch_size: usize, drop_last: bool) -> Result<StreamBatches> {
        positive("batch_size", batch_size)?;
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed);
        let seed = self
            .shuffle_seed
            .or(self.shuffle_buffer.map(|_| 0))
            .map(|s| rng::epoch_seed(s, epoch));
        match &self.shard {
            Shard::Memory(dataset) => {
                let blocks: Vec<Batch> = match self.shuffle_seed {
                    None => dataset.blocks().to_vec(),
                    Some(seed) => {
                        let all = dataset.concat_all();
                        let order = rng::permutation(all.num_rows(), rng::epoch_seed(seed, epoch));
                        vec![all.gather(&order)]
                    }
                };
                let chunks = Box::new(blocks.into_iter().map(|b| Ok(Chunk::Rows(b))));
                Ok(StreamBatches::new(chunks, None, batch_size, drop_last))
            }
            Shard::Streaming(split) => {
                let batches = split.epoch(epoch, batch_size, drop_last);
                Ok(match seed {
                    Some(seed) => batches.local_shuffle(self.shuffle_buffer.unwrap_or(1000), seed),
                    None => batches,
                })
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

    /// The number of rows per epoch: known for a shard in memory, and for a
    /// streaming one when the pipeline's source knows its row count, no
    /// step changes it, and the split is equal. `None` otherwise.
    ///
    /// # Errors
    ///
    /// [`DataError::Split`](super::DataError::Split) if a streaming shard's
    /// coordinator cannot be reached.
    pub fn count(&self) -> Result<Option<usize>> {
        match &self.shard {
            Shard::Memory(d) => Ok(Some(d.count())),
            Shard::Streaming(split) => split.rows_per_epoch(),
        }
    }

    /// The shard's schema, when known without reading it (always for a
    /// shard in memory; for a streaming one, when no step of the pipeline
    /// changes the source's columns).
    pub fn schema(&self) -> Option<Schema> {
        match &self.shard {
            Shard::Memory(d) => Some(d.schema()),
            Shard::Streaming(split) => split.schema.clone(),
        }
    }

    /// The shard's rows, unshuffled, for a shard held in memory.
    pub fn dataset(&self) -> Option<&Dataset> {
        match &self.shard {
            Shard::Memory(d) => Some(d),
            Shard::Streaming(_) => None,
        }
    }

    /// What a streaming shard's pipeline did in its current (or last)
    /// epoch, stage by stage; empty for a shard in memory.
    ///
    /// # Errors
    ///
    /// [`DataError::Split`](super::DataError::Split) if the coordinator
    /// cannot be reached.
    pub fn stats(&self) -> Result<Vec<StageStats>> {
        match &self.shard {
            Shard::Memory(_) => Ok(Vec::new()),
            Shard::Streaming(split) => split.stats(),
        }
    }
}
