//! Actors through a real cluster: order, concurrency, handles passed
//! around, names, kill, constructor failure.

mod common;

use common::{cluster, wait_until};
use prism::{ActorHandle, ActorOptions, Error, ObjectRef};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[prism::actor]
struct Log {
    entries: Vec<(u32, u32)>,
}

#[prism::actor]
impl Log {
    fn new() -> Self {
        Log {
            entries: Vec::new(),
        }
    }

    fn append(&mut self, caller: u32, seq: u32) -> usize {
        self.entries.push((caller, seq));
        self.entries.len()
    }

    fn entries(&self) -> Vec<(u32, u32)> {
        self.entries.clone()
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }

    async fn len_async(&self) -> usize {
        tokio::task::yield_now().await;
        self.entries.len()
    }
}

#[prism::remote]
fn append_from_task(log: ActorHandle<Log>, caller: u32, count: u32) -> usize {
    let mut last = None;
    for seq in 0..count {
        last = Some(log.append(caller, seq).expect("a task can call an actor"));
    }
    last.map(|r| prism::get(&r).expect("and get the result"))
        .unwrap_or(0)
}

#[prism::remote]
fn make_log() -> ActorHandle<Log> {
    Log::remote().expect("a task can create an actor")
}

static INSIDE: AtomicUsize = AtomicUsize::new(0);

#[prism::actor(max_concurrency = 4)]
struct Gate;

#[prism::actor]
impl Gate {
    fn new() -> Self {
        Gate
    }

    /// Returns true if `n` calls were inside at once within the deadline.
    fn rendezvous(&self, n: usize) -> bool {
        INSIDE.fetch_add(1, Ordering::SeqCst);
        let met = wait_until(Duration::from_secs(10), || {
            INSIDE.load(Ordering::SeqCst) >= n
        });
        // Stay a little so the others see the count too.
        std::thread::sleep(Duration::from_millis(100));
        met
    }
}

/// A `max_concurrency` actor that counts its own calls inside, so that
/// bursts can follow each other on the same instance.
#[prism::actor(max_concurrency = 3)]
struct Burst {
    inside: AtomicUsize,
}

#[prism::actor]
impl Burst {
    fn new() -> Self {
        Burst {
            inside: AtomicUsize::new(0),
        }
    }

    fn ping(&self) -> u32 {
        1
    }

    /// Returns true if `n` calls were inside at once within the deadline;
    /// leaves the count as it found it.
    fn rendezvous(&self, n: usize) -> bool {
        self.inside.fetch_add(1, Ordering::SeqCst);
        let met = wait_until(Duration::from_secs(10), || {
            self.inside.load(Ordering::SeqCst) >= n
        });
        std::thread::sleep(Duration::from_millis(100));
        self.inside.fetch_sub(1, Ordering::SeqCst);
        met
    }
}

#[derive(Debug)]
struct BadConfig;

impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("capacity must be positive")
    }
}

#[prism::actor]
struct Picky {
    capacity: i64,
}

#[prism::actor]
impl Picky {
    fn new(capacity: i64) -> Result<Self, BadConfig> {
        if capacity > 0 {
            Ok(Picky { capacity })
        } else {
            Err(BadConfig)
        }
    }

    fn capacity(&self) -> i64 {
        self.capacity
    }
}

#[test]
fn calls_from_several_callers_each_run_in_the_order_sent() {
    cluster();
    let log = Log::remote().unwrap();
    let per_caller = 200u32;
    std::thread::scope(|s| {
        for caller in 0..3u32 {
            let log = log.clone();
            s.spawn(move || {
                for seq in 0..per_caller {
                    log.append(caller, seq).unwrap();
                }
            });
        }
    });
    let from_tasks: Vec<ObjectRef<usize>> = (10..12u32)
        .map(|caller| append_from_task::remote(log.clone(), caller, per_caller).unwrap())
        .collect();
    prism::get_many(&from_tasks).unwrap();
    let entries = prism::get(&log.entries().unwrap()).unwrap();
    assert_eq!(entries.len(), 5 * per_caller as usize);
    for caller in [0, 1, 2, 10, 11] {
        let seqs: Vec<u32> = entries
            .iter()
            .filter(|(c, _)| *c == caller)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(
            seqs,
            (0..per_caller).collect::<Vec<_>>(),
            "caller {caller}'s calls ran out of order"
        );
    }
    assert_eq!(
        prism::get(&log.len_async().unwrap()).unwrap(),
        entries.len()
    );
}

