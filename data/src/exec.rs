//! Running a [`LazyDataset`]'s plan: block tasks, the window that bounds
//! them, and the steps between them. See the `pipeline` module docs.

use super::actors::{ActorPool, ActorStep};
use super::batch::Batch;
use super::block::{failure, Block};
use super::error::{DataError, Result};
use super::map::{BlockFn, Outcome};
use super::parquet::{self, RowGroup};
use super::plan::{ExecutionOptions, LazyDataset, Source, Step};
use super::shuffle::{self, Regroup};
use super::stats::StageStats;
use super::wire::{self, Decoded};
use super::{binary, csv};
use prism::{ObjectRef, TaskOptions, View};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The size a block is assumed to have before the first one is seen.
const ASSUMED_BLOCK_BYTES: usize = 64 << 20;

/// How long a block task may keep its consumer waiting before the
/// pipeline says so.
const STALL_WARNING: Duration = Duration::from_secs(20);

/// Rows per block of [`LazyDataset::range`].
pub(crate) const RANGE_BLOCK_ROWS: usize = 8192;

/// What a block task reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Piece {
    RowGroup {
        group: RowGroup,
        columns: Option<Vec<String>>,
    },
    Csv(PathBuf),
    Files {
        paths: Vec<PathBuf>,
        include_paths: bool,
    },
    Range {
        start: usize,
        end: usize,
    },
}

impl Piece {
    /// Reads the piece in batches of up to `chunk_rows` rows.
    fn read(&self, chunk_rows: usize) -> Result<Vec<Batch>> {
        match self {
            Piece::RowGroup { group, columns } => {
                parquet::read(group, columns.as_deref(), chunk_rows)
            }
            Piece::Csv(path) => Ok(vec![csv::read(path)?]),
            Piece::Files {
                paths,
                include_paths,
            } => binary::read(paths, *include_paths, chunk_rows),
            Piece::Range { start, end } => {
                let step = chunk_rows.clamp(1, RANGE_BLOCK_ROWS);
                (*start..*end)
                    .step_by(step)
                    .map(|a| {
                        let b = (a + step).min(*end);
                        let ids = super::Column::I64((a as i64..b as i64).collect());
                        Batch::new(vec![("id".to_string(), ids)])
                    })
                    .collect()
            }
        }
    }
}

/// The rows a read should decode at a time for `stages`: the first
/// stage's batch size, so its batches need no copy.
fn chunk_rows(stages: &[BlockFn]) -> usize {
    stages
        .first()
        .and_then(|s| s.batch_size)
        .unwrap_or(usize::MAX)
}

/// `parts` cut into batches of exactly `size` rows (the last shorter),
/// copying only when they are not cut that way already.
fn rechunk(parts: Vec<Batch>, size: usize) -> Result<Vec<Batch>> {
    let n = parts.len();
    let aligned = parts
        .iter()
        .enumerate()
        .all(|(i, p)| p.num_rows() == size || (i + 1 == n && p.num_rows() <= size));
    if aligned {
        return Ok(parts);
    }
    let all = Batch::concat(&parts)?;
    Ok((0..all.num_rows())
        .step_by(size.max(1))
        .map(|a| all.slice(a..(a + size).min(all.num_rows())))
        .collect())
}

/// Runs `stages` over a block given as consecutive batches, as a block
/// task's body, and encodes the result as one block.
fn apply(stages: &[BlockFn], mut parts: Vec<Batch>) -> Vec<u8> {
    for stage in stages {
        // SAFETY: the token was made by PortableFn::new in the stage's
        // constructor, in this executable (checked by resolve).
        let run = match unsafe { stage.run.resolve() } {
            Ok(run) => run,
            Err(e) => return outcome_bytes(&stage.name, e.into()),
        };
        let inputs = match stage.batch_size {
            Some(size) => match rechunk(parts, size) {
                Ok(p) => p,
                Err(e) => return wire::encode_failed(&stage.name, &e.to_string()),
            },
            None => parts,
        };
        let mut outputs = Vec::with_capacity(inputs.len());
        for part in inputs {
            match run(stage.user.clone(), part) {
                Outcome::Done(out) => outputs.push(out),
                other => return outcome_bytes(&stage.name, other),
            }
        }
        parts = outputs;
    }
    // Empty outputs (a filter that kept nothing) may carry no schema.
    if parts.iter().any(|p| p.num_rows() > 0) {
        parts.retain(|p| p.num_rows() > 0);
    } else {
        parts.truncate(1);
    }
    if let Err(e) = super::batch::check_schemas(&parts) {
        let stage = stages.last().map(|s| s.name.as_str()).unwrap_or("read");
        return wire::encode_failed(stage, &e.to_string());
    }
    wire::encode_many(&parts)
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
    match piece.read(chunk_rows(&stages)) {
        Ok(parts) => apply(&stages, parts),
        Err(e) => wire::encode_failed("read", &e.to_string()),
    }
}

