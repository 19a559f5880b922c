//! The autoscaler at work: `prism autoscaler CLUSTER_FILE`, which `prism
//! up` starts beside the head (on its machine over SSH; on the machine of
//! the containers with podman) when a worker type may grow
//! (`max_workers` above `min_workers`). Every [`PERIOD`] it reads the
//! cluster from the head (its nodes' resources and waiting demand; the
//! actors and objects on each node from the state API), asks
//! [`Autoscaler::decide`](super::autoscaler::Autoscaler::decide), starts
//! and stops worker nodes (over SSH, or as containers) as `prism up` and `prism down` do, and
//! writes what it does and why to the head's key-value table, where
//! `prism status` shows it. It ends when the head has been gone for
//! [`HEAD_GONE`].

use super::autoscaler::{Autoscaler, Observation, Policy, SeenNode, Shape, TypeLimits};
use super::provider::HEAD_TYPE_TAG;
use super::{Launch, STOP_SCRIPT};
use crate::args::LaunchArgs;
use prism_gcs::pb::{NodeState, Resource};
use prism_gcs::{GcsClient, Token};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Prints a line of the autoscaler's log, after the time of day (UTC, to
/// the millisecond).
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{} {}", time_of_day(), format!($($arg)*))
    };
}

/// The time of day now, `HH:MM:SS.mmm` UTC.
fn time_of_day() -> String {
    let ms = prism_protocol::clock::unix_ms();
    let s = ms / 1000 % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        ms % 1000
    )
}

/// The head's key-value entry `prism status` reads.
pub(crate) const STATUS_KEY: &str = "prism:autoscaler:status";
/// How often the autoscaler looks: a node list from the head is a few
/// hundred bytes per node, and a launch waits for this at most.
const PERIOD: Duration = Duration::from_millis(100);
/// How long the head may be unreachable before the autoscaler ends.
const HEAD_GONE: Duration = Duration::from_secs(30);

fn shape(resources: &[Resource]) -> Shape {
    resources
        .iter()
        .map(|r| (r.name.clone(), r.units as f64 / 10_000.0))
        .collect()
}

/// The worker types' limits from the cluster file (which `Cluster::check`
/// made sure give their resources).
fn policy(l: &Launch) -> Policy {
    let c = &l.cluster;
    let mut types = Vec::new();
    for (name, t) in &c.file.available_node_types {
        if *name == c.head_type {
            continue;
        }
        types.push(TypeLimits {
            name: name.clone(),
            resources: t.resources.clone(),
            min_workers: t.min_workers,
            max_workers: t.max_workers.unwrap_or(c.max_workers),
        });
    }
    Policy {
        types,
        head: Shape::new(),
        max_workers: c.max_workers,
        idle_timeout: Duration::from_secs_f64(c.file.idle_timeout_minutes * 60.0),
        launch_timeout: Duration::from_secs(300),
        upscaling_speed: 1.0,
    }
}

/// The hosts running something the state API says keeps them: a live
/// actor, or an object in their store. `None` when the state API does not
/// answer (then no node is stopped).
async fn kept_hosts(state: &Option<prism_state::StateClient>) -> Option<Vec<String>> {
    let client = state.as_ref()?;
    let mut hosts = Vec::new();
    for (kind, filter) in [
        (prism_state::Kind::Actors, Some("state=ALIVE")),
        (prism_state::Kind::Objects, None),
    ] {
        let mut query = prism_state::Query::new(kind);
        query.limit = 10_000;
        if let Some(f) = filter {
            query.filters.push(prism_state::Filter::parse(f).ok()?);
        }
        let listing = client.list(&query).await.ok()?;
        hosts.extend(
            listing
                .rows
                .iter()
                .filter_map(|r| r["node_ip"].as_str().map(str::to_string)),
        );
    }
    Some(hosts)
}

/// How the autoscaler reaches the head.
struct HeadLink {
    /// The control store, `HOST:PORT`.
    head: String,
    token: Token,
    /// The dashboard (the state API), `HOST:PORT`, if the head has one.
    dashboard: Option<String>,
}

