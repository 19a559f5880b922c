//! Datasets for training input: the part of Ray Data that Ray Train uses
//! (`prism-data`, re-exported as `prism_train::data`).
//!
//! Two kinds of dataset share one row format ([`Batch`], named typed
//! columns):
//!
//! - a [`LazyDataset`] (Ray Data's `Dataset`) is a plan: a source (Parquet
//!   or CSV files, a range, rows in memory) and transformations, run as a
//!   streaming pipeline of Prism tasks when it is read, with the memory in
//!   flight bounded; [`LazyDataset::streaming_split`] feeds several
//!   training workers from one pipeline while they train;
//! - a [`Dataset`] (Ray's `MaterializedDataset`) is rows held in memory as
//!   a list of columnar [`Batch`] blocks, which is what the rest of this
//!   page describes.
//!
//! [`Dataset::lazy`] turns the second into the first, and
//! [`LazyDataset::materialize`] the first into the second.
//! Build one from serializable items ([`Dataset::from_items`]),
//! from host arrays ([`Dataset::from_columns`]), from a CSV file
//! ([`Dataset::read_csv`]) or from a range ([`Dataset::range`]); transform
//! it on the cluster ([`Dataset::map_batches`]); shuffle it; split it into
//! one shard per training worker; and read each shard in batches, epoch
//! after epoch ([`DataIterator`]). Users who keep their own in-memory
//! dataset pick each rank's part with a [`DistributedSampler`].
//!
//! ```
//! use prism_data::{Column, Dataset};
//! use serde::Serialize;
//!
//! #[derive(Serialize)]
//! struct Example {
//!     pixels: Vec<f32>,
//!     label: i64,
//! }
//!
//! # fn main() -> Result<(), prism_data::DataError> {
//! let items = (0..10).map(|i| Example { pixels: vec![i as f32; 4], label: i % 2 });
//! let ds = Dataset::from_items(items)?;
//! assert_eq!(ds.count(), 10);
//! assert_eq!(ds.schema().to_string(), "pixels: tensor<f32>[4], label: i64");
//!
//! // One shard per worker, each with the same number of rows.
//! let shards = ds.random_shuffle(42).streaming_split(3, true)?;
//! assert!(shards.iter().all(|s| matches!(s.count(), Ok(Some(3)))));
//!
//! // A worker's training loop: host arrays, batch by batch, each epoch.
//! let shard = shards[0].clone().local_shuffle_seed(7);
//! for _epoch in 0..2 {
//!     for batch in shard.iter_batches(2, true)? {
//!         let batch = batch?;
//!         let x = batch.tensor("pixels")?; // [2, 4] floats
//!         let y = batch.i64("label")?;
//!         assert_eq!((x.shape(), y.len()), ([2, 4], 2));
//!     }
//! }
//!
//! // Columns straight from host arrays.
//! let ds = Dataset::from_columns([("x", Column::F64(vec![0.5, 1.5]))])?;
//! assert_eq!(ds.take_batch(1).f64("x")?, [0.5]);
//! # Ok(())
//! # }
//! ```
//!
//! # Blocks and batches
//!
//! Columns are typed ([`ColumnType`]): `f32`, `f64`, `i64`, `str`, and
//! fixed-width tensors (each row a vector of `f32`, such as an image's
//! pixels). [`Batch`] accessors hand out host slices and fail with
//! [`DataError::ColumnNotFound`] or [`DataError::ColumnType`] (which names
//! the column, the type it holds and the type asked for). Blocks are the
//! unit of storage; batches of any size may span them.
//!
//! # Running on the cluster
//!
//! Only [`Dataset::map_batches`] needs a cluster: it runs one Prism task per
//! batch, so call `prism::init` first. Everything else runs in the calling
//! process. Datasets, batches and [`DataIterator`]s serialize with serde,
//! so they travel as task arguments and to training workers.
//!
//! # Determinism
//!
//! Every shuffle takes a seed, and a seed names one order on every platform
//! and release (SplitMix64 and Fisher-Yates, no outside generator).
//! Per-epoch orders ([`DataIterator`], [`DistributedSampler`]) are derived
//! from the seed and the epoch number.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod actors;
mod batch;
mod binary;
mod block;
mod csv;
mod dataset;
mod error;
mod exec;
mod iter;
mod map;
mod pages;
mod parquet;
mod pipeline;
mod plan;
mod rng;
mod rows;
mod sampler;
mod schema;
mod shuffle;
mod split;
mod stats;
mod stream;
mod wire;

pub use actors::{BatchMapper, MapperError, PoolSize, POOL_IDLE};
pub use batch::{Batch, Column, TensorColumn};
pub use dataset::{Batches, Dataset};
pub use error::{DataError, ItemProblem, Result};
pub use iter::{AnyDataset, DataIterator};
pub use map::BatchFn;
pub use plan::{ExecutionOptions, LazyDataset};
pub use sampler::DistributedSampler;
pub use schema::{ColumnType, Field, Schema};
pub use stats::StageStats;
pub use stream::StreamBatches;
