//! `prism start`: a node process (the head's control store and raylet, or a
//! raylet joining a head), in the background or in the foreground.

use crate::args::StartArgs;
use crate::common::{find_token, given_token, runtime, token_on_command_line};
use crate::control_store::{ControlStore, Plan};
use prism_config::Backoff;
use prism_gcs::{GcsSettings, StateStore, Token};
use prism_raylet::{ClusterLink, NodeRecord, Raylet};
use std::net::UdpSocket;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `prism start` waits for the node it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The head's dashboard port unless `--dashboard-port` says otherwise (Ray's).
const DASHBOARD_PORT: u16 = 8265;

pub(crate) fn start(mut args: StartArgs) -> Result<ExitCode, String> {
    // In a Slurm allocation: the head or a joining node, as Slurm's
    // variables say; the head tells the others where it is.
    let publish = match args.slurm {
        true => slurm_roles(&mut args)?,
        false => None,
    };
    if let Some(meet) = publish {
        let temp = args.temp.temp_dir.clone();
        let block = args.block;
        let publisher = std::thread::spawn(move || publish_head(&temp, &meet));
        if !block {
            let code = start_now(args)?;
            publisher
                .join()
                .map_err(|_| "publishing the head's address panicked".to_string())??;
            return Ok(code);
        }
        // In the foreground: published once the head runs; a failure to
        // publish is logged by the thread, as the node keeps running.
        return start_now(args);
    }
    start_now(args)
}

/// Sets `args` for this node of the Slurm allocation: its role, session
/// folder, CPUs and GPUs, and (joining) the head's address and token.
/// Returns the meeting folder for the head to publish in.
fn slurm_roles(args: &mut StartArgs) -> Result<Option<PathBuf>, String> {
    let alloc = crate::slurm::Allocation::from_env(|k| std::env::var(k).ok())?;
    if args.temp.temp_dir == prism_protocol::guard::default_temp_dir() {
        args.temp.temp_dir = alloc.temp_dir();
    }
    args.num_cpus = args.num_cpus.or(alloc.cpus);
    args.num_gpus = args.num_gpus.or(alloc.gpus);
    let meet = alloc.meeting_dir();
    if alloc.node_index == 0 {
        crate::slurm::make_private_dir(&meet)?;
        args.head = true;
        eprintln!(
            "prism: Slurm job {}: the head runs on {} ({} node(s))",
            alloc.job_id,
            alloc.nodes[0],
            alloc.nodes.len()
        );
        return Ok(Some(meet));
    }
    let head = crate::slurm::wait_for_file(&meet.join("head"), crate::slurm::MEET_LIMIT)?;
    args.address = Some(head);
    args.token_file = Some(meet.join("token"));
    Ok(None)
}

