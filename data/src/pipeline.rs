//! [`LazyDataset`]: a dataset described by its source and transformations,
//! run as a streaming pipeline when it is read.
//!
//! # How a pipeline runs
//!
//! The plan is cut into *steps*. Per-block transformations that follow one
//! another (`map_batches`, `map`, `filter`) are fused with the read before
//! them into one task per block, as Ray Data fuses operators: a block is
//! read, transformed and encoded in one worker, and only the result goes
//! through the object store. `limit` truncates the stream; `random_shuffle`
//! and `repartition` are barriers that need every row before they can
//! yield one.
//!
//! A fused step keeps a bounded window of block tasks in flight and yields
//! their outputs in input order: the window is the smaller of the task
//! bound ([`ExecutionOptions::max_tasks_in_flight`]) and the memory budget
//! ([`ExecutionOptions::memory_budget_bytes`]) divided by the largest block
//! seen so far. A consumer that stops reading stops the pipeline: no new
//! task starts, and blocks it held are freed when their references drop.

use super::batch::{Batch, Schema};
use super::dataset::Dataset;
use super::error::{positive, DataError, Result};
use super::map::{Outcome, Trampoline};
use super::parquet::{self, Files, RowGroup};
use super::wire::{self, Decoded};
use super::{csv, rng};
use prism::portable::PortableFn;
use prism::{ObjectRef, TaskOptions, View};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The size a block is assumed to have before the first one is seen.
const ASSUMED_BLOCK_BYTES: usize = 64 << 20;

/// Rows per block of [`LazyDataset::range`].
const RANGE_BLOCK_ROWS: usize = 8192;

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
enum Source {
    /// Blocks in the driver's memory.
    Memory(Dataset),
    /// Blocks already in the object store, encoded, with their row counts.
    Stored(Vec<(ObjectRef<Vec<u8>>, usize)>),
    /// Row groups of Parquet files.
    Parquet(Files),
    /// CSV files, one block each.
    Csv(Vec<PathBuf>),
    /// `0..n` in an `id` column.
    Range(usize),
}

/// A function applied to each block inside its task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockFn {
    /// `MapBatches`, `Map`, `Filter`.
    pub(crate) name: String,
    pub(crate) run: PortableFn<Trampoline>,
    /// The user's function, as its JSON token.
    pub(crate) user: String,
    /// Rows per call; `None` calls it once per block.
    pub(crate) batch_size: Option<usize>,
    /// Whether the stage keeps the row count (`map_batches` may not).
    pub(crate) keeps_rows: bool,
}

/// One step of a plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Step {
    Apply(BlockFn),
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
    source: Source,
    steps: Vec<Step>,
    options: ExecutionOptions,
}

impl From<Dataset> for LazyDataset {
    fn from(dataset: Dataset) -> Self {
        LazyDataset::new(Source::Memory(dataset))
    }
}

impl Dataset {
    /// This dataset as the source of a lazy, streaming pipeline.
    pub fn lazy(&self) -> LazyDataset {
        LazyDataset::from(self.clone())
    }
}

/// The files a list of paths names: each file as given, each directory's
/// files whose names end in `extension`, sorted.
fn expand(paths: Vec<PathBuf>, extension: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path).map_err(|source| DataError::Io {
                path: path.clone(),
                source,
            })?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.to_string_lossy().ends_with(extension))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

impl LazyDataset {
    fn new(source: Source) -> LazyDataset {
        LazyDataset {
            source,
            steps: Vec::new(),
            options: ExecutionOptions::default(),
        }
    }

    fn with_step(&self, step: Step) -> LazyDataset {
        let mut next = self.clone();
        next.steps.push(step);
        next
    }

