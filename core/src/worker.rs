//! Worker mode: what a process started by a raylet does instead of `main`.
//!
//! The raylet starts workers by re-executing the job's binary with
//! `PRISM_WORKER=1`. A function placed in the ELF `.init_array` section runs
//! before `main` (and before a test harness), sees the variable, and turns
//! the process into a worker: it connects to the raylet, maps the store,
//! serves tasks until the raylet goes away, and exits. So any binary that
//! links `prism` (an example, a `main`, a `cargo test` or `cargo nextest`
//! test executable) serves as its own worker, with no code in `main`.
//! Remote functions and actor classes are found through tables built by the
//! linker (`linkme`), which are complete before any code runs.

use crate::config::Config;
use crate::core_worker::{self, CoreHandler, CoreWorker, Role, Startup};
use crate::{Error, Result};
use prism_protocol::ids::{JobId, NodeId, WorkerId};
use prism_protocol::messages::{GetClusterResources, RegisterWorker};
use prism_protocol::rpc::Connection;
use std::path::PathBuf;
use std::sync::Arc;

#[used]
#[link_section = ".init_array"]
static WORKER_ENTRY: extern "C" fn() = worker_entry;

extern "C" fn worker_entry() {
    enter_if_requested();
}

/// Runs the worker and exits, if this process was started as one.
pub(crate) fn enter_if_requested() {
    if std::env::var_os("PRISM_WORKER").is_none() {
        return;
    }
    // Before main, std has not yet ignored SIGPIPE; a write to a closed
    // socket must be an error, not death.
    // SAFETY: setting a signal disposition has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let code = match std::panic::catch_unwind(run) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("prism worker failed: {e}");
            1
        }
        Err(_) => 101,
    };
    std::process::exit(code);
}

/// The raylet closed our connection: the node is going away.
pub(crate) fn raylet_gone() {
    std::process::exit(0);
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::Config {
        key: name.to_string(),
        value: String::new(),
        expected: "a value set by the raylet that started this worker".into(),
    })
}

fn env_id(name: &str) -> Result<u128> {
    let v = env(name)?;
    v.parse().map_err(|_| Error::Config {
        key: name.to_string(),
        value: v,
        expected: "an id".into(),
    })
}

fn run() -> Result<()> {
    let worker_id = WorkerId(env_id("PRISM_WORKER_ID")?);
    let session_dir = PathBuf::from(env("PRISM_SESSION_DIR")?);
    let raylet_socket = PathBuf::from(env("PRISM_RAYLET_SOCKET")?);
    let store_path = PathBuf::from(env("PRISM_STORE_PATH")?);
    let node_id = NodeId(env_id("PRISM_NODE_ID")?);
    let job_id = JobId(env_id("PRISM_JOB_ID")?);
    crate::logging::init_file_logging(&session_dir, &format!("worker-{}.log", worker_id.0 as u64));
    let config = Arc::new(Config::default().apply_env()?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the worker's runtime", e))?;
    let handle = rt.handle().clone();
    let (jobs_tx, jobs) = std::sync::mpsc::channel::<crate::executor::Job>();
    rt.block_on(async move {
        let handler = CoreHandler::default();
        let raylet = Connection::connect(&raylet_socket, Arc::new(handler.clone())).await?;
        let core = CoreWorker::build(Startup {
            role: Role::Worker,
            rt: handle,
            config,
            worker_id,
            node_id,
            job_id,
            session_dir,
            store_path,
            raylet: raylet.clone(),
            handler,
        })?;
        core.executor.set_queue(jobs_tx);
        core_worker::set_current(Some(core.clone()));
        fetch_cluster_total(&core).await?;
        raylet
            .request(RegisterWorker {
                worker_id,
                address: core.address().clone(),
                pid: std::process::id(),
            })
            .await?;
        tracing::info!(worker = %worker_id, "worker ready");
        Ok::<(), Error>(())
    })?;
    // This thread is now the executor thread; the runtime's threads serve
    // connections. The process ends when the raylet goes away
    // (raylet_gone exits it).
    while let Ok(job) = jobs.recv() {
        job();
    }
    drop(rt);
    Ok(())
}

/// Caches the cluster's total resources for feasibility checks.
pub(crate) async fn fetch_cluster_total(core: &Arc<CoreWorker>) -> Result<()> {
    let resources = core.raylet.request(GetClusterResources {}).await?;
    *core.cluster_total.lock() = resources.total;
    Ok(())
}
