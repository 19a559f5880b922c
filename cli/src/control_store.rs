//! The head's control store as a process of its own (`prism gcs-server`,
//! which `prism start --head` runs), and the supervisor in the head node's
//! process that starts it and starts it again when it dies.
//!
//! The control store keeps its state in a file or in Redis (see
//! `prism_gcs`), so one
//! that starts again resumes the cluster: the head's raylet and workers,
//! and every other node, run on while it is down, and their calls to the
//! head wait for it (`PRISM_HEAD_RECONNECT_TIMEOUT_MS`). The dashboard
//! lives in the control store's process, since it reads its tables.

use crate::args::{ControlStoreArgs, TlsArgs};
use crate::common::runtime;
use prism_config::Backoff;
use prism_gcs::{GcsServer, GcsSettings, StateStore, Token};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// How long the supervisor waits for a control store to say it serves.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait before starting a control store that died again; it
/// doubles up to [`RESTART_WAIT_MAX`], and starts over after one that ran
/// for [`RESTART_WAIT_MAX`].
const RESTART_WAIT: Duration = Duration::from_millis(100);
const RESTART_WAIT_MAX: Duration = Duration::from_secs(5);
/// How long a control store asked to stop is given before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often a control store checks that the process that started it is
/// still there (it stops with its head node).
const PARENT_CHECK: Duration = Duration::from_millis(200);

/// What a control store prints, as one JSON line, once it serves.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ready {
    port: u16,
    cluster_id: String,
    dashboard: Option<String>,
}

/// `prism gcs-server`: serves the control store (and the dashboard) until
/// SIGTERM, SIGINT, or the end of the process that started it.
pub(crate) fn run(args: ControlStoreArgs) -> Result<ExitCode, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRISM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    if let Err(e) = prism_protocol::guard::raise_open_file_limit() {
        tracing::warn!(error = %e, "could not raise the soft limit on open files");
    }
    let rt = runtime()?;
    rt.block_on(serve(args))
}

async fn serve(args: ControlStoreArgs) -> Result<ExitCode, String> {
    let parent = std::os::unix::process::parent_id();
    let token = std::env::var("PRISM_AUTH_TOKEN")
        .map_err(|_| "the control store takes its token from PRISM_AUTH_TOKEN".to_string())
        .and_then(|t| Token::parse(&t).map_err(|e| e.to_string()))?;
    if let Some(files) = args.tls.files()? {
        let loaded = prism_protocol::tls::Tls::load(&files).map_err(|e| e.to_string())?;
        prism_protocol::tls::set(Some(loaded));
    }
    let config = prism::Config::default()
        .apply_env()
        .map_err(|e| e.to_string())?;
    let mut settings = GcsSettings::new(
        token.clone(),
        Duration::from_millis(config.heartbeat_period_ms.max(1)),
        Duration::from_millis(config.node_death_timeout_ms.max(1)),
    );
    settings.state = match (args.redis.place(), &args.state) {
        (Some(place), _) => Some(StateStore::Redis(place)),
        (None, Some(file)) => Some(StateStore::File(file.clone())),
        (None, None) => return Err("the control store needs --state or --redis-address".into()),
    };
    let bind = SocketAddr::from(([0, 0, 0, 0], args.port));
    let gcs = GcsServer::start(bind, settings)
        .await
        .map_err(|e| e.to_string())?;
    let jobs = crate::jobs::manager(&args, &gcs, &token).map_err(|e| e.to_string())?;
    let state = crate::state::api(&gcs, jobs.clone(), &token);
    let dashboard = match args.dashboard.dashboard_port {
        Some(port) if args.dashboard.include_dashboard => {
            let at = SocketAddr::new(args.dashboard.dashboard_host, port);
            let apis = crate::dashboard::Apis {
                jobs: Some(jobs.clone()),
                state: Some(state.clone()),
            };
            match crate::dashboard::start(at, gcs.view(), token.clone(), apis).await {
                Ok(running) => Some(running),
                Err(e) if args.dashboard_optional && e.kind() == std::io::ErrorKind::AddrInUse => {
                    tracing::warn!(address = %at, error = %e, "no dashboard: the default port is taken (choose one with --dashboard-port)");
                    None
                }
                Err(e) => {
                    gcs.shutdown().await;
                    return Err(format!(
                        "cannot serve the dashboard on {at}: {e} (choose another port with \
                         --dashboard-port, or start without one with --include-dashboard false)"
                    ));
                }
            }
        }
        _ => None,
    };
    let ready = Ready {
        port: gcs.address().port(),
        cluster_id: gcs.cluster_id().to_string(),
        dashboard: dashboard.as_ref().map(|d| d.address.to_string()),
    };
    let discovery =
        crate::discovery::start(gcs.view(), &args.temp.temp_dir, ready.dashboard.clone());
    let line = serde_json::to_string(&ready).map_err(|e| e.to_string())?;
    say!("{line}");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch for SIGTERM: {e}"))?;
    let orphaned = async {
        // Bounded by the life of the process that started this one.
        loop {
            tokio::time::sleep(PARENT_CHECK).await;
            if std::os::unix::process::parent_id() != parent {
                return;
            }
        }
    };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("the control store stops"),
        _ = tokio::signal::ctrl_c() => tracing::info!("the control store stops"),
        _ = orphaned => tracing::warn!("the head node's process is gone; the control store stops"),
    }
    drop(dashboard);
    drop(discovery);
    // The head stops: so do its jobs (a control store that dies leaves
    // them running, for the one started after it to find again).
    jobs.stop_all().await;
    gcs.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// How the supervisor runs the control store.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The port to listen on (0 picks one, kept for the restarts).
    pub(crate) port: u16,
    /// Where the state is kept.
    pub(crate) state: StateStore,
    /// The cluster token.
    pub(crate) token: Token,
    /// The dashboard's port and address, if it serves one, and whether
    /// it may go without when the port is taken.
    pub(crate) dashboard: Option<(u16, std::net::IpAddr, bool)>,
    /// TLS files, passed on.
    pub(crate) tls: TlsArgs,
    /// The temp folder, passed on.
    pub(crate) temp_dir: PathBuf,
    /// The folder of the job table and the jobs' logs.
    pub(crate) jobs_dir: PathBuf,
    /// The head node's address.
    pub(crate) node_ip: String,
}