    /// Reads Parquet files (Ray's `read_parquet`): each path a file, or a
    /// directory whose `*.parquet` files are read in name order. Each row
    /// group becomes a block, read by a task.
    ///
    /// The footers are read now: every file must exist, be Parquet, and
    /// have the same columns. See [`LazyDataset::read_parquet_columns`] to
    /// read only some columns.
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] for a file that cannot be opened,
    /// [`DataError::Parquet`] for one that is not Parquet (a corrupt footer)
    /// or has a column of a type with no column type here,
    /// [`DataError::FileSchema`] naming the first file whose columns differ.
    pub fn read_parquet<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<LazyDataset> {
        LazyDataset::read_parquet_inner(paths, None)
    }

    /// [`LazyDataset::read_parquet`] of the named columns only, in that
    /// order (column projection: other columns are never decoded).
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::read_parquet`], and [`DataError::MissingColumn`]
    /// naming the file and the column it lacks.
    pub fn read_parquet_columns<P: AsRef<Path>, C: AsRef<str>>(
        paths: impl IntoIterator<Item = P>,
        columns: impl IntoIterator<Item = C>,
    ) -> Result<LazyDataset> {
        let columns: Vec<String> = columns
            .into_iter()
            .map(|c| c.as_ref().to_string())
            .collect();
        LazyDataset::read_parquet_inner(paths, Some(columns))
    }

    fn read_parquet_inner<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
        columns: Option<Vec<String>>,
    ) -> Result<LazyDataset> {
        let paths = expand(
            paths
                .into_iter()
                .map(|p| p.as_ref().to_path_buf())
                .collect(),
            ".parquet",
        )?;
        let files = parquet::scan(&paths, columns.as_deref())?;
        Ok(LazyDataset::new(Source::Parquet(files)))
    }

    /// Reads CSV files, one block per file, each read by a task as
    /// [`Dataset::read_csv`] reads one (a directory's `*.csv` files are read
    /// in name order). The files are opened only when the pipeline runs.
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] for a directory that cannot be listed.
    pub fn read_csv<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<LazyDataset> {
        let paths = expand(
            paths
                .into_iter()
                .map(|p| p.as_ref().to_path_buf())
                .collect(),
            ".csv",
        )?;
        Ok(LazyDataset::new(Source::Csv(paths)))
    }

    /// `0..n` in an `i64` column named `id`, made by tasks in blocks of
    /// 8,192 rows.
    pub fn range(n: usize) -> LazyDataset {
        LazyDataset::new(Source::Range(n))
    }

    /// The same plan, run with other [`ExecutionOptions`].
    pub fn with_options(mut self, options: ExecutionOptions) -> LazyDataset {
        self.options = options;
        self
    }

    /// The options the plan runs with.
    pub fn options(&self) -> &ExecutionOptions {
        &self.options
    }

    /// Applies `f` to batches of up to `batch_size` rows of each block, in
    /// the block's task (the batches do not span blocks). As with
    /// [`Dataset::map_batches`], `f` is a `fn` item that runs in worker
    /// processes, and may change rows and columns.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `batch_size = 0`. The function's
    /// own errors come when the pipeline runs, as [`DataError::Stage`].
    pub fn map_batches<E: std::fmt::Display + 'static>(
        &self,
        f: super::BatchFn<E>,
        batch_size: usize,
    ) -> Result<LazyDataset> {
        positive("batch_size", batch_size)?;
        Ok(self.with_step(Step::Apply(super::map::batch_stage(f, Some(batch_size)))))
    }

    /// Applies `f` to each row, given as a `T` (deserialized from the row
    /// as [`Dataset::take`] does) and returning the row as a `U`
    /// (serialized as [`Dataset::from_items`] does).
    pub fn map<T, U>(&self, f: fn(T) -> U) -> LazyDataset
    where
        T: serde::de::DeserializeOwned + 'static,
        U: Serialize + 'static,
    {
        self.with_step(Step::Apply(super::map::row_map_stage(f)))
    }

    /// Keeps the rows for which `f` is true (each row given as a `T`, as to
    /// [`LazyDataset::map`]).
    pub fn filter<T: serde::de::DeserializeOwned + 'static>(
        &self,
        f: fn(T) -> bool,
    ) -> LazyDataset {
        self.with_step(Step::Apply(super::map::filter_stage(f)))
    }

    /// The first `n` rows. Tasks past them are not started.
    pub fn limit(&self, n: usize) -> LazyDataset {
        self.with_step(Step::Limit(n))
    }

    /// Every row in a random order fixed by `seed` (a global shuffle: it
    /// waits for every row before yielding one). Blocks keep their sizes.
    pub fn random_shuffle(&self, seed: u64) -> LazyDataset {
        self.with_step(Step::Shuffle(seed))
    }

    /// The rows in `num_blocks` blocks of nearly equal size (a barrier, as
    /// [`LazyDataset::random_shuffle`]).
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `num_blocks = 0`.
    pub fn repartition(&self, num_blocks: usize) -> Result<LazyDataset> {
        positive("num_blocks", num_blocks)?;
        Ok(self.with_step(Step::Repartition(num_blocks)))
    }

    /// The plan's stages, as they are named in errors and stats: the
    /// source, then each step.
    pub fn stage_names(&self) -> Vec<String> {
        let mut names = vec![self.source_name().to_string()];
        names.extend(self.steps.iter().map(|s| match s {
            Step::Apply(f) => f.name.clone(),
            Step::Limit(n) => format!("Limit({n})"),
            Step::Shuffle(_) => "RandomShuffle".to_string(),
            Step::Repartition(n) => format!("Repartition({n})"),
        }));
        names
    }

    fn source_name(&self) -> &'static str {
        match &self.source {
            Source::Memory(_) | Source::Stored(_) => "FromBlocks",
            Source::Parquet(_) => "ReadParquet",
            Source::Csv(_) => "ReadCsv",
            Source::Range(_) => "Range",
        }
    }

    /// The number of rows the plan yields without running it, when the
    /// source knows it and no step changes it.
    fn known_count(&self) -> Option<usize> {
        let mut n = match &self.source {
            Source::Memory(d) => d.count(),
            Source::Stored(blocks) => blocks.iter().map(|b| b.1).sum(),
            Source::Parquet(files) => files.row_groups.iter().map(|g| g.rows).sum(),
            Source::Csv(_) => return None,
            Source::Range(n) => *n,
        };
        for step in &self.steps {
            match step {
                Step::Apply(f) if !f.keeps_rows => return None,
                Step::Limit(l) => n = n.min(*l),
                _ => {}
            }
        }
        Some(n)
    }

    /// The number of rows. Known from the source when it can be (a Parquet
    /// footer, a range) and no step changes the row count; otherwise the
    /// pipeline runs, and only block headers are read.
    ///
    /// # Errors
    ///
    /// Whatever running the pipeline reports ([`DataError::Stage`], ...).
    pub fn count(&self) -> Result<usize> {
        if let Some(n) = self.known_count() {
            return Ok(n);
        }
        let mut total = 0;
        for block in self.stream()? {
            total += block?.rows;
        }
        Ok(total)
    }

    /// The columns the plan yields. Known from the source when no step
    /// changes the columns; otherwise the first block is computed.
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::count`].
    pub fn schema(&self) -> Result<Schema> {
        match self.schema_if_known() {
            Some(s) => Ok(s),
            None => Ok(self.limit(1).materialize()?.schema()),
        }
    }

    /// The schema, when the source knows it and no step changes columns.
    pub(crate) fn schema_if_known(&self) -> Option<Schema> {
        if self.steps.iter().any(|s| matches!(s, Step::Apply(_))) {
            return None;
        }
        match &self.source {
            Source::Memory(d) => Some(d.schema()),
            Source::Parquet(f) if !has_unknown_lengths(&f.schema) => Some(f.schema.clone()),
            Source::Range(_) => Some(Dataset::range(0).schema()),
            _ => None,
        }
    }

    /// Runs the plan and keeps every row in memory.
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::count`]; [`DataError::SchemaMismatch`] if blocks
    /// differ in their columns.
    pub fn materialize(&self) -> Result<Dataset> {
        let mut blocks = Vec::new();
        for block in self.stream()? {
            blocks.push(block?.fetch()?);
        }
        Dataset::from_batches(blocks)
    }

    /// Up to `n` rows from the start, as one batch; only the blocks needed
    /// are computed.
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::count`].
    pub fn take_batch(&self, n: usize) -> Result<Batch> {
        Ok(self.limit(n).materialize()?.take_batch(n))
    }

    /// Up to `n` rows from the start, each turned into a `T`.
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::count`], and [`DataError::RowDecode`].
    pub fn take<T: serde::de::DeserializeOwned>(&self, n: usize) -> Result<Vec<T>> {
        self.limit(n).materialize()?.take(n)
    }

    /// One pass over the rows in batches of `batch_size` (batches span
    /// blocks; the last is short unless `drop_last`). The pipeline runs as
    /// the batches are read.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for `batch_size = 0`,
    /// [`DataError::NotInitialized`] without a cluster. Errors of the run
    /// come as `Err` items.
    pub fn iter_batches(&self, batch_size: usize, drop_last: bool) -> Result<StreamBatches> {
        positive("batch_size", batch_size)?;
        Ok(StreamBatches::new(self.stream()?, batch_size, drop_last))
    }

    /// Writes the rows as Parquet files into `dir` (made if missing), one
    /// file per block, named `part-00000.parquet` and on; returns their
    /// paths. Tensor columns are written as fixed-size lists of `float`.
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::count`], and [`DataError::Io`] or
    /// [`DataError::Parquet`] for a file that cannot be written.
    pub fn write_parquet(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| DataError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut written = Vec::new();
        for (i, block) in self.stream()?.enumerate() {
            let batch = block?.fetch()?;
            let path = dir.join(format!("part-{i:05}.parquet"));
            parquet::write(&path, &batch)?;
            written.push(path);
        }
        Ok(written)
    }

    /// Runs the plan: its blocks, in order.
    pub(crate) fn stream(&self) -> Result<BlockStream> {
        if !prism::is_initialized() {
            return Err(DataError::NotInitialized);
        }
        BlockStream::new(self)
    }
}

