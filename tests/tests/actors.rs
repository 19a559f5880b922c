//! Actors through a real cluster: order, concurrency, handles passed
//! around, names, kill, constructor failure, restarts after their process
//! dies, and ending themselves.

mod common;

use common::{cluster, is_gone, must_become, must_eventually, must_fail, wait_until};
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

/// Remote methods next to plain helpers.
#[prism::actor]
struct Stats {
    seen: Vec<f64>,
}

#[prism::actor]
impl Stats {
    fn new() -> Self {
        Stats { seen: Vec::new() }
    }

    /// An associated helper with borrowed arguments stays a plain function.
    fn label(prefix: &str, n: usize) -> String {
        format!("{prefix}{n}")
    }

    fn add(&mut self, x: f64) -> (String, f64) {
        self.seen.push(x);
        (Self::label("n=", self.seen.len()), self.mean(&self.seen))
    }

    /// A method that is not remote: it takes a borrow.
    #[local]
    fn mean(&self, xs: &[f64]) -> f64 {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

#[test]
fn local_methods_and_associated_helpers_stay_plain() {
    cluster();
    let stats = Stats::remote().unwrap();
    prism::get(&stats.add(1.0).unwrap()).unwrap();
    let (label, mean) = prism::get(&stats.add(2.0).unwrap()).unwrap();
    assert_eq!((label.as_str(), mean), ("n=2", 1.5));
    assert_eq!(Stats::label("x", 1), "x1");
    let here = Stats { seen: vec![] };
    assert_eq!(here.mean(&[4.0]), 4.0);
}

#[test]
fn get_if_exists_returns_the_actor_already_named() {
    cluster();
    let opts = ActorOptions::new()
        .name("found-or-made")
        .namespace("ns-g")
        .get_if_exists(true);
    let made = Log::remote_with(opts.clone()).unwrap();
    prism::get(&made.append(3, 0).unwrap()).unwrap();
    let found = Log::remote_with(opts).unwrap();
    assert_eq!(found.id(), made.id());
    assert_eq!(prism::get(&found.entries().unwrap()).unwrap(), vec![(3, 0)]);
    // Another class under that name is not it.
    let wrong = Gate::remote_with(
        ActorOptions::new()
            .name("found-or-made")
            .namespace("ns-g")
            .get_if_exists(true),
    )
    .unwrap_err();
    assert!(matches!(wrong, Error::ActorClassMismatch { .. }), "{wrong}");
    // Without a name there is nothing to find.
    let unnamed = Log::remote_with(ActorOptions::new().get_if_exists(true)).unwrap_err();
    assert!(
        unnamed.to_string().contains("get_if_exists") && unnamed.to_string().contains("name"),
        "{unnamed}"
    );
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

/// Counts calls; its count starts again at 0 in a restarted process.
#[prism::actor(max_restarts = 1)]
struct Counter {
    calls: u32,
}

#[prism::actor]
impl Counter {
    fn new() -> Self {
        Counter { calls: 0 }
    }

    fn incr(&mut self) -> u32 {
        self.calls += 1;
        self.calls
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }

    /// Whether this process is a restart of the actor, and how many.
    fn restarted(&self) -> (bool, u32) {
        let here = prism::runtime_context().expect("inside the actor");
        (here.was_current_actor_restarted, here.actor_restarts)
    }

    /// Kills its own process the first time (the marker file does not
    /// exist yet), as a crash in the middle of a call would.
    fn die_once(&mut self, marker: String) -> u32 {
        let marker = std::path::Path::new(&marker);
        if !marker.exists() {
            let _ = std::fs::write(marker, b"");
            std::process::exit(3);
        }
        self.calls += 1;
        self.calls
    }

    /// Ends the actor once this call has answered.
    fn finish(&mut self) -> prism::Result<u32> {
        prism::exit_actor()?;
        Ok(self.calls)
    }
}

fn marker(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("prism-actor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path.display().to_string()
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn an_actor_whose_process_dies_runs_its_constructor_again_until_max_restarts() {
    let c = cluster();
    // A call sent while the killed process is still closing its sockets
    // may reach it; one task retry covers that (max_task_retries = 0 is
    // the next test's).
    let options = ActorOptions::new().name("restarting").max_task_retries(1);
    let counter = Counter::remote_with(options).unwrap();
    for expected in 1..=3 {
        assert_eq!(prism::get(&counter.incr().unwrap()).unwrap(), expected);
    }
    let first = prism::get(&counter.pid().unwrap()).unwrap();
    assert_eq!(
        prism::get(&counter.restarted().unwrap()).unwrap(),
        (false, 0)
    );
    c.kill_worker(first, LIMIT);
    // A call sent right after the death waits for the restart; the new
    // process ran the constructor again, so the count starts over.
    let after = prism::get_timeout(&counter.incr().unwrap(), LIMIT).unwrap();
    assert_eq!(after, 1, "a restarted actor starts from its constructor");
    assert_eq!(
        prism::get(&counter.restarted().unwrap()).unwrap(),
        (true, 1),
        "the new process knows it is a restart"
    );
    let second = prism::get(&counter.pid().unwrap()).unwrap();
    assert_ne!(first, second, "the restarted actor runs in a new process");
    let same: ActorHandle<Counter> = prism::get_actor("restarting").unwrap();
    assert_eq!(
        same.id(),
        counter.id(),
        "it keeps its name while it restarts"
    );
    // Its one restart is used: the next death is final.
    c.kill_worker(second, LIMIT);
    let err = must_fail(
        prism::get_timeout(&counter.incr().unwrap(), LIMIT),
        "a call after the last restart is used up must fail",
    );
    assert!(
        matches!(&err, Error::ActorDied { reason, .. } if reason.contains("restarted 1 time")),
        "{err}"
    );
    // Its name now says that it died, when, where and why.
    let err = must_fail(
        prism::get_actor::<Counter>("restarting"),
        "a dead actor's name finds nothing",
    );
    match &err {
        Error::NamedActorDied { death, .. } => {
            assert_eq!(death.actor_id, counter.id());
            assert!(death.cause.contains("restarted 1 time"), "{err}");
            let said = err.to_string();
            assert!(
                said.contains("died at ") && said.contains(" UTC on node node-"),
                "{said}"
            );
        }
        other => panic!("the name must say its actor died: {other}"),
    }
}

#[test]
fn a_call_running_when_the_process_dies_is_sent_again_only_within_max_task_retries() {
    cluster();
    let retried = Counter::remote_with(ActorOptions::new().max_task_retries(1)).unwrap();
    let m = marker("retried");
    let answer = prism::get_timeout(&retried.die_once(m).unwrap(), LIMIT).unwrap();
    assert_eq!(answer, 1, "the call ran again on the restarted actor");

    let not_retried = Counter::remote().unwrap();
    prism::get(&not_retried.incr().unwrap()).unwrap();
    let m = marker("not-retried");
    let doomed = not_retried.die_once(m).unwrap();
    let queued: Vec<_> = (0..3).map(|_| not_retried.incr().unwrap()).collect();
    let err = must_fail(
        prism::get_timeout(&doomed, LIMIT),
        "a call whose process died is not sent again with max_task_retries = 0",
    );
    assert!(
        matches!(&err, Error::ActorUnavailable { reason, .. } if reason.contains("max_task_retries = 0")),
        "{err}"
    );
    // Calls queued behind it went to the restarted actor, in order.
    let counts: Vec<u32> = queued
        .iter()
        .map(|r| prism::get_timeout(r, LIMIT).unwrap())
        .collect();
    assert_eq!(counts, vec![1, 2, 3]);
}

#[test]
fn kill_allow_restart_restarts_the_actor_and_kill_ends_it_for_good() {
    cluster();
    let counter = Counter::remote().unwrap();
    let first = prism::get(&counter.pid().unwrap()).unwrap();
    prism::kill_allow_restart(&counter).unwrap();
    let second = prism::get_timeout(&counter.pid().unwrap(), LIMIT).unwrap();
    assert_ne!(first, second, "a kill that allows a restart restarts it");

    let counter = Counter::remote_with(ActorOptions::new().max_restarts(5)).unwrap();
    prism::get(&counter.incr().unwrap()).unwrap();
    prism::kill(&counter).unwrap();
    let err = must_fail(
        prism::get_timeout(&counter.incr().unwrap(), LIMIT),
        "prism::kill ends an actor whatever its max_restarts",
    );
    assert!(
        matches!(&err, Error::ActorDied { reason, .. } if reason.contains("prism::kill")),
        "{err}"
    );
}

#[test]
fn an_actor_that_calls_exit_actor_answers_that_call_then_ends_without_restart() {
    cluster();
    let counter =
        Counter::remote_with(ActorOptions::new().name("leaving").max_restarts(3)).unwrap();
    prism::get(&counter.incr().unwrap()).unwrap();
    let last = counter.finish().unwrap();
    let after = counter.incr().unwrap();
    assert_eq!(
        prism::get_timeout(&last, LIMIT).unwrap(),
        1,
        "the call that ends the actor still answers"
    );
    let err = must_fail(
        prism::get_timeout(&after, LIMIT),
        "a call after exit_actor must fail",
    );
    assert!(
        matches!(&err, Error::ActorDied { reason, .. } if reason.contains("exit_actor")),
        "{err}"
    );
    Counter::remote_with(ActorOptions::new().name("leaving")).expect("its name is free again");
    let outside = prism::exit_actor().unwrap_err();
    assert!(
        outside.to_string().contains("outside an actor"),
        "{outside}"
    );
}

/// A counter whose state survives restarts through checkpoints.
#[prism::actor(checkpoint, max_restarts = -1, max_task_retries = 1)]
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

    /// Adds one and asks for a checkpoint.
    fn add_and_save(&mut self) -> prism::Result<u32> {
        self.count += 1;
        prism::checkpoint_actor()?;
        Ok(self.count)
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}

#[test]
fn a_checkpointed_actor_resumes_from_its_latest_checkpoint_after_a_crash() {
    let c = cluster();
    let every_call = ActorOptions::new().checkpoint_every(1);
    let tally = Tally::remote_with(every_call).unwrap();
    for expected in 1..=3 {
        assert_eq!(prism::get(&tally.add().unwrap()).unwrap(), expected);
    }
    c.kill_worker(prism::get(&tally.pid().unwrap()).unwrap(), LIMIT);
    assert_eq!(
        prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(),
        4,
        "the restarted actor resumed from its checkpoint, not its constructor"
    );

    // Saved only when a method asks: a call after the save is lost.
    let rarely = ActorOptions::new().checkpoint_every(1000);
    let tally = Tally::remote_with(rarely).unwrap();
    prism::get(&tally.add().unwrap()).unwrap();
    assert_eq!(prism::get(&tally.add_and_save().unwrap()).unwrap(), 2);
    assert_eq!(prism::get(&tally.add().unwrap()).unwrap(), 3);
    c.kill_worker(prism::get(&tally.pid().unwrap()).unwrap(), LIMIT);
    assert_eq!(
        prism::get_timeout(&tally.add().unwrap(), LIMIT).unwrap(),
        3,
        "the state is the checkpoint's (2): the call after it was lost"
    );
}

#[test]
fn checkpoints_need_a_checkpointable_class_and_run_inside_a_checkpointed_actor() {
    cluster();
    let err = Counter::remote_with(ActorOptions::new().checkpoint_every(5)).unwrap_err();
    assert!(
        err.to_string().contains("#[prism::actor(checkpoint)]"),
        "{err}"
    );
    let err = prism::checkpoint_actor().unwrap_err();
    assert!(err.to_string().contains("outside an actor"), "{err}");
    let plain = Tally::remote().unwrap();
    let err = prism::get(&plain.add_and_save().unwrap()).unwrap_err();
    assert!(err.to_string().contains("checkpoint_every"), "{err}");
}

/// Creates a Log actor from a task and returns it with this worker's pid.
#[prism::remote]
fn make_owned_log() -> (ActorHandle<Log>, u32) {
    let log = Log::remote().expect("a task can create an actor");
    prism::get(&log.append(0, 0).expect("call")).expect("the actor answers");
    (log, std::process::id())
}

#[test]
fn an_actor_ends_with_the_process_that_created_it() {
    // In a cluster of its own: the worker it kills may also have made the
    // actors of other tests, which would end with it.
    let name = "an_actor_ends_with_the_process_that_created_it";
    if !common::in_own_process(name, &[], Duration::from_secs(120)) {
        return;
    }
    let c = cluster();
    let (log, owner) = prism::get(&make_owned_log::remote().unwrap()).unwrap();
    assert_eq!(prism::get(&log.append(1, 1).unwrap()).unwrap(), 2);
    c.kill_worker(owner, LIMIT);
    // The node ends the actor once it has seen its owner exit.
    let err = must_become("the actor ends with its owner", LIMIT, || {
        prism::get_timeout(&log.append(1, 2).unwrap(), LIMIT).err()
    });
    assert!(
        matches!(&err, Error::ActorDied { reason, .. } if reason.contains("its owner")),
        "{err}"
    );
}

/// Holds a handle to a log in its state.
#[prism::actor]
struct Holder {
    log: ActorHandle<Log>,
}

#[prism::actor]
impl Holder {
    fn new(log: ActorHandle<Log>) -> Self {
        Holder { log }
    }

    fn append_through(&self, seq: u32) -> usize {
        let appended = self.log.append(7, seq).expect("the held handle calls");
        prism::get(&appended).expect("and gets the answer")
    }
}

#[test]
fn an_unnamed_actor_stops_once_its_last_handle_anywhere_is_dropped() {
    let _c = cluster();
    let log = Log::remote().unwrap();
    let pid = prism::get(&log.pid().unwrap()).unwrap();
    let copy = log.clone();
    drop(log);
    assert_eq!(
        prism::get(&copy.append(1, 1).unwrap()).unwrap(),
        1,
        "a clone keeps it"
    );
    // Another actor's state holds a handle, borrowed from this process.
    let holder = Holder::remote(copy.clone()).unwrap();
    // A call sent before the driver's last handle goes still answers.
    let pending = copy.append(1, 2).unwrap();
    drop(copy);
    assert_eq!(prism::get_timeout(&pending, LIMIT).unwrap(), 2);
    assert_eq!(
        prism::get_timeout(&holder.append_through(3).unwrap(), LIMIT).unwrap(),
        3,
        "the holder's handle keeps the log alive after the driver's are gone"
    );
    assert!(!is_gone(pid));
    // The holder goes (its handle with it), and then the log.
    drop(holder);
    must_eventually("the log's process ends", LIMIT, || is_gone(pid));
}

#[test]
fn a_handle_returned_by_a_task_keeps_the_actor_the_task_made() {
    // In a cluster of its own: the actor's owner is a task worker, which
    // other tests' kills could reach (as an actor's process, later).
    let name = "a_handle_returned_by_a_task_keeps_the_actor_the_task_made";
    if !common::in_own_process(name, &[], Duration::from_secs(120)) {
        return;
    }
    let _c = cluster();
    // The task's own handle is dropped when it returns; the driver's copy,
    // registered before the task answered, keeps the actor.
    let log = prism::get(&make_log::remote().unwrap()).unwrap();
    let pid = prism::get_timeout(&log.pid().unwrap(), LIMIT).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        prism::get_timeout(&log.append(1, 1).unwrap(), LIMIT).unwrap(),
        1
    );
    drop(log);
    must_eventually("the log's process ends", LIMIT, || is_gone(pid));
}

#[test]
fn named_and_detached_actors_outlive_their_handles() {
    let _c = cluster();
    let named = Log::remote_with(ActorOptions::new().name("kept-by-name")).unwrap();
    let pid = prism::get(&named.pid().unwrap()).unwrap();
    drop(named);
    std::thread::sleep(Duration::from_millis(300));
    let found: ActorHandle<Log> = prism::get_actor("kept-by-name").unwrap();
    assert_eq!(
        prism::get_timeout(&found.pid().unwrap(), LIMIT).unwrap(),
        pid
    );
    // A handle found by name does not count either: killing is explicit.
    drop(found);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!is_gone(pid));
    let found: ActorHandle<Log> = prism::get_actor("kept-by-name").unwrap();
    prism::kill(&found).unwrap();
    must_eventually("the killed actor's process ends", LIMIT, || is_gone(pid));
}

/// Finds the actor the driver named, from inside a task, and says where
/// the task ran.
#[prism::remote]
fn find_named_log(name: String) -> (usize, String, bool, Option<prism::ActorId>) {
    let log = prism::get_actor::<Log>(&name).expect("a task finds the driver's named actor");
    let len = prism::get(&log.append(9, 9).unwrap()).unwrap();
    let here = prism::runtime_context().unwrap();
    (len, here.namespace, here.task_id.is_some(), here.actor_id)
}

/// Names an actor from inside a task, in the task's namespace.
#[prism::remote]
fn name_a_log(name: String) -> prism::ActorId {
    let log = Log::remote_with(ActorOptions::new().name(name)).unwrap();
    log.id()
}

/// Reports the call's own identity as an actor sees it.
#[prism::actor]
struct Introspect {
    /// The actor id its constructor saw.
    born_as: Option<prism::ActorId>,
}

#[prism::actor]
impl Introspect {
    fn new() -> Self {
        Introspect {
            born_as: prism::runtime_context().unwrap().actor_id,
        }
    }
    fn ids(&self) -> (Option<prism::TaskId>, Option<prism::ActorId>, String) {
        let here = prism::runtime_context().unwrap();
        (here.task_id, here.actor_id, here.namespace)
    }
    fn born_as(&self) -> Option<prism::ActorId> {
        self.born_as
    }
    async fn ids_async(&self) -> (Option<prism::TaskId>, Option<prism::ActorId>) {
        tokio::task::yield_now().await;
        let here = prism::runtime_context().unwrap();
        (here.task_id, here.actor_id)
    }
}

#[test]
fn tasks_and_actors_share_the_drivers_namespace_and_know_their_ids() {
    let name = "tasks_and_actors_share_the_drivers_namespace_and_know_their_ids";
    if !common::in_own_process(name, &[], Duration::from_secs(120)) {
        return;
    }
    common::ClusterSpec::new().namespace("team-a").start();
    let driver = prism::runtime_context().unwrap();
    assert_eq!(driver.namespace, "team-a");
    assert_eq!((driver.task_id, driver.actor_id), (None, None));

    // A name the driver gives is found from a task, in the same namespace.
    let log = Log::remote_with(ActorOptions::new().name("shared-log")).unwrap();
    prism::get(&log.append(1, 1).unwrap()).unwrap();
    let (len, namespace, has_task, actor) =
        prism::get(&find_named_log::remote("shared-log").unwrap()).unwrap();
    assert_eq!(len, 2, "the task called the driver's actor");
    assert_eq!(namespace, "team-a");
    assert!(has_task, "a task knows its task id");
    assert_eq!(actor, None, "a task worker hosts no actor");

    // A name a task gives is found by the driver.
    let made = prism::get(&name_a_log::remote("made-in-task").unwrap()).unwrap();
    let found = prism::get_actor::<Log>("made-in-task").unwrap();
    assert_eq!(found.id(), made);
    let elsewhere = prism::get_actor_in::<Log>("made-in-task", "default").unwrap_err();
    assert!(
        matches!(elsewhere, Error::ActorNotFound { .. }),
        "{elsewhere}"
    );

    // An actor knows itself, and each call is a task of its own.
    let probe = Introspect::remote().unwrap();
    let (first, me, namespace) = prism::get(&probe.ids().unwrap()).unwrap();
    let (second, _, _) = prism::get(&probe.ids().unwrap()).unwrap();
    let (from_async, me_async) = prism::get(&probe.ids_async().unwrap()).unwrap();
    assert_eq!(me, Some(probe.id()));
    assert_eq!(me_async, Some(probe.id()));
    assert_eq!(
        prism::get(&probe.born_as().unwrap()).unwrap(),
        Some(probe.id()),
        "the constructor knows its actor"
    );
    assert_eq!(namespace, "team-a");
    assert!(first.is_some() && second.is_some() && from_async.is_some());
    assert_ne!(first, second);
    assert_ne!(first, from_async);
}

/// A pool member: doubles, says which process did, or waits for a file.
#[prism::actor]
struct Doubler;

#[prism::actor]
impl Doubler {
    fn new() -> Self {
        Doubler
    }
    fn double(&self, x: i64) -> (i64, u32) {
        (2 * x, std::process::id())
    }
    /// Doubles once `gate` exists (30 s at most).
    fn double_after(&self, x: i64, gate: String) -> (i64, u32) {
        wait_until(LIMIT, || std::path::Path::new(&gate).exists());
        (2 * x, std::process::id())
    }
}

#[test]
fn an_actor_pool_spreads_calls_keeps_order_and_lends_freed_actors_to_waiting_calls() {
    cluster();
    let actors: Vec<_> = (0..2).map(|_| Doubler::remote().unwrap()).collect();
    let mut pool = prism::ActorPool::new(actors.clone());
    assert!(pool.has_free() && !pool.has_next());

    // In order, over both actors.
    let out: Vec<(i64, u32)> = pool
        .map(|a, x| a.double(x), 0..8)
        .collect::<prism::Result<_>>()
        .unwrap();
    assert_eq!(
        out.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        vec![0, 2, 4, 6, 8, 10, 12, 14]
    );
    let pids: std::collections::BTreeSet<u32> = out.iter().map(|(_, p)| *p).collect();
    assert_eq!(pids.len(), 2, "both actors ran calls");
    let mut any: Vec<i64> = pool
        .map_unordered(|a, x| a.double(x), 10..14)
        .map(|r| r.unwrap().0)
        .collect();
    any.sort_unstable();
    assert_eq!(any, vec![20, 22, 24, 26]);
    assert!(!pool.has_next());

    // One actor held by a call that waits; three more calls share the
    // other, the two queued ones taking it as it frees.
    let gate = std::env::temp_dir().join(format!("prism-pool-gate-{}", std::process::id()));
    let _ = std::fs::remove_file(&gate);
    let gate_path = gate.display().to_string();
    pool.submit(move |a| a.double_after(1, gate_path));
    for x in 2..5 {
        pool.submit(move |a| a.double(x));
    }
    assert!(!pool.has_free());
    let early: Vec<i64> = (0..3)
        .map(|_| pool.get_next_unordered().unwrap().0)
        .collect();
    assert_eq!(
        early,
        vec![4, 6, 8],
        "the free actor ran the queued calls in order"
    );
    let err = pool
        .get_next_timeout(Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, Error::GetTimeout { .. }), "{err}");
    assert!(
        pool.has_next(),
        "a timed-out read leaves the result to read later"
    );
    // A long map while that call still holds its actor: the other actor
    // runs every call, read in order, and the held call stays unread.
    let many: Vec<i64> = pool
        .map(|a, x| a.double(x), 0..300)
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(many, (0..300).map(|x| 2 * x).collect::<Vec<_>>());
    assert!(pool.has_next(), "the held call is still to be read");
    std::fs::write(&gate, b"open").unwrap();
    assert_eq!(pool.get_next().unwrap().0, 2);
    let _ = std::fs::remove_file(&gate);

    // A call that could not be submitted gives its error in its turn.
    pool.submit(|_| Err(Error::invalid("x", "refused by the caller")));
    pool.submit(|a| a.double(7));
    let refused = pool.get_next().unwrap_err();
    assert!(
        refused.to_string().contains("refused by the caller"),
        "{refused}"
    );
    assert_eq!(pool.get_next().unwrap().0, 14);
    let nothing = pool.get_next().unwrap_err();
    assert!(
        nothing.to_string().contains("submit one first"),
        "{nothing}"
    );

    // Without actors, waiting calls are an error until one is pushed.
    let (first, second) = (pool.pop_idle().unwrap(), pool.pop_idle().unwrap());
    assert!(pool.pop_idle().is_none());
    pool.submit(|a| a.double(21));
    let none = pool.get_next().unwrap_err();
    assert!(none.to_string().contains("push one"), "{none}");
    pool.push(first.clone()).unwrap();
    let twice = pool.push(first).unwrap_err();
    assert!(
        twice.to_string().contains("in this pool already"),
        "{twice}"
    );
    assert_eq!(pool.get_next().unwrap().0, 42);

    // A map over no actors says why once, then ends.
    let mut empty = prism::ActorPool::<Doubler, (i64, u32)>::new(Vec::new());
    let mut results = empty.map(|a, x| a.double(x), 0..3);
    let why = results.next().unwrap().unwrap_err();
    assert!(why.to_string().contains("push one"), "{why}");
    assert!(results.next().is_none());
    drop(second);
}

#[prism::remote]
fn triple(x: i64) -> i64 {
    3 * x
}

/// Ray's test helper: `wait` returns once `send` was called.
#[prism::actor]
struct Signal {
    ready: tokio::sync::watch::Sender<bool>,
    bumps: AtomicUsize,
}

#[prism::actor]
impl Signal {
    fn new() -> Self {
        Signal {
            ready: tokio::sync::watch::Sender::new(false),
            bumps: AtomicUsize::new(0),
        }
    }
    async fn wait(&self) -> bool {
        let mut ready = self.ready.subscribe();
        let sent = ready.wait_for(|sent| *sent).await.is_ok();
        sent
    }
    fn send(&self) {
        self.ready.send_replace(true);
    }
    /// Waits for the signal, then reads a task's result with the blocking
    /// `get` (the async form is the right one here; this one must not
    /// stop the runtime either).
    async fn wait_then_get(&self, x: i64) -> i64 {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|sent| *sent).await;
        prism::get(&triple::remote(x).unwrap()).unwrap()
    }
    fn bump(&self) -> usize {
        self.bumps.fetch_add(1, Ordering::SeqCst) + 1
    }
    async fn bumps(&self) -> usize {
        self.bumps.load(Ordering::SeqCst)
    }
}

#[test]
fn an_async_actor_runs_later_calls_while_an_async_call_waits_and_starts_calls_in_order() {
    cluster();
    let signal = Signal::remote().unwrap();
    let waits: Vec<_> = (0..3).map(|_| signal.wait().unwrap()).collect();
    let gets: Vec<_> = (0..4).map(|x| signal.wait_then_get(x).unwrap()).collect();
    // Each caller's calls start in the order sent: the async read sees
    // every bump before it.
    for _ in 0..3 {
        signal.bump().unwrap();
    }
    assert_eq!(prism::get(&signal.bumps().unwrap()).unwrap(), 3);
    prism::get_timeout(&signal.send().unwrap(), LIMIT).expect("send runs while the waits wait");
    for wait in &waits {
        assert!(prism::get_timeout(wait, LIMIT).unwrap());
    }
    // Four blocking reads at once, on a runtime of two threads.
    let got: Vec<i64> = gets
        .iter()
        .map(|r| prism::get_timeout(r, LIMIT).unwrap())
        .collect();
    assert_eq!(got, vec![0, 3, 6, 9]);

    // An explicit max_concurrency of 1 runs one call at a time, async
    // ones included: `send` waits behind `wait`.
    let one = Signal::remote_with(ActorOptions::new().max_concurrency(1)).unwrap();
    let _wait = one.wait().unwrap();
    let send = one.send().unwrap();
    let err = prism::get_timeout(&send, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::GetTimeout { .. }), "{err}");
    prism::kill(&one).unwrap();
}

