//! The test hosts of the multi-node tests: real node processes in network
//! namespaces, started, inspected, killed and stopped through the `prism`
//! command, and drivers run on a host as children of the test binary; and
//! what several test files share besides: remote functions and actors
//! their drivers run, scheduling options, and clusters brought up for a
//! driver.

#![allow(dead_code)]

use prism_tests::{must, must_eventually};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use prism_tests::netns::Network;

pub mod head;

pub const PRISM: &str = env!("CARGO_BIN_EXE_prism");
/// Set in the child that acts as a driver on one of the hosts.
pub const DRIVER: &str = "PRISM_CLI_TEST_DRIVER";
/// Set in a driver child: the folder it and its test talk through (some
/// tests choose the child's mode by it, not by [`DRIVER`]).
pub const MARKS: &str = "PRISM_CLI_TEST_MARKS";
/// A head that marks a silent node dead within 1.5 s.
pub const FAST_DEATH: &[(&str, &str)] = &[
    ("PRISM_NODE_DEATH_TIMEOUT_MS", "1500"),
    ("PRISM_HEARTBEAT_PERIOD_MS", "200"),
];

/// Test hosts, and the temp dir of each host's node (each host plays a
/// machine of its own). Dropping it stops every node by force and removes
/// the namespaces and folders.
pub struct Machines {
    pub net: Network,
    pub temps: Vec<PathBuf>,
}

impl Machines {
    /// `None` (and a note) where namespaces cannot be made.
    pub fn new(tag: &str, hosts: usize) -> Option<Machines> {
        if let Err(why) = Network::available() {
            eprintln!("skipped: {why}");
            return None;
        }
        let net = must(Network::create(tag, hosts), "the test hosts must be made");
        let temps = (0..hosts)
            .map(|i| {
                std::env::temp_dir().join(format!("prism-cli-{}-{tag}-{i}", std::process::id()))
            })
            .collect::<Vec<_>>();
        for t in &temps {
            let _ = std::fs::remove_dir_all(t);
        }
        Some(Machines { net, temps })
    }

    pub fn ip(&self, host: usize) -> &str {
        &self.net.hosts()[host].ip
    }

    /// Runs `prism <args> --temp-dir <host's>` on `host`, bounded in time.
    pub fn prism(&self, host: usize, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = self.net.command(host, PRISM);
        command.args(args).arg("--temp-dir").arg(&self.temps[host]);
        run_bounded(command, env, Duration::from_secs(60))
    }

    pub fn start_head(&self, env: &[(&str, &str)]) -> String {
        self.start_head_with(env, &["--num-cpus", "1"])
    }

    /// Starts the head on host 0 with `extra` flags (its resources).
    pub fn start_head_with(&self, env: &[(&str, &str)], extra: &[&str]) -> String {
        let ip = self.ip(0).to_string();
        let mut args = vec![
            "start",
            "--head",
            "--port",
            "6380",
            "--node-ip-address",
            &ip,
        ];
        args.extend_from_slice(extra);
        let out = self.prism(0, &args, env);
        assert!(out.status.success(), "the head must start: {}", text(&out));
        format!("{ip}:6380")
    }

    pub fn token(&self) -> String {
        must(
            std::fs::read_to_string(self.temps[0].join("token")),
            "the head saves its token",
        )
    }

    pub fn join(&self, host: usize, head: &str) -> Output {
        self.join_with(host, head, &[])
    }

    /// Joins `host` with `hidden` (a folder) empty to its node: a machine
    /// that lacks what the others have there.
    pub fn join_hiding(&self, host: usize, head: &str, hidden: &std::path::Path) -> Output {
        let (ip, token) = (self.ip(host).to_string(), self.token());
        // `ip netns exec` runs its command in a mount namespace of its own:
        // the empty file system mounted over `hidden` is seen by this
        // node's processes only.
        let mut command = self.net.command(host, "sh");
        command
            .args([
                "-c",
                "mount -t tmpfs -o size=1m prism-hidden \"$0\" && exec \"$@\"",
            ])
            .arg(hidden)
            .arg(PRISM)
            .args(["start", "--address", head, "--token", &token])
            .args(["--node-ip-address", &ip, "--num-cpus", "1", "--temp-dir"])
            .arg(&self.temps[host]);
        run_bounded(command, &[], Duration::from_secs(60))
    }