fn has_unknown_lengths(schema: &Schema) -> bool {
    schema
        .fields
        .iter()
        .any(|f| matches!(f.data_type, super::ColumnType::Tensor { row_len: 0 }))
}

/// What a block task reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Piece {
    RowGroup {
        group: RowGroup,
        columns: Option<Vec<String>>,
    },
    Csv(PathBuf),
    Range {
        start: usize,
        end: usize,
    },
}

impl Piece {
    fn read(&self) -> Result<Batch> {
        match self {
            Piece::RowGroup { group, columns } => parquet::read(group, columns.as_deref()),
            Piece::Csv(path) => csv::read(path),
            Piece::Range { start, end } => {
                let ids = super::Column::I64((*start as i64..*end as i64).collect());
                Batch::new(vec![("id".to_string(), ids)])
            }
        }
    }
}

/// Runs `stages` over `batch`, as a block task's body.
fn apply(stages: &[BlockFn], mut batch: Batch) -> Vec<u8> {
    for stage in stages {
        let step = batch.num_rows().max(1);
        let size = stage.batch_size.unwrap_or(step).max(1);
        // SAFETY: the token was made by PortableFn::new in the stage's
        // constructor, in this executable (checked by resolve).
        let run = match unsafe { stage.run.resolve() } {
            Ok(run) => run,
            Err(e) => return outcome_bytes(&stage.name, e.into()),
        };
        let mut outputs = Vec::with_capacity(batch.num_rows().div_ceil(size));
        let mut start = 0;
        loop {
            let end = (start + size).min(batch.num_rows());
            let part = if start == 0 && end == batch.num_rows() {
                std::mem::take(&mut batch)
            } else {
                batch.slice(start..end)
            };
            match run(stage.user.clone(), part) {
                Outcome::Done(out) => outputs.push(out),
                other => return outcome_bytes(&stage.name, other),
            }
            start = end;
            if start >= batch.num_rows() {
                break;
            }
        }
        batch = match Batch::concat(&outputs) {
            Ok(b) => b,
            Err(e) => return wire::encode_failed(&stage.name, &e.to_string()),
        };
    }
    wire::encode(&batch)
}