/// The head's addresses and token: from this machine's records when the
/// head runs here (SSH clusters run the autoscaler on the head), else from
/// the head's records, read through the cluster's shell (podman).
fn head_link(l: &Launch) -> Result<HeadLink, String> {
    if !l.in_containers() {
        let temp = std::env::var_os("PRISM_TEMP_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(prism_protocol::guard::default_temp_dir);
        let record = prism_raylet::NodeRecord::list(&temp)
            .into_iter()
            .find(|r| r.is_head)
            .ok_or_else(|| {
                format!(
                    "no head runs on this machine (none recorded in {})",
                    temp.display()
                )
            })?;
        let token = Token::find(None, &temp).map_err(|e| e.to_string())?;
        return Ok(HeadLink {
            head: record.head,
            token,
            dashboard: record.dashboard,
        });
    }
    let out = l.run(
        &l.cluster.head_ip,
        "reading the head's records",
        "for f in \"$PRISM_SESSION_DIR\"/nodes/*.json; do [ -f \"$f\" ] && cat \"$f\"; echo; done\n\
         echo TOKEN; cat \"$PRISM_SESSION_DIR/token\"\n",
        None,
    )?;
    let (records, token) = out
        .rsplit_once("TOKEN")
        .ok_or("the head's records gave no token")?;
    let token = Token::parse(token.trim()).map_err(|e| format!("the head's token: {e}"))?;
    let record = serde_json::Deserializer::from_str(records)
        .into_iter::<prism_raylet::NodeRecord>()
        .filter_map(Result::ok)
        .find(|r| r.is_head)
        .ok_or_else(|| format!("no head runs in the container of {}", l.cluster.head_ip))?;
    Ok(HeadLink {
        head: record.head,
        token,
        dashboard: record.dashboard,
    })
}

/// `prism autoscaler CLUSTER_FILE` (run by `prism up`: on the head of an
/// SSH cluster, on this machine beside the containers of a podman one).
pub(crate) fn run(args: LaunchArgs) -> Result<ExitCode, String> {
    let l = Launch::open(&args.cluster_file)?;
    let mut provider = l.provider()?;
    let mut scaler = Autoscaler::new(policy(&l));
    let HeadLink {
        head,
        token,
        dashboard,
    } = head_link(&l)?;
    let state = dashboard.as_ref().and_then(|at| {
        prism_state::StateClient::new(&format!("http://{at}"), Some(token.reveal().to_string()))
            .ok()
    });
    let rt = crate::common::runtime()?;
    let worker_ips = l.cluster.file.provider.worker_ips.clone();
    provider.adopt(&l.cluster.head_ip, HEAD_TYPE_TAG)?;
    // Workers the provider made and that may not have joined yet (a
    // `prism up` that just started them) count as launching, not missing.
    for n in provider.nodes()? {
        if n.node_type != HEAD_TYPE_TAG && n.host != l.cluster.head_ip {
            scaler.launched(&n.node_type, std::slice::from_ref(&n.host), Instant::now());
        }
    }
    let mut unreachable_since: Option<Instant> = None;
    let mut adopted = false;
    let mut last_report: Vec<String> = Vec::new();
    // Nodes launched and not yet seen alive, with when they were launched.
    let mut joining: BTreeMap<String, Instant> = BTreeMap::new();
    say!(
        "autoscaler of cluster {}: worker types {:?}, idle timeout {} s",
        l.cluster.file.cluster_name,
        l.cluster
            .file
            .available_node_types
            .keys()
            .filter(|t| **t != l.cluster.head_type)
            .collect::<Vec<_>>(),
        (l.cluster.file.idle_timeout_minutes * 60.0) as u64
    );
    let (stops_done, stopped) = std::sync::mpsc::channel::<(String, Result<String, String>)>();
    loop {
        for (host, r) in stopped.try_iter() {
            match r {
                Ok(_) => provider.terminate_node(&host)?,
                Err(e) => say!("{host}: could not be stopped: {e}"),
            }
        }
        let looked = rt.block_on(async {
            let mut gcs = GcsClient::connect(&head, &token).await?;
            let nodes = gcs.get_nodes().await?;
            Ok::<_, prism_gcs::GcsError>((gcs, nodes))
        });
        let (mut gcs, nodes) = match looked {
            Ok(x) => {
                unreachable_since = None;
                x
            }
            Err(e) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > HEAD_GONE {
                    say!("the head is gone ({e}); the autoscaler ends");
                    return Ok(ExitCode::SUCCESS);
                }
                std::thread::sleep(PERIOD);
                continue;
            }
        };
        let alive: Vec<_> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Alive as i32)
            .collect();
        // The state API (every node asked for its actors and objects) only
        // when a worker could be idle: no demand anywhere, and one holds
        // no lease.
        let may_idle = alive.iter().all(|n| n.demands.is_empty())
            && alive
                .iter()
                .any(|n| !n.is_head && shape(&n.total) == shape(&n.available));
        let kept = match may_idle {
            true => rt.block_on(kept_hosts(&state)),
            false => Some(Vec::new()),
        };
        let mut seen = Observation::default();
        let mut waiting: BTreeMap<Vec<(String, u64)>, (Shape, u64)> = BTreeMap::new();
        for n in &alive {
            let host = n.node_ip.clone();
            if n.is_head {
                scaler.set_head(shape(&n.total));
            }
            for d in &n.demands {
                if d.spread {
                    seen.spread.push((shape(&d.shape), d.count));
                    continue;
                }
                let key: Vec<(String, u64)> = d
                    .shape
                    .iter()
                    .map(|r| (r.name.clone(), r.units as u64))
                    .collect();
                waiting.entry(key).or_insert_with(|| (shape(&d.shape), 0)).1 += d.count;
            }
            seen.nodes.push(SeenNode {
                is_head: n.is_head,
                total: shape(&n.total),
                free: shape(&n.available),
                demand: n.demands.iter().map(|d| d.count).sum(),
                // Without the state API, nothing is known to be free of
                // actors and objects: no node is stopped.
                kept: kept.as_ref().is_none_or(|k| k.contains(&host)),
                host,
            });
        }
        seen.demand = waiting.into_values().collect();
        for n in &seen.nodes {
            if let Some(at) = joining.remove(&n.host) {
                say!(
                    "{} joined, {:.2} s after its launch began",
                    n.host,
                    at.elapsed().as_secs_f64()
                );
            }
        }
        if !adopted {
            // Workers already running (prism up's min_workers, or an
            // earlier autoscaler's) are counted, by the type they serve.
            for n in seen.nodes.iter().filter(|n| !n.is_head) {
                if worker_ips.contains(&n.host) {
                    provider.adopt(&n.host, &l.cluster.worker_type)?;
                    scaler.adopt(&n.host, &l.cluster.worker_type);
                }
            }
            adopted = true;
        }
        let decision = scaler.decide(&seen, Instant::now());
        // Each idle node is stopped in the background (it leaves the
        // cluster with its `prism stop`), as launches are; the provider
        // ends its machine once that is done.
        for host in &decision.terminate {
            let why = scaler
                .report()
                .iter()
                .find(|line| line.starts_with(&format!("{host}: idle for")))
                .map_or(String::new(), |line| format!(" ({line})"));
            say!("stopping {host}{why}");
            let (l, host, done) = (l.clone(), host.clone(), stops_done.clone());
            std::thread::spawn(move || {
                let r = l.run(&host, "stopping prism", STOP_SCRIPT, None);
                let _ = done.send((host, r));
            });
        }
        for (node_type, count) in &decision.launch {
            let making = Instant::now();
            match provider.create_nodes(node_type, *count as usize) {
                Ok(made) => {
                    let hosts: Vec<String> = made.iter().map(|n| n.host.clone()).collect();
                    say!(
                        "launching {node_type} on {} (the provider made it in {:.2} s)",
                        hosts.join(", "),
                        making.elapsed().as_secs_f64()
                    );
                    scaler.launched(node_type, &hosts, Instant::now());
                    for h in &hosts {
                        joining.insert(h.clone(), making);
                    }
                    let token = token.reveal().to_string();
                    for host in hosts {
                        // Each launch in the background: a slow machine
                        // does not hold up the others, nor the next look.
                        let l = l.clone();
                        let token = token.clone();
                        std::thread::spawn(move || {
                            let started = Instant::now();
                            let token = || Ok(token.clone());
                            match l.bring_up(&host, false, false, Some(&token)) {
                                Ok(_) => say!(
                                    "{host}: node started in {:.2} s",
                                    started.elapsed().as_secs_f64()
                                ),
                                Err(e) => say!("{host}: launch failed: {e}"),
                            }
                        });
                    }
                }
                Err(e) => say!("cannot launch {count} {node_type} node(s): {e}"),
            }
        }
        let mut lines = scaler.report().to_vec();
        if may_idle && kept.is_none() {
            lines.push(
                "scale-down waits: the head's state API (its dashboard) does not answer, so \
                 no node is known to be free of actors and objects"
                    .into(),
            );
        }
        if lines.is_empty() {
            lines.push("nothing to do".into());
        }
        // Written when it changes (the head keeps its table on disk).
        if lines != last_report {
            let value = serde_json::json!({"lines": lines}).to_string().into_bytes();
            if rt
                .block_on(gcs.kv_put(STATUS_KEY.to_string(), value, true))
                .is_ok()
            {
                last_report = lines;
            }
        }
        std::thread::sleep(PERIOD);
    }
}