    pub fn join_with(&self, host: usize, head: &str, extra: &[&str]) -> Output {
        self.join_env(host, head, extra, &[])
    }

    /// Joins `host` with extra flags, its node process started with `env`.
    pub fn join_env(
        &self,
        host: usize,
        head: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        let (ip, token) = (self.ip(host).to_string(), self.token());
        let mut args = vec!["start", "--address", head, "--token", &token];
        args.extend(["--node-ip-address", &ip, "--num-cpus", "1"]);
        args.extend_from_slice(extra);
        self.prism(host, &args, env)
    }

    pub fn status(&self, host: usize) -> String {
        let out = self.prism(host, &["status"], &[]);
        assert!(
            out.status.success(),
            "prism status must work: {}",
            text(&out)
        );
        text(&out)
    }

    /// Runs this test binary's `test` on `host` as a driver of the cluster
    /// at `head` (its child mode is chosen by `env`), bounded in time.
    pub fn run_driver(
        &self,
        host: usize,
        test: &str,
        head: &str,
        env: &[(&str, &str)],
        limit: Duration,
    ) -> String {
        let exe = must(std::env::current_exe(), "this test's binary");
        self.run_driver_from(&exe, host, test, head, env, limit)
    }

    /// [`Machines::run_driver`] with this test's binary found at `exe`.
    pub fn run_driver_from(
        &self,
        exe: &std::path::Path,
        host: usize,
        test: &str,
        head: &str,
        env: &[(&str, &str)],
        limit: Duration,
    ) -> String {
        let mut driver = self.net.command(host, exe);
        driver.args(["--exact", test, "--nocapture"]);
        let temp = self.temps[host].display().to_string();
        let mut all = vec![("PRISM_ADDRESS", head), ("PRISM_TEMP_DIR", temp.as_str())];
        all.extend_from_slice(env);
        let out = run_bounded(driver, &all, limit);
        let said = text(&out);
        assert!(out.status.success(), "the driver must run: {said}");
        said
    }

    /// The pid of the node process running on `host`.
    pub fn node_pid(&self, host: usize) -> u32 {
        let records = prism_raylet::NodeRecord::list(&self.temps[host]);
        must(
            records.first().map(|r| r.pid).ok_or("none"),
            "the host runs a node",
        )
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        for t in &self.temps {
            for r in prism_raylet::NodeRecord::list(t) {
                // SAFETY: kill has no memory-safety preconditions; the
                // record names a process of this test (pid and start time).
                unsafe { libc::kill(r.pid as libc::pid_t, libc::SIGKILL) };
                let _ = prism_tests::wait_until(Duration::from_secs(5), || !r.is_running());
            }
            let _ = std::fs::remove_dir_all(t);
        }
    }
}

/// Starts the head on host 0 with FAST_DEATH and `extra` flags, its
/// temp folder made first (a machine whose disk was wiped), and returns
/// its address.
pub fn run_bounded_until_started(m: &Machines, extra: &[&str]) -> String {
    must(
        std::fs::create_dir_all(&m.temps[0]),
        "the head's temp folder",
    );
    m.start_head_with(FAST_DEATH, extra)
}

