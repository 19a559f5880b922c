//! [`StreamBatches`]: batches cut from a stream of blocks as a consumer
//! reads them.
//!
//! Blocks in the object store are read in place: the consumer holds a
//! pinned view of each block it is cutting batches from, and copies out only
//! the rows of each batch (one copy from shared memory to the batch).

use super::batch::Batch;
use super::block::Block;
use super::error::{DataError, Result};
use super::rng;
use super::stats::StageStats;
use super::wire::{self, Decoded};
use prism::View;
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Rows a consumer holds: decoded, or an encoded block in the object
/// store, read in place.
pub(crate) enum Chunk {
    Rows(Batch),
    Stored {
        view: View<u8>,
        /// The block's rows that belong to this chunk.
        rows: Range<usize>,
    },
}

impl Chunk {
    /// A block of a running pipeline, mapped (not copied) from the store.
    pub(crate) fn open(block: &Block) -> Result<Chunk> {
        let view = prism::get_view(&block.data).map_err(|e| DataError::Stage {
            stage: "fetch".into(),
            block: 0,
            message: e.to_string(),
        })?;
        Ok(Chunk::Stored {
            view,
            rows: block.start..block.start + block.rows,
        })
    }

    fn num_rows(&self) -> usize {
        match self {
            Chunk::Rows(b) => b.num_rows(),
            Chunk::Stored { rows, .. } => rows.len(),
        }
    }

    /// Rows `range` (relative to the chunk), copied out.
    pub(crate) fn rows(&self, range: Range<usize>) -> Result<Batch> {
        match self {
            Chunk::Rows(b) if range.start == 0 && range.end == b.num_rows() => Ok(b.clone()),
            Chunk::Rows(b) => Ok(b.slice(range)),
            Chunk::Stored { view, rows } => {
                let abs = rows.start + range.start..rows.start + range.end;
                match wire::decode_rows(view, Some(abs))? {
                    Decoded::Block(b) => Ok(b),
                    _ => Err(DataError::Corrupt {
                        what: "a failure record where rows were expected".into(),
                    }),
                }
            }
        }
    }
}

impl Block {
    /// The rows, copied out of the store (only this block's range of the
    /// encoded batch is decoded).
    pub(crate) fn fetch(&self) -> Result<Batch> {
        Chunk::open(self)?.rows(0..self.rows)
    }
}

/// Batches of a running pipeline: what
/// [`LazyDataset::iter_batches`](super::LazyDataset::iter_batches) and
/// [`DataIterator::iter_batches`](super::DataIterator::iter_batches)
/// return. Each item is a batch, or the error that ended the run.
pub struct StreamBatches {
    chunks: Box<dyn Iterator<Item = Result<Chunk>> + Send>,
    stats: Option<Arc<Mutex<Vec<StageStats>>>>,
    /// Chunks not yet fully yielded, and the row reached in the first.
    queue: VecDeque<Chunk>,
    offset: usize,
    queued_rows: usize,
    batch_size: usize,
    drop_last: bool,
    done: bool,
    shuffle: Option<(usize, rng::SplitMix64)>,
    /// With a shuffle: rows in a random order, and the next one to yield.
    shuffled: Option<(Batch, usize)>,
    progress: Option<Progress>,
}

/// Whether live progress lines are shown: on when stderr is a terminal,
/// unless `PRISM_DATA_PROGRESS=0`; `PRISM_DATA_PROGRESS=1` turns them on
/// anywhere.
pub(crate) fn progress_on() -> bool {
    match std::env::var("PRISM_DATA_PROGRESS").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => std::io::stderr().is_terminal(),
    }
}

/// One progress line: the last stage's rows, rates over `secs`, blocks,
/// and the tasks running in every stage.
fn progress_line(stats: &[StageStats], secs: f64) -> String {
    let Some(last) = stats.last() else {
        return String::new();
    };
    let secs = secs.max(1e-9);
    let in_flight: usize = stats.iter().map(|s| s.in_flight).sum();
    format!(
        "{}: {} rows, {:.0} rows/s, {:.0} MB/s, {} blocks, {in_flight} tasks running",
        last.name,
        last.rows,
        last.rows as f64 / secs,
        last.bytes as f64 / secs / 1e6,
        last.blocks,
    )
}

