//! The shared harness of Prism's integration tests.
//!
//! Integration tests run real clusters: [`ClusterSpec`] starts this test
//! binary's embedded cluster with the CPUs, GPUs and custom resources a
//! test needs (the raylet forks the workers from this very binary), and
//! the [`Cluster`] it returns finds and kills worker processes by pid.
//! Every wait is bounded, and the `must_` helpers fail with a message that
//! states the requirement that was not met, not just the values compared.
//!
//! ```no_run
//! use prism_tests::{must, must_eventually, ClusterSpec};
//! use std::time::Duration;
//!
//! let cluster = ClusterSpec::new().cpus(2).resource("special", 1.0).start();
//! let pids = cluster.worker_pids();
//! must_eventually("the pool has started", Duration::from_secs(10), || {
//!     !cluster.worker_pids().is_empty()
//! });
//! let total = must(prism::cluster_resources(), "the cluster reports its resources").0;
//! # let _ = (pids, total);
//! ```
#![warn(missing_docs)]

pub mod netns;

use std::fmt::Debug;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// How often bounded waits poll.
const POLL: Duration = Duration::from_millis(20);

/// The cluster a test binary needs. One embedded cluster runs per process:
/// the first [`ClusterSpec::start`] starts it, later ones (from other tests
/// of the same binary) join it, so tests that share a binary must ask for
/// the same spec (under nextest each test is a process of its own).
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    cpus: u32,
    gpus: u32,
    resources: Vec<(String, f64)>,
    store_bytes: u64,
    lease_idle: Option<Duration>,
    namespace: Option<String>,
}

impl Default for ClusterSpec {
    /// Two CPUs, two (fake) GPUs, one `special` resource and a 1 GiB store,
    /// whatever the machine has.
    fn default() -> Self {
        ClusterSpec {
            cpus: 2,
            gpus: 2,
            resources: vec![("special".into(), 1.0)],
            store_bytes: 1 << 30,
            lease_idle: None,
            namespace: None,
        }
    }
}

impl ClusterSpec {
    /// A cluster with two CPUs, no GPUs, no custom resources and a 1 GiB
    /// store.
    pub fn new() -> Self {
        ClusterSpec {
            gpus: 0,
            resources: Vec::new(),
            ..ClusterSpec::default()
        }
    }

    /// CPUs the node offers.
    pub fn cpus(mut self, n: u32) -> Self {
        self.cpus = n;
        self
    }

    /// GPUs the node offers (devices `0..n`, whether or not they exist).
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// A custom resource the node offers.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources.push((name.to_string(), amount));
        self
    }

    /// The object store's capacity.
    pub fn store_bytes(mut self, bytes: u64) -> Self {
        self.store_bytes = bytes;
        self
    }

    /// How long the driver keeps an idle leased worker (`lease_idle_ms`).
    pub fn lease_idle(mut self, hold: Duration) -> Self {
        self.lease_idle = Some(hold);
        self
    }

    /// The driver's namespace for named actors (`Config::namespace`).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Starts this process's cluster (or joins the one already started).
    ///
    /// # Panics
    ///
    /// If the cluster cannot start, with the reason.
    pub fn start(self) -> Cluster {
        let mut config = prism::Config::default()
            .num_cpus(self.cpus)
            .num_gpus(self.gpus)
            .object_store_memory(self.store_bytes)
            .ignore_reinit_error(true);
        for (name, amount) in &self.resources {
            config = config.resource(name.clone(), *amount);
        }
        if let Some(namespace) = self.namespace {
            config = config.namespace(namespace);
        }
        if let Some(hold) = self.lease_idle {
            config.lease_idle_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        }
        must(prism::init(config), "the embedded test cluster must start");
        Cluster { _private: () }
    }
}

/// The standard test cluster: [`ClusterSpec::default`], started.
pub fn cluster() -> Cluster {
    ClusterSpec::default().start()
}

/// A running test cluster.
#[derive(Debug)]
pub struct Cluster {
    _private: (),
}

