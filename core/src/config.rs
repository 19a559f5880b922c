//! The runtime's part of the table of tunables (`docs/config.md` lists
//! every crate's).
//!
//! Every knob is one entry below: its name with its unit, type, default and
//! why. Code sets it on [`Config`] (fields and builder methods); the
//! environment variable `PRISM_<NAME>` (upper case), read when
//! `prism::init` runs, overrides that. A value that does not parse makes
//! `init` fail with [`Error::Config`] naming the variable, the value and
//! the type expected.

use crate::Error;
use prism_protocol::resources::{Quantity, ResourceSet, CPU, GPU, MEMORY};
use prism_raylet::{MemoryMonitorConfig, RayletConfig, SpillConfig};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

prism_config::table! {
    /// Runtime configuration; see the module docs for overrides.
    #[derive(Debug, Clone)]
    pub struct Config("PRISM_") {
    /// Address of a running cluster to join: its head, `HOST:PORT` (the
    /// driver connects through the raylet that `prism start` runs on this
    /// machine), or a raylet socket path or session directory. `None`
    /// starts an embedded single-node cluster.
    address: Option<String> = None;
    /// CPUs this node offers; `None` means every core of the machine.
    num_cpus: Option<u32> = None;
    /// GPUs this node offers; `None` counts `/dev/nvidia<N>` devices.
    num_gpus: Option<u32> = None;
    /// Memory this node offers to tasks, in bytes; `None` is the machine's
    /// total, or the node's cgroup limit when that is lower (a container's).
    memory_bytes: Option<u64> = None;
    /// Object store capacity. Ray's default is 30% of memory (the memory
    /// offered to tasks above, so a container's limit bounds it); we take
    /// the same share, bounded so that tests on small machines stay small.
    object_store_memory_bytes: Option<u64> = None;
    /// Values up to this size travel inside messages; larger ones go to
    /// shared memory once. 100 KiB, as in Ray: below this a copy through a
    /// socket costs less than a store round trip.
    max_direct_call_object_size_bytes: u64 = 100 * 1024;
    /// Namespace for named actors.
    namespace: String = "default".to_string();
    /// Where session directories are made (logs, sockets): `/tmp/prism`
    /// for root, `/tmp/prism-<uid>` for any other user, so that users of
    /// one machine never share one.
    temp_dir: PathBuf = prism_protocol::guard::default_temp_dir();
    /// Session folders of ended sessions kept in `temp_dir` (their logs);
    /// older ones are removed when a new session starts. 10: the last few
    /// runs to read back, a few MB of logs, not the program copies and
    /// sockets of every run ever (those go when a session ends).
    sessions_kept: usize = 10;
    /// Forward workers' stdout and stderr to the driver's terminal.
    log_to_driver: bool = true;
    /// Threads of the driver's runtime: two serve a 2-core machine, more
    /// only add switching.
    runtime_threads: usize = 2;
    /// How long a submitter keeps an idle leased worker before giving it
    /// back; a short hold makes back-to-back calls skip the lease round trip.
    lease_idle_ms: u64 = 20;
    /// Workers beyond the prestarted pool (started for a burst of tasks)
    /// are stopped after being idle this long; starting one again costs a
    /// few milliseconds, an idle one a few MiB.
    idle_worker_timeout_ms: u64 = 10_000;
    /// How long a lease request of a local client that fits no live node
    /// of a multi-node cluster waits for a node that can hold it to join
    /// (reported meanwhile as demand, which an autoscaler answers with a
    /// new node) before it fails as infeasible. 0 (the default) fails it
    /// at once, as a cluster that cannot grow should; `prism up` sets 10
    /// minutes on the nodes of a cluster its autoscaler may grow.
    infeasible_wait_ms: u64 = 0;
    /// How long `init` waits for the raylet and the first workers.
    startup_timeout_ms: u64 = 30_000;
    /// Lease requests a driver keeps in flight per resource shape. 16:
    /// enough to fill a node's workers quickly, few enough that a burst of
    /// tasks does not flood the raylet.
    max_lease_requests_per_shape: usize = 16;
    /// The most tasks a submitter sends a leased worker at once. Tasks of a
    /// kind that takes under a millisecond are sent ahead, about a
    /// millisecond of them: the worker finds its next task queued as it
    /// finishes one instead of waiting a round trip for it, and tasks
    /// travel several to a read. Tasks queued behind one that runs 10 ms
    /// are handed back and go to other workers. 64: on 2 cores a single
    /// client's short tasks ran 2.4 times as fast at 16 as one at a time,
    /// and 1.2 times faster again at 64, where a worker still holds a
    /// millisecond of 15 µs tasks at most. 1 sends one at a time, as Ray
    /// does.
    max_tasks_in_flight_per_worker: usize = 64;
    /// The most task workers one job may have on a node at once (actors
    /// not counted); `None` is 4 per CPU, at least 8, so that blocked tasks
    /// (a nested `get`) leave room for the tasks they wait on.
    max_workers_per_job: Option<usize> = None;
    /// Worker processes that may fail to start in a row before the requests
    /// waiting for one fail with `WorkerStartFailed`. 3: a transient
    /// failure (a fork refused under memory pressure) gets retried, a
    /// binary that cannot start is reported within a second.
    worker_start_attempts: u32 = 3;
    /// How often the raylet stops workers idle for longer than
    /// `idle_worker_timeout_ms`. 1 s: far below the timeout itself.
    idle_worker_reap_period_ms: u64 = 1_000;
    /// Removed placement groups whose state stays readable (as `Removed`)
    /// after their resources went back. 10,000 groups: a few MiB at most.
    removed_placement_groups_kept: usize = 10_000;
    /// Ended tasks each node keeps for `prism list tasks` (the oldest are
    /// dropped first, and counted). 10,000 tasks: a few MiB.
    task_events_kept: usize = 10_000;
    /// How often a process reports the tasks it owned that ended, those
    /// waiting in its queues, and the runs it executed to its node (for
    /// `prism list tasks`, `prism timeline` and the `ray_tasks` metric;
    /// runs are also sent 20 ms after they end); 0 turns the recording off
    /// (Ray's `task_events_report_interval_ms`).
    task_events_report_interval_ms: u64 = 1_000;
    /// The first bytes of the object store that the raylet allocates in the
    /// background as it starts, so that the first puts find their memory
    /// ready (a fresh 100 MiB put is about twice as fast). 128 MiB: the
    /// size of a large first put, held from start-up on (it shows in the
    /// machine's shared memory, in no process's PSS until used); 0 turns
    /// it off.
    object_store_warm_bytes: u64 = 128 << 20;
    /// Spill objects to disk when the store fills, instead of failing puts
    /// and task results with `ObjectStoreFull`; they are read back when
    /// needed. On, as in Ray.
    object_spilling: bool = true;
    /// The store's fill level (a fraction of its capacity, in (0, 1]) from
    /// which unpinned objects are spilled in the background, least
    /// recently used first. 0.8, as Ray: room for the next puts stays free.
    object_spilling_threshold: f64 = 0.8;
    /// Where spill files go; `None` is `spill/` in the session directory.
    /// Files are deleted when their objects are freed and at shutdown.
    object_spill_dir: Option<PathBuf> = None;
    /// The node's memory use (a fraction in (0, 1], of the machine's memory
    /// or of the raylet's cgroup limit when it is lower) above which the
    /// raylet stops the worker of the newest task, which then fails with
    /// `WorkerDied` naming the memory in use and is retried like any worker
    /// death. 0.95, as Ray: close to full, before the kernel's own
    /// out-of-memory killer picks a process (perhaps the driver).
    memory_usage_threshold: f64 = 0.95;
    /// How often the memory monitor reads the node's memory; 0 turns it
    /// off. 250 ms, as Ray: a task allocating at memory speed still gets
    /// stopped before the machine is full.
    memory_monitor_refresh_ms: u64 = 250;
    /// Freed heap memory a worker process keeps for its next allocations
    /// instead of handing it back to the kernel (glibc's trim threshold;
    /// allocations up to 32 MiB then come from the heap rather than from
    /// a mapping of their own). A task that allocates large buffers block
    /// after block (a data pipeline's, a batch of tensors) otherwise pays
    /// a page fault and a page clearing for every 4 KiB of every buffer,
    /// which measured a third of a Parquet ingest's time. 256 MiB per
    /// worker at most, held only after a task used it; 0 keeps glibc's
    /// defaults. Read by each worker from its environment
    /// (`PRISM_WORKER_HEAP_KEEP_BYTES`).
    worker_heap_keep_bytes: u64 = 256 << 20;
    /// How long a thread waiting for an answer that is about to come (a
    /// `get` of a call's result, a worker's executor waiting for its next
    /// task or actor call) polls before it sleeps. A sleeping thread costs
    /// a wake-up of tens of microseconds on a virtual machine, as much as a
    /// round trip; polling costs that much CPU at most per wait. 0 sleeps
    /// at once. Read by each worker from its environment
    /// (`PRISM_SPIN_WAIT_US`).
    spin_wait_us: u64 = 100;
    /// When not 0, a thread waiting as `spin_wait_us` says polls only
    /// while the machine's runnable threads (the kernel's count in
    /// `/proc/loadavg`, sampled at most once a millisecond, polling threads
    /// included) are at most this percent of the cores the process may
    /// use, and sleeps at once above it: a polling thread takes turns from
    /// threads that have work when there are more of them than cores. 0 (the default) polls whatever
    /// the load: on two cores a limit of 100-200% made synchronous calls
    /// 15-40% slower, as the polling threads count themselves. Read by each
    /// worker from its environment (`PRISM_SPIN_MAX_LOAD_PERCENT`).
    spin_max_load_percent: u64 = 0;
    /// How often each node of a multi-node cluster reports its free
    /// resources to the head (set on the head, which tells each node as it
    /// joins). 500 ms: a few hundred bytes
    /// per node per beat, and a view of the cluster that is never more
    /// than half a second old.
    heartbeat_period_ms: u64 = 500;
    /// A node whose heartbeats stopped for this long is marked DEAD by the
    /// head (set on the head). 5 s: ten missed beats, so a pause of a busy
    /// machine is not taken for a death, while a dead node's callers learn
    /// of it within seconds (Ray waits about 15 s).
    node_death_timeout_ms: u64 = 5_000;
    /// How long a node keeps trying a call to the head while the head
    /// cannot be reached (its control store is restarting) before the
    /// call fails with an error that says so: a new named actor, a
    /// spillback, a placement group, a key-value call. The node's own tasks
    /// and actors run on meanwhile. 60 s, as Ray's
    /// `gcs_rpc_server_reconnect_timeout_s`. A node started before its
    /// head (`prism start --address`) waits as long for the head to
    /// answer, with a log line per try.
    head_reconnect_timeout_ms: u64 = 60_000;
    /// Environment variables for every worker and actor of this driver's
    /// job, as a JSON object of strings (Ray's `ray.init(runtime_env=
    /// {"env_vars": ...})`); a job submitted through the Jobs API gets its
    /// `env_vars` here. Set in code with [`Config::job_env_vars`].
    job_env_vars_json: Option<String> = None;
    }
    extra {
        /// Custom resources this node offers (name to amount).
        resources: BTreeMap<String, f64> = BTreeMap::new();
        /// Return `Ok` from a second `init` instead of `AlreadyInitialized`.
        ignore_reinit_error: bool = false;
    }
}

