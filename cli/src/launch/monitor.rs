//! The autoscaler at work: `prism autoscaler CLUSTER_FILE`, which `prism
//! up` starts on the head when a worker type may grow
//! (`max_workers` above `min_workers`). Every [`PERIOD`] it reads the
//! cluster from the head (its nodes' resources and waiting demand; the
//! actors and objects on each node from the state API), asks
//! [`Autoscaler::decide`](super::autoscaler::Autoscaler::decide), starts
//! and stops worker nodes over SSH as `prism up` and `prism down` do, and
//! writes what it does and why to the head's key-value table, where
//! `prism status` shows it. It ends when the head has been gone for
//! [`HEAD_GONE`].

use super::autoscaler::{Autoscaler, Observation, Policy, SeenNode, Shape, TypeLimits};
use super::provider::{NodeProvider, HEAD_TYPE_TAG};
use super::{Launch, STOP_SCRIPT};
use crate::args::LaunchArgs;
use prism_gcs::pb::{NodeState, Resource};
use prism_gcs::{GcsClient, Token};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The head's key-value entry `prism status` reads.
pub(crate) const STATUS_KEY: &str = "prism:autoscaler:status";
/// How often the autoscaler looks: a node list from the head is a few
/// hundred bytes per node, and a launch waits for this at most.
const PERIOD: Duration = Duration::from_millis(250);
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

/// `prism autoscaler CLUSTER_FILE` (run on the head by `prism up`).
pub(crate) fn run(args: LaunchArgs) -> Result<ExitCode, String> {
    let l = Launch::open(&args.cluster_file)?;
    let mut provider = l.provider()?;
    let mut scaler = Autoscaler::new(policy(&l));
    let temp = prism_protocol::guard::default_temp_dir();
    let temp = std::env::var_os("PRISM_TEMP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or(temp);
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
    let state = record.dashboard.as_ref().and_then(|at| {
        prism_state::StateClient::new(&format!("http://{at}"), Some(token.reveal().to_string()))
            .ok()
    });
    let rt = crate::common::runtime()?;
    let worker_ips = l.cluster.file.provider.worker_ips.clone();
    provider.adopt(&l.cluster.head_ip, HEAD_TYPE_TAG)?;
    let mut unreachable_since: Option<Instant> = None;
    let mut adopted = false;
    let mut last_report: Vec<String> = Vec::new();
    println!(
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
    loop {
        let looked = rt.block_on(async {
            let mut gcs = GcsClient::connect(&record.head, &token).await?;
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
                    println!("the head is gone ({e}); the autoscaler ends");
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
        for host in &decision.terminate {
            println!("stopping {host}");
            match l.run(host, "stopping prism", STOP_SCRIPT, None) {
                Ok(_) => provider.terminate_node(host)?,
                Err(e) => println!("{host}: could not be stopped: {e}"),
            }
        }
        for (node_type, count) in &decision.launch {
            match provider.create_nodes(node_type, *count as usize) {
                Ok(made) => {
                    let hosts: Vec<String> = made.iter().map(|n| n.host.clone()).collect();
                    println!("launching {node_type} on {}", hosts.join(", "));
                    scaler.launched(node_type, &hosts, Instant::now());
                    let token = token.reveal().to_string();
                    for host in hosts {
                        // Each launch in the background: a slow machine
                        // does not hold up the others, nor the next look.
                        let l = l.clone();
                        let token = token.clone();
                        std::thread::spawn(move || {
                            if let Err(e) = l.bring_up(&host, false, false, Some(&token)) {
                                println!("{host}: launch failed: {e}");
                            }
                        });
                    }
                }
                Err(e) => println!("cannot launch {count} {node_type} node(s): {e}"),
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