/// The live line of a streaming split's pipeline, which runs in its
/// coordinator actor: a thread of the process that made the split asks
/// the coordinator for its stats twice a second and shows them while rows
/// flow, ending the line when an epoch's rows stop growing. The thread
/// ends with the cluster (its calls fail), or after `IDLE_POLLS` polls in a
/// row without progress (`IDLE_POLLS_ORPHANED`, 30 s, once rows have
/// flowed and no handle of the split is left in this process, `alive`).
pub(crate) fn watch_split(
    name: String,
    alive: std::sync::Weak<()>,
    stats: impl Fn() -> Option<Vec<StageStats>> + Send + 'static,
) {
    // Polls without new rows before it stops: many while a split's handle
    // lives in this process (a consumer may be slow to start), fewer once
    // they are all gone, so that the coordinator it holds can end.
    const IDLE_POLLS: usize = 1200;
    const IDLE_POLLS_ORPHANED: usize = 60;
    let label = name.clone();
    let spawned = std::thread::Builder::new()
        .name("prism-data-progress".into())
        .spawn(move || {
            let (mut shown_rows, mut idle, mut open) = (0usize, 0usize, false);
            // Orphaned counts only once rows were seen: a trainer hands
            // every split to its workers before any row flows.
            let limit = |seen: bool| match (seen, alive.strong_count()) {
                (true, 0) => IDLE_POLLS_ORPHANED,
                _ => IDLE_POLLS,
            };
            while idle < limit(shown_rows > 0) {
                std::thread::sleep(Duration::from_millis(500));
                let Some(now) = stats() else { break };
                let rows = now.last().map_or(0, |s| s.rows);
                let wall = now.last().map_or(0.0, |s| s.wall.as_secs_f64());
                if rows != shown_rows {
                    eprint!("\r\x1b[2K{name} {}", progress_line(&now, wall));
                    (shown_rows, idle, open) = (rows, 0, true);
                } else {
                    if open {
                        eprintln!();
                        open = false;
                    }
                    idle += 1;
                }
            }
            if open {
                eprintln!();
            }
        });
    if let Err(e) = spawned {
        eprintln!("prism-data: no progress line for {label}: {e}");
    }
}

/// The live line a pipeline read on a terminal shows on stderr.
struct Progress {
    started: Instant,
    last: Instant,
    shown: bool,
}

impl Progress {
    /// On when stderr is a terminal, unless `PRISM_DATA_PROGRESS=0`;
    /// `PRISM_DATA_PROGRESS=1` turns it on anywhere.
    fn new() -> Option<Progress> {
        let now = Instant::now();
        progress_on().then_some(Progress {
            started: now,
            last: now,
            shown: false,
        })
    }

    fn line(&self, stats: &[StageStats]) -> String {
        progress_line(stats, self.started.elapsed().as_secs_f64())
    }

    fn tick(&mut self, stats: &[StageStats]) {
        if self.last.elapsed() >= Duration::from_millis(500) {
            self.last = Instant::now();
            self.shown = true;
            eprint!("\r\x1b[2K{}", self.line(stats));
        }
    }

    fn finish(&mut self, stats: &[StageStats]) {
        if self.shown {
            eprintln!("\r\x1b[2K{}", self.line(stats));
            self.shown = false;
        }
    }
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
    /// Batches of `batch_size` rows cut from the incoming chunks, which
    /// may have any size.
    pub(crate) fn new(
        chunks: Box<dyn Iterator<Item = Result<Chunk>> + Send>,
        stats: Option<Arc<Mutex<Vec<StageStats>>>>,
        batch_size: usize,
        drop_last: bool,
    ) -> StreamBatches {
        StreamBatches {
            progress: None,
            chunks,
            stats,
            queue: VecDeque::new(),
            offset: 0,
            queued_rows: 0,
            batch_size,
            drop_last,
            done: false,
            shuffle: None,
            shuffled: None,
        }
        .with_progress()
    }

    fn with_progress(mut self) -> StreamBatches {
        if self.stats.is_some() {
            self.progress = Progress::new();
        }
        self
    }