impl Cluster {
    /// The pids of this cluster's worker processes now: the embedded
    /// raylet forks them as children of this process, with `PRISM_WORKER`
    /// set.
    pub fn worker_pids(&self) -> Vec<u32> {
        let me = std::process::id();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| parent_of(pid) == Some(me) && !is_gone(pid) && is_worker(pid))
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Kills worker `pid` at once (SIGKILL) and waits, bounded, until it
    /// has exited.
    ///
    /// # Panics
    ///
    /// If `pid` is not one of this cluster's workers, or outlives `limit`.
    pub fn kill_worker(&self, pid: u32, limit: Duration) {
        assert!(
            self.worker_pids().contains(&pid),
            "pid {pid} must be a worker of this cluster to be killed; workers: {:?}",
            self.worker_pids()
        );
        kill(pid);
        must_eventually(&format!("worker {pid} exits after SIGKILL"), limit, || {
            is_gone(pid)
        });
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields start after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn is_worker(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|v| v == b"PRISM_WORKER=1"))
        .unwrap_or(false)
}

/// True once `pid` has exited: gone, or a zombie not yet reaped whose
/// threads have all exited (a process's leader turns zombie while its
/// other threads may still be closing its files).
pub fn is_gone(pid: u32) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    zombie && threads <= 1
}

/// Sends SIGKILL to `pid`.
pub fn kill(pid: u32) {
    // SAFETY: kill(2) touches no memory of this process.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}

/// Polls `check` until it holds; false if `limit` passes first. For code
/// that must not panic (an actor method waiting for its peers).
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `check` until it holds.
///
/// # Panics
///
/// If it does not hold within `limit`, naming the requirement `what`.
pub fn must_eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not true after {limit:?}");
        std::thread::sleep(POLL);
    }
}

/// Polls `probe` until it gives a value.
///
/// # Panics
///
/// If it gives none within `limit`, naming the requirement `what`.
pub fn must_become<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(start.elapsed() < limit, "{what}: not true after {limit:?}");
        std::thread::sleep(POLL);
    }
}

/// The value of `result`.
///
/// # Panics
///
/// On an error, stating `requirement` and the error.
pub fn must<T, E: Debug>(result: Result<T, E>, requirement: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{requirement}; it failed with {e:?}"),
    }
}

/// The error of `result`.
///
/// # Panics
///
/// If it succeeded, stating `requirement` and the value.
pub fn must_fail<T: Debug, E>(result: Result<T, E>, requirement: &str) -> E {
    match result {
        Ok(value) => panic!("{requirement}; it succeeded with {value:?}"),
        Err(e) => e,
    }
}

/// Runs `command` (another driver, say) to completion within `limit`.
///
/// # Panics
///
/// If it cannot start, runs past `limit` (it is killed and reaped first),
/// or exits unsuccessfully; each message names `what`.
pub fn must_run_child(what: &str, command: &mut Command, limit: Duration) -> ExitStatus {
    let mut child = must(command.spawn(), &format!("{what} must start"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = must(child.try_wait(), &format!("{what} must be waited on")) {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} must finish within {limit:?}; it was killed");
        }
        std::thread::sleep(POLL);
    };
    assert!(
        status.success(),
        "{what} must succeed; it exited with {status}"
    );
    status
}

/// Set in a test's child process by [`in_own_process`].
const OWN_PROCESS: &str = "PRISM_TEST_OWN_PROCESS";

/// Runs test `name` of the current test binary again in a child process
/// with `env` set, and requires it to pass within `limit`: for tests that
/// need a cluster of their own (one cluster per process) or settings read
/// at start-up. Returns true in the child, where the test does its work,
/// and false in the parent once the child passed.
///
/// # Panics
///
/// In the parent, if the child fails or runs past `limit`.
pub fn in_own_process(name: &str, env: &[(&str, &str)], limit: Duration) -> bool {
    if std::env::var_os(OWN_PROCESS).is_some() {
        return true;
    }
    let exe = must(std::env::current_exe(), "the test binary must be known");
    let mut command = Command::new(exe);
    command
        .args(["--exact", name, "--nocapture"])
        .env(OWN_PROCESS, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    must_run_child(name, &mut command, limit);
    false
}
