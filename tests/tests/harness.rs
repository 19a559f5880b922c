//! The harness itself, on a real cluster: it finds the workers the raylet
//! forked, kills one by pid, and the node replaces it and keeps serving.

mod common;

use common::{must, must_become, must_eventually, ClusterSpec};
use std::time::Duration;

#[prism::remote]
fn my_pid() -> u32 {
    std::process::id()
}

#[test]
fn a_worker_killed_by_pid_is_replaced_and_the_node_keeps_serving() {
    let cluster = ClusterSpec::new().cpus(2).start();
    let pid = must(
        prism::get(&must(my_pid::remote(), "a task must be submitted")),
        "a task must run on a worker",
    );
    must_eventually(
        "the task's worker is found among the cluster's workers",
        Duration::from_secs(10),
        || cluster.worker_pids().contains(&pid),
    );
    cluster.kill_worker(pid, Duration::from_secs(10));
    // The raylet refills its pool of two (one per CPU) without the killed one.
    let pool = must_become(
        "the pool is back to two workers, the killed one not among them",
        Duration::from_secs(20),
        || {
            let pids = cluster.worker_pids();
            (pids.len() >= 2 && !pids.contains(&pid)).then_some(pids)
        },
    );
    let refs: Vec<_> = (0..4)
        .map(|_| must(my_pid::remote(), "a task must be submitted"))
        .collect();
    let ran_on = must(prism::get_many(&refs), "tasks must run after the kill");
    assert!(
        ran_on.iter().all(|p| *p != pid),
        "no task may run on the killed worker {pid}: {ran_on:?}"
    );
    assert!(
        ran_on.iter().any(|p| pool.contains(p)),
        "tasks must run on the refilled pool {pool:?}: {ran_on:?}"
    );
    prism::shutdown();
}