/// A block task over a block already in the store (read in place).
#[prism::remote]
fn map_block(block: View<u8>, stages: Vec<BlockFn>) -> Vec<u8> {
    match wire::decode(&block) {
        Ok(Decoded::Block(batch)) => apply(&stages, vec![batch]),
        Ok(_) => wire::encode_failed("input", "the input block is a failure record"),
        Err(e) => wire::encode_failed("input", &e.to_string()),
    }
}

/// The block a finished task returned, from its header (its failure as an
/// error).
fn finished_block(data: ObjectRef<Vec<u8>>, index: usize, stage: &str) -> Result<Block> {
    let view = prism::get_view(&data).map_err(|e| DataError::Stage {
        stage: stage.to_string(),
        block: index,
        message: e.to_string(),
    })?;
    let bytes = view.len();
    match wire::rows(&view)? {
        Some(rows) => Ok(Block {
            data,
            start: 0,
            rows,
            bytes,
        }),
        None => Err(failure(wire::decode(&view)?, index)),
    }
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
    pub(crate) stats: Arc<Mutex<Vec<StageStats>>>,
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
    pub(crate) fn new(plan: &LazyDataset) -> Result<BlockStream> {
        let stats = Arc::new(Mutex::new(Vec::new()));
        let mut upstream: Upstream = source_inputs(&plan.source)?;
        let mut pending: Vec<BlockFn> = Vec::new();
        let mut pending_name = plan.source_name().to_string();
        let tasks = max_tasks(&plan.options);
        let fuse = |up: Upstream, fns: Vec<BlockFn>, name: String| -> Upstream {
            let run = Fused::new(up, fns, name, &plan.options, tasks, stats.clone());
            Box::new(run.map(|b| b.map(Input::Block)))
        };
        let on_actors = |up: Upstream, step: &ActorStep| -> Result<Upstream> {
            let pool = step.start().map_err(|e| DataError::Stage {
                stage: step.name.clone(),
                block: 0,
                message: format!("cannot start the actor pool: {e}"),
            })?;
            let mut run = Fused::new(
                up,
                Vec::new(),
                step.name.clone(),
                &plan.options,
                // Two calls queued per actor: one running, one ready to start.
                2 * step.pool.max,
                stats.clone(),
            );
            run.task_cpus = step.num_cpus;
            run.actors = Some(pool);
            Ok(Box::new(run.map(|b| b.map(Input::Block))))
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
                        Step::Shuffle(seed) => all_to_all(
                            upstream,
                            Regroup::Shuffle(*seed),
                            &plan.options,
                            stats.clone(),
                        ),
                        Step::Repartition(n) => {
                            all_to_all(upstream, Regroup::Blocks(*n), &plan.options, stats.clone())
                        }
                        Step::Actors(a) => on_actors(upstream, a)?,
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
        Source::Binary(files) => {
            let include_paths = files.include_paths;
            let pieces: Vec<Input> = files
                .groups()
                .into_iter()
                .map(|paths| {
                    Input::Piece(Piece::Files {
                        paths,
                        include_paths,
                    })
                })
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
    task_cpus: f64,
    warned: bool,
    /// A pool of actors that runs this step instead of tasks.
    actors: Option<ActorPool>,
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
        let task_cpus = fns
            .iter()
            .map(|f| f.num_cpus.unwrap_or(options.num_cpus_per_task))
            .reduce(f64::max)
            .unwrap_or(options.num_cpus_per_task);
        Fused {
            upstream,
            upstream_done: false,
            fns,
            name,
            task: TaskOptions::new().num_cpus(task_cpus),
            in_flight: VecDeque::new(),
            next_index: 0,
            max_tasks,
            budget: options.memory_budget_bytes,
            largest_block: 0,
            started: None,
            stats,
            slot,
            task_cpus,
            warned: false,
            actors: None,
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
                Input::Block(block) if self.actors.is_some() => {
                    let pool = self.actors.as_mut().expect("checked just above");
                    let r = pool.map(&block.data);
                    let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(st) = s.get_mut(self.slot) {
                        st.peak_actors = st.peak_actors.max(pool.len());
                        st.actors_stopped_idle = pool.stopped_idle;
                    }
                    r
                }
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
                        st.in_flight = self.in_flight.len();
                    }
                }
                Err(e) => return Some(Err(self.stage_error(index, e.to_string()))),
            }
        }
        None
    }

    /// Waits for a block task, saying on stderr (once per step) when it
    /// has waited long: a pipeline whose tasks cannot get a CPU, because
    /// training workers hold them all, would otherwise hang in silence.
    fn wait_for(&mut self, index: usize, data: &ObjectRef<Vec<u8>>) {
        let started = Instant::now();
        loop {
            match prism::wait(std::slice::from_ref(data), 1, Some(STALL_WARNING)) {
                Ok((ready, _)) if ready.is_empty() => {}
                // Ready, or an error that reading the block will report.
                _ => return,
            }
            if !self.warned {
                self.warned = true;
                let cpus = prism::cluster_resources()
                    .map(|(total, free)| {
                        format!("{} of {} CPUs are free", free.get("CPU"), total.get("CPU"))
                    })
                    .unwrap_or_else(|_| "the free CPUs are unknown".into());
                eprintln!(
                    "prism-data: block {index} of {} has waited {} s for its task ({cpus}). Each block task needs {} CPU; if training workers or other tasks hold every CPU of the cluster, the pipeline cannot go on: give the cluster more CPUs than the workers take (prism::Config::num_cpus), or lower ExecutionOptions::num_cpus_per_task.",
                    self.name,
                    started.elapsed().as_secs(),
                    self.task_cpus,
                );
            }
        }
    }

    fn record(&self, block: &Block, waited: Duration) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = s.get_mut(self.slot) {
            st.in_flight = self.in_flight.len();
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
        self.wait_for(index, &data);
        let block = match finished_block(data, index, &self.name) {
            Ok(b) => b,
            Err(e) => {
                self.in_flight.clear();
                self.upstream_done = true;
                return Some(Err(e));
            }
        };
        let waited = waiting.elapsed();
        self.largest_block = self.largest_block.max(block.bytes);
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
        let keep = Block {
            rows: std::mem::take(&mut self.left),
            ..block
        };
        Some(keep.fetch().and_then(|b| Block::put(&b)).map(Input::Block))
    }
}

