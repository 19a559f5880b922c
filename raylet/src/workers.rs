//! Starting worker processes, capturing their output, and noticing when they
//! exit.
//!
//! A worker is the job's own executable started with `PRISM_WORKER=1`: the
//! `prism` crate checks that variable before `main` runs and turns the
//! process into a worker, so examples, binaries and test executables all
//! serve as their own workers. Its stdout and stderr go, line by line, to
//! `logs/worker-<id>.out|.err` and (by default) to the driver's terminal.

use crate::node::{Job, Node, Worker, WorkerUse};
use parking_lot::Mutex;
use prism_protocol::error::Error;
use prism_protocol::ids::{JobId, WorkerId};
use prism_protocol::messages::{Request, Stream};
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;

/// What [`Node::launch`] needs to fork a worker.
struct Launch {
    worker_id: WorkerId,
    job_id: JobId,
    executable: PathBuf,
    cwd: PathBuf,
    /// Where its output goes besides the log files.
    driver: Option<Connection>,
    gpu_ids: Vec<u32>,
    label: Arc<Mutex<String>>,
}

impl Node {
    /// Records a driver and prestarts its workers.
    pub(crate) fn register_job(self: &Arc<Self>, job_id: JobId, job: Job) {
        let mut state = self.state.lock();
        state.jobs.insert(job_id, job);
        let launches: Vec<Launch> = (0..self.config.prestart_workers)
            .filter_map(|_| self.prepare_worker(&mut state, job_id, Vec::new()))
            .collect();
        drop(state);
        // Forked here, before the driver hears it is registered (so they
        // boot while it starts), but without the lock.
        for launch in launches {
            self.clone().launch(launch);
        }
    }

    /// Counts a worker that failed to start (or exited before it
    /// registered). After `RayletConfig::worker_start_attempts` in a row, returns the error that the job's waiting requests fail
    /// with, and counts afresh (a later request tries again).
    pub(crate) fn note_start_failure(
        &self,
        state: &mut crate::node::State,
        job_id: JobId,
        reason: String,
    ) -> Option<Error> {
        tracing::error!(job = %job_id, %reason, "a worker process failed to start");
        let job = state.jobs.get_mut(&job_id)?;
        job.start_failures += 1;
        let attempts = self.config.worker_start_attempts.max(1);
        if job.start_failures < attempts {
            return None;
        }
        job.start_failures = 0;
        Some(Error::WorkerStartFailed {
            executable: job.executable.display().to_string(),
            attempts,
            reason,
        })
    }

    /// Fails every queued request of `job_id` with `error`.
    fn refuse_job(self: &Arc<Self>, state: &mut crate::node::State, job_id: JobId, error: Error) {
        let (mine, rest): (std::collections::VecDeque<_>, _) = std::mem::take(&mut state.pending)
            .into_iter()
            .partition(|p| p.job == job_id);
        state.pending = rest;
        for pending in mine {
            self.refuse(state, pending, error.clone());
        }
    }

    /// A driver left: its workers and actors end with it.
    pub(crate) fn end_job(self: &Arc<Self>, job_id: JobId) {
        let mut state = self.state.lock();
        state.jobs.remove(&job_id);
        let pids: Vec<u32> = state
            .workers
            .values()
            .filter(|w| w.job == job_id)
            .map(|w| w.pid)
            .collect();
        drop(state);
        self.remove_groups_of(job_id);
        for pid in pids {
            kill_pid(pid);
        }
        tracing::info!(job = %job_id, "job ended; its workers were stopped");
    }

    /// Starts a worker process for `job_id`: records it as starting, then
    /// forks it on a blocking thread, so the scheduling state is never
    /// locked while a process is being forked. A worker that cannot be
    /// started goes the way of one that exits before registering
    /// ([`Node::worker_exited`]).
    pub(crate) fn start_worker(
        self: &Arc<Self>,
        state: &mut crate::node::State,
        job_id: JobId,
        gpu_ids: Vec<u32>,
    ) {
        if let Some(launch) = self.prepare_worker(state, job_id, gpu_ids) {
            let node = self.clone();
            tokio::task::spawn_blocking(move || node.launch(launch));
        }
    }

