//! [`LazyDataset::streaming_split`]: one pipeline feeding `n` consumers
//! (training workers) at once, through a coordinator actor.
//!
//! The coordinator runs the pipeline (its block tasks run anywhere in the
//! cluster) and hands each split references to blocks; the split fetches
//! them itself, so rows never pass through the coordinator. Epoch `e`
//! starts when the first split asks for it, once every split is done with
//! epoch `e - 1`; each epoch runs the pipeline again.
//!
//! # Equal splits
//!
//! With `equal = true` every split gets the same number of rows per epoch,
//! as data-parallel training needs, although the total is not known until
//! the pipeline ends. The coordinator keeps it possible to the end:
//!
//! - it serves a block only to a split that has had the fewest rows so far,
//!   so no split is ever more than one block (`B` rows, the largest block
//!   seen) ahead of another (others wait, and their iterators poll);
//! - it holds back at least `n * B` rows;
//! - when the pipeline ends, each split's total is set to
//!   `T = (rows handed out + rows held back) / n`, which the two rules above
//!   make at least every split's count so far, and the rows held back are
//!   cut (as row ranges of blocks, no copy) to bring each split to `T`. The
//!   last `total % n` rows are dropped.

use super::block::Block;
use super::error::{DataError, Result};
use super::exec::BlockStream;
use super::plan::LazyDataset;
use super::schema::Schema;
use super::stats::StageStats;
use super::stream::{Chunk, StreamBatches};
use prism::{ActorHandle, ObjectRef};
use prism_config::Backoff;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a split waits for the others before it gives up: they may be
/// a whole epoch behind (a slow worker), so it is long.
const WAIT_LIMIT: Duration = Duration::from_secs(600);

/// What the coordinator answers a split.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Next {
    /// Rows `start..end` of an encoded block.
    Block {
        data: ObjectRef<Vec<u8>>,
        start: usize,
        end: usize,
    },
    /// Ask again soon: other splits must catch up first.
    Wait,
    /// The split's epoch is over.
    End,
}

/// One epoch's run of the pipeline.
struct EpochRun {
    epoch: u64,
    stream: BlockStream,
    done: bool,
    failed: Option<String>,
    given: Vec<usize>,
    ended: Vec<bool>,
    held: VecDeque<Block>,
    held_rows: usize,
    largest: usize,
    /// With `equal`, once the pipeline has ended: what each split still gets.
    finals: Option<Vec<VecDeque<Block>>>,
}

/// The actor behind a streaming split.
#[prism::actor]
pub(crate) struct SplitCoordinator {
    plan: LazyDataset,
    n: usize,
    equal: bool,
    /// In a mutex only because actors are `Sync`; methods take `&mut self`.
    run: Mutex<Option<EpochRun>>,
    last_stats: Vec<StageStats>,
}

fn give(block: Block) -> Next {
    Next::Block {
        start: block.start,
        end: block.start + block.rows,
        data: block.data,
    }
}

impl EpochRun {
    fn pull(&mut self) -> std::result::Result<Option<Block>, String> {
        match self.stream.next() {
            None => {
                self.done = true;
                Ok(None)
            }
            Some(Ok(b)) => {
                self.largest = self.largest.max(b.rows);
                Ok(Some(b))
            }
            Some(Err(e)) => {
                let message = e.to_string();
                self.failed = Some(message.clone());
                self.done = true;
                Err(message)
            }
        }
    }

    fn next_any(&mut self, split: usize) -> std::result::Result<Next, String> {
        if let Some(b) = self.held.pop_front() {
            return Ok(give(b));
        }
        match self.pull()? {
            Some(b) if b.rows > 0 => Ok(give(b)),
            Some(_) => Ok(Next::Wait),
            None => {
                self.ended[split] = true;
                Ok(Next::End)
            }
        }
    }