#[test]
fn handles_pass_to_tasks_and_return_from_them() {
    cluster();
    let log = prism::get(&make_log::remote().unwrap()).unwrap();
    prism::get(&log.append(1, 1).unwrap()).unwrap();
    let n = prism::get(&append_from_task::remote(log.clone(), 2, 3).unwrap()).unwrap();
    assert_eq!(n, 4);
}

#[test]
fn max_concurrency_runs_calls_at_the_same_time() {
    cluster();
    let gate = Gate::remote().unwrap();
    let calls: Vec<ObjectRef<bool>> = (0..4).map(|_| gate.rendezvous(4).unwrap()).collect();
    let met = prism::get_many(&calls).unwrap();
    assert!(
        met.iter().all(|m| *m),
        "4 calls must be inside at once with max_concurrency = 4: {met:?}"
    );
}

#[test]
fn a_burst_overlaps_on_an_actor_that_already_served_calls() {
    cluster();
    let burst = Burst::remote().unwrap();
    for round in 0..3 {
        // A call served alone first leaves an idle call thread behind.
        assert_eq!(prism::get(&burst.ping().unwrap()).unwrap(), 1);
        let calls: Vec<ObjectRef<bool>> = (0..3).map(|_| burst.rendezvous(3).unwrap()).collect();
        let met = prism::get_many(&calls).unwrap();
        assert!(
            met.iter().all(|m| *m),
            "round {round}: 3 calls must be inside at once with max_concurrency = 3, \
             after a call was served: {met:?}"
        );
    }
}

#[test]
fn named_actors_are_found_by_name_and_names_are_unique_per_namespace() {
    cluster();
    let log = Log::remote_with(ActorOptions::new().name("shared-log").namespace("ns-a")).unwrap();
    prism::get(&log.append(7, 0).unwrap()).unwrap();
    let found: ActorHandle<Log> = prism::get_actor_in("shared-log", "ns-a").unwrap();
    assert_eq!(found.id(), log.id());
    assert_eq!(prism::get(&found.entries().unwrap()).unwrap(), vec![(7, 0)]);

    let clash =
        Log::remote_with(ActorOptions::new().name("shared-log").namespace("ns-a")).unwrap_err();
    assert!(matches!(clash, Error::ActorNameTaken { .. }), "{clash}");
    // Another namespace is another name space.
    Log::remote_with(ActorOptions::new().name("shared-log").namespace("ns-b")).unwrap();

    let missing = prism::get_actor_in::<Log>("nobody", "ns-a").unwrap_err();
    assert!(matches!(missing, Error::ActorNotFound { .. }), "{missing}");
    let wrong = prism::get_actor_in::<Gate>("shared-log", "ns-a").unwrap_err();
    assert!(matches!(wrong, Error::ActorClassMismatch { .. }), "{wrong}");
}

#[test]
fn a_killed_actor_fails_its_calls_and_frees_its_name() {
    cluster();
    let log = Log::remote_with(ActorOptions::new().name("doomed")).unwrap();
    prism::get(&log.append(1, 1).unwrap()).unwrap();
    prism::kill(&log).unwrap();
    let err = prism::get_timeout(&log.append(1, 2).unwrap(), Duration::from_secs(30)).unwrap_err();
    assert!(matches!(err, Error::ActorDied { .. }), "{err}");
    Log::remote_with(ActorOptions::new().name("doomed")).expect("the name is free again");
}

#[test]
fn a_failed_constructor_fails_every_call_with_an_actor_error() {
    cluster();
    let bad = Picky::remote(0).unwrap();
    for _ in 0..2 {
        let err =
            prism::get_timeout(&bad.capacity().unwrap(), Duration::from_secs(30)).unwrap_err();
        assert!(
            matches!(&err, Error::ActorCreationFailed { message, .. } if message.contains("capacity must be positive")),
            "{err}"
        );
    }
    let good = Picky::remote(3).unwrap();
    assert_eq!(prism::get(&good.capacity().unwrap()).unwrap(), 3);
}

#[test]
fn each_actor_lives_in_its_own_process() {
    cluster();
    let a = Log::remote().unwrap();
    let b = Log::remote().unwrap();
    let pa = prism::get(&a.pid().unwrap()).unwrap();
    let pb = prism::get(&b.pid().unwrap()).unwrap();
    assert_ne!(pa, pb, "two actors must not share a process");
    assert_ne!(
        pa,
        std::process::id(),
        "an actor must not run in the driver"
    );
}
