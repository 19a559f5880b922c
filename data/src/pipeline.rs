//! [`LazyDataset`]: a dataset described by its source and transformations,
//! run as a streaming pipeline when it is read.
//!
//! This module builds and reads plans; the type and the parts a plan is
//! made of are in the `plan` module.
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

use super::actors::{make_mapper, ActorStep, BatchMapper, Make, PoolSize};
use super::batch::Batch;
use super::binary;
use super::block::Block;
use super::dataset::Dataset;
use super::error::{positive, DataError, Result};
use super::exec::BlockStream;
use super::parquet;
use super::plan::{ExecutionOptions, LazyDataset, Source, Step};
use super::schema::{ColumnType, Field, Schema};
use super::stream::{Chunk, StreamBatches};
use prism::portable::PortableFn;
use serde::Serialize;
use std::fmt::Display;
use std::path::{Path, PathBuf};

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

    /// Reads whole files (Ray's `read_binary_files`): each file is one row,
    /// its contents in a `bytes` column. Each path is a file, or a
    /// directory whose files are read recursively in name order (names
    /// starting with `.` are skipped). The files are listed and sized now
    /// and read when the pipeline runs, by tasks that each read a block of
    /// files (about 64 MiB, at most 1,024 files).
    ///
    /// ```no_run
    /// use prism_data::LazyDataset;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let files = LazyDataset::read_binary_files(["images/"])?;
    /// for batch in files.iter_batches(32, false)? {
    ///     for contents in batch?.bytes("bytes")? {
    ///         println!("{} bytes", contents.len());
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] naming a path that does not exist or cannot be
    /// listed. A file that cannot be read when its block runs fails that
    /// block with the file's name.
    pub fn read_binary_files<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<LazyDataset> {
        LazyDataset::binary_files(paths, false)
    }

    /// As [`LazyDataset::read_binary_files`], with each file's path in a
    /// `str` column `path` before `bytes` (Ray's `include_paths=True`).
    ///
    /// # Errors
    ///
    /// As [`LazyDataset::read_binary_files`].
    pub fn read_binary_files_with_paths<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<LazyDataset> {
        LazyDataset::binary_files(paths, true)
    }

    fn binary_files<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
        include_paths: bool,
    ) -> Result<LazyDataset> {
        let paths = paths
            .into_iter()
            .map(|p| p.as_ref().to_path_buf())
            .collect();
        let files = binary::scan(paths, include_paths)?;
        Ok(LazyDataset::new(Source::Binary(files)))
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

    /// The CPUs each task of the last step needs (Ray's `num_cpus` of
    /// `map_batches`), instead of [`ExecutionOptions::num_cpus_per_task`]:
    /// 0.5 lets two such tasks share a CPU, 2 gives a multi-threaded
    /// function two. A task that runs several fused steps asks for the
    /// most any of them needs.
    ///
    /// ```no_run
    /// use prism_data::{Batch, DataError, LazyDataset};
    /// fn identity(batch: Batch) -> Result<Batch, DataError> {
    ///     Ok(batch)
    /// }
    /// # fn main() -> Result<(), DataError> {
    /// let ds = LazyDataset::range(1000).map_batches(identity, 100)?.num_cpus(0.5)?;
    /// for batch in ds.iter_batches(100, false)? {
    ///     println!("{} rows", batch?.num_rows());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for a negative or non-finite
    /// number, or when the last step is not `map_batches`, `map` or
    /// `filter` (an actor pool's CPUs are given when it is made).
    pub fn num_cpus(&self, num_cpus: f64) -> Result<LazyDataset> {
        let invalid = |reason: &'static str| DataError::InvalidArgument {
            argument: "num_cpus",
            value: num_cpus.to_string(),
            reason,
        };
        if !(num_cpus >= 0.0 && num_cpus.is_finite()) {
            return Err(invalid("a finite number of CPUs, 0 or more"));
        }
        let mut next = self.clone();
        match next.steps.last_mut() {
            Some(Step::Apply(f)) => f.num_cpus = Some(num_cpus),
            _ => return Err(invalid(
                "it applies to the step just before it, which must be map_batches, map or filter",
            )),
        }
        Ok(next)
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
            Step::Actors(a) => a.name.clone(),
            Step::Limit(n) => format!("Limit({n})"),
            Step::Shuffle(_) => "RandomShuffle".to_string(),
            Step::Repartition(n) => format!("Repartition({n})"),
        }));
        names
    }

    /// The number of rows the plan yields without running it, when the
    /// source knows it and no step changes it.
    fn known_count(&self) -> Option<usize> {
        let mut n = match &self.source {
            Source::Memory(d) => d.count(),
            Source::Stored(blocks) => blocks.iter().map(|b| b.1).sum(),
            Source::Parquet(files) => files.row_groups.iter().map(|g| g.rows).sum(),
            Source::Csv(_) => return None,
            Source::Binary(b) => b.files.len(),
            Source::Range(n) => *n,
        };
        for step in &self.steps {
            match step {
                Step::Apply(f) if !f.keeps_rows => return None,
                Step::Actors(_) => return None,
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
        if self
            .steps
            .iter()
            .any(|s| matches!(s, Step::Apply(_) | Step::Actors(_)))
        {
            return None;
        }
        match &self.source {
            Source::Memory(d) => Some(d.schema()),
            Source::Parquet(f) if !has_unknown_lengths(&f.schema) => Some(f.schema.clone()),
            Source::Range(_) => Some(Dataset::range(0).schema()),
            Source::Binary(b) => {
                let mut fields = Vec::with_capacity(2);
                if b.include_paths {
                    fields.push(Field {
                        name: "path".to_string(),
                        data_type: ColumnType::Str,
                    });
                }
                fields.push(Field {
                    name: "bytes".to_string(),
                    data_type: ColumnType::Bytes,
                });
                Some(Schema { fields })
            }
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
        let stream = self.stream()?;
        let stats = Some(stream.stats.clone());
        let chunks = Box::new(stream.map(|b| b.and_then(|b| Chunk::open(&b))));
        Ok(StreamBatches::new(chunks, stats, batch_size, drop_last))
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

impl LazyDataset {
    /// Applies a stateful mapper to every block, in batches of up to
    /// `batch_size` rows, on a pool of actors (Ray's `map_batches` with a
    /// callable class and `concurrency`). `pool` is a fixed size (`4`) or
    /// a range (`(1, 4)`, see [`PoolSize`]). Each actor runs `make` once,
    /// in its own worker process, then maps the blocks it is given; each
    /// block goes to the actor with the fewest unfinished calls, and blocks
    /// come back in order. The actors are stopped when the run ends.
    ///
    /// `make` is a `fn` item (workers run this same executable). Each actor
    /// asks for `num_cpus` CPUs (0 is allowed).
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`]
    /// for a pool of 0 actors or whose `min` is above its `max`, a
    /// `batch_size` of 0, or a negative `num_cpus`.
    /// When the pipeline runs: [`DataError::Stage`]
    /// for a constructor that fails or a mapper that returns `Err` or
    /// panics.
    pub fn map_batches_with_actors<M: BatchMapper, E: Display + 'static>(
        &self,
        make: fn() -> std::result::Result<M, E>,
        pool: impl Into<PoolSize>,
        batch_size: usize,
        num_cpus: f64,
    ) -> Result<LazyDataset> {
        let pool = pool.into();
        positive("pool_size", pool.min)?;
        if pool.min > pool.max {
            return Err(super::DataError::InvalidArgument {
                argument: "pool_size",
                value: format!("({}, {})", pool.min, pool.max),
                reason: "min must not be above max",
            });
        }
        positive("batch_size", batch_size)?;
        if !(num_cpus >= 0.0 && num_cpus.is_finite()) {
            return Err(super::DataError::InvalidArgument {
                argument: "num_cpus",
                value: num_cpus.to_string(),
                reason: "must be a finite number of CPUs, 0 or more",
            });
        }
        let user = serde_json::to_string(&PortableFn::new(make))
            .expect("a function token serializes to JSON");
        let size = match pool.min == pool.max {
            true => pool.min.to_string(),
            false => format!("{}-{}", pool.min, pool.max),
        };
        let step = ActorStep {
            name: format!("MapBatches(actors x{size})"),
            make: PortableFn::new(make_mapper::<M, E> as Make),
            user,
            pool,
            batch_size,
            num_cpus,
        };
        let mut next = self.clone();
        next.steps.push(Step::Actors(step));
        Ok(next)
    }
}

fn has_unknown_lengths(schema: &Schema) -> bool {
    schema
        .fields
        .iter()
        .any(|f| matches!(f.data_type, super::ColumnType::Tensor { row_len: 0 }))
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