impl Config {
    /// Applies `PRISM_<NAME>` environment overrides.
    pub fn apply_env(mut self) -> Result<Self, Error> {
        self.apply_env_overrides().map_err(|e| Error::Config {
            key: e.key,
            value: e.value,
            expected: e.expected,
        })?;
        Ok(self)
    }
}

impl Config {
    /// Sets environment variables for every worker and actor of this
    /// driver's job (Ray's `runtime_env={"env_vars": ...}` in `ray.init`).
    ///
    /// ```
    /// let config = prism::Config::default().job_env_vars([("MODE", "fast")]);
    /// # let _ = config;
    /// ```
    pub fn job_env_vars<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let vars: BTreeMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self.job_env_vars_json = serde_json::to_string(&vars).ok();
        self
    }

    /// The job's environment variables, checked.
    pub(crate) fn job_env_vars_checked(&self) -> Result<BTreeMap<String, String>, Error> {
        let Some(text) = &self.job_env_vars_json else {
            return Ok(BTreeMap::new());
        };
        let bad = || Error::Config {
            key: "PRISM_JOB_ENV_VARS_JSON".into(),
            value: text.clone(),
            expected: "a JSON object of strings, names without '=' or NUL".into(),
        };
        let vars: BTreeMap<String, String> = serde_json::from_str(text).map_err(|_| bad())?;
        if vars
            .iter()
            .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(bad());
        }
        Ok(vars)
    }

    /// Sets the CPU count.
    pub fn num_cpus(mut self, n: u32) -> Self {
        self.num_cpus = Some(n);
        self
    }

    /// Sets the GPU count.
    pub fn num_gpus(mut self, n: u32) -> Self {
        self.num_gpus = Some(n);
        self
    }

    /// Sets the object store capacity in bytes.
    pub fn object_store_memory(mut self, bytes: u64) -> Self {
        self.object_store_memory_bytes = Some(bytes);
        self
    }

    /// Adds a custom resource.
    pub fn resource(mut self, name: impl Into<String>, amount: impl Into<f64>) -> Self {
        self.resources.insert(name.into(), amount.into());
        self
    }

    /// Turns spilling objects to disk on or off (default on).
    pub fn object_spilling(mut self, on: bool) -> Self {
        self.object_spilling = on;
        self
    }

    /// Sets where spill files go.
    pub fn object_spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.object_spill_dir = Some(dir.into());
        self
    }

    /// Sets the namespace for named actors.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Joins the cluster at `address` instead of starting one.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Whether worker output is printed by the driver.
    pub fn log_to_driver(mut self, on: bool) -> Self {
        self.log_to_driver = on;
        self
    }

    /// Makes a second `init` succeed quietly.
    pub fn ignore_reinit_error(mut self, on: bool) -> Self {
        self.ignore_reinit_error = on;
        self
    }

    /// The node's total resources, from this config and the machine.
    pub(crate) fn node_resources(&self) -> Result<ResourceSet, Error> {
        let mut set = ResourceSet::new();
        let cpus = self.num_cpus.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
        set.set(CPU, Quantity::whole(cpus as u64));
        let gpus = self.num_gpus.unwrap_or_else(count_gpu_devices);
        set.set(GPU, Quantity::whole(gpus as u64));
        set.set(
            MEMORY,
            Quantity::whole(self.memory_bytes.unwrap_or_else(total_memory_bytes)),
        );
        for (name, amount) in &self.resources {
            if matches!(name.as_str(), CPU | GPU | MEMORY) {
                return Err(Error::invalid(
                    format!("resource {name:?}"),
                    "use Config::num_cpus / num_gpus / memory_bytes for the built-in resources",
                ));
            }
            let q = Quantity::from_f64(name, *amount)
                .map_err(|e| Error::invalid(format!("resource {name:?}"), e.to_string()))?;
            set.set(name.clone(), q);
        }
        Ok(set)
    }

    /// The raylet settings this config gives a node whose session
    /// directory is `session_dir`: what the embedded cluster and
    /// `prism start` run.
    pub fn raylet_config(&self, session_dir: PathBuf) -> Result<RayletConfig, Error> {
        let resources = self.node_resources()?;
        let cpus = (resources.get(CPU).units() / Quantity::SCALE) as usize;
        let spill_dir =
            (self.object_spill_dir.clone()).unwrap_or_else(|| session_dir.join("spill"));
        Ok(RayletConfig {
            resources,
            object_store_bytes: self.store_capacity(),
            prestart_workers: cpus,
            max_workers_per_job: match self.max_workers_per_job {
                Some(n) => n.max(1),
                None => (cpus * 4).max(8),
            },
            idle_worker_timeout: Duration::from_millis(self.idle_worker_timeout_ms),
            infeasible_wait: Duration::from_millis(self.infeasible_wait_ms),
            idle_worker_reap_period: Duration::from_millis(self.idle_worker_reap_period_ms),
            worker_start_attempts: self.worker_start_attempts,
            removed_placement_groups_kept: self.removed_placement_groups_kept,
            task_events_kept: self.task_events_kept,
            object_store_warm_bytes: self.object_store_warm_bytes,
            memory_monitor: MemoryMonitorConfig {
                threshold: self.memory_usage_threshold,
                refresh: Duration::from_millis(self.memory_monitor_refresh_ms),
            },
            spill: SpillConfig {
                enabled: self.object_spilling,
                threshold: self.object_spilling_threshold,
                dir: spill_dir,
            },
            session_dir,
            cluster: None,
        })
    }

    /// Makes a fresh session directory under `temp_dir` (and points
    /// `session_latest` at it).
    pub fn new_session_dir(&self) -> Result<PathBuf, Error> {
        crate::logging::new_session_dir(&self.temp_dir, self.sessions_kept)
    }

    pub(crate) fn store_capacity(&self) -> u64 {
        self.object_store_memory_bytes.unwrap_or_else(|| {
            let memory = self.memory_bytes.unwrap_or_else(total_memory_bytes);
            (memory / 10 * 3).clamp(64 << 20, 8 << 30)
        })
    }
}