fn outcome_bytes(stage: &str, outcome: Outcome) -> Vec<u8> {
    match outcome {
        Outcome::Done(batch) => wire::encode(&batch),
        Outcome::Failed(message) => wire::encode_failed(stage, &message),
        Outcome::NotPortable { sent, here } => wire::encode_not_portable(stage, &sent, &here),
    }
}

/// A block task that reads its input.
#[prism::remote]
fn read_block(piece: Piece, stages: Vec<BlockFn>) -> Vec<u8> {
    match piece.read() {
        Ok(batch) => apply(&stages, batch),
        Err(e) => wire::encode_failed("read", &e.to_string()),
    }
}

/// A block task over a block already in the store (read in place).
#[prism::remote]
fn map_block(block: View<u8>, stages: Vec<BlockFn>) -> Vec<u8> {
    match wire::decode(&block) {
        Ok(Decoded::Block(batch)) => apply(&stages, batch),
        Ok(_) => wire::encode_failed("input", "the input block is a failure record"),
        Err(e) => wire::encode_failed("input", &e.to_string()),
    }
}

/// One block of a running pipeline: an encoded batch in the object store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Block {
    pub(crate) data: ObjectRef<Vec<u8>>,
    /// The rows of the encoded batch that belong to this block:
    /// `start..start + rows` (a split may hand out part of one).
    pub(crate) start: usize,
    pub(crate) rows: usize,
    pub(crate) bytes: usize,
}

impl Block {
    fn put(batch: &Batch) -> Result<Block> {
        let bytes = wire::encode(batch);
        let len = bytes.len();
        let data = prism::put(bytes).map_err(|e| DataError::Stage {
            stage: "put".into(),
            block: 0,
            message: e.to_string(),
        })?;
        Ok(Block {
            data,
            start: 0,
            rows: batch.num_rows(),
            bytes: len,
        })
    }

    /// The rows, copied out of the store.
    pub(crate) fn fetch(&self) -> Result<Batch> {
        fetch_rows(&self.data, self.start..self.start + self.rows)
    }
}

/// Rows `rows` of an encoded block.
pub(crate) fn fetch_rows(data: &ObjectRef<Vec<u8>>, rows: std::ops::Range<usize>) -> Result<Batch> {
    let view = prism::get_view(data).map_err(|e| DataError::Stage {
        stage: "fetch".into(),
        block: 0,
        message: e.to_string(),
    })?;
    match wire::decode(&view)? {
        Decoded::Block(batch) if rows.start == 0 && rows.end == batch.num_rows() => Ok(batch),
        Decoded::Block(batch) => Ok(batch.slice(rows.start..rows.end.min(batch.num_rows()))),
        other => Err(failure(other, 0)),
    }
}