    /// Records a worker of `job_id` as starting; [`Node::launch`] then forks
    /// it.
    fn prepare_worker(
        &self,
        state: &mut crate::node::State,
        job_id: JobId,
        gpu_ids: Vec<u32>,
    ) -> Option<Launch> {
        let job = state.jobs.get(&job_id)?;
        let worker_id = WorkerId::new();
        let label = Arc::new(Mutex::new("starting".to_string()));
        let launch = Launch {
            worker_id,
            job_id,
            executable: job.executable.clone(),
            cwd: job.cwd.clone(),
            driver: job.log_to_driver.then(|| job.driver.clone()),
            gpu_ids: gpu_ids.clone(),
            label: label.clone(),
        };
        state.workers.insert(
            worker_id,
            Worker {
                job: job_id,
                // Set once forked (or by the worker's registration).
                pid: 0,
                gpu_ids,
                conn: None,
                address: None,
                usage: WorkerUse::Starting,
                label,
                blocked: false,
                idle_since: std::time::Instant::now(),
            },
        );
        Some(launch)
    }

    /// Forks and execs a worker recorded by [`Node::start_worker`], without
    /// the scheduling state's lock.
    fn launch(self: Arc<Self>, launch: Launch) {
        let Launch {
            worker_id,
            job_id,
            executable,
            cwd,
            driver,
            gpu_ids,
            label,
        } = launch;
        let mut cmd = Command::new(&executable);
        cmd.current_dir(&cwd)
            .env("PRISM_WORKER", "1")
            .env("PRISM_WORKER_ID", worker_id.0.to_string())
            .env("PRISM_RAYLET_SOCKET", &self.socket)
            .env("PRISM_SESSION_DIR", &self.config.session_dir)
            .env("PRISM_STORE_PATH", self.segment.path())
            .env("PRISM_NODE_ID", self.node_id.0.to_string())
            .env("PRISM_JOB_ID", job_id.0.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        if !gpu_ids.is_empty() {
            let ids: Vec<String> = gpu_ids.iter().map(|i| i.to_string()).collect();
            cmd.env("CUDA_VISIBLE_DEVICES", ids.join(","));
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let reason = format!("{} could not be started: {e}", executable.display());
                return self.worker_exited(worker_id, reason);
            }
        };
        let pid = child.id().unwrap_or(0);
        *label.lock() = format!("pid={pid}");
        let logs = self.config.session_dir.join("logs");
        if let Some(out) = child.stdout.take() {
            let path = logs.join(format!("worker-{}.out", worker_id.0 as u64));
            tokio::spawn(forward_lines(
                out,
                path,
                Stream::Stdout,
                label.clone(),
                driver.clone(),
            ));
        }
        if let Some(err) = child.stderr.take() {
            let path = logs.join(format!("worker-{}.err", worker_id.0 as u64));
            tokio::spawn(forward_lines(
                err,
                path,
                Stream::Stderr,
                label.clone(),
                driver,
            ));
        }
        {
            let mut state = self.state.lock();
            let wanted = !state.shutting_down && state.jobs.contains_key(&job_id);
            match state.workers.get_mut(&worker_id) {
                Some(worker) if wanted => {
                    if worker.pid == 0 {
                        worker.pid = pid;
                    }
                }
                // Its job ended (or the node is stopping) while it was being
                // forked: nobody else knows its pid.
                _ => kill_pid(pid),
            }
        }
        tracing::debug!(worker = %worker_id, pid, job = %job_id, "worker started");
        let node = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let reason = match status {
                Ok(s) => format!("worker process exited ({s})"),
                Err(e) => format!("worker process could not be waited on: {e}"),
            };
            node.worker_exited(worker_id, reason);
        });
    }

    /// A started worker connected back.
    pub(crate) fn register_worker(
        self: &Arc<Self>,
        worker_id: WorkerId,
        address: String,
        pid: u32,
        conn: Connection,
    ) -> Result<JobId, Error> {
        let mut state = self.state.lock();
        let Some(worker) = state.workers.get_mut(&worker_id) else {
            return Err(Error::Protocol {
                message: format!("{worker_id} was not started by this raylet"),
            });
        };
        // It may register before its launcher recorded the pid.
        if worker.pid == 0 {
            worker.pid = pid;
        }
        worker.conn = Some(conn);
        worker.address = Some(address);
        worker.set_idle();
        let job = worker.job;
        if let Some(job) = state.jobs.get_mut(&job) {
            job.start_failures = 0;
        }
        self.schedule(&mut state);
        Ok(job)
    }

    fn worker_exited(self: &Arc<Self>, worker_id: WorkerId, reason: String) {
        let mut state = self.state.lock();
        let Some(worker) = state.workers.remove(&worker_id) else {
            return;
        };
        tracing::debug!(worker = %worker_id, pid = worker.pid, %reason, "worker exited");
        if worker.usage == WorkerUse::Starting && !state.shutting_down {
            // It never registered: a failed start. No pool refill here, so
            // a binary that cannot start is not restarted in a loop.
            let reason = if worker.pid == 0 {
                reason // never forked: the reason says why
            } else {
                format!(
                    "{reason} before it registered; its output is in {}",
                    self.config
                        .session_dir
                        .join("logs")
                        .join(format!("worker-{}.err", worker_id.0 as u64))
                        .display()
                )
            };
            if let Some(error) = self.note_start_failure(&mut state, worker.job, reason) {
                self.refuse_job(&mut state, worker.job, error);
            }
            self.schedule(&mut state);
            return;
        }
        let lease = match worker.usage {
            WorkerUse::Leased(lease_id) => Some(lease_id),
            WorkerUse::Actor(actor_id) => {
                self.actor_died(&mut state, actor_id, reason.clone());
                state
                    .leases
                    .iter()
                    .find(|(_, l)| l.worker == worker_id)
                    .map(|(id, _)| *id)
            }
            _ => None,
        };
        if let Some(lease) = lease.and_then(|id| state.leases.remove(&id)) {
            crate::node::release_lease(&mut state, &lease);
        }
        // Keep the job's pool at its prestart size.
        if state.jobs.contains_key(&worker.job) && !state.shutting_down {
            let pool = state
                .workers
                .values()
                .filter(|w| {
                    w.job == worker.job && matches!(w.usage, WorkerUse::Idle | WorkerUse::Starting)
                })
                .count();
            if pool < self.config.prestart_workers {
                self.start_worker(&mut state, worker.job, Vec::new());
            }
        }
        self.schedule(&mut state);
    }

    /// Stops workers beyond the prestarted pool that have been idle for
    /// `idle_worker_timeout` (a burst of tasks can grow the pool).
    pub(crate) fn reap_idle_workers(&self) {
        let state = self.state.lock();
        let mut kept: HashMap<JobId, usize> = HashMap::new();
        let mut idle: Vec<&Worker> = state
            .workers
            .values()
            .filter(|w| w.usage == WorkerUse::Idle)
            .collect();
        // Keep the most recently used ones.
        idle.sort_by_key(|w| std::cmp::Reverse(w.idle_since));
        let mut victims = Vec::new();
        for w in idle {
            let n = kept.entry(w.job).or_default();
            if *n < self.config.prestart_workers
                || w.idle_since.elapsed() < self.config.idle_worker_timeout
            {
                *n += 1;
            } else {
                victims.push(w.pid);
            }
        }
        drop(state);
        for pid in victims {
            tracing::debug!(pid, "stopping an idle worker beyond the pool size");
            kill_pid(pid);
        }
    }

    /// Stops every worker process (shutdown) and reaps them.
    pub(crate) fn kill_all_workers(&self) {
        let mut state = self.state.lock();
        state.shutting_down = true;
        let pids: Vec<u32> = state.workers.values().map(|w| w.pid).collect();
        drop(state);
        for &pid in &pids {
            kill_pid(pid);
        }
        // Reap them, so a program that starts and stops clusters collects
        // no zombies; SIGKILL is immediate, the wait is bounded anyway.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let mut left = pids;
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

pub(crate) fn kill_pid(pid: u32) {
    if pid > 0 {
        // SIGKILL: a worker holds no state that must be flushed; its logs
        // are line-buffered through the raylet.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

async fn forward_lines(
    source: impl AsyncRead + Unpin,
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
            let _ = driver.notify(Request::WorkerOutput {
                label,
                stream,
                lines: vec![line],
            });
        }
    }
}