/// Bounds each wait for a result of a call with `num_returns`.
const WITHIN: Duration = Duration::from_secs(30);

/// Methods that return several values, each stored as its own object.
#[prism::actor]
struct Splitter {
    calls: u32,
}

#[prism::actor]
impl Splitter {
    fn new() -> Self {
        Splitter { calls: 0 }
    }

    /// The values below and from `pivot`, and how many calls so far.
    #[method(num_returns = 3)]
    fn partition(&mut self, values: Vec<i64>, pivot: i64) -> (Vec<i64>, Vec<i64>, u32) {
        self.calls += 1;
        let (low, high) = values.into_iter().partition(|v| *v < pivot);
        (low, high, self.calls)
    }

    /// The calls so far, then each value, as a stream (the iterator
    /// borrows the actor).
    #[method(num_returns = "streaming")]
    fn numbered(&self, values: Vec<i64>) -> impl Iterator<Item = String> + '_ {
        std::iter::once(format!("calls {}", self.calls)).chain(
            values
                .into_iter()
                .map(move |v| format!("{v} after {} calls", self.calls)),
        )
    }

    #[method(num_returns = 2)]
    async fn checked_halves(&self, n: i64) -> Result<(i64, i64), String> {
        if n % 2 != 0 {
            return Err(format!("{n} is odd"));
        }
        Ok((n / 2, n / 2))
    }
}

