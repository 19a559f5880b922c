//! A second driver joins a running cluster through PRISM_ADDRESS, detached
//! actors outlive the driver that made them, and requests wait until their
//! resources are free.

mod common;

use common::{cluster, is_gone, must, must_become, must_eventually, must_run_child};
use prism::{ActorHandle, ActorOptions, Error};
use std::time::Duration;

#[prism::remote]
fn square(x: i64) -> i64 {
    x * x
}

/// Holds the cluster's only "special" unit for a while; returns when it
/// started and ended, in ms since the Unix epoch.
#[prism::remote(resource("special", 1.0))]
fn hold_special(ms: u64) -> (u128, u128) {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    };
    let start = now();
    std::thread::sleep(Duration::from_millis(ms));
    (start, now())
}

#[test]
fn a_second_driver_joins_through_prism_address() {
    if std::env::var_os("PRISM_JOIN_CHILD").is_some() {
        // The child: a driver of its own job on the parent's cluster.
        prism::init(prism::Config::default()).expect("joins the running cluster");
        assert_eq!(prism::get(&square::remote(12).unwrap()).unwrap(), 144);
        prism::shutdown();
        return;
    }
    cluster();
    let session = prism::runtime_context().unwrap().session_dir;
    must_run_child(
        "the joining driver",
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_second_driver_joins_through_prism_address",
                "--nocapture",
            ])
            .env("PRISM_JOIN_CHILD", "1")
            .env("PRISM_ADDRESS", &session),
        Duration::from_secs(60),
    );
}

#[test]
fn joining_an_address_where_nothing_runs_is_a_clear_error() {
    if std::env::var_os("PRISM_JOIN_CHILD").is_some() {
        return;
    }
    // Checked in a child so this process's own cluster is untouched.
    if std::env::var_os("PRISM_JOIN_NOWHERE").is_some() {
        let err = prism::init(prism::Config::default()).unwrap_err();
        assert!(err.to_string().contains("is it running?"), "{err}");
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "joining_an_address_where_nothing_runs_is_a_clear_error",
            "--nocapture",
        ])
        .env("PRISM_JOIN_NOWHERE", "1")
        .env("PRISM_ADDRESS", "/nonexistent/prism/raylet.sock")
        .status()
        .unwrap();
    assert!(status.success(), "the child failed: {status}");
}

#[test]
fn tasks_wait_until_their_resources_are_free() {
    if std::env::var_os("PRISM_JOIN_CHILD").is_some() {
        return;
    }
    cluster();
    // The node has one "special": three tasks that each need it must run
    // one after another, never overlapping.
    let refs: Vec<_> = (0..3).map(|_| hold_special::remote(200).unwrap()).collect();
    let mut spans = prism::get_many(&refs).unwrap();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "tasks holding the only unit overlapped: {spans:?}"
        );
    }
}

#[prism::remote]
fn pid_after(ms: u64) -> u32 {
    std::thread::sleep(Duration::from_millis(ms));
    std::process::id()
}

#[test]
fn workers_started_for_a_burst_are_stopped_when_idle() {
    if std::env::var_os("PRISM_JOIN_CHILD").is_some() {
        return;
    }
    if std::env::var_os("PRISM_IDLE_CHILD").is_none() {
        // In a child, with a short idle timeout, so this binary's shared
        // cluster keeps its defaults.
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "workers_started_for_a_burst_are_stopped_when_idle",
                "--nocapture",
            ])
            .env("PRISM_IDLE_CHILD", "1")
            .env("PRISM_IDLE_WORKER_TIMEOUT_MS", "300")
            .status()
            .unwrap();
        assert!(status.success(), "the child failed: {status}");
        return;
    }
    prism::init(prism::Config::default().num_cpus(2)).unwrap();
    let zero_cpu = prism::TaskOptions::new().num_cpus(0.0);
    let refs: Vec<_> = (0..6)
        .map(|_| pid_after::remote_with(zero_cpu.clone(), 300).unwrap())
        .collect();
    let pids: std::collections::HashSet<u32> =
        prism::get_many(&refs).unwrap().into_iter().collect();
    assert!(
        pids.len() > 2,
        "six concurrent zero-CPU tasks should have grown the pool: {pids:?}"
    );
    must_eventually(
        "idle workers beyond the pool of two stop",
        Duration::from_secs(20),
        || pids.iter().filter(|p| !is_gone(**p)).count() <= 2,
    );
    prism::shutdown();
}

#[prism::actor]
struct Tally {
    count: u32,
}

#[prism::actor]
impl Tally {
    fn new(start: u32) -> Self {
        Tally { count: start }
    }

    fn add(&mut self) -> u32 {
        self.count += 1;
        self.count
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}

#[test]
fn a_detached_actor_outlives_its_driver_and_another_driver_finds_it() {
    if std::env::var_os("PRISM_JOIN_CHILD").is_some() {
        return;
    }
    if std::env::var_os("PRISM_DETACHED_CHILD").is_some() {
        // The first driver: one detached actor, one that ends with it.
        prism::init(prism::Config::default()).expect("joins the running cluster");
        let options = ActorOptions::new().namespace("detached-test");
        let kept = Tally::remote_with(options.clone().name("kept").detached(), 10).unwrap();
        let gone = Tally::remote_with(options.name("gone"), 0).unwrap();
        assert_eq!(prism::get(&kept.add().unwrap()).unwrap(), 11);
        prism::get(&gone.pid().unwrap()).unwrap();
        prism::shutdown();
        return;
    }
    cluster();
    let session = prism::runtime_context().unwrap().session_dir;
    must_run_child(
        "the driver that creates a detached actor",
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_detached_actor_outlives_its_driver_and_another_driver_finds_it",
                "--nocapture",
            ])
            .env("PRISM_DETACHED_CHILD", "1")
            .env("PRISM_ADDRESS", &session),
        Duration::from_secs(60),
    );
    let kept: ActorHandle<Tally> = must(
        prism::get_actor_in("kept", "detached-test"),
        "a detached actor is found by name after its driver exited",
    );
    assert_eq!(
        prism::get(&kept.add().unwrap()).unwrap(),
        12,
        "it kept its state"
    );
    let err = must_become(
        "the creator's other actor ends with its job",
        Duration::from_secs(20),
        || prism::get_actor_in::<Tally>("gone", "detached-test").err(),
    );
    // Its name says that it died, and why.
    match &err {
        Error::NamedActorDied { death, .. } => {
            assert!(death.cause.contains("its job ended"), "{err}")
        }
        other => panic!("the name must say its actor died: {other}"),
    }
    prism::kill(&kept).unwrap();
}