fn failure(decoded: Decoded, block: usize) -> DataError {
    match decoded {
        Decoded::Failed { stage, message } => DataError::Stage {
            stage,
            block,
            message,
        },
        Decoded::NotPortable { stage, sent, here } => DataError::Stage {
            stage,
            block,
            message: format!(
                "the function cannot run in the worker: it was sent by {sent}, and the worker runs {here}; workers must run the driver's executable"
            ),
        },
        Decoded::Block(_) => DataError::Corrupt {
            what: "a block where a failure was expected".into(),
        },
    }
}

/// What each step did in one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageStats {
    /// The step's name (fused steps joined with `->`).
    pub name: String,
    /// Blocks it yielded.
    pub blocks: usize,
    /// Rows it yielded.
    pub rows: usize,
    /// Bytes of the encoded blocks it yielded.
    pub bytes: usize,
    /// Time from its first task to its last block.
    pub wall: Duration,
    /// Time its consumer spent waiting for its blocks.
    pub waited: Duration,
    /// The most tasks it had running at once (bounded by the task limit and
    /// by the memory budget over the largest block).
    pub peak_tasks: usize,
}

/// A source of blocks: the plan's source, or the step before.
type Upstream = Box<dyn Iterator<Item = Result<Input>> + Send>;

/// What a step consumes.
enum Input {
    Piece(Piece),
    Block(Block),
}

/// The blocks of a running plan, in order.
pub(crate) struct BlockStream {
    inner: Box<dyn Iterator<Item = Result<Block>> + Send>,
    stats: Arc<Mutex<Vec<StageStats>>>,
}

impl std::fmt::Debug for BlockStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockStream").finish_non_exhaustive()
    }
}

impl Iterator for BlockStream {
    type Item = Result<Block>;

    fn next(&mut self) -> Option<Result<Block>> {
        self.inner.next()
    }
}

impl BlockStream {
    fn new(plan: &LazyDataset) -> Result<BlockStream> {
        let stats = Arc::new(Mutex::new(Vec::new()));
        let mut upstream: Upstream = source_inputs(&plan.source)?;
        let mut pending: Vec<BlockFn> = Vec::new();
        let mut pending_name = plan.source_name().to_string();
        let tasks = max_tasks(&plan.options);
        let fuse = |up: Upstream, fns: Vec<BlockFn>, name: String| -> Upstream {
            let run = Fused::new(up, fns, name, &plan.options, tasks, stats.clone());
            Box::new(run.map(|b| b.map(Input::Block)))
        };
        for step in &plan.steps {
            match step {
                Step::Apply(f) => {
                    pending_name = format!("{pending_name}->{}", f.name);
                    pending.push(f.clone());
                }
                barrier => {
                    upstream = fuse(upstream, std::mem::take(&mut pending), pending_name);
                    pending_name = String::new();
                    upstream = match barrier {
                        Step::Limit(n) => Box::new(Limit { upstream, left: *n }),
                        Step::Shuffle(seed) => all_to_all(upstream, Regroup::Shuffle(*seed)),
                        Step::Repartition(n) => all_to_all(upstream, Regroup::Blocks(*n)),
                        Step::Apply(_) => unreachable!("handled above"),
                    };
                }
            }
        }
        let last = fuse(upstream, pending, pending_name);
        Ok(BlockStream {
            inner: Box::new(last.map(|i| match i {
                Ok(Input::Block(b)) => Ok(b),
                Ok(Input::Piece(_)) => unreachable!("every piece is read by a fused step"),
                Err(e) => Err(e),
            })),
            stats,
        })
    }

