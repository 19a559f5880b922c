//! A leased worker its holder keeps idle, for back-to-back calls, goes
//! back as soon as another request waits for what it holds. Here the
//! driver keeps idle workers for ten minutes on a one-CPU node, so a
//! request that had to wait out that hold would time out instead.

mod common;

use common::{must, ClusterSpec};
use std::time::Duration;

/// The driver's hold on an idle worker.
const HOLD: Duration = Duration::from_secs(600);

/// How long a waiting request may take: far below `HOLD`.
const LIMIT: Duration = Duration::from_secs(60);

fn cluster() {
    ClusterSpec::new().cpus(1).lease_idle(HOLD).start();
}

#[prism::remote]
fn one_cpu() -> u32 {
    std::process::id()
}

#[prism::remote(num_cpus = 0.5)]
fn half_cpu() -> u32 {
    std::process::id()
}

/// Another client: a process of its own that runs `n` one-CPU tasks.
#[prism::remote(num_cpus = 0)]
fn client(n: u32) -> u32 {
    let refs: Vec<_> = (0..n).map(|_| one_cpu::remote().expect("submit")).collect();
    prism::get_many_timeout(&refs, LIMIT)
        .expect("the client's tasks get the CPU")
        .len() as u32
}

#[test]
fn another_client_gets_the_cpu_a_driver_keeps_idle() {
    cluster();
    // The driver's worker now holds the node's one CPU, idle.
    must(
        prism::get_timeout(&one_cpu::remote().expect("submit"), LIMIT),
        "the driver's task runs",
    );
    let done = client::remote(20).expect("submit the client");
    let ran = must(
        prism::get_timeout(&done, LIMIT),
        "another client's tasks run while the driver keeps its idle worker",
    );
    assert_eq!(ran, 20);
    // The driver runs again afterwards.
    must(
        prism::get_timeout(&one_cpu::remote().expect("submit"), LIMIT),
        "the driver's next task runs",
    );
}

#[test]
fn a_task_of_another_shape_gets_the_cpu_its_own_driver_keeps_idle() {
    cluster();
    must(
        prism::get_timeout(&one_cpu::remote().expect("submit"), LIMIT),
        "a one-CPU task runs",
    );
    // Its worker holds the CPU for `one_cpu`'s shape; half a CPU is
    // another shape, with leases of its own.
    let refs: Vec<_> = (0..4)
        .map(|_| half_cpu::remote().expect("submit"))
        .collect();
    let ran = must(
        prism::get_many_timeout(&refs, LIMIT),
        "half-CPU tasks run while the driver keeps its one-CPU worker",
    );
    assert_eq!(ran.len(), 4);
}
