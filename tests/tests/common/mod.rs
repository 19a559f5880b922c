//! Shared helpers: one embedded cluster per test binary, bounded waits.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Starts this binary's cluster once (tests in one process share it; under
/// nextest each test process starts its own). Two CPUs, two fake GPUs and a
/// custom resource, whatever the machine has.
pub fn cluster() {
    prism::init(
        prism::Config::default()
            .num_cpus(2)
            .num_gpus(2)
            .resource("special", 1.0)
            .object_store_memory(1 << 30)
            .ignore_reinit_error(true),
    )
    .expect("the embedded cluster must start");
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub fn must_eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not true after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
