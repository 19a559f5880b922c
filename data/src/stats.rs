//! [`StageStats`]: what each step of a pipeline did in one run. A leaf:
//! the executor fills them in, and the streams, splits and iterators that
//! read a pipeline hand them out.

use serde::{Deserialize, Serialize};
use std::time::Duration;

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
    /// Tasks running now (0 once the step is done).
    pub in_flight: usize,
    /// The most actors its pool ran at once (0 for a step of tasks).
    pub peak_actors: usize,
    /// Actors of its pool stopped for being idle (a range pool shrinks
    /// back towards its `min`).
    pub actors_stopped_idle: usize,
}

impl std::fmt::Display for StageStats {
    /// One line: `ReadParquet->MapBatches: 11 blocks, 70000 rows, 219.6 MB
    /// in 0.312 s (224k rows/s, 704 MB/s); consumer waited 0.101 s; at most
    /// 4 tasks at once`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.wall.as_secs_f64().max(1e-9);
        write!(
            f,
            "{}: {} blocks, {} rows, {:.1} MB in {:.3} s ({:.0}k rows/s, {:.0} MB/s); consumer waited {:.3} s; at most {} tasks at once",
            self.name,
            self.blocks,
            self.rows,
            self.bytes as f64 / 1e6,
            self.wall.as_secs_f64(),
            self.rows as f64 / secs / 1e3,
            self.bytes as f64 / secs / 1e6,
            self.waited.as_secs_f64(),
            self.peak_tasks,
        )?;
        if self.peak_actors > 0 {
            write!(f, "; {} actors at most", self.peak_actors)?;
        }
        if self.actors_stopped_idle > 0 {
            write!(f, ", {} stopped idle", self.actors_stopped_idle)?;
        }
        Ok(())
    }
}