fn count_gpu_devices() -> u32 {
    (0..64)
        .take_while(|i| std::path::Path::new(&format!("/dev/nvidia{i}")).exists())
        .count() as u32
}

/// The machine's memory, or this process's cgroup limit when lower (in a
/// container, the pod's limit: offering the machine's would let the node
/// be killed by the kernel for using what it was told it had).
fn total_memory_bytes() -> u64 {
    let machine = machine_memory_bytes();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let read = |path: &std::path::Path| std::fs::read_to_string(path).ok();
    match cgroup_memory_limit(&own, read) {
        Some(limit) if limit < machine => limit,
        _ => machine,
    }
}

/// The memory limit that applies to the cgroup `/proc/self/cgroup` (`own`)
/// names: the lowest of cgroup v2's `memory.max` or v1's
/// `memory.limit_in_bytes` over the group and its ancestors (the group's
/// path exists only inside a cgroup namespace; without one, a container
/// sees its own group at the hierarchy's root, also read). `None` without
/// a limit ("max", or v1's page-rounded i64::MAX).
fn cgroup_memory_limit(
    own: &str,
    read: impl Fn(&std::path::Path) -> Option<String>,
) -> Option<u64> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let parse = |text: Option<String>| -> Option<u64> {
        let value: u64 = text?.trim().parse().ok()?;
        (value < 1 << 60).then_some(value)
    };
    let mut lowest: Option<u64> = None;
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The group, each ancestor, and the root.
        let mut dir = std::path::PathBuf::from(path.trim_start_matches('/'));
        loop {
            if let Some(limit) = parse(read(&base.join(&dir).join(file))) {
                lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
            }
            if !dir.pop() {
                break;
            }
        }
    }
    lowest
}