/// A control store process kept running until [`ControlStore::stop`].
#[derive(Debug)]
pub(crate) struct ControlStore {
    /// The port it listens on.
    pub(crate) port: u16,
    /// The dashboard's address, if it serves one.
    pub(crate) dashboard: Option<String>,
    stop: tokio::sync::oneshot::Sender<()>,
    supervising: tokio::task::JoinHandle<()>,
}

impl ControlStore {
    /// Starts the control store and waits until it serves.
    pub(crate) async fn start(mut plan: Plan) -> Result<ControlStore, String> {
        let (child, ready) = launch(&plan).await?;
        // Restarts listen where the first one did.
        plan.port = ready.port;
        if let (Some(d), Some(at)) = (&mut plan.dashboard, &ready.dashboard) {
            if let Ok(at) = at.parse::<SocketAddr>() {
                d.0 = at.port();
            }
        }
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let supervising = tokio::spawn(supervise(plan, child, stopped));
        Ok(ControlStore {
            port: ready.port,
            dashboard: ready.dashboard,
            stop,
            supervising,
        })
    }

    /// Stops the control store and waits until it has.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.supervising.await;
    }
}

/// Starts one control store process and reads its ready line.
async fn launch(plan: &Plan) -> Result<(tokio::process::Child, Ready), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("gcs-server")
        .arg("--port")
        .arg(plan.port.to_string())
        .arg("--temp-dir")
        .arg(&plan.temp_dir)
        .arg("--jobs-dir")
        .arg(&plan.jobs_dir)
        .arg("--node-ip")
        .arg(&plan.node_ip)
        .env("PRISM_AUTH_TOKEN", plan.token.reveal())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        // A group of its own: a Ctrl-C at the head's terminal stops the
        // head node, which then stops it (it would be started again
        // otherwise); it stops by itself if the head node is killed.
        .process_group(0)
        .kill_on_drop(true);
    match &plan.state {
        StateStore::File(file) => {
            command.arg("--state").arg(file);
        }
        // The password, if any, is in the environment it inherits.
        StateStore::Redis(place) => {
            command
                .arg("--redis-address")
                .arg(&place.address)
                .arg("--storage-namespace")
                .arg(&place.namespace);
        }
    }
    match plan.dashboard {
        Some((port, host, optional)) => {
            command
                .arg("--dashboard-port")
                .arg(port.to_string())
                .arg("--dashboard-host")
                .arg(host.to_string());
            if optional {
                command.arg("--dashboard-optional");
            }
        }
        None => {
            command.arg("--include-dashboard").arg("false");
        }
    }
    for (flag, file) in [
        ("--tls-cert", &plan.tls.tls_cert),
        ("--tls-key", &plan.tls.tls_key),
        ("--tls-ca", &plan.tls.tls_ca),
    ] {
        if let Some(file) = file {
            command.arg(flag).arg(file);
        }
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the control store: {e}"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| "the control store's output cannot be read".to_string())?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(READY_TIMEOUT, lines.next_line()).await;
    let line = match first {
        Ok(Ok(Some(line))) => line,
        Ok(_) => {
            let status = child.wait().await.map_err(|e| e.to_string())?;
            return Err(format!(
                "the control store did not start ({status}); the lines above in this log say why"
            ));
        }
        Err(_) => {
            let _ = child.kill().await;
            return Err(format!(
                "the control store did not answer within {} s",
                READY_TIMEOUT.as_secs()
            ));
        }
    };
    let ready: Ready = serde_json::from_str(&line)
        .map_err(|e| format!("the control store said {line:?} instead of its address: {e}"))?;
    Ok((child, ready))
}

/// Starts the control store again each time it dies, until told to stop.
async fn supervise(
    plan: Plan,
    mut child: tokio::process::Child,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let mut backoff = Backoff::new(RESTART_WAIT, RESTART_WAIT_MAX);
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                tracing::error!(%status, "the control store died; starting it again (the nodes run on meanwhile)");
                if since.elapsed() >= RESTART_WAIT_MAX {
                    backoff.reset();
                }
                loop {
                    // No deadline: there is always a next pause.
                    let wait = backoff.next_pause().unwrap_or(RESTART_WAIT_MAX);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = &mut stopped => return,
                    }
                    match launch(&plan).await {
                        Ok((again, ready)) => {
                            tracing::info!(port = ready.port, cluster = %ready.cluster_id, "the control store serves again");
                            child = again;
                            since = tokio::time::Instant::now();
                            break;
                        }
                        Err(e) => tracing::error!(error = %e, "the control store could not be started again; trying again"),
                    }
                }
            }
            _ = &mut stopped => {
                terminate(&mut child).await;
                return;
            }
        }
    }
}

/// Asks the control store to stop, then kills it after the grace period.
async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // child's, not yet reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("the control store did not stop in time; killing it");
        let _ = child.kill().await;
    }
}