    /// What each step has done so far.
    pub(crate) fn stats(&self) -> Vec<StageStats> {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn max_tasks(options: &ExecutionOptions) -> usize {
    options
        .max_tasks_in_flight
        .unwrap_or_else(|| {
            let cpus = prism::cluster_resources()
                .ok()
                .map(|(total, _)| total.get("CPU").as_f64())
                .unwrap_or(2.0);
            ((cpus * 2.0) as usize).max(2)
        })
        .max(1)
}

fn source_inputs(source: &Source) -> Result<Upstream> {
    Ok(match source {
        Source::Memory(d) => {
            let blocks = d.blocks().to_vec();
            Box::new(blocks.into_iter().map(|b| Block::put(&b).map(Input::Block)))
        }
        Source::Stored(blocks) => {
            let blocks: Vec<Input> = blocks
                .iter()
                .map(|(data, rows)| {
                    Input::Block(Block {
                        data: data.clone(),
                        start: 0,
                        rows: *rows,
                        bytes: 0,
                    })
                })
                .collect();
            Box::new(blocks.into_iter().map(Ok))
        }
        Source::Parquet(files) => {
            let columns = files.columns.clone();
            let pieces: Vec<Input> = files
                .row_groups
                .iter()
                .map(|g| {
                    Input::Piece(Piece::RowGroup {
                        group: g.clone(),
                        columns: columns.clone(),
                    })
                })
                .collect();
            Box::new(pieces.into_iter().map(Ok))
        }
        Source::Csv(paths) => {
            let pieces: Vec<Input> = paths
                .iter()
                .map(|p| Input::Piece(Piece::Csv(p.clone())))
                .collect();
            Box::new(pieces.into_iter().map(Ok))
        }
        Source::Range(n) => {
            let n = *n;
            Box::new((0..n.div_ceil(RANGE_BLOCK_ROWS)).map(move |i| {
                let start = i * RANGE_BLOCK_ROWS;
                Ok(Input::Piece(Piece::Range {
                    start,
                    end: (start + RANGE_BLOCK_ROWS).min(n),
                }))
            }))
        }
    })
}

/// Reads and transforms blocks with a bounded window of tasks, yielding
/// their outputs in input order.
struct Fused {
    upstream: Upstream,
    upstream_done: bool,
    fns: Vec<BlockFn>,
    name: String,
    task: TaskOptions,
    in_flight: VecDeque<(usize, ObjectRef<Vec<u8>>)>,
    next_index: usize,
    max_tasks: usize,
    budget: usize,
    largest_block: usize,
    started: Option<Instant>,
    stats: Arc<Mutex<Vec<StageStats>>>,
    slot: usize,
}

impl Fused {
    fn new(
        upstream: Upstream,
        fns: Vec<BlockFn>,
        name: String,
        options: &ExecutionOptions,
        max_tasks: usize,
        stats: Arc<Mutex<Vec<StageStats>>>,
    ) -> Fused {
        let slot = {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.push(StageStats {
                name: name.clone(),
                ..StageStats::default()
            });
            s.len() - 1
        };
        Fused {
            upstream,
            upstream_done: false,
            fns,
            name,
            task: TaskOptions::new().num_cpus(options.num_cpus_per_task),
            in_flight: VecDeque::new(),
            next_index: 0,
            max_tasks,
            budget: options.memory_budget_bytes,
            largest_block: 0,
            started: None,
            stats,
            slot,
        }
    }

    fn window(&self) -> usize {
        // Until a block has been seen, blocks are assumed to be of 64 MiB.
        let block = if self.largest_block == 0 {
            ASSUMED_BLOCK_BYTES
        } else {
            self.largest_block
        };
        (self.budget / block).clamp(1, self.max_tasks)
    }

    fn stage_error(&self, block: usize, message: String) -> DataError {
        DataError::Stage {
            stage: self.name.clone(),
            block,
            message,
        }
    }

    /// Starts tasks until the window is full. A block that needs no task
    /// (no functions to apply to a stored block) is returned at once.
    fn fill(&mut self) -> Option<Result<Block>> {
        while !self.upstream_done && self.in_flight.len() < self.window() {
            let input = match self.upstream.next() {
                None => {
                    self.upstream_done = true;
                    break;
                }
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(input)) => input,
            };
            let index = self.next_index;
            self.next_index += 1;
            self.started.get_or_insert_with(Instant::now);
            let submitted = match input {
                Input::Block(block) if self.fns.is_empty() && self.in_flight.is_empty() => {
                    return Some(Ok(block));
                }
                Input::Block(block) => {
                    map_block::remote_with(self.task.clone(), &block.data, self.fns.clone())
                }
                Input::Piece(piece) => {
                    read_block::remote_with(self.task.clone(), piece, self.fns.clone())
                }
            };
            match submitted {
                Ok(r) => {
                    self.in_flight.push_back((index, r));
                    let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(st) = s.get_mut(self.slot) {
                        st.peak_tasks = st.peak_tasks.max(self.in_flight.len());
                    }
                }
                Err(e) => return Some(Err(self.stage_error(index, e.to_string()))),
            }
        }
        None
    }

    fn record(&self, block: &Block, waited: Duration) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = s.get_mut(self.slot) {
            st.blocks += 1;
            st.rows += block.rows;
            st.bytes += block.bytes;
            st.waited += waited;
            st.wall = self.started.map(|t| t.elapsed()).unwrap_or_default();
        }
    }
}

impl Iterator for Fused {
    type Item = Result<Block>;

