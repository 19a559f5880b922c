//! Data ingest, timed: Fashion-MNIST's Parquet files read by tasks,
//! scaled to `float32` by `map_batches`, and consumed in batches of 128,
//! first by the driver, then through `streaming_split(2)` by two actors.
//! The same pipelines as `bench/ray/data_ray.py` runs on Ray Data.
//!
//! ```text
//! bash scripts/fetch-dataset.sh fashion-mnist --parquet
//! cargo run --release -p prism-data --example ingest
//! ```
//!
//! Options: `--data DIR` (the folder `fetch-dataset.sh --parquet` printed;
//! its `train/` and `test/` files are read: 70,000 rows in 11 files),
//! `--runs N` (default 5), `--budget-mib N` (the pipeline's memory budget,
//! default 512), `--json` (one JSON object per run instead of text).
//!
//! Each run prints the seconds it took, the rows per second, and the most
//! bytes of finished blocks the pipeline could hold ahead of its consumer
//! (its peak number of tasks times its average block), which the budget
//! bounds; the last run also prints its stages' stats. On a terminal the
//! pipeline shows a live progress line (`PRISM_DATA_PROGRESS=0` hides it).

use prism_data::{
    Batch, Column, DataError, DataIterator, ExecutionOptions, LazyDataset, StageStats,
};
use std::path::PathBuf;
use std::time::Instant;

type BoxError = Box<dyn std::error::Error>;

fn scale(batch: Batch) -> Result<Batch, DataError> {
    let image = batch.tensor("image")?;
    let (scaled, row_len) = (
        image.values.iter().map(|v| v / 255.0).collect(),
        image.row_len,
    );
    batch.with_column("image", Column::tensor(scaled, row_len)?)
}

/// One consumer of a streaming split, in its own worker process.
#[prism::actor]
struct Consumer;

#[prism::actor]
impl Consumer {
    fn new() -> Self {
        Consumer
    }

    /// Reads one epoch of its split; returns the rows read.
    fn consume(&self, split: DataIterator) -> Result<usize, String> {
        let mut rows = 0;
        for batch in split.iter_batches(128, false).map_err(|e| e.to_string())? {
            rows += batch.map_err(|e| e.to_string())?.num_rows();
        }
        Ok(rows)
    }
}

struct Args {
    data: PathBuf,
    runs: usize,
    budget_mib: usize,
    json: bool,
}

fn args() -> Result<Args, BoxError> {
    let home = std::env::var("HOME").unwrap_or_else(|_| ".".into());
    let dir =
        std::env::var("PRISM_DATA_DIR").unwrap_or_else(|_| format!("{home}/.cache/prism/datasets"));
    let mut a = Args {
        data: PathBuf::from(dir).join("fashion-mnist-parquet"),
        runs: 5,
        budget_mib: 512,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => a.data = PathBuf::from(value()?),
            "--runs" => a.runs = value()?.parse()?,
            "--budget-mib" => a.budget_mib = value()?.parse()?,
            "--json" => a.json = true,
            other => return Err(format!("unknown option {other}; see the example's docs").into()),
        }
    }
    Ok(a)
}

fn held_bytes(stats: &[StageStats]) -> usize {
    stats
        .iter()
        .map(|s| s.peak_tasks * s.bytes.checked_div(s.blocks).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

fn report(a: &Args, name: &str, run: usize, rows: usize, seconds: f64, stats: &[StageStats]) {
    let held = held_bytes(stats);
    if a.json {
        println!(
            "{{\"system\": \"prism\", \"pipeline\": \"{name}\", \"run\": {run}, \"rows\": {rows}, \"seconds\": {seconds:.4}, \"rows_per_second\": {:.0}, \"held_bytes\": {held}}}",
            rows as f64 / seconds
        );
    } else {
        println!(
            "{name} run {run}: {rows} rows in {seconds:.3} s, {:.0} rows/s, at most {:.1} MiB of blocks ahead",
            rows as f64 / seconds,
            held as f64 / (1 << 20) as f64
        );
    }
}

fn main() -> Result<(), BoxError> {
    let a = args()?;
    prism::init(prism::Config::default())?;
    let options = ExecutionOptions {
        memory_budget_bytes: a.budget_mib << 20,
        ..ExecutionOptions::default()
    };
    let dirs = [a.data.join("train"), a.data.join("test")];
    let ds = LazyDataset::read_parquet(&dirs)
        .map_err(|e| format!("{e}; run bash scripts/fetch-dataset.sh fashion-mnist --parquet"))?
        .with_options(options)
        .map_batches(scale, 1024)?;
    let consumers = [Consumer::remote()?, Consumer::remote()?];
    for run in 0..a.runs {
        let start = Instant::now();
        let mut batches = ds.iter_batches(128, false)?;
        let mut rows = 0;
        for batch in batches.by_ref() {
            rows += batch?.num_rows();
        }
        report(
            &a,
            "iter_batches",
            run,
            rows,
            start.elapsed().as_secs_f64(),
            &batches.stats(),
        );
        if !a.json && run + 1 == a.runs {
            for stage in batches.stats() {
                println!("  {stage}");
            }
        }

        let start = Instant::now();
        let splits = ds.streaming_split(2, true)?;
        let calls = consumers
            .iter()
            .zip(splits.iter().cloned())
            .map(|(c, s)| c.consume(s))
            .collect::<Result<Vec<_>, _>>()?;
        let rows: usize = prism::get_many(&calls)?.into_iter().sum();
        let seconds = start.elapsed().as_secs_f64();
        report(
            &a,
            "streaming_split_2",
            run,
            rows,
            seconds,
            &splits[0].stats()?,
        );
    }
    Ok(())
}