pub fn run_bounded(mut command: Command, env: &[(&str, &str)], limit: Duration) -> Output {
    command
        .env_remove("PRISM_ADDRESS")
        .env_remove("PRISM_AUTH_TOKEN")
        .env_remove("PRISM_TEMP_DIR")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = must(command.spawn(), "the command must start");
    // Read while it runs: output larger than a pipe holds must not stop it.
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = must(child.try_wait(), "the command's state") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// What the multi-node test files share beyond the hosts: remote functions
// and actors their drivers run, scheduling options, clusters brought up
// for a driver, and drivers run in the background.

/// Sleeps so that tasks overlap, and says where it ran and what it got:
/// the sum of `data`, and `out` bytes made here.
#[prism::remote]
pub fn where_and_sum(data: Vec<u8>, out: usize) -> (String, u64, Vec<u8>) {
    std::thread::sleep(Duration::from_millis(400));
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    let sum = data.iter().map(|&b| b as u64).sum();
    (node, sum, vec![7u8; out])
}

#[prism::actor]
pub struct Tally {
    total: u64,
}

#[prism::actor]
impl Tally {
    fn new() -> Self {
        Tally { total: 0 }
    }

    fn add(&mut self, n: u64) -> u64 {
        self.total += n;
        self.total
    }
}

#[prism::remote]
pub fn node_of() -> String {
    std::thread::sleep(Duration::from_millis(300));
    prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default()
}

/// Node affinity to `node` (with `soft`, falling back elsewhere when it is
/// gone).
pub fn affinity(node: &prism::NodeInfo, soft: bool) -> prism::SchedulingStrategy {
    let node_id = must(
        prism::NodeId::parse(&node.node_id).ok_or("bad id"),
        "a node id",
    );
    prism::SchedulingStrategy::NodeAffinity { node_id, soft }
}

/// Options that run a task on `node` and nowhere else.
pub fn on(node: &prism::NodeInfo) -> prism::TaskOptions {
    prism::TaskOptions::new().scheduling_strategy(affinity(node, false))
}

/// Options that place an actor on `node`.
pub fn actor_on(node: &prism::NodeInfo) -> prism::ActorOptions {
    prism::ActorOptions::new().scheduling_strategy(affinity(node, false))
}

/// A driver's start: it joins its node and finds the nodes of the second
/// and third hosts.
pub fn join_and_find_b_c() -> (prism::NodeInfo, prism::NodeInfo) {
    // Not the default namespace: the job's workers on B and C must be told
    // it, or they name and look up actors elsewhere.
    must(
        prism::init(prism::Config::default().namespace("cluster-tests")),
        "the driver joins its node",
    );
    let listed = must(prism::nodes(), "the nodes are listed");
    let host = |ip: &str| {
        must(
            listed
                .iter()
                .find(|n| n.node_ip == ip)
                .cloned()
                .ok_or("absent"),
            "the host is a node",
        )
    };
    (host("10.77.0.2"), host("10.77.0.3"))
}

/// Three hosts: the head (started with `head_env`) and two nodes joined,
/// each in every raylet's view. `None` where namespaces cannot be made.
pub fn three_nodes(tag: &str, head_env: &[(&str, &str)]) -> Option<(Machines, String)> {
    nodes_up(tag, 3, head_env)
}

/// `hosts` hosts: the head (started with `head_env`) and the others
/// joined, each in every raylet's view. `None` where namespaces cannot be
/// made.
pub fn nodes_up(tag: &str, hosts: usize, head_env: &[(&str, &str)]) -> Option<(Machines, String)> {
    let m = Machines::new(tag, hosts)?;
    let head = m.start_head(head_env);
    for host in 1..hosts {
        let out = m.join(host, &head);
        assert!(out.status.success(), "the node joins: {}", text(&out));
    }
    let alive = format!("Nodes: {hosts} alive");
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains(&alive),
    );
    // One heartbeat later every raylet has the others in its view.
    std::thread::sleep(Duration::from_millis(1200));
    Some((m, head))
}

/// Runs the driver part of `test` (this binary, in driver mode) on the
/// head's host and returns what it printed.
pub fn drive_on_head(m: &Machines, head: &str, test: &str) -> String {
    m.run_driver(0, test, head, &[(DRIVER, "1")], Duration::from_secs(180))
}

