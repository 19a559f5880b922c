//! Starting worker processes, capturing their output, and noticing when they
//! exit, behind the [`Launcher`] trait.
//!
//! A worker is the job's own executable started with `PRISM_WORKER=1`: the
//! `prism` crate checks that variable before `main` runs and turns the
//! process into a worker, so examples, binaries and test executables all
//! serve as their own workers. [`ProcessLauncher`] sends its stdout and
//! stderr, line by line, to `logs/worker-<id>.out|.err` and (by default) to
//! the driver's terminal.

use parking_lot::Mutex;
use prism_protocol::ids::{JobId, NodeId, WorkerId};
use prism_protocol::messages::{Stream, WorkerOutput};
use prism_protocol::rpc::Connection;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;

/// One worker to start.
#[derive(Debug)]
pub(crate) struct WorkerLaunch {
    pub(crate) worker: WorkerId,
    pub(crate) job: JobId,
    pub(crate) executable: PathBuf,
    pub(crate) cwd: PathBuf,
    /// The job's namespace (`PRISM_NAMESPACE` in its environment).
    pub(crate) namespace: String,
    /// The job's environment variables (set before the node's own, which
    /// they cannot change).
    pub(crate) env_vars: std::collections::BTreeMap<String, String>,
    /// Its `CUDA_VISIBLE_DEVICES`, when not empty.
    pub(crate) gpu_ids: Vec<u32>,
    /// Where its output goes besides the log files.
    pub(crate) driver: Option<Connection>,
    /// The prefix of its output lines on the driver's terminal.
    pub(crate) label: Arc<Mutex<String>>,
}

/// Called once, with the reason, when a launched worker exits.
pub(crate) type OnExit = Box<dyn FnOnce(String) + Send>;

/// Starts and stops worker processes. The raylet forks real ones
/// ([`ProcessLauncher`]); anything else that stands in for it must call
/// `on_exit` once per worker it launched.
pub(crate) trait Launcher: Send + Sync + std::fmt::Debug {
    /// Starts a worker and returns its pid, or says why it could not.
    /// Runs on a blocking thread inside the runtime, never under the
    /// scheduling lock.
    fn launch(&self, launch: WorkerLaunch, on_exit: OnExit) -> Result<u32, String>;

    /// Stops a worker at once (a pid of zero is ignored).
    fn kill(&self, pid: u32);

    /// Stops workers and collects them, waiting a bounded time.
    fn kill_and_reap(&self, pids: Vec<u32>);
}

/// What every worker of this node is told in its environment.
#[derive(Debug)]
pub(crate) struct ProcessLauncher {
    pub(crate) node_id: NodeId,
    pub(crate) raylet_socket: PathBuf,
    pub(crate) session_dir: PathBuf,
    pub(crate) store_path: PathBuf,
    /// In a multi-node cluster: this node's address and the cluster token,
    /// so that workers listen on TCP for peers on other nodes.
    pub(crate) cluster: Option<(String, String)>,
}

impl Launcher for ProcessLauncher {
    fn launch(&self, launch: WorkerLaunch, on_exit: OnExit) -> Result<u32, String> {
        if let Some(e) = crate::faults::injected("worker_start") {
            return Err(e.to_string());
        }
        let WorkerLaunch {
            worker,
            job,
            executable,
            cwd,
            namespace,
            env_vars,
            gpu_ids,
            driver,
            label,
        } = launch;
        let mut cmd = Command::new(&executable);
        cmd.current_dir(&cwd)
            .envs(&env_vars)
            .env("PRISM_WORKER", "1")
            .env("PRISM_WORKER_ID", worker.0.to_string())
            .env("PRISM_RAYLET_SOCKET", &self.raylet_socket)
            .env("PRISM_SESSION_DIR", &self.session_dir)
            .env("PRISM_STORE_PATH", &self.store_path)
            .env("PRISM_NODE_ID", self.node_id.0.to_string())
            .env("PRISM_JOB_ID", job.0.to_string())
            .env("PRISM_NAMESPACE", namespace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        match &self.cluster {
            Some((node_ip, token)) => {
                cmd.env("PRISM_NODE_IP", node_ip)
                    .env("PRISM_AUTH_TOKEN", token);
                // Workers speak TLS to other nodes as their node does.
                match prism_protocol::tls::current() {
                    Some(tls) => {
                        let files = tls.files();
                        cmd.env("PRISM_TLS_CERT", &files.cert)
                            .env("PRISM_TLS_KEY", &files.key)
                            .env("PRISM_TLS_CA", &files.ca);
                    }
                    None => {
                        cmd.env_remove("PRISM_TLS_CERT")
                            .env_remove("PRISM_TLS_KEY")
                            .env_remove("PRISM_TLS_CA");
                    }
                }
            }
            None => {
                cmd.env_remove("PRISM_NODE_IP");
            }
        }
        if !gpu_ids.is_empty() {
            let ids: Vec<String> = gpu_ids.iter().map(|i| i.to_string()).collect();
            cmd.env("CUDA_VISIBLE_DEVICES", ids.join(","));
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{} could not be started: {e}", executable.display()))?;
        let pid = child.id().unwrap_or(0);
        *label.lock() = format!("pid={pid}");
        let logs = self.session_dir.join("logs");
        let outputs = [
            (child.stdout.take().map(boxed), "out", Stream::Stdout),
            (child.stderr.take().map(boxed), "err", Stream::Stderr),
        ];
        for (source, ext, stream) in outputs {
            if let Some(source) = source {
                let path = logs.join(format!("worker-{}.{ext}", worker.0 as u64));
                tokio::spawn(forward_lines(
                    source,
                    path,
                    stream,
                    label.clone(),
                    driver.clone(),
                ));
            }
        }
        tracing::debug!(%worker, pid, %job, "worker started");
        tokio::spawn(async move {
            let reason = match child.wait().await {
                Ok(s) => format!("worker process exited ({s})"),
                Err(e) => format!("worker process could not be waited on: {e}"),
            };
            on_exit(reason);
        });
        Ok(pid)
    }

    fn kill(&self, pid: u32) {
        kill_pid(pid);
    }

    fn kill_and_reap(&self, pids: Vec<u32>) {
        for &pid in &pids {
            kill_pid(pid);
        }
        // Reap them, so a program that starts and stops clusters collects
        // no zombies; SIGKILL is immediate, the wait is bounded anyway.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let mut left: Vec<u32> = pids.into_iter().filter(|&p| p > 0).collect();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            left.retain(|&pid| {
                let mut status = 0;
                // SAFETY: waitpid on our own child with a valid out pointer.
                let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
                r == 0
            });
            if !left.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}

type Output = Box<dyn AsyncRead + Unpin + Send>;

fn boxed(source: impl AsyncRead + Unpin + Send + 'static) -> Output {
    Box::new(source)
}

fn kill_pid(pid: u32) {
    if pid > 0 {
        // SIGKILL: a worker holds no state that must be flushed; its logs
        // are line-buffered through the raylet.
        // SAFETY: kill(2) takes any pid and signal; it touches no memory.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

async fn forward_lines(
    source: Output,
    log_path: PathBuf,
    stream: Stream,
    label: Arc<Mutex<String>>,
    driver: Option<Connection>,
) {
    let mut log = std::fs::File::create(&log_path).ok();
    let mut lines = BufReader::new(source).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(f) = log.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        if let Some(driver) = &driver {
            let label = label.lock().clone();
            let _ = driver.notify(WorkerOutput {
                label,
                stream,
                lines: vec![line],
            });
        }
    }
}
