//! Injected faults (the raylet's fail points; build with
//! `--features failpoints`): each test turns one on with `FAILPOINTS` in a
//! child process running its own cluster, and checks that the fault gives
//! the caller a clear error, or is recovered from, with nothing else lost.
#![cfg(feature = "failpoints")]

mod common;

use common::{in_own_process, must};
use prism::{ActorOptions, Error, TaskOptions};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Runs test `name` in a child process of its own with
/// `FAILPOINTS=failpoints`.
fn in_child(name: &str, failpoints: &str) -> bool {
    in_own_process(
        name,
        &[("FAILPOINTS", failpoints)],
        Duration::from_secs(120),
    )
}

fn small_cluster() -> prism::Config {
    prism::Config::default()
        .num_cpus(1)
        .object_store_memory(8 << 20)
}

#[prism::remote]
fn square(x: i64) -> i64 {
    x * x
}

#[prism::actor(max_restarts = 3)]
struct Phoenix;

#[prism::actor]
impl Phoenix {
    fn new() -> Self {
        Phoenix
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}

fn mentions(err: &Error, point: &str) -> bool {
    err.to_string().contains(&format!("fail point {point}")) || err.to_string().contains(point)
}

#[test]
fn a_worker_that_cannot_start_fails_its_tasks_naming_why() {
    let name = "a_worker_that_cannot_start_fails_its_tasks_naming_why";
    if !in_child(name, "worker_start=return") {
        return;
    }
    let err = match prism::init(small_cluster()) {
        Err(e) => e,
        Ok(()) => prism::get_timeout(&square::remote(3).unwrap(), LIMIT).unwrap_err(),
    };
    assert!(mentions(&err, "worker_start"), "{err}");
}

#[test]
fn a_refused_lease_fails_its_task_and_the_next_one_runs() {
    let name = "a_refused_lease_fails_its_task_and_the_next_one_runs";
    if !in_child(name, "lease_grant=1*return") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let err = prism::get_timeout(&square::remote(3).unwrap(), LIMIT).unwrap_err();
    assert!(mentions(&err, "lease_grant"), "{err}");
    assert_eq!(
        prism::get_timeout(&square::remote(4).unwrap(), LIMIT).unwrap(),
        16
    );
    prism::shutdown();
}

#[test]
fn a_seal_that_fails_fails_the_put_and_leaves_the_store_usable() {
    let name = "a_seal_that_fails_fails_the_put_and_leaves_the_store_usable";
    if !in_child(name, "object_seal=1*return") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let err = prism::put(vec![1u8; 1 << 20]).unwrap_err();
    assert!(mentions(&err, "object_seal"), "{err}");
    let r = must(prism::put(vec![2u8; 1 << 20]), "the next put works");
    assert_eq!(prism::get(&r).unwrap()[0], 2);
    prism::shutdown();
}

#[test]
fn a_spill_that_cannot_be_written_keeps_the_object_and_reports_a_full_store() {
    let name = "a_spill_that_cannot_be_written_keeps_the_object_and_reports_a_full_store";
    if !in_child(name, "spill_write=return") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let kept = must(prism::put(vec![7u8; 6 << 20]), "the first put fits");
    let err = prism::put(vec![8u8; 6 << 20]).unwrap_err();
    assert!(matches!(err, Error::ObjectStoreFull { .. }), "{err}");
    assert_eq!(
        prism::get(&kept).unwrap()[100],
        7,
        "the object whose spill failed is intact"
    );
    prism::shutdown();
}

#[test]
fn a_spill_file_that_cannot_be_read_back_fails_the_get_and_is_kept() {
    let name = "a_spill_file_that_cannot_be_read_back_fails_the_get_and_is_kept";
    if !in_child(name, "restore_read=1*return") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let first = must(prism::put(vec![1u8; 5 << 20]), "the first put fits");
    let second = must(
        prism::put(vec![2u8; 5 << 20]),
        "the second spills the first",
    );
    let err = prism::get(&first).unwrap_err();
    assert!(mentions(&err, "restore_read"), "{err}");
    assert_eq!(prism::get(&second).unwrap()[0], 2);
    assert_eq!(
        prism::get(&first).unwrap()[0],
        1,
        "the spill file was kept: a later get reads it back"
    );
    prism::shutdown();
}

#[test]
fn an_actor_whose_restart_fails_dies_naming_why() {
    let name = "an_actor_whose_restart_fails_dies_naming_why";
    if !in_child(name, "actor_restart=return") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let actor = Phoenix::remote_with(ActorOptions::new()).unwrap();
    let pid = prism::get(&actor.pid().unwrap()).unwrap();
    common::kill(pid);
    let err = common::must_become("the actor dies once its restart fails", LIMIT, || {
        prism::get_timeout(&actor.pid().unwrap(), LIMIT).err()
    });
    assert!(
        matches!(&err, Error::ActorDied { reason, .. } if reason.contains("actor_restart")),
        "{err}"
    );
    // Tasks are unaffected.
    let once = TaskOptions::new().max_retries(0);
    assert_eq!(
        prism::get_timeout(&square::remote_with(once, 5).unwrap(), LIMIT).unwrap(),
        25
    );
    prism::shutdown();
}

/// A counter whose state survives restarts through a checkpoint after
/// every call.
#[prism::actor(checkpoint, max_restarts = 3, max_task_retries = 1)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Tally {
    count: u32,
}

#[prism::actor]
impl Tally {
    fn new() -> Self {
        Tally { count: 0 }
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
fn a_failed_checkpoint_commit_keeps_the_previous_checkpoint() {
    let name = "a_failed_checkpoint_commit_keeps_the_previous_checkpoint";
    // Every call saves a checkpoint: the first two saves commit, the third
    // fails, later ones commit.
    if !in_child(name, "checkpoint_commit=2*off->1*return->off") {
        return;
    }
    must(prism::init(small_cluster()), "a cluster starts");
    let tally = Tally::remote_with(ActorOptions::new().checkpoint_every(1)).unwrap();
    let pid = prism::get_timeout(&tally.pid().unwrap(), LIMIT).unwrap(); // save 1: 0
    assert_eq!(prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(), 1); // save 2: 1
    assert_eq!(
        prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(),
        2,
        "a call answers even when its checkpoint does not commit"
    ); // save 3 fails
    common::kill(pid);
    assert_eq!(
        prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(),
        2,
        "restarted from the checkpoint before the failed one: the call whose save failed is lost"
    ); // save 4: 2
    let pid = prism::get_timeout(&tally.pid().unwrap(), LIMIT).unwrap(); // save 5: 2
    assert_eq!(prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(), 3); // save 6: 3
    common::kill(pid);
    assert_eq!(
        prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(),
        4,
        "checkpoints commit again after the failure"
    );
    prism::shutdown();
}