    fn next(&mut self) -> Option<Result<Block>> {
        if let Some(ready) = self.fill() {
            if let Ok(b) = &ready {
                self.record(b, Duration::ZERO);
            }
            return Some(ready);
        }
        let (index, data) = self.in_flight.pop_front()?;
        let waiting = Instant::now();
        let header = prism::get_view(&data)
            .map_err(|e| self.stage_error(index, e.to_string()))
            .and_then(|view| {
                let rows = wire::rows(&view)?;
                match rows {
                    Some(rows) => Ok((rows, view.len())),
                    None => Err(failure(wire::decode(&view)?, index)),
                }
            });
        let waited = waiting.elapsed();
        let (rows, bytes) = match header {
            Ok(h) => h,
            Err(e) => {
                self.in_flight.clear();
                self.upstream_done = true;
                return Some(Err(e));
            }
        };
        self.largest_block = self.largest_block.max(bytes);
        let block = Block {
            data,
            start: 0,
            rows,
            bytes,
        };
        self.record(&block, waited);
        if let Some(Err(e)) = self.fill() {
            return Some(Err(e));
        }
        Some(Ok(block))
    }
}

/// The first `left` rows of the stream.
struct Limit {
    upstream: Upstream,
    left: usize,
}

impl Iterator for Limit {
    type Item = Result<Input>;

    fn next(&mut self) -> Option<Result<Input>> {
        if self.left == 0 {
            return None;
        }
        let block = match self.upstream.next()? {
            Ok(Input::Block(b)) => b,
            Ok(Input::Piece(_)) => unreachable!("a fused step comes before every limit"),
            Err(e) => return Some(Err(e)),
        };
        if block.rows <= self.left {
            self.left -= block.rows;
            return Some(Ok(Input::Block(block)));
        }
        let keep = std::mem::take(&mut self.left);
        let rows = block.start..block.start + keep;
        Some(
            fetch_rows(&block.data, rows)
                .and_then(|b| Block::put(&b))
                .map(Input::Block),
        )
    }
}

enum Regroup {
    Shuffle(u64),
    Blocks(usize),
}

/// A barrier: every block of the stream, fetched, regrouped and put back.
fn all_to_all(upstream: Upstream, how: Regroup) -> Upstream {
    let mut pending = Some(upstream);
    let mut out: VecDeque<Result<Input>> = VecDeque::new();
    Box::new(std::iter::from_fn(move || {
        if let Some(up) = pending.take() {
            match regroup(up, &how) {
                Ok(blocks) => out.extend(blocks.into_iter().map(|b| Ok(Input::Block(b)))),
                Err(e) => out.push_back(Err(e)),
            }
        }
        out.pop_front()
    }))
}

fn regroup(upstream: Upstream, how: &Regroup) -> Result<Vec<Block>> {
    let mut batches = Vec::new();
    for input in upstream {
        match input? {
            Input::Block(b) => batches.push(b.fetch()?),
            Input::Piece(_) => unreachable!("a fused step comes before every barrier"),
        }
    }
    let sizes: Vec<usize> = batches.iter().map(Batch::num_rows).collect();
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    let all = Batch::concat(&batches)?;
    drop(batches);
    let (all, sizes) = match how {
        Regroup::Shuffle(seed) => (all.gather(&rng::permutation(all.num_rows(), *seed)), sizes),
        Regroup::Blocks(n) => {
            let (base, extra) = (all.num_rows() / n, all.num_rows() % n);
            (
                all,
                (0..*n).map(|i| base + usize::from(i < extra)).collect(),
            )
        }
    };
    let mut start = 0;
    sizes
        .into_iter()
        .map(|len| {
            let block = Block::put(&all.slice(start..start + len));
            start += len;
            block
        })
        .collect()
}

/// Batches of a running pipeline: what [`LazyDataset::iter_batches`]
/// returns. Each item is a batch, or the error that ended the run.
pub struct StreamBatches {
    batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    stats: Option<Arc<Mutex<Vec<StageStats>>>>,
    /// Decoded blocks not yet fully yielded, and the row reached in the
    /// first.
    queue: VecDeque<Batch>,
    offset: usize,
    queued_rows: usize,
    batch_size: usize,
    drop_last: bool,
    done: bool,
    shuffle: Option<(usize, rng::SplitMix64)>,
}

impl std::fmt::Debug for StreamBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBatches")
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .field("queued_rows", &self.queued_rows)
            .finish_non_exhaustive()
    }
}

impl StreamBatches {
    fn new(stream: BlockStream, batch_size: usize, drop_last: bool) -> StreamBatches {
        let stats = Some(stream.stats.clone());
        let batches = Box::new(stream.map(|b| b.and_then(|b| b.fetch())));
        StreamBatches::from_batches(batches, stats, batch_size, drop_last)
    }

