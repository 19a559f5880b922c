//! A pipeline whose consumer stops early releases every block it held: the
//! node's object store goes back to what it held before. Alone in its
//! binary, so that no other test's objects share the store.

use prism_train::data::{Batch, Column, DataError, ExecutionOptions, LazyDataset};
use std::time::{Duration, Instant};

fn store_bytes() -> (u64, u64) {
    let s = prism::object_store_stats().expect("the store answers");
    (s.used_bytes, s.num_objects)
}

/// Waits (up to 20 s) for the store to hold what it held at `baseline`.
fn back_to(baseline: (u64, u64)) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = store_bytes();
        if now == baseline || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn widen(batch: Batch) -> Result<Batch, DataError> {
    let n = batch.num_rows();
    batch.with_column("wide", Column::tensor(vec![0.5; n * 64], 64)?)
}

#[test]
fn a_consumer_that_stops_early_leaves_no_block_in_the_store() {
    prism::init(prism::Config::default().num_cpus(2)).expect("the embedded cluster must start");
    // Blocks of 8,192 rows of 264 bytes: 2 MiB each, far past the size
    // that travels inline, so each lives in the store.
    let ds = LazyDataset::range(400_000)
        .with_options(ExecutionOptions {
            max_tasks_in_flight: Some(4),
            ..ExecutionOptions::default()
        })
        .map_batches(widen, 8192)
        .unwrap();
    let baseline = store_bytes();

    let mut batches = ds.iter_batches(1000, false).unwrap();
    assert_eq!(batches.next().unwrap().unwrap().num_rows(), 1000);
    assert!(
        store_bytes().1 > baseline.1,
        "blocks are in the store while it runs"
    );
    drop(batches);
    assert_eq!(
        back_to(baseline),
        baseline,
        "every block freed after an early stop"
    );

    // Read to the end: the same.
    let rows: usize = ds
        .iter_batches(1000, false)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(rows, 400_000);
    assert_eq!(
        back_to(baseline),
        baseline,
        "every block freed after a full read"
    );

    prism::shutdown();
}
