//! An actor pipeline: a source produces batches, a chain of stage actors
//! transforms them, a sink actor aggregates. Stages pass ObjectRefs along,
//! so batches move between processes without going through the driver.
//!
//! Run: `cargo run --release --example pipeline [batches]`

use prism::{ActorHandle, ObjectRef};
use std::time::Instant;

/// Normalizes each batch: subtracts the running mean it has seen so far.
#[prism::actor]
struct Normalize {
    seen: u64,
    mean: f64,
}

#[prism::actor]
impl Normalize {
    fn new() -> Self {
        Normalize { seen: 0, mean: 0.0 }
    }

    fn apply(&mut self, batch: Vec<f64>) -> Vec<f64> {
        for x in &batch {
            self.seen += 1;
            self.mean += (x - self.mean) / self.seen as f64;
        }
        batch.into_iter().map(|x| x - self.mean).collect()
    }
}

/// Squares every element.
#[prism::actor]
struct Square;

#[prism::actor]
impl Square {
    fn new() -> Self {
        Square
    }

    fn apply(&self, batch: Vec<f64>) -> Vec<f64> {
        batch.into_iter().map(|x| x * x).collect()
    }
}

/// Keeps running totals; named so any process can find it.
#[prism::actor(name = "pipeline-sink")]
struct Sink {
    batches: u64,
    total: f64,
}

#[prism::actor]
impl Sink {
    fn new() -> Self {
        Sink {
            batches: 0,
            total: 0.0,
        }
    }

    fn add(&mut self, batch: Vec<f64>) -> u64 {
        self.batches += 1;
        self.total += batch.iter().sum::<f64>();
        self.batches
    }

    fn summary(&self) -> (u64, f64) {
        (self.batches, self.total)
    }
}

/// A task that makes batch `i` (the pipeline's source).
#[prism::remote]
fn make_batch(i: u64, len: usize) -> Vec<f64> {
    (0..len)
        .map(|j| ((i as usize * len + j) % 97) as f64)
        .collect()
}

/// Runs one batch through the stages, each call taking the last one's ref.
fn push_through(
    batch: ObjectRef<Vec<f64>>,
    normalize: &ActorHandle<Normalize>,
    square: &ActorHandle<Square>,
    sink: &ActorHandle<Sink>,
) -> prism::Result<ObjectRef<u64>> {
    let normalized = normalize.apply(&batch)?;
    let squared = square.apply(&normalized)?;
    sink.add(&squared)
}

#[prism::main]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let batches: u64 = match std::env::args().nth(1) {
        None => 200,
        Some(s) => s
            .parse()
            .map_err(|_| format!("batches must be a whole number, got {s:?}"))?,
    };
    let len = 10_000;
    prism::init(prism::Config::default())?;
    let normalize = Normalize::remote()?;
    let square = Square::remote()?;
    Sink::remote()?;
    let sink: ActorHandle<Sink> = prism::get_actor("pipeline-sink")?;

    let start = Instant::now();
    let mut last = None;
    for i in 0..batches {
        let batch = make_batch::remote(i, len)?;
        last = Some(push_through(batch, &normalize, &square, &sink)?);
    }
    if let Some(last) = last {
        prism::get(&last)?;
    }
    let elapsed = start.elapsed();
    let (count, total) = prism::get(&sink.summary()?)?;
    println!(
        "{count} batches of {len} values through 3 actors in {:.3} s",
        elapsed.as_secs_f64()
    );
    println!(
        "{:.0} batches/s, {:.1} M values/s; sum of squares of normalized values: {total:.1}",
        count as f64 / elapsed.as_secs_f64(),
        (count as usize * len) as f64 / elapsed.as_secs_f64() / 1e6
    );
    Ok(())
}
