//! [`DistributedSampler`]: each rank's part of a dataset the user keeps
//! in memory, as torch's `DistributedSampler` (Ray Train's
//! `prepare_data_loader` installs one).

use super::error::{positive, DataError, Result};
use super::rng;

/// The indices of a dataset of `len` items that one rank of a data-parallel
/// group reads in one epoch.
///
/// Semantics follow `torch.utils.data.DistributedSampler`:
///
/// 1. The order is `0..len`, or with [`shuffle`](Self::shuffle) (the
///    default) a permutation derived from [`seed`](Self::seed) and the
///    epoch: identical on every rank, different each epoch, the same on
///    every run.
/// 2. Without [`drop_last`](Self::drop_last) (the default) the order is
///    padded by repeating its start until its length divides by
///    `world_size`; with it, the tail is cut instead.
/// 3. Rank `r` takes positions `r, r + world_size, r + 2 * world_size, ...`.
///
/// So every rank gets [`num_samples`](Self::num_samples) indices, and the
/// ranks' indices are disjoint apart from the padding; call
/// [`set_epoch`](Self::set_epoch) at the start of each epoch.
///
/// ```
/// use prism_data::DistributedSampler;
///
/// let mut all = Vec::new();
/// for rank in 0..3 {
///     let mut sampler = DistributedSampler::new(10, rank, 3)?.seed(42);
///     sampler.set_epoch(5);
///     all.extend(sampler.indices());
/// }
/// assert_eq!(all.len(), 12); // 10 padded to 12
/// all.sort();
/// all.dedup();
/// assert_eq!(all, (0..10).collect::<Vec<_>>());
/// # Ok::<(), prism_data::DataError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// A sampler over `len` items for `rank` of `world_size`, shuffling
    /// with seed 0 and padding.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `world_size = 0`,
    /// [`DataError::InvalidRank`] for `rank >= world_size`.
    pub fn new(len: usize, rank: usize, world_size: usize) -> Result<Self> {
        positive("world_size", world_size)?;
        if rank >= world_size {
            return Err(DataError::InvalidRank { rank, world_size });
        }
        Ok(DistributedSampler {
            len,
            rank,
            world_size,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
        })
    }

    /// A sampler for this process's rank, from the `RANK` and `WORLD_SIZE`
    /// environment variables that the Trainer and torchrun set (the part
    /// of Ray Train's `prepare_data_loader` that picks each rank's data).
    ///
    /// # Errors
    ///
    /// [`DataError::Env`] if either variable is missing or not a number;
    /// else as [`DistributedSampler::new`].
    pub fn from_env(len: usize) -> Result<Self> {
        fn var(name: &'static str) -> Result<usize> {
            let value = std::env::var(name).ok();
            value
                .as_deref()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(DataError::Env { name, value })
        }
        DistributedSampler::new(len, var("RANK")?, var("WORLD_SIZE")?)
    }

    /// Whether to shuffle each epoch (default `true`).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed every rank must share (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether to cut the tail that does not divide among the ranks rather
    /// than pad (default `false`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets the epoch, which picks the order when shuffling.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The epoch set last.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How many indices each rank gets per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.world_size
        } else {
            self.len.div_ceil(self.world_size)
        }
    }

    /// This rank's indices for the current epoch.
    pub fn indices(&self) -> Vec<usize> {
        let order = if self.shuffle {
            rng::permutation(self.len, rng::epoch_seed(self.seed, self.epoch))
        } else {
            (0..self.len).collect()
        };
        // Position p of the padded order is order[p % len]; with drop_last
        // no position reaches len. With len = 0 there are no samples.
        (0..self.num_samples())
            .map(|i| order[(self.rank + i * self.world_size) % self.len])
            .collect()
    }

    /// This rank's indices for the current epoch in batches of
    /// `batch_size`, the last one short (a data loader's batch sampler).
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `batch_size = 0`.
    pub fn batches(&self, batch_size: usize) -> Result<Vec<Vec<usize>>> {
        positive("batch_size", batch_size)?;
        Ok(self
            .indices()
            .chunks(batch_size)
            .map(<[usize]>::to_vec)
            .collect())
    }
}
