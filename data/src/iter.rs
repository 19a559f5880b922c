//! [`DataIterator`]: a training worker's epochs over its shard, and the
//! `streaming_split`s that make one per worker, of a [`Dataset`], a
//! [`LazyDataset`] or an [`AnyDataset`]. (A single pass over a dataset in
//! memory is [`Batches`](super::Batches), in the `dataset` module.)

use super::batch::Batch;
use super::dataset::Dataset;
use super::error::{positive, DataError, Result};
use super::plan::LazyDataset;
use super::rng;
use super::schema::Schema;
use super::split::{SplitCoordinator, SplitHandle};
use super::stats::StageStats;
use super::stream::{Chunk, StreamBatches};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// [`DataError::InvalidArgument`]
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
    /// [`DataError::Split`] if a streaming shard's
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
    /// [`DataError::Split`] if the coordinator
    /// cannot be reached.
    pub fn stats(&self) -> Result<Vec<StageStats>> {
        match &self.shard {
            Shard::Memory(_) => Ok(Vec::new()),
            Shard::Streaming(split) => split.stats(),
        }
    }
}

impl Dataset {
    /// [`Dataset::split`] into the per-worker iterators that
    /// [`DataIterator`] describes (Ray's `streaming_split`).
    ///
    /// # Errors
    ///
    /// As [`Dataset::split`].
    pub fn streaming_split(&self, n: usize, equal: bool) -> Result<Vec<DataIterator>> {
        Ok(self
            .split(n, equal)?
            .into_iter()
            .map(|d| d.iterator())
            .collect())
    }

    /// An iterator over this dataset's rows for a training loop, which can
    /// run any number of epochs and shuffle each (Ray's `iterator()`; a
    /// Trainer worker's `get_dataset_shard` gives one).
    pub fn iterator(&self) -> DataIterator {
        DataIterator::new(self.clone())
    }
}

impl LazyDataset {
    /// Splits the pipeline's rows, as they stream, among `n` consumers
    /// (Ray's `streaming_split`): one [`DataIterator`] each, to hand to
    /// training workers. The pipeline runs once per epoch, on the cluster,
    /// feeding all `n` at once; each block goes to one split.
    ///
    /// With `equal = true` each split reads the same number of rows per
    /// epoch (up to `n - 1` rows are dropped); splits then take turns, so
    /// they must all read every epoch. See the module docs.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `n = 0`,
    /// [`DataError::NotInitialized`] without a cluster,
    /// [`DataError::Split`] if the coordinator actor cannot start.
    ///
    /// [`DataIterator`]: super::DataIterator
    pub fn streaming_split(&self, n: usize, equal: bool) -> Result<Vec<DataIterator>> {
        super::error::positive("n", n)?;
        if !prism::is_initialized() {
            return Err(DataError::NotInitialized);
        }
        let plan = self.shareable()?;
        let schema = self.schema_if_known();
        let options = prism::ActorOptions::new().num_cpus(0.0);
        let coordinator = SplitCoordinator::remote_with(options, plan, n, equal).map_err(|e| {
            DataError::Split {
                split: 0,
                message: format!("cannot start the split coordinator: {e}"),
            }
        })?;
        let local = std::sync::Arc::new(());
        if super::stream::progress_on() {
            let watched = coordinator.clone();
            let alive = std::sync::Arc::downgrade(&local);
            super::stream::watch_split(format!("streaming_split({n})"), alive, move || {
                let r = watched.stats().ok()?;
                prism::get_timeout(&r, Duration::from_secs(30)).ok()
            });
        }
        Ok((0..n)
            .map(|split| {
                DataIterator::streaming(SplitHandle {
                    coordinator: coordinator.clone(),
                    split,
                    schema: schema.clone(),
                    _alive: Some(local.clone()),
                })
            })
            .collect())
    }
}

/// A dataset to split among training workers: rows in memory, or a
/// pipeline that streams to them (what the Trainer's `dataset` takes).
#[derive(Clone, Debug)]
pub enum AnyDataset {
    /// Split once; each worker holds its shard.
    Memory(Dataset),
    /// Streamed through [`LazyDataset::streaming_split`]; preprocessing runs
    /// on the cluster while the workers train.
    Streaming(LazyDataset),
}

impl From<Dataset> for AnyDataset {
    fn from(d: Dataset) -> Self {
        AnyDataset::Memory(d)
    }
}

impl From<LazyDataset> for AnyDataset {
    fn from(d: LazyDataset) -> Self {
        AnyDataset::Streaming(d)
    }
}

impl AnyDataset {
    /// One iterator per worker: [`super::Dataset::streaming_split`] or
    /// [`LazyDataset::streaming_split`].
    ///
    /// # Errors
    ///
    /// As those.
    pub fn streaming_split(&self, n: usize, equal: bool) -> Result<Vec<DataIterator>> {
        match self {
            AnyDataset::Memory(d) => d.streaming_split(n, equal),
            AnyDataset::Streaming(d) => d.streaming_split(n, equal),
        }
    }
}