/// A barrier: every block of the stream, then the tasks that regroup
/// them ([`shuffle`](super::shuffle)), whose blocks it yields in order.
fn all_to_all(
    upstream: Upstream,
    how: Regroup,
    options: &ExecutionOptions,
    stats: Arc<Mutex<Vec<StageStats>>>,
) -> Upstream {
    let task = TaskOptions::new().num_cpus(options.num_cpus_per_task);
    let slot = {
        let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
        s.push(StageStats {
            name: how.name().to_string(),
            ..StageStats::default()
        });
        s.len() - 1
    };
    let mut pending = Some(upstream);
    let mut outputs: std::vec::IntoIter<ObjectRef<Vec<u8>>> = Vec::new().into_iter();
    let mut index = 0;
    let mut started = Instant::now();
    Box::new(std::iter::from_fn(move || {
        if let Some(up) = pending.take() {
            let mut blocks = Vec::new();
            for input in up {
                match input {
                    Ok(Input::Block(b)) => blocks.push(b),
                    Ok(Input::Piece(_)) => unreachable!("a fused step comes before every barrier"),
                    Err(e) => return Some(Err(e)),
                }
            }
            started = Instant::now();
            match shuffle::start(blocks, how, &task) {
                Ok(refs) => outputs = refs.into_iter(),
                Err(e) => return Some(Err(e)),
            }
        }
        let data = outputs.next()?;
        let waiting = Instant::now();
        let block = finished_block(data, index, how.name());
        if let Ok(b) = &block {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(st) = s.get_mut(slot) {
                st.blocks += 1;
                st.rows += b.rows;
                st.bytes += b.bytes;
                st.waited += waiting.elapsed();
                st.wall = started.elapsed();
            }
        } else {
            outputs = Vec::new().into_iter();
        }
        index += 1;
        Some(block.map(Input::Block))
    }))
}