fn machine_memory_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        8 << 30
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_memory_limit_is_read_from_its_cgroup() {
        let files = |entries: &'static [(&'static str, &'static str)]| {
            move |p: &std::path::Path| {
                entries
                    .iter()
                    .find(|(path, _)| std::path::Path::new(path) == p)
                    .map(|(_, text)| text.to_string())
            }
        };
        // cgroup v2, inside a container's namespace.
        let v2 = files(&[("/sys/fs/cgroup/memory.max", "2147483648\n")]);
        assert_eq!(cgroup_memory_limit("0::/\n", v2), Some(2 << 30));
        // cgroup v2 with no limit.
        let unlimited = files(&[("/sys/fs/cgroup/user.slice/memory.max", "max\n")]);
        assert_eq!(cgroup_memory_limit("0::/user.slice\n", unlimited), None);
        // cgroup v1 (hybrid: the v1 memory controller wins), unlimited and
        // limited.
        let own = "12:memory:/pod1\n0::/pod1\n";
        let v1 = files(&[(
            "/sys/fs/cgroup/memory/pod1/memory.limit_in_bytes",
            "1073741824\n",
        )]);
        assert_eq!(cgroup_memory_limit(own, v1), Some(1 << 30));
        let v1_unlimited = files(&[(
            "/sys/fs/cgroup/memory/pod1/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(cgroup_memory_limit(own, v1_unlimited), None);
        assert_eq!(cgroup_memory_limit("", files(&[])), None);
        // Without a cgroup namespace, the container's own group is at the
        // root of its mount; a parent's lower limit applies too; a line
        // that does not parse is skipped.
        let root_only = files(&[("/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n")]);
        assert_eq!(
            cgroup_memory_limit("garbage\n4:memory:/kubepods/pod1/c1\n", root_only),
            Some(512 << 20)
        );
        let parent = files(&[
            ("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "1073741824\n"),
        ]);
        assert_eq!(
            cgroup_memory_limit("0::/kubepods/pod1/c1\n", parent),
            Some(1 << 30)
        );
    }

    #[test]
    fn the_object_store_takes_30_percent_of_the_memory_offered() {
        let config = Config {
            memory_bytes: Some(4 << 30),
            ..Config::default()
        };
        assert_eq!(config.store_capacity(), (4u64 << 30) / 10 * 3);
        let given = config.object_store_memory(100 << 20);
        assert_eq!(given.store_capacity(), 100 << 20);
    }

    #[test]
    fn a_value_that_does_not_parse_names_key_value_and_type() {
        std::env::set_var("PRISM_LEASE_IDLE_MS", "soon");
        let err = Config::default().apply_env().unwrap_err();
        std::env::remove_var("PRISM_LEASE_IDLE_MS");
        assert_eq!(
            err.to_string(),
            "config PRISM_LEASE_IDLE_MS: \"soon\" is not an unsigned integer"
        );
    }
}