#[test]
fn an_actor_method_with_num_returns_gives_one_ref_per_value() {
    cluster();
    let splitter = Splitter::remote().unwrap();
    let (low, high, calls) = splitter.partition(vec![5, 1, 9, 3, 7], 5).unwrap();
    assert_eq!(prism::get_timeout(&calls, WITHIN).unwrap(), 1);
    assert_eq!(prism::get_timeout(&high, WITHIN).unwrap(), vec![5, 9, 7]);
    assert_eq!(prism::get_timeout(&low, WITHIN).unwrap(), vec![1, 3]);
    // A result is an argument like any ref: the low part split again.
    let (lowest, _, calls) = splitter.partition(&low, 2).unwrap();
    assert_eq!(prism::get_timeout(&lowest, WITHIN).unwrap(), vec![1]);
    assert_eq!(prism::get_timeout(&calls, WITHIN).unwrap(), 2);

    let (a, b) = splitter.checked_halves(10).unwrap();
    assert_eq!(
        (
            prism::get_timeout(&a, WITHIN).unwrap(),
            prism::get_timeout(&b, WITHIN).unwrap()
        ),
        (5, 5)
    );
    let (a, b) = splitter.checked_halves(3).unwrap();
    for outcome in [
        prism::get_timeout(&b, WITHIN),
        prism::get_timeout(&a, WITHIN),
    ] {
        let said = must_fail(outcome, "an odd number fails both halves").to_string();
        assert!(said.contains("3 is odd"), "{said}");
    }
}