/// Once this machine's head runs, writes its token and then its address
/// into the meeting folder (the address last: the others wait for it).
fn publish_head(temp: &Path, meet: &Path) -> Result<(), String> {
    let deadline = std::time::Instant::now() + crate::slurm::MEET_LIMIT;
    let head = loop {
        if let Some(r) = NodeRecord::list(temp).into_iter().find(|r| r.is_head) {
            break r.head;
        }
        if std::time::Instant::now() > deadline {
            let e = format!(
                "the head did not start within {} s",
                crate::slurm::MEET_LIMIT.as_secs()
            );
            eprintln!("prism: {e}");
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let token = std::fs::read_to_string(temp.join("token"))
        .map_err(|e| format!("the head's token in {}: {e}", temp.display()))?;
    crate::slurm::write_private(&meet.join("token"), token.trim())?;
    crate::slurm::write_private(&meet.join("head"), &head)?;
    Ok(())
}

fn start_now(mut args: StartArgs) -> Result<ExitCode, String> {
    // Everything that can be checked here is, so a mistake is reported
    // before any process starts.
    args.token = given_token(args.token.as_deref(), args.token_file.as_deref())?;
    if token_on_command_line() && !args.block {
        eprintln!(
            "prism: warning: a token given with --token can be read by every user of this \
             machine while this command runs; use --token-file FILE or PRISM_AUTH_TOKEN (the \
             node started here gets it from its environment, not its command line)"
        );
    }
    let config = node_config(&args)?;
    if let Some(files) = args.tls.files()? {
        prism_protocol::tls::Tls::load(&files).map_err(|e| e.to_string())?;
    }
    if !args.head {
        find_token(args.token.as_deref(), &args.temp.temp_dir)?;
    }
    if let Some(warning) = no_route_warning(&args) {
        eprintln!("prism: warning: {warning}");
    }
    if args.block {
        return run_node(args, config);
    }
    // A joining node may wait for its head first (see `wait_for_head`).
    let limit = if args.head {
        START_TIMEOUT
    } else {
        START_TIMEOUT + Duration::from_millis(config.head_reconnect_timeout_ms)
    };
    start_in_background(&args, limit)
}

/// The node's settings: the environment's `PRISM_` values, then the flags.
fn node_config(args: &StartArgs) -> Result<prism::Config, String> {
    let mut config = prism::Config::default()
        .apply_env()
        .map_err(|e| e.to_string())?;
    config.temp_dir = args.temp.temp_dir.clone();
    if let Some(n) = args.num_cpus {
        config = config.num_cpus(n);
    }
    if let Some(n) = args.num_gpus {
        config = config.num_gpus(n);
    }
    if let Some(bytes) = args.memory {
        config.memory_bytes = Some(bytes);
    }
    if let Some(bytes) = args.object_store_memory {
        config = config.object_store_memory(bytes);
    }
    if let Some(json) = &args.resources {
        let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
            .map_err(|e| {
                format!("--resources {json:?} is not a JSON object of names to amounts: {e}")
            })?;
        for (name, amount) in parsed {
            let amount = amount.as_f64().ok_or_else(|| {
                format!("--resources: the amount of {name:?} must be a number, not {amount}")
            })?;
            config = config.resource(name, amount);
        }
    }
    // Resource values are checked here (a negative amount, a built-in name).
    config
        .raylet_config(args.temp.temp_dir.join("unused"))
        .map_err(|e| e.to_string())?;
    if let Some(address) = &args.address {
        prism_gcs::check_address(address).map_err(|e| format!("--address: {e}"))?;
    }
    Ok(config)
}

/// Runs this command again with `--block` in a new session, its output in
/// a log file, and waits until the node's record appears.
fn start_in_background(args: &StartArgs, limit: Duration) -> Result<ExitCode, String> {
    let temp = &args.temp.temp_dir;
    let logs = temp.join("logs");
    prism_protocol::guard::private_dir(temp)
        .and_then(|()| prism_protocol::guard::private_dir(&logs))
        .map_err(|e| format!("cannot keep logs in {}: {e}", logs.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let log_path = logs.join(format!("prism-node-{stamp}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let err_log = log
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut command = std::process::Command::new(exe);
    // The token goes in the environment, which only this user can read;
    // never on the node's command line, which every user can.
    command
        .args(without_token(std::env::args_os().skip(1)))
        .env_remove("PRISM_AUTH_TOKEN")
        .arg("--block")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err_log);
    if let Some(token) = &args.token {
        command.env("PRISM_AUTH_TOKEN", token);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the node from this
    // terminal's session, so closing the terminal does not stop it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the node process: {e}"))?;
    let record_path = NodeRecord::dir(temp).join(format!("{}.json", child.id()));
    let deadline = Instant::now() + limit;
    loop {
        if let Some(record) = NodeRecord::list(temp)
            .into_iter()
            .find(|r| r.pid == child.id())
        {
            print_started(&record, temp, &log_path, args.dashboard.include_dashboard);
            return Ok(ExitCode::SUCCESS);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!(
                "the node did not start ({status}):\n{}",
                output.trim_end()
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the node did not answer within {} s (no {}); its log is {}",
                limit.as_secs(),
                record_path.display(),
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn print_started(record: &NodeRecord, temp: &Path, log: &Path, dashboard_wanted: bool) {
    let token_path = temp.join("token");
    let token = Token::load(&token_path)
        .map(|t| t.reveal().to_string())
        .unwrap_or_else(|_| "<see the token file>".into());
    if record.is_head {
        say!("Prism head node started.");
    } else {
        say!(
            "Prism node started and joined the cluster at {}.",
            record.head
        );
    }
    say!(
        "  node:     {} at {} (pid {})",
        record.node_id,
        record.node_ip,
        record.pid
    );
    say!("  session:  {}", record.session_dir.display());
    say!("  log:      {}", log.display());
    if record.is_head {
        say!("  address:  {}", record.head);
        say!(
            "  token:    {token} (saved in {}, readable by you only)",
            token_path.display()
        );
        say!();
        match &record.dashboard {
            Some(at) => say!("  dashboard: {}", crate::dashboard::login_url(at, &token)),
            None if dashboard_wanted => say!(
                "  dashboard: none, port {DASHBOARD_PORT} is taken here (choose another with \
                 --dashboard-port)"
            ),
            None => {}
        }
        say!("To add another machine to this cluster, run there (the token in the");
        say!("environment, where other users of that machine cannot read it):");
        say!(
            "  PRISM_AUTH_TOKEN={token} prism start --address {}",
            record.head
        );
        say!(
            "or copy {} there and give it with --token-file.",
            token_path.display()
        );
    }
    say!();
    say!("To run a driver on this machine, in this cluster:");
    say!(
        "  PRISM_ADDRESS={} cargo run --release --example pi",
        record.head
    );
    say!("To see the cluster: prism status");
    say!("To stop this machine's nodes: prism stop");
}

/// The arguments of this command without the token's flags and values
/// (`--token T`, `--token=T`, `--token-file F`, `--token-file=F`).
fn without_token(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        match arg.to_str() {
            Some("--token" | "--token-file") => skip_value = true,
            Some(a) if a.starts_with("--token=") || a.starts_with("--token-file=") => {}
            _ => kept.push(arg),
        }
    }
    kept
}

/// The node process itself: runs until SIGTERM or SIGINT (it leaves the
/// cluster), or until the head gives it up.
fn run_node(args: StartArgs, config: prism::Config) -> Result<ExitCode, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRISM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a node's log file is plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    match prism_protocol::guard::raise_open_file_limit() {
        Ok((before, after)) if after > before => {
            tracing::info!(before, after, "raised the soft limit on open files");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not raise the soft limit on open files"),
    }
    if let Some(warning) = no_route_warning(&args) {
        tracing::warn!("{warning}");
    }
    let rt = runtime()?;
    rt.block_on(serve(args, config))
}

async fn serve(args: StartArgs, config: prism::Config) -> Result<ExitCode, String> {
    let temp = args.temp.temp_dir.clone();
    prism_protocol::guard::private_dir(&temp).map_err(|e| e.to_string())?;
    // Every TCP connection of this node, and of its workers, in TLS.
    let tls = args.tls.files()?;
    if let Some(files) = &tls {
        let loaded = prism_protocol::tls::Tls::load(files).map_err(|e| e.to_string())?;
        prism_protocol::tls::set(Some(loaded));
    }
    let (gcs, head, token, node_ip) = if args.head {
        // A head already running here holds both the port and the state:
        // say so by the port, the clearer of the two.
        if args.port != 0 {
            let address = std::net::SocketAddr::from(([0, 0, 0, 0], args.port));
            if let Err(e) = std::net::TcpListener::bind(address) {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    return Err(prism_gcs::GcsError::PortInUse { address }.to_string());
                }
            }
        }
        let state_dir = head_state_dir(&args);
        let state = match args.redis.place() {
            Some(place) => StateStore::Redis(place),
            None => StateStore::File(state_dir.join("state.redb")),
        };
        let token = match &args.token {
            Some(t) => Token::parse(t).map_err(|e| e.to_string())?,
            None => match saved_token(&state).await? {
                Some(saved) => {
                    tracing::info!(%state, "resuming the cluster saved there, with its token");
                    saved
                }
                None => Token::generate(),
            },
        };
        let node_ip = match &args.node_ip_address {
            Some(ip) => ip.clone(),
            None => route_ip(None),
        };
        let asked = &args.dashboard;
        let dashboard = asked.include_dashboard.then(|| {
            (
                asked.dashboard_port.unwrap_or(DASHBOARD_PORT),
                asked.dashboard_host,
                asked.dashboard_port.is_none(),
            )
        });
        let store = ControlStore::start(Plan {
            port: args.port,
            state,
            token: token.clone(),
            dashboard,
            tls: args.tls.clone(),
            temp_dir: temp.clone(),
            jobs_dir: state_dir.clone(),
            node_ip: node_ip.clone(),
        })
        .await?;
        token.save(&temp.join("token")).map_err(|e| e.to_string())?;
        let head = format!("{node_ip}:{}", store.port);
        (Some((store, state_dir)), head, token, node_ip)
    } else {
        let head = args.address.clone().unwrap_or_default();
        let token = find_token(args.token.as_deref(), &temp)?;
        wait_for_head(
            &head,
            Duration::from_millis(config.head_reconnect_timeout_ms),
        )
        .await?;
        let node_ip = match &args.node_ip_address {
            Some(ip) => ip.clone(),
            None => route_ip(Some(&head)),
        };
        (None, head, token, node_ip)
    };
    let dashboard = gcs.as_ref().and_then(|(store, _)| store.dashboard.clone());
    let metrics = match crate::metrics::bind(&node_ip, args.metrics_export_port).await {
        Ok(m) => m,
        Err(e) => {
            if let Some((store, state_dir)) = gcs {
                store.stop().await;
                forget_state(&args, &state_dir);
            }
            return Err(e);
        }
    };
    let session_dir = config.new_session_dir().map_err(|e| e.to_string())?;
    let mut raylet_config = config
        .raylet_config(session_dir.clone())
        .map_err(|e| e.to_string())?;
    raylet_config.cluster = Some(ClusterLink {
        head: head.clone(),
        token: token.clone(),
        node_ip: node_ip.clone(),
        is_head: args.head,
        head_patience: Duration::from_millis(config.head_reconnect_timeout_ms),
        metrics_address: Some(metrics.address.to_string()),
    });
    let raylet = match Raylet::start(raylet_config).await {
        Ok(r) => r,
        Err(e) => {
            if let Some((store, state_dir)) = gcs {
                store.stop().await;
                forget_state(&args, &state_dir);
            }
            // Nothing ran in it: a failed start leaves no session behind.
            let _ = std::fs::remove_dir_all(&session_dir);
            return Err(format!(
                "the node could not join the cluster at {head}: {e}"
            ));
        }
    };
    let _metrics = metrics.serve(raylet.view(), token.clone());
    if !args.head && args.token.is_some() {
        // The head took it: drivers and `prism status` on this machine
        // find it here.
        token.save(&temp.join("token")).map_err(|e| e.to_string())?;
    }
    let record = NodeRecord {
        pid: std::process::id(),
        start_ticks: NodeRecord::own_start_ticks(),
        node_id: raylet.node_id().to_string(),
        cluster_id: raylet.cluster_id().unwrap_or_default().to_string(),
        head: head.clone(),
        node_ip,
        is_head: args.head,
        session_dir,
        socket: raylet.socket_path().to_path_buf(),
        tls,
        dashboard,
        scratch_state: gcs
            .as_ref()
            .filter(|_| args.state_dir.is_none() && args.redis.redis_address.is_none())
            .map(|(_, dir)| dir.clone()),
    };
    record.write(&temp).map_err(|e| e.to_string())?;
    tracing::info!(node = %record.node_id, head = %head, "node up");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch for SIGTERM: {e}"))?;
    let code = tokio::select! {
        _ = terminate.recv() => None,
        _ = tokio::signal::ctrl_c() => None,
        cause = raylet.lost() => Some(cause),
    };
    let exit = match &code {
        None => {
            tracing::info!("stopping: leaving the cluster");
            raylet.leave_cluster("stopped by prism stop").await;
            ExitCode::SUCCESS
        }
        Some(cause) => {
            tracing::error!(%cause, "the head gave this node up; it stops (start it again to rejoin as a new node)");
            ExitCode::FAILURE
        }
    };
    raylet.shutdown();
    if let Some((store, state_dir)) = gcs {
        store.stop().await;
        // A head stopped on purpose ends its cluster; one that died keeps
        // its state for the head started after it.
        if code.is_none() {
            forget_state(&args, &state_dir);
        }
    }
    record.remove(&temp);
    Ok(exit)
}

/// The folder the head's control store keeps its state in.
fn head_state_dir(args: &StartArgs) -> std::path::PathBuf {
    match &args.state_dir {
        Some(dir) => dir.clone(),
        // Two heads on port 0 in one temp folder must not share a state.
        None if args.port == 0 => args
            .temp
            .temp_dir
            .join(format!("head-pid{}", std::process::id())),
        None => args.temp.temp_dir.join(format!("head-{}", args.port)),
    }
}

/// Removes the head's state when it is in the default folder (a cluster
/// that ended); a folder the user named is theirs to keep.
fn forget_state(args: &StartArgs, state_dir: &Path) {
    if args.state_dir.is_none() {
        if let Err(e) = std::fs::remove_dir_all(state_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %state_dir.display(), error = %e, "could not remove the head's state");
            }
        }
    }
}

/// The token saved in the head's state, waiting a little for a control
/// store of a head that just died to let go of the file.
async fn saved_token(state: &StateStore) -> Result<Option<Token>, String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match GcsSettings::saved_token(state) {
            Ok(token) => return Ok(token),
            Err(prism_gcs::GcsError::StateInUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Waits until the head at `head` takes a connection (its name resolves
/// and its port answers), trying again after a pause that doubles from
/// 0.25 s up to 5 s, with a log line each time, for at most `patience`: a
/// node started before its head (a worker pod before the head's pod)
/// joins once the head is up, and one given a wrong address says so.
async fn wait_for_head(head: &str, patience: Duration) -> Result<(), String> {
    let started = Instant::now();
    let mut backoff =
        Backoff::new(Duration::from_millis(250), Duration::from_secs(5)).until(started + patience);
    let mut tries = 0u32;
    loop {
        tries += 1;
        let reached =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(head))
                .await;
        let why = match reached {
            Ok(Ok(_)) => {
                if tries > 1 {
                    tracing::info!(%head, tries, waited_ms = started.elapsed().as_millis() as u64, "the head answers");
                }
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 2 s".to_string(),
        };
        let waited = started.elapsed();
        if !backoff.fits() {
            return Err(format!(
                "the head at {head} could not be reached in {:.1} s ({tries} tries; the last: \
                 {why}): check the address and that the head runs, or wait longer with \
                 PRISM_HEAD_RECONNECT_TIMEOUT_MS",
                waited.as_secs_f64()
            ));
        }
        let pause = backoff.next_pause().unwrap_or_default();
        tracing::warn!(%head, tries, error = %why, next_try_ms = pause.as_millis() as u64, "waiting for the head");
        tokio::time::sleep(pause).await;
    }
}

/// The local address of the route to `head` (or to the outside, for a
/// head): the address other machines reach this one at. No packet is sent;
/// a machine with no route uses 127.0.0.1 (see [`no_route_warning`]).
fn route_ip(head: Option<&str>) -> String {
    routed_ip(head).unwrap_or_else(|| "127.0.0.1".into())
}

fn routed_ip(head: Option<&str>) -> Option<String> {
    let target = head.unwrap_or("10.255.255.255:1");
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(target).map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .ok()
}

/// What to tell the user of a head that would advertise 127.0.0.1 because
/// this machine has no route out (no default route): other machines could
/// not join with the address it prints.
fn no_route_warning(args: &StartArgs) -> Option<String> {
    if !args.head || args.node_ip_address.is_some() || routed_ip(None).is_some() {
        return None;
    }
    Some(
        "this machine has no route to other machines (no default route), so the head \
         advertises 127.0.0.1 and only nodes on this machine can join it; give \
         --node-ip-address with an address the other machines reach this one at \
         (or --node-ip-address 127.0.0.1 to say that one machine is meant)"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::without_token;

    #[test]
    fn the_token_never_reaches_the_nodes_command_line() {
        let given = [
            "start",
            "--address",
            "h:6380",
            "--token",
            "SECRET1",
            "--token=SECRET2",
            "--token-file",
            "/f",
            "--token-file=/g",
            "--num-cpus",
            "2",
        ];
        let kept = without_token(given.iter().map(std::ffi::OsString::from));
        let kept: Vec<&str> = kept.iter().filter_map(|a| a.to_str()).collect();
        assert_eq!(kept, ["start", "--address", "h:6380", "--num-cpus", "2"]);
    }
}