    /// Batches of `batch_size` rows cut from the incoming ones, which may
    /// have any size.
    pub(crate) fn from_batches(
        batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
        stats: Option<Arc<Mutex<Vec<StageStats>>>>,
        batch_size: usize,
        drop_last: bool,
    ) -> StreamBatches {
        StreamBatches {
            batches,
            stats,
            queue: VecDeque::new(),
            offset: 0,
            queued_rows: 0,
            batch_size,
            drop_last,
            done: false,
            shuffle: None,
        }
    }

    /// Shuffles rows locally: batches are drawn at random from a buffer of
    /// at least `buffer_rows` rows as the stream fills it (Ray's
    /// `local_shuffle_buffer_size`), in an order fixed by `seed`.
    pub fn local_shuffle(mut self, buffer_rows: usize, seed: u64) -> StreamBatches {
        self.shuffle = Some((buffer_rows.max(1), rng::SplitMix64::new(seed)));
        self
    }

    /// What each stage of the pipeline has done so far (all of it, once
    /// the iterator is exhausted): blocks, rows, bytes and time per stage.
    pub fn stats(&self) -> Vec<StageStats> {
        self.stats
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.clone()))
            .unwrap_or_default()
    }

    fn want(&self) -> usize {
        match &self.shuffle {
            Some((buffer, _)) => buffer + self.batch_size,
            None => self.batch_size,
        }
    }

    /// Pulls blocks until enough rows are queued or the stream ends.
    fn top_up(&mut self) -> Result<()> {
        while !self.done && self.queued_rows < self.want() {
            match self.batches.next() {
                None => self.done = true,
                Some(batch) => {
                    let batch = match batch {
                        Ok(b) => b,
                        Err(e) => {
                            self.done = true;
                            return Err(e);
                        }
                    };
                    self.queued_rows += batch.num_rows();
                    if batch.num_rows() > 0 {
                        self.queue.push_back(batch);
                    }
                }
            }
        }
        Ok(())
    }

    /// The next `n` queued rows, in order.
    fn take_rows(&mut self, n: usize) -> Result<Batch> {
        let first = self.queue.front().expect("rows are queued");
        if first.num_rows() - self.offset >= n {
            let out = first.slice(self.offset..self.offset + n);
            self.advance(n);
            return Ok(out);
        }
        let mut out = first.empty_like();
        let mut need = n;
        while need > 0 {
            let Some(block) = self.queue.front() else {
                break;
            };
            let take = (block.num_rows() - self.offset).min(need);
            out.try_extend_from(block, self.offset..self.offset + take)?;
            need -= take;
            self.advance(take);
        }
        Ok(out)
    }

    fn advance(&mut self, n: usize) {
        self.offset += n;
        self.queued_rows -= n;
        if let Some(front) = self.queue.front() {
            if self.offset >= front.num_rows() {
                self.queue.pop_front();
                self.offset = 0;
            }
        }
    }

    fn next_batch(&mut self) -> Result<Option<Batch>> {
        self.top_up()?;
        let n = self.batch_size.min(self.queued_rows);
        if n == 0 || (n < self.batch_size && self.drop_last) {
            return Ok(None);
        }
        if self.shuffle.is_none() {
            return self.take_rows(n).map(Some);
        }
        // Draw n random rows from everything queued.
        let all = self.take_rows(self.queued_rows)?;
        let Some((_, rng)) = self.shuffle.as_mut() else {
            return Ok(None);
        };
        let order = rng::permutation(all.num_rows(), rng.next_u64());
        let out = all.gather(&order[..n]);
        let rest = all.gather(&order[n..]);
        self.queued_rows = rest.num_rows();
        self.offset = 0;
        if rest.num_rows() > 0 {
            self.queue.push_back(rest);
        }
        Ok(Some(out))
    }
}

impl Iterator for StreamBatches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        match self.next_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                self.queue.clear();
                self.queued_rows = 0;
                Some(Err(e))
            }
        }
    }
}

impl LazyDataset {
    /// The same plan with in-memory source blocks moved into the object
    /// store, so that it travels to another process as references.
    pub(crate) fn shareable(&self) -> Result<LazyDataset> {
        let Source::Memory(d) = &self.source else {
            return Ok(self.clone());
        };
        let blocks = d
            .blocks()
            .iter()
            .map(|b| Block::put(b).map(|k| (k.data, k.rows)))
            .collect::<Result<_>>()?;
        Ok(LazyDataset {
            source: Source::Stored(blocks),
            steps: self.steps.clone(),
            options: self.options.clone(),
        })
    }

    /// The plan's row count, when known without running it.
    pub(crate) fn count_if_known(&self) -> Option<usize> {
        self.known_count()
    }
}
