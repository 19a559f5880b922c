//! The test hosts of the multi-node tests: real node processes in network
//! namespaces, started, inspected, killed and stopped through the `prism`
//! command, and drivers run on a host as children of the test binary.

#![allow(dead_code)]

use prism_tests::must;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use prism_tests::netns::Network;

pub const PRISM: &str = env!("CARGO_BIN_EXE_prism");
/// Set in the child that acts as a driver on one of the hosts.
pub const DRIVER: &str = "PRISM_CLI_TEST_DRIVER";
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
    let deadline = Instant::now() + limit;
    while must(child.try_wait(), "the command's state").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    must(child.wait_with_output(), "the command's output")
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