    /// Shuffles rows locally (Ray's `local_shuffle_buffer_size`): rows are
    /// gathered until at least `2 * buffer_rows` are at hand, put in a
    /// random order, and yielded until `buffer_rows` are left, which are
    /// shuffled again with the next rows; the order is fixed by `seed`.
    /// Each row is copied about twice, whatever the buffer's size.
    pub fn local_shuffle(mut self, buffer_rows: usize, seed: u64) -> StreamBatches {
        self.shuffle = Some((buffer_rows.max(1), rng::SplitMix64::new(seed)));
        self
    }

    /// What each stage of the pipeline has done so far (all of it, once
    /// the iterator is exhausted): blocks, rows, bytes and time per stage.
    /// Empty for batches that do not come from a pipeline run here.
    pub fn stats(&self) -> Vec<StageStats> {
        self.stats
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.clone()))
            .unwrap_or_default()
    }

    fn want(&self) -> usize {
        match &self.shuffle {
            Some((buffer, _)) => 2 * buffer + self.batch_size,
            None => self.batch_size,
        }
    }

    /// Pulls chunks until enough rows are queued or the stream ends.
    fn top_up(&mut self) -> Result<()> {
        if self.progress.is_some() {
            let stats = self.stats();
            if let Some(p) = self.progress.as_mut() {
                p.tick(&stats);
            }
        }
        while !self.done && self.queued_rows < self.want() {
            match self.chunks.next() {
                None => {
                    self.done = true;
                    if let Some(mut p) = self.progress.take() {
                        p.finish(&self.stats());
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Some(Ok(chunk)) => {
                    self.queued_rows += chunk.num_rows();
                    if chunk.num_rows() > 0 {
                        self.queue.push_back(chunk);
                    }
                }
            }
        }
        Ok(())
    }

    /// The next `n` queued rows, in order.
    fn take_rows(&mut self, n: usize) -> Result<Batch> {
        let mut parts = Vec::new();
        let mut need = n;
        while need > 0 {
            let Some(chunk) = self.queue.front() else {
                break;
            };
            let take = (chunk.num_rows() - self.offset).min(need);
            parts.push(chunk.rows(self.offset..self.offset + take)?);
            need -= take;
            self.offset += take;
            self.queued_rows -= take;
            if self.offset >= chunk.num_rows() {
                self.queue.pop_front();
                self.offset = 0;
            }
        }
        match parts.len() {
            1 => Ok(parts.pop().unwrap_or_default()),
            _ => Batch::concat(&parts),
        }
    }

    fn next_batch(&mut self) -> Result<Option<Batch>> {
        if let Some((buffer, _)) = &self.shuffle {
            let buffer = *buffer;
            return self.next_shuffled(buffer);
        }
        self.top_up()?;
        let n = self.batch_size.min(self.queued_rows);
        if n == 0 || (n < self.batch_size && self.drop_last) {
            return Ok(None);
        }
        self.take_rows(n).map(Some)
    }

    fn next_shuffled(&mut self, buffer: usize) -> Result<Option<Batch>> {
        let size = self.batch_size;
        loop {
            let ended = self.done && self.queued_rows == 0;
            if let Some((rows, at)) = &mut self.shuffled {
                let left = rows.num_rows() - *at;
                if left >= size && (ended || left - size >= buffer) {
                    let out = rows.slice(*at..*at + size);
                    *at += size;
                    return Ok(Some(out));
                }
                if ended {
                    let tail =
                        (left > 0 && !self.drop_last).then(|| rows.slice(*at..rows.num_rows()));
                    self.shuffled = None;
                    return Ok(tail);
                }
            } else if ended {
                return Ok(None);
            }
            // Refill: what is left of the shuffled rows and every queued
            // row, in a new random order.
            self.top_up()?;
            let mut parts = Vec::new();
            if let Some((rows, at)) = self.shuffled.take() {
                if at < rows.num_rows() {
                    parts.push(rows.slice(at..rows.num_rows()));
                }
            }
            if self.queued_rows > 0 {
                parts.push(self.take_rows(self.queued_rows)?);
            }
            if parts.is_empty() {
                continue;
            }
            let all = Batch::concat(&parts)?;
            let Some((_, rng)) = self.shuffle.as_mut() else {
                return Ok(None);
            };
            let order = rng::permutation(all.num_rows(), rng.next_u64());
            self.shuffled = Some((all.gather(&order), 0));
        }
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
                self.shuffled = None;
                Some(Err(e))
            }
        }
    }
}