/// A synchronous actor that streams what it recorded.
#[prism::actor]
struct Tape {
    entries: Vec<String>,
}

#[prism::actor]
impl Tape {
    fn new() -> Self {
        Tape {
            entries: Vec::new(),
        }
    }

    fn record(&mut self, entry: String) -> usize {
        self.entries.push(entry);
        self.entries.len()
    }

    /// The entries from `from` on; an entry "bad" ends the stream with an
    /// error.
    #[method(num_returns = "streaming")]
    fn replay(&mut self, from: usize) -> impl Iterator<Item = Result<String, String>> + '_ {
        self.entries.iter().skip(from).map(|e| {
            if e == "bad" {
                Err("a bad entry".to_string())
            } else {
                Ok(e.to_uppercase())
            }
        })
    }
}

fn read_stream<T: serde::de::DeserializeOwned + Send + 'static>(
    stream: prism::ObjectRefGenerator<T>,
) -> Vec<Result<T, Error>> {
    stream
        .map(|r| r.and_then(|r| prism::get_timeout(&r, WITHIN)))
        .collect()
}

#[test]
fn an_actor_method_streams_its_values() {
    cluster();
    // An async actor's synchronous streaming method.
    let splitter = Splitter::remote().unwrap();
    let (_, _, calls) = splitter.partition(vec![1], 0).unwrap();
    assert_eq!(prism::get_timeout(&calls, WITHIN).unwrap(), 1);
    let said: Vec<String> = read_stream(splitter.numbered(vec![4, 5]).unwrap())
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(said, ["calls 1", "4 after 1 calls", "5 after 1 calls"]);

    // A synchronous actor's: calls before and after run in order.
    let tape = Tape::remote().unwrap();
    for entry in ["a", "b", "c"] {
        tape.record(entry.to_string()).unwrap();
    }
    let replayed = tape.replay(1).unwrap();
    let after = tape.record("bad".to_string()).unwrap();
    let values: Vec<String> = read_stream(replayed)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(values, ["B", "C"]);
    assert_eq!(prism::get_timeout(&after, WITHIN).unwrap(), 4);
    let outcome = read_stream(tape.replay(0).unwrap());
    assert_eq!(
        outcome.len(),
        4,
        "three values, then the error: {outcome:?}"
    );
    match &outcome[3] {
        Err(Error::TaskFailed { message, .. }) => assert_eq!(message, "a bad entry"),
        other => panic!("expected the method's error, got {other:?}"),
    }
    // The actor serves on.
    assert_eq!(
        prism::get_timeout(&tape.record("d").unwrap(), WITHIN).unwrap(),
        5
    );
}