/// Kills the node process this task runs under (its workers' parent).
#[prism::remote]
pub fn end_my_node() {
    // SAFETY: kill and getppid have no memory-safety preconditions; the
    // parent is this test's node process on its own test host.
    unsafe { libc::kill(libc::getppid(), libc::SIGKILL) };
}

/// Says which node it runs on.
#[prism::actor]
pub struct Where {}

#[prism::actor]
impl Where {
    fn new() -> Self {
        Where {}
    }

    fn node(&self) -> String {
        prism::runtime_context()
            .map(|c| c.node_id.to_string())
            .unwrap_or_default()
    }

    /// Ends this actor for good.
    fn leave(&self) -> Result<(), String> {
        prism::exit_actor().map_err(|e| e.to_string())
    }

    /// Crashes its process.
    fn crash(&self) {
        std::process::exit(3);
    }
}

/// A worker's context, its process group and its node's id.
pub fn worker_start() -> Result<
    (
        prism_train::TrainContext,
        std::sync::Arc<prism_train::collective::ProcessGroup>,
        String,
    ),
    prism_train::TrainError,
> {
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    Ok((ctx, group, node))
}

/// A head that marks a silent node dead within 1.5 s (one CPU, for the
/// driver) and three nodes offering one `resource` each, all in every
/// raylet's view. `None` where namespaces cannot be made.
pub fn head_and_three(tag: &str, resource: &str) -> Option<(Machines, String)> {
    let m = Machines::new(tag, 4)?;
    let head = m.start_head_with(FAST_DEATH, &["--num-cpus", "1"]);
    let offer = format!("{{\"{resource}\": 1}}");
    for host in 1..4 {
        let out = m.join_with(host, &head, &["--resources", &offer]);
        assert!(out.status.success(), "the node joins: {}", text(&out));
    }
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 4 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));
    Some((m, head))
}

/// An empty marks folder for this test process.
pub fn fresh_marks(tag: &str) -> PathBuf {
    let marks = std::env::temp_dir().join(format!("prism-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marks);
    must(std::fs::create_dir_all(&marks), "the marks folder");
    marks
}

/// Runs this binary's `test` as a driver on the head's host, in the
/// background (the test meanwhile kills nodes), with `marks` to talk
/// through.
pub fn drive_in_background(
    m: &Machines,
    test: &'static str,
    head: &str,
    marks: &std::path::Path,
) -> std::thread::JoinHandle<std::process::Output> {
    let mut driver = m
        .net
        .command(0, must(std::env::current_exe(), "this test's binary"));
    driver.args(["--exact", test, "--nocapture"]);
    let temp0 = m.temps[0].display().to_string();
    let marks = marks.display().to_string();
    let address = head.to_string();
    std::thread::spawn(move || {
        let env = [
            (DRIVER, "1"),
            (MARKS, marks.as_str()),
            ("PRISM_ADDRESS", address.as_str()),
            ("PRISM_TEMP_DIR", temp0.as_str()),
        ];
        run_bounded(driver, &env, Duration::from_secs(150))
    })
}

/// What a background driver said, once it finished well.
pub fn finished(waiter: std::thread::JoinHandle<std::process::Output>) -> String {
    let out = must(waiter.join().map_err(|_| "panicked"), "the driver finishes");
    let said = text(&out);
    assert!(out.status.success(), "the driver must finish: {said}");
    said
}

/// The host whose node is `node_id`.
pub fn host_of(m: &Machines, node_id: &str) -> usize {
    must(
        (0..m.temps.len())
            .find(|&h| {
                prism_raylet::NodeRecord::list(&m.temps[h])
                    .iter()
                    .any(|r| r.node_id == node_id)
            })
            .ok_or("no host runs it"),
        "the node is one of the hosts",
    )
}
