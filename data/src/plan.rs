//! What a [`LazyDataset`] is made of: the type itself, its [`Source`], its
//! [`Step`]s and the [`ExecutionOptions`] it runs with. A leaf under the
//! modules that build plans (`pipeline`, which holds the methods of
//! [`LazyDataset`]), run them (`exec`) and split them (`split`, `iter`):
//! they all use it, and it uses none of them.

use super::binary::BinaryFiles;
use super::dataset::Dataset;
use super::map::BlockFn;
use super::parquet::Files;
use prism::ObjectRef;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How a pipeline may use the cluster while it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionOptions {
    /// The most bytes of finished blocks that the pipeline keeps ahead of
    /// its consumer (default 512 MiB; at least one block is always allowed).
    pub memory_budget_bytes: usize,
    /// The most block tasks running at once (default: twice the cluster's
    /// CPUs, at least 2).
    pub max_tasks_in_flight: Option<usize>,
    /// CPUs each block task asks for (default 1).
    pub num_cpus_per_task: f64,
}

impl Default for ExecutionOptions {
    fn default() -> Self {
        ExecutionOptions {
            memory_budget_bytes: 512 << 20,
            max_tasks_in_flight: None,
            num_cpus_per_task: 1.0,
        }
    }
}

/// Where a pipeline's rows come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Source {
    /// Blocks in the driver's memory.
    Memory(Dataset),
    /// Blocks already in the object store, encoded, with their row counts.
    Stored(Vec<(ObjectRef<Vec<u8>>, usize)>),
    /// Row groups of Parquet files.
    Parquet(Files),
    /// CSV files, one block each.
    Csv(Vec<PathBuf>),
    /// Whole files, a row each.
    Binary(BinaryFiles),
    /// `0..n` in an `id` column.
    Range(usize),
}

/// One step of a plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Step {
    Apply(BlockFn),
    Actors(super::actors::ActorStep),
    Limit(usize),
    Shuffle(u64),
    Repartition(usize),
}

/// A dataset whose rows are computed when it is read: a source, then
/// transformations, run as a streaming pipeline of Prism tasks (Ray Data's
/// `Dataset`).
///
/// Building one reads only what it must to check the input (a Parquet
/// file's footer, never its rows); transformations return a new plan and
/// run nothing. Reading it ([`LazyDataset::iter_batches`],
/// [`LazyDataset::streaming_split`], [`LazyDataset::materialize`],
/// [`LazyDataset::count`], [`LazyDataset::write_parquet`]) runs the plan,
/// once per read.
///
/// ```no_run
/// use prism_data::{Batch, Column, DataError, LazyDataset};
///
/// fn scale(batch: Batch) -> Result<Batch, DataError> {
///     let x = batch.tensor("image")?;
///     let (scaled, row_len) = (x.values.iter().map(|v| v / 255.0).collect(), x.row_len);
///     batch.with_column("image", Column::tensor(scaled, row_len)?)
/// }
///
/// prism::init(prism::Config::default()).expect("a local cluster");
/// let ds = LazyDataset::read_parquet(["data/fashion-mnist/parquet"])?
///     .map_batches(scale, 1024)?;
/// for batch in ds.iter_batches(128, false)? {
///     let batch = batch?;
///     assert!(batch.num_rows() <= 128);
/// }
/// # Ok::<(), DataError>(())
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LazyDataset {
    pub(crate) source: Source,
    pub(crate) steps: Vec<Step>,
    pub(crate) options: ExecutionOptions,
}

impl LazyDataset {
    pub(crate) fn source_name(&self) -> &'static str {
        match &self.source {
            Source::Memory(_) | Source::Stored(_) => "FromBlocks",
            Source::Parquet(_) => "ReadParquet",
            Source::Csv(_) => "ReadCsv",
            Source::Binary(_) => "ReadBinary",
            Source::Range(_) => "Range",
        }
    }
}
