//! `prism::cancel` through a real cluster: a task queued for a resource
//! never runs, a running one is stopped with its worker (`force`) or runs
//! to its end with its result dropped, one waiting for its arguments ends
//! when they arrive, and finished tasks and puts keep their values. An
//! actor call that has not started never runs; a started synchronous one
//! keeps its result, and a started async one is stopped where it waits.

mod common;

use common::{is_gone, must_become, must_eventually, ClusterSpec};
use prism::{Error, ObjectRef};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bounds every wait here; the tasks that must not finish sleep longer.
const LIMIT: Duration = Duration::from_secs(30);

fn cluster() {
    ClusterSpec::new().cpus(2).resource("gate", 1.0).start();
}

/// A fresh folder for one test's marker files.
fn marks(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prism-cancel-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a marker folder");
    dir
}

/// Writes its pid to `dir/started`, sleeps `ms`, then writes `dir/done`.
#[prism::remote]
fn marked(dir: String, ms: u64) -> u32 {
    let dir = Path::new(&dir);
    let pid = std::process::id();
    let _ = std::fs::write(dir.join("started"), pid.to_string());
    std::thread::sleep(Duration::from_millis(ms));
    let _ = std::fs::write(dir.join("done"), "");
    pid
}

/// Holds the cluster's one `gate` for `ms`.
#[prism::remote(resource("gate", 1.0))]
fn hold_gate(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

/// Needs the `gate` too; leaves a mark if it ever runs.
#[prism::remote(resource("gate", 1.0))]
fn gated(dir: String) -> u32 {
    let _ = std::fs::write(Path::new(&dir).join("gated ran"), "");
    1
}

#[prism::remote]
fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[prism::remote]
fn later(ms: u64, value: i64) -> i64 {
    std::thread::sleep(Duration::from_millis(ms));
    value
}

/// Marks `dir/started`, then returns `mib` MiB after `ms`: a result
/// kept in the object store.
#[prism::remote]
fn big_after(dir: String, ms: u64, mib: usize) -> Vec<u8> {
    let _ = std::fs::write(Path::new(&dir).join("started"), "");
    std::thread::sleep(Duration::from_millis(ms));
    vec![7u8; mib << 20]
}

#[prism::remote]
fn fails_after(ms: u64) -> Result<i64, String> {
    std::thread::sleep(Duration::from_millis(ms));
    Err("on purpose".into())
}

/// Tries to cancel a task another process submitted.
#[prism::remote]
fn cancel_theirs(refs: Vec<ObjectRef<i64>>) -> String {
    match prism::cancel(&refs[0], true) {
        Ok(()) => "cancelled".into(),
        Err(e) => e.to_string(),
    }
}

fn cancelled<T: std::fmt::Debug>(outcome: prism::Result<T>) -> String {
    match outcome {
        Err(e @ Error::TaskCancelled { .. }) => e.to_string(),
        other => panic!("expected TaskCancelled, got {other:?}"),
    }
}

#[test]
fn a_task_queued_for_a_resource_never_runs() {
    cluster();
    let dir = marks("queued");
    let holder = hold_gate::remote(2_000).unwrap();
    // Wait until the gate is taken, so `gated` waits for it.
    must_eventually("the gate is taken", LIMIT, || {
        prism::cluster_resources()
            .map(|(_, free)| free.get("gate").is_zero())
            .unwrap_or(false)
    });
    let waiting = gated::remote(dir.display().to_string()).unwrap();
    prism::cancel(&waiting, false).unwrap();
    let said = cancelled(prism::get_timeout(&waiting, LIMIT));
    assert!(
        said.contains("gated") && said.contains("cancelled"),
        "{said}"
    );
    assert_eq!(prism::get_timeout(&holder, LIMIT).unwrap(), 2_000);
    // The gate is free now: a cancelled task would have run by now.
    assert_eq!(
        prism::get_timeout(&gated::remote(dir.display().to_string()).unwrap(), LIMIT).unwrap(),
        1
    );
    std::fs::remove_file(dir.join("gated ran")).expect("the second one ran");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !dir.join("gated ran").exists(),
        "the cancelled one never ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_running_task_cancelled_with_force_stops_with_its_worker_and_is_not_retried() {
    cluster();
    let dir = marks("force");
    let running = marked::remote(dir.display().to_string(), 600_000).unwrap();
    let pid: u32 = must_become("the task starts", LIMIT, || {
        std::fs::read_to_string(dir.join("started"))
            .ok()?
            .parse()
            .ok()
    });
    prism::cancel(&running, true).unwrap();
    let said = cancelled(prism::get_timeout(&running, LIMIT));
    assert!(said.contains("force"), "{said}");
    must_eventually("its worker exits", LIMIT, || is_gone(pid));
    // Not retried: it would start again and mark it.
    std::fs::remove_file(dir.join("started")).expect("the mark");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!dir.join("started").exists(), "the task was not run again");
    // The node goes on.
    assert_eq!(
        prism::get_timeout(&add::remote(2, 3).unwrap(), LIMIT).unwrap(),
        5
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_running_task_cancelled_without_force_runs_to_its_end_and_its_result_is_dropped() {
    cluster();
    let dir = marks("gentle");
    let running = marked::remote(dir.display().to_string(), 500).unwrap();
    must_become("the task starts", LIMIT, || {
        std::fs::read_to_string(dir.join("started")).ok()
    });
    prism::cancel(&running, false).unwrap();
    let said = cancelled(prism::get_timeout(&running, LIMIT));
    assert!(!said.contains("force"), "{said}");
    assert!(dir.join("done").exists(), "it ran to its end first");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_task_waiting_for_its_arguments_ends_when_they_arrive() {
    cluster();
    let first = later::remote(300, 1).unwrap();
    let second = add::remote(&first, 1).unwrap();
    prism::cancel(&second, false).unwrap();
    cancelled(prism::get_timeout(&second, LIMIT));
    assert_eq!(prism::get_timeout(&first, LIMIT).unwrap(), 1);
}

#[test]
fn finished_tasks_and_puts_keep_their_values() {
    cluster();
    let done = add::remote(1, 2).unwrap();
    assert_eq!(prism::get(&done).unwrap(), 3);
    prism::cancel(&done, true).unwrap();
    assert_eq!(prism::get(&done).unwrap(), 3);
    let put = prism::put(7i64).unwrap();
    prism::cancel(&put, false).unwrap();
    assert_eq!(prism::get(&put).unwrap(), 7);
}

#[test]
fn only_the_submitting_process_may_cancel() {
    cluster();
    let mine = later::remote(100, 4).unwrap();
    let said =
        prism::get_timeout(&cancel_theirs::remote(vec![mine.clone()]).unwrap(), LIMIT).unwrap();
    assert!(
        said.contains("invalid argument: cancel")
            && said.contains("only the process that submitted"),
        "{said}"
    );
    assert_eq!(prism::get_timeout(&mine, LIMIT).unwrap(), 4);
}

#[test]
fn a_cancelled_tasks_stored_result_is_freed() {
    cluster();
    let dir = marks("stored");
    let running = big_after::remote(dir.display().to_string(), 300, 4).unwrap();
    must_become("the task starts", LIMIT, || {
        std::fs::read_to_string(dir.join("started")).ok()
    });
    prism::cancel(&running, false).unwrap();
    cancelled(prism::get_timeout(&running, LIMIT));
    must_eventually("its 4 MiB result leaves the store", LIMIT, || {
        prism::object_store_stats()
            .map(|s| s.used_bytes < 1 << 20)
            .unwrap_or(false)
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_task_cancelled_while_its_argument_fails_ends_cancelled() {
    cluster();
    let bad = fails_after::remote(300).unwrap();
    let next = add::remote(&bad, 1).unwrap();
    prism::cancel(&next, false).unwrap();
    cancelled(prism::get_timeout(&next, LIMIT));
}

/// Waits (at most `LIMIT`) for `dir/open` after marking `dir/<name>`.
fn wait_open(dir: &str, name: &str) {
    let dir = Path::new(dir);
    let _ = std::fs::write(dir.join(name), "");
    let until = std::time::Instant::now() + LIMIT;
    while !dir.join("open").exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Records the numbers it is given, in call order.
#[prism::actor]
struct Recorder {
    seen: Vec<i64>,
}

#[prism::actor]
impl Recorder {
    fn new() -> Self {
        Recorder { seen: Vec::new() }
    }

    /// Holds the actor until the test opens `dir`.
    fn hold(&mut self, dir: String, name: String) -> String {
        wait_open(&dir, &name);
        name
    }

    fn record(&mut self, n: i64) -> Vec<i64> {
        self.seen.push(n);
        self.seen.clone()
    }

    /// Counts up without end, a value every 5 ms.
    #[method(num_returns = "streaming")]
    fn ticks(&self) -> impl Iterator<Item = u64> {
        (0..).inspect(|_| std::thread::sleep(Duration::from_millis(5)))
    }
}

/// Two calls at a time; the third waits for a thread.
#[prism::actor(max_concurrency = 2)]
struct Pair;

#[prism::actor]
impl Pair {
    fn new() -> Self {
        Pair
    }

    fn hold(&self, dir: String, name: String) -> String {
        wait_open(&dir, &name);
        name
    }

    /// Counts up without end, a value every 5 ms.
    #[method(num_returns = "streaming")]
    fn ticks(&self) -> impl Iterator<Item = u64> {
        (0..).inspect(|_| std::thread::sleep(Duration::from_millis(5)))
    }
}

fn open(dir: &Path) {
    std::fs::write(dir.join("open"), "").expect("the gate file");
}

#[test]
fn an_actor_call_queued_at_the_actor_never_runs_and_the_later_ones_do() {
    cluster();
    let dir = marks("actor-queued");
    let d = dir.display().to_string();
    let recorder = Recorder::remote().unwrap();
    let running = recorder.hold(d.clone(), "running").unwrap();
    must_eventually("the first call starts", LIMIT, || {
        dir.join("running").exists()
    });
    let queued = recorder.record(1).unwrap();
    let after = recorder.record(2).unwrap();
    // The calls reach the actor and wait there behind the running one.
    std::thread::sleep(Duration::from_millis(100));
    prism::cancel(&queued, false).unwrap();
    // Answered while the first call still holds the actor.
    let said = cancelled(prism::get_timeout(&queued, LIMIT));
    assert!(said.contains("Recorder::record"), "{said}");
    assert!(!dir.join("open").exists());
    open(&dir);
    assert_eq!(prism::get_timeout(&running, LIMIT).unwrap(), "running");
    assert_eq!(prism::get_timeout(&after, LIMIT).unwrap(), vec![2]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_actor_call_waiting_here_for_its_argument_never_runs() {
    cluster();
    let dir = marks("actor-arg");
    let recorder = Recorder::remote().unwrap();
    let slow = later::remote(300, 5).unwrap();
    let waiting = recorder.record(&slow).unwrap();
    prism::cancel(&waiting, false).unwrap();
    cancelled(prism::get_timeout(&waiting, LIMIT));
    assert_eq!(prism::get_timeout(&slow, LIMIT).unwrap(), 5);
    assert_eq!(
        prism::get_timeout(&recorder.record(6).unwrap(), LIMIT).unwrap(),
        vec![6],
        "the cancelled call never ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_running_actor_call_runs_to_its_end_and_keeps_its_result() {
    cluster();
    let dir = marks("actor-running");
    let d = dir.display().to_string();
    let recorder = Recorder::remote().unwrap();
    let running = recorder.hold(d, "running").unwrap();
    must_eventually("the call starts", LIMIT, || dir.join("running").exists());
    prism::cancel(&running, false).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    open(&dir);
    assert_eq!(prism::get_timeout(&running, LIMIT).unwrap(), "running");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_actor_call_cannot_be_cancelled_with_force() {
    cluster();
    let recorder = Recorder::remote().unwrap();
    let call = recorder.record(1).unwrap();
    let said = match prism::cancel(&call, true) {
        Err(e @ Error::InvalidArgument { .. }) => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(
        said.contains("actor") && said.contains("prism::kill"),
        "{said}"
    );
    assert_eq!(prism::get_timeout(&call, LIMIT).unwrap(), vec![1]);
}

#[test]
fn a_call_waiting_for_a_thread_of_a_concurrent_actor_never_runs() {
    cluster();
    let dir = marks("actor-pair");
    let d = dir.display().to_string();
    let pair = Pair::remote().unwrap();
    let first = pair.hold(d.clone(), "first").unwrap();
    let second = pair.hold(d.clone(), "second").unwrap();
    must_eventually("both threads are taken", LIMIT, || {
        dir.join("first").exists() && dir.join("second").exists()
    });
    let third = pair.hold(d.clone(), "third").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    prism::cancel(&third, false).unwrap();
    cancelled(prism::get_timeout(&third, LIMIT));
    open(&dir);
    assert_eq!(prism::get_timeout(&first, LIMIT).unwrap(), "first");
    assert_eq!(prism::get_timeout(&second, LIMIT).unwrap(), "second");
    assert!(!dir.join("third").exists(), "the cancelled call never ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Counts the waits of a gate dropped before their end.
struct NoteDrop {
    dropped: Arc<AtomicUsize>,
    ended: bool,
}

impl Drop for NoteDrop {
    fn drop(&mut self) {
        if !self.ended {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Waits until the gate opens, counting the waits that started and the
/// ones dropped before their end.
async fn wait_for_gate(
    open: &tokio::sync::watch::Sender<bool>,
    started: &AtomicUsize,
    dropped: &Arc<AtomicUsize>,
    n: u32,
) -> u32 {
    started.fetch_add(1, Ordering::SeqCst);
    let mut note = NoteDrop {
        dropped: dropped.clone(),
        ended: false,
    };
    let _ = open.subscribe().wait_for(|open| *open).await;
    note.ended = true;
    n
}

/// An async actor (async methods, `max_concurrency` left unset).
#[prism::actor]
struct AsyncGate {
    open: tokio::sync::watch::Sender<bool>,
    started: AtomicUsize,
    dropped: Arc<AtomicUsize>,
    bumps: usize,
}

#[prism::actor]
impl AsyncGate {
    fn new() -> Self {
        AsyncGate {
            open: tokio::sync::watch::Sender::new(false),
            started: AtomicUsize::new(0),
            dropped: Arc::new(AtomicUsize::new(0)),
            bumps: 0,
        }
    }
    async fn wait(&self, n: u32) -> u32 {
        wait_for_gate(&self.open, &self.started, &self.dropped, n).await
    }
    #[method(num_returns = 2)]
    async fn wait_pair(&self, n: u32) -> (u32, u32) {
        let n = wait_for_gate(&self.open, &self.started, &self.dropped, n).await;
        (n, n + 1)
    }
    fn open(&self) {
        self.open.send_replace(true);
    }
    /// Waits calls started, and dropped.
    async fn counts(&self) -> (usize, usize) {
        let started = self.started.load(Ordering::SeqCst);
        (started, self.dropped.load(Ordering::SeqCst))
    }
    /// Needs the write lock, which a waiting call's read lock holds off.
    fn bump(&mut self) -> usize {
        self.bumps += 1;
        self.bumps
    }
}

/// The same waits in an actor given an explicit `max_concurrency`.
#[prism::actor(max_concurrency = 4)]
struct CountedGate {
    open: tokio::sync::watch::Sender<bool>,
    started: AtomicUsize,
    dropped: Arc<AtomicUsize>,
}

#[prism::actor]
impl CountedGate {
    fn new() -> Self {
        CountedGate {
            open: tokio::sync::watch::Sender::new(false),
            started: AtomicUsize::new(0),
            dropped: Arc::new(AtomicUsize::new(0)),
        }
    }
    async fn wait(&self, n: u32) -> u32 {
        wait_for_gate(&self.open, &self.started, &self.dropped, n).await
    }
    fn open(&self) {
        self.open.send_replace(true);
    }
    fn counts(&self) -> (usize, usize) {
        let started = self.started.load(Ordering::SeqCst);
        (started, self.dropped.load(Ordering::SeqCst))
    }
}

#[test]
fn a_started_async_actor_call_is_stopped_where_it_waits_and_releases_the_actor() {
    cluster();
    let gate = AsyncGate::remote().unwrap();
    let counts = || prism::get_timeout(&gate.counts().unwrap(), LIMIT).unwrap();
    let first = gate.wait(1).unwrap();
    must_eventually("the wait starts", LIMIT, || counts().0 == 1);
    // Behind the waiting call's read lock until that call is gone.
    let bumped = gate.bump().unwrap();
    prism::cancel(&first, false).unwrap();
    let said = cancelled(prism::get_timeout(&first, LIMIT));
    assert!(said.contains("AsyncGate::wait"), "{said}");
    assert_eq!(prism::get_timeout(&bumped, LIMIT).unwrap(), 1);
    assert_eq!(counts(), (1, 1), "the wait's future was dropped");

    let second = gate.wait(2).unwrap();
    let third = gate.wait(3).unwrap();
    must_eventually("both waits start", LIMIT, || counts().0 == 3);
    prism::cancel(&third, false).unwrap();
    cancelled(prism::get_timeout(&third, LIMIT));
    // Either result of a call that returns two names the call.
    let (pair_first, pair_second) = gate.wait_pair(4).unwrap();
    must_eventually("the pair's wait starts", LIMIT, || counts().0 == 4);
    prism::cancel(&pair_second, false).unwrap();
    cancelled(prism::get_timeout(&pair_first, LIMIT));
    cancelled(prism::get_timeout(&pair_second, LIMIT));
    // Also once the first result's references are all dropped.
    let (_, lone) = gate.wait_pair(5).unwrap();
    must_eventually("the lone pair's wait starts", LIMIT, || counts().0 == 5);
    prism::cancel(&lone, false).unwrap();
    cancelled(prism::get_timeout(&lone, LIMIT));
    prism::get_timeout(&gate.open().unwrap(), LIMIT).unwrap();
    assert_eq!(prism::get_timeout(&second, LIMIT).unwrap(), 2, "ran on");
    assert_eq!(counts(), (5, 4));
    // Cancelling a call that finished changes nothing.
    prism::cancel(&second, false).unwrap();
    assert_eq!(prism::get_timeout(&second, LIMIT).unwrap(), 2);
}

#[test]
fn a_started_async_call_of_a_concurrent_actor_is_stopped_where_it_waits() {
    cluster();
    let gate = CountedGate::remote().unwrap();
    let counts = || prism::get_timeout(&gate.counts().unwrap(), LIMIT).unwrap();
    let first = gate.wait(1).unwrap();
    let second = gate.wait(2).unwrap();
    must_eventually("both waits start", LIMIT, || counts().0 == 2);
    prism::cancel(&first, false).unwrap();
    cancelled(prism::get_timeout(&first, LIMIT));
    assert_eq!(counts(), (2, 1));
    prism::get_timeout(&gate.open().unwrap(), LIMIT).unwrap();
    assert_eq!(prism::get_timeout(&second, LIMIT).unwrap(), 2);
}

#[prism::remote(resource("gate", 1.0), num_returns = 2)]
fn gated_pair(dir: String) -> (u32, u32) {
    let _ = std::fs::write(Path::new(&dir).join("pair-ran"), "");
    (1, 2)
}

#[test]
fn cancelling_any_result_of_a_task_with_num_returns_cancels_the_task() {
    cluster();
    let dir = marks("pair");
    let d = dir.display().to_string();
    let holder = hold_gate::remote(300).unwrap();
    let (first, second) = gated_pair::remote(d).unwrap();
    prism::cancel(&second, false).unwrap();
    cancelled(prism::get_timeout(&second, LIMIT));
    cancelled(prism::get_timeout(&first, LIMIT));
    prism::get_timeout(&holder, LIMIT).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !dir.join("pair-ran").exists(),
        "the cancelled task never ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Marks `dir/started`, then returns two values after `ms`.
#[prism::remote(num_returns = 2)]
fn marked_pair(dir: String, ms: u64) -> (u32, u32) {
    let _ = std::fs::write(Path::new(&dir).join("started"), "");
    std::thread::sleep(Duration::from_millis(ms));
    (1, 2)
}

#[test]
fn a_later_result_cancels_its_running_task_after_the_first_result_was_dropped() {
    cluster();
    let dir = marks("pair-running");
    let (first, second) = marked_pair::remote(dir.display().to_string(), 300).unwrap();
    must_eventually("the task starts", LIMIT, || dir.join("started").exists());
    drop(first);
    prism::cancel(&second, false).unwrap();
    // It runs to its end; its results are dropped.
    cancelled(prism::get_timeout(&second, LIMIT));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Async waits in an actor that runs one call at a time (on its executor
/// thread): a wait marks `dir/<n>` when it starts.
#[prism::actor(max_concurrency = 1)]
struct SerialGate {
    open: tokio::sync::watch::Sender<bool>,
    started: AtomicUsize,
    dropped: Arc<AtomicUsize>,
}

#[prism::actor]
impl SerialGate {
    fn new() -> Self {
        SerialGate {
            open: tokio::sync::watch::Sender::new(false),
            started: AtomicUsize::new(0),
            dropped: Arc::new(AtomicUsize::new(0)),
        }
    }
    async fn wait(&self, dir: String, n: u32) -> u32 {
        let _ = std::fs::write(Path::new(&dir).join(n.to_string()), "");
        wait_for_gate(&self.open, &self.started, &self.dropped, n).await
    }
    fn counts(&self) -> (usize, usize) {
        let started = self.started.load(Ordering::SeqCst);
        (started, self.dropped.load(Ordering::SeqCst))
    }
}

#[test]
fn a_started_async_call_of_an_actor_running_one_call_at_a_time_is_stopped_too() {
    cluster();
    let dir = marks("serial-gate");
    let d = dir.display().to_string();
    let gate = SerialGate::remote().unwrap();
    let first = gate.wait(d.clone(), 1).unwrap();
    must_eventually("the wait starts", LIMIT, || dir.join("1").exists());
    // Behind the wait: it runs once the wait is gone.
    let counts = gate.counts().unwrap();
    prism::cancel(&first, false).unwrap();
    cancelled(prism::get_timeout(&first, LIMIT));
    assert_eq!(prism::get_timeout(&counts, LIMIT).unwrap(), (1, 1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads the first `n` values of a counting stream, checking each.
fn read_first(stream: &mut prism::ObjectRefGenerator<u64>, n: u64) {
    for expected in 0..n {
        let r = stream.next().expect("a value").unwrap();
        assert_eq!(prism::get_timeout(&r, LIMIT).unwrap(), expected);
    }
}

/// Counts up without end, a value every 5 ms.
#[prism::remote(num_returns = "streaming")]
fn endless() -> impl Iterator<Item = u64> {
    (0..).inspect(|_| std::thread::sleep(Duration::from_millis(5)))
}

#[test]
fn a_cancelled_streaming_task_makes_no_further_value() {
    cluster();
    let mut stream = endless::remote().unwrap();
    read_first(&mut stream, 3);
    stream.cancel(false).unwrap();
    // The values made before the cancel took hold, in order, then the
    // cancel; the function was asked for no further value.
    let mut next = 3;
    let start = std::time::Instant::now();
    let error = loop {
        assert!(
            start.elapsed() < LIMIT,
            "the stream must end soon after its cancel; {next} values so far"
        );
        match stream.next_timeout(LIMIT) {
            Some(Ok(r)) => {
                assert_eq!(prism::get_timeout(&r, LIMIT).unwrap(), next);
                next += 1;
            }
            Some(Err(e)) => break e,
            None => panic!("the stream must end cancelled"),
        }
    };
    cancelled(Err::<(), _>(error));
    assert!(stream.next().is_none());
    cancelled(prism::get_timeout(stream.completed(), LIMIT));
    // Tasks run on.
    assert_eq!(
        prism::get_timeout(&add::remote(2, 3).unwrap(), LIMIT).unwrap(),
        5
    );
}

/// Reads two values of `stream`, cancels it, and requires it to end
/// cancelled (after the values made before the cancel took hold).
fn cancel_stream_after_two(mut stream: prism::ObjectRefGenerator<u64>) {
    read_first(&mut stream, 2);
    stream.cancel(false).unwrap();
    let start = std::time::Instant::now();
    let error = loop {
        assert!(
            start.elapsed() < LIMIT,
            "the stream must end soon after its cancel"
        );
        match stream.next_timeout(LIMIT) {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("the stream must end cancelled"),
        }
    };
    cancelled(Err::<(), _>(error));
}

#[test]
fn a_streaming_actor_call_is_stopped_by_its_cancel() {
    cluster();
    // An actor running one call at a time: the next call runs after.
    let recorder = Recorder::remote().unwrap();
    cancel_stream_after_two(recorder.ticks().unwrap());
    assert_eq!(
        prism::get_timeout(&recorder.record(7).unwrap(), LIMIT).unwrap(),
        vec![7]
    );
    // An actor running calls on threads of its own.
    let pair = Pair::remote().unwrap();
    cancel_stream_after_two(pair.ticks().unwrap());
    cancel_stream_after_two(pair.ticks().unwrap());
}

#[test]
fn a_dropped_generator_ends_its_streaming_task() {
    cluster();
    let mut stream = endless::remote().unwrap();
    read_first(&mut stream, 2);
    let done = stream.completed().clone();
    drop(stream);
    // The next value finds no generator: the task ends, cancelled,
    // instead of making values nobody reads.
    let said = cancelled(prism::get_timeout(&done, LIMIT));
    assert!(said.contains("endless"), "{said}");
}