    fn next_equal(&mut self, split: usize) -> std::result::Result<Next, String> {
        let n = self.given.len();
        while self.finals.is_none() {
            if self.done {
                self.finals = Some(self.final_shares());
                break;
            }
            if self.held_rows >= n * self.largest.max(1) {
                break;
            }
            if let Some(b) = self.pull()? {
                self.held_rows += b.rows;
                if b.rows > 0 {
                    self.held.push_back(b);
                }
            }
        }
        if let Some(finals) = &mut self.finals {
            return Ok(match finals[split].pop_front() {
                Some(b) => give(b),
                None => {
                    self.ended[split] = true;
                    Next::End
                }
            });
        }
        let least = self.given.iter().copied().min().unwrap_or(0);
        if self.given[split] > least {
            return Ok(Next::Wait);
        }
        let Some(b) = self.held.pop_front() else {
            return Ok(Next::Wait);
        };
        self.held_rows -= b.rows;
        self.given[split] += b.rows;
        Ok(give(b))
    }

    /// Cuts the held rows so that every split ends with the same count.
    fn final_shares(&mut self) -> Vec<VecDeque<Block>> {
        let n = self.given.len();
        let total: usize = self.given.iter().sum::<usize>() + self.held_rows;
        let target = total / n;
        let mut shares = vec![VecDeque::new(); n];
        for (split, share) in shares.iter_mut().enumerate() {
            let mut need = target.saturating_sub(self.given[split]);
            while need > 0 {
                let Some(mut b) = self.held.pop_front() else {
                    break;
                };
                let take = b.rows.min(need);
                if take < b.rows {
                    let rest = Block {
                        data: b.data.clone(),
                        start: b.start + take,
                        rows: b.rows - take,
                        bytes: b.bytes,
                    };
                    self.held.push_front(rest);
                    b.rows = take;
                }
                need -= take;
                self.given[split] += take;
                share.push_back(b);
            }
        }
        self.held.clear();
        self.held_rows = 0;
        shares
    }
}

#[prism::actor]
impl SplitCoordinator {
    fn new(plan: LazyDataset, n: usize, equal: bool) -> Self {
        SplitCoordinator {
            plan,
            n,
            equal,
            run: Mutex::new(None),
            last_stats: Vec::new(),
        }
    }

    /// The next block for `split` in `epoch`.
    fn next(&mut self, split: usize, epoch: u64) -> std::result::Result<Next, String> {
        if split >= self.n {
            return Err(format!("there are only {} splits", self.n));
        }
        let slot = self.run.get_mut().unwrap_or_else(|p| p.into_inner());
        let current = slot.as_ref().map(|r| r.epoch);
        match current {
            Some(e) if e > epoch => {
                return Err(format!(
                    "epoch {epoch} is over: the splits are reading epoch {e}; every split must read each epoch once, in order"
                ))
            }
            Some(e) if e < epoch => {
                let run = slot.as_mut().expect("a run is present");
                // Asking for a later epoch ends this split's earlier one.
                run.ended[split] = true;
                if !run.ended.iter().all(|d| *d) {
                    return Ok(Next::Wait);
                }
                self.last_stats = run.stream_stats();
                *slot = None;
            }
            _ => {}
        }
        if slot.is_none() {
            let stream = self.plan.stream().map_err(|e| e.to_string())?;
            *slot = Some(EpochRun {
                epoch,
                stream,
                done: false,
                failed: None,
                given: vec![0; self.n],
                ended: vec![false; self.n],
                held: VecDeque::new(),
                held_rows: 0,
                largest: 0,
                finals: None,
            });
        }
        let equal = self.equal;
        let run = slot.as_mut().expect("a run was just made");
        if let Some(message) = &run.failed {
            return Err(message.clone());
        }
        if run.ended[split] {
            return Ok(Next::End);
        }
        // A block handed out lives on as long as the split's handle: the
        // runtime counts each handout as a borrow of its own, so a block
        // given to two splits of one process outlives the first one's
        // release.
        if equal {
            run.next_equal(split)
        } else {
            run.next_any(split)
        }
    }

    /// `split` stops reading `epoch` early (its iterator was dropped).
    fn finish(&mut self, split: usize, epoch: u64) {
        let slot = self.run.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(run) = slot.as_mut().filter(|r| r.epoch == epoch) {
            if let Some(e) = run.ended.get_mut(split) {
                *e = true;
            }
        }
    }

    /// The rows each split gets per epoch, when known without running.
    fn rows_per_split(&self) -> Option<usize> {
        let total = self.plan.count_if_known()?;
        self.equal.then_some(total / self.n)
    }

    /// The stats of the current epoch's run, or the last finished one's.
    fn stats(&self) -> Vec<StageStats> {
        let slot = self.run.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref()
            .map(EpochRun::stream_stats)
            .unwrap_or_else(|| self.last_stats.clone())
    }
}

impl EpochRun {
    fn stream_stats(&self) -> Vec<StageStats> {
        self.stream.stats()
    }
}

/// One split's handle on the coordinator, held by its [`DataIterator`]s.
///
/// [`DataIterator`]: super::DataIterator
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SplitHandle {
    pub(crate) coordinator: ActorHandle<SplitCoordinator>,
    pub(crate) split: usize,
    pub(crate) schema: Option<Schema>,
    /// Held by the split's handles in the process that made the split
    /// (not sent along): its progress line stops once they are all gone,
    /// and lets the coordinator end with the last handle anywhere.
    #[serde(skip)]
    pub(crate) _alive: Option<std::sync::Arc<()>>,
}

impl SplitHandle {
    fn error(&self, message: impl ToString) -> DataError {
        DataError::Split {
            split: self.split,
            message: message.to_string(),
        }
    }

    /// One epoch's batches.
    pub(crate) fn epoch(&self, epoch: u64, batch_size: usize, drop_last: bool) -> StreamBatches {
        let blocks = SplitBlocks {
            handle: self.clone(),
            epoch,
            ended: false,
        };
        StreamBatches::new(Box::new(blocks), None, batch_size, drop_last)
    }

    /// The rows per epoch, when the coordinator knows them up front.
    pub(crate) fn rows_per_epoch(&self) -> Result<Option<usize>> {
        let r = self
            .coordinator
            .rows_per_split()
            .map_err(|e| self.error(e))?;
        prism::get(&r).map_err(|e| self.error(e))
    }

    /// What the pipeline's stages did in the current (or last) epoch.
    pub(crate) fn stats(&self) -> Result<Vec<StageStats>> {
        let r = self.coordinator.stats().map_err(|e| self.error(e))?;
        prism::get(&r).map_err(|e| self.error(e))
    }
}

/// The batches of one split's epoch, as they come from the coordinator.
struct SplitBlocks {
    handle: SplitHandle,
    epoch: u64,
    ended: bool,
}

impl SplitBlocks {
    fn ask(&self) -> Result<Next> {
        let h = &self.handle;
        let r = h
            .coordinator
            .next(h.split, self.epoch)
            .map_err(|e| h.error(format!("cannot reach the coordinator: {e}")))?;
        prism::get(&r).map_err(|e| h.error(e))
    }
}

impl Iterator for SplitBlocks {
    type Item = Result<Chunk>;

    fn next(&mut self) -> Option<Result<Chunk>> {
        if self.ended {
            return None;
        }
        let started = Instant::now();
        let mut backoff = Backoff::new(Duration::from_micros(500), Duration::from_millis(20));
        loop {
            match self.ask() {
                Ok(Next::Block { data, start, end }) => {
                    let block = Block {
                        data,
                        start,
                        rows: end - start,
                        bytes: 0,
                    };
                    return Some(Chunk::open(&block));
                }
                Ok(Next::End) => {
                    self.ended = true;
                    return None;
                }
                Ok(Next::Wait) if started.elapsed() < WAIT_LIMIT => {
                    backoff.sleep();
                }
                Ok(Next::Wait) => {
                    self.ended = true;
                    return Some(Err(self.handle.error(format!(
                        "waited {} s for the other splits to read their share of epoch {}; every split must read every epoch",
                        WAIT_LIMIT.as_secs(),
                        self.epoch
                    ))));
                }
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Drop for SplitBlocks {
    fn drop(&mut self) {
        if !self.ended {
            // Fire and forget: the other splits must not wait for this one.
            let _ = self
                .handle
                .coordinator
                .finish(self.handle.split, self.epoch);
        }
    }
}
