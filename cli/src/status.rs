//! `prism status`: the cluster's nodes, resources and waiting demand, from
//! the head's control store.

use crate::args::StatusArgs;
use crate::common::{find_token, given_token, runtime};
use prism_gcs::pb::{NodeInfo, NodeState, Resource};
use prism_gcs::GcsClient;
use prism_raylet::NodeRecord;
use std::collections::BTreeMap;
use std::process::ExitCode;

pub(crate) fn run(args: StatusArgs) -> Result<ExitCode, String> {
    let temp = &args.temp.temp_dir;
    let address = match &args.address {
        Some(a) => a.clone(),
        None => NodeRecord::list(temp)
            .into_iter()
            .next()
            .map(|r| r.head)
            .ok_or_else(|| {
                format!(
                    "no Prism node runs on this machine (none recorded in {}): give the head \
                     with --address HOST:PORT or PRISM_ADDRESS, or start one with `prism start --head`",
                    NodeRecord::dir(temp).display()
                )
            })?,
    };
    let given = given_token(args.token.as_deref(), args.token_file.as_deref())?;
    let token = find_token(given.as_deref(), temp)?;
    args.tls.apply(temp, &address)?;
    let rt = runtime()?;
    let (info, nodes, scaler) = rt
        .block_on(async {
            let mut client = GcsClient::connect(&address, &token).await?;
            let info = client.cluster_info().await?;
            let nodes = client.get_nodes().await?;
            let scaler = client
                .kv_get(crate::launch::monitor::STATUS_KEY.to_string())
                .await?;
            Ok::<_, prism_gcs::GcsError>((info, nodes, scaler))
        })
        .map_err(|e| e.to_string())?;
    // What the autoscaler of a `prism up` cluster does, and why.
    let lines = scaler
        .and_then(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok())
        .and_then(|v| v["lines"].as_array().cloned());
    if args.format == crate::args::OutputFormat::Json {
        let doc = as_json(
            &address,
            &info.cluster_id,
            &nodes,
            lines.unwrap_or_default(),
        );
        say!("{doc:#}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = render(&address, &info.cluster_id, &nodes);
    if let Some(lines) = lines {
        text.push_str("Autoscaler:\n");
        for line in lines.iter().filter_map(|l| l.as_str()) {
            text.push_str(&format!(" {line}\n"));
        }
    }
    say!("{}", text.trim_end_matches('\n'));
    Ok(ExitCode::SUCCESS)
}

/// The status as JSON: the head, the cluster's id, each node (live or
/// dead) with its resources (in whole units, as `prism start` takes them)
/// and demand, and the autoscaler's lines.
fn as_json(
    address: &str,
    cluster_id: &str,
    nodes: &[NodeInfo],
    autoscaler: Vec<serde_json::Value>,
) -> serde_json::Value {
    use serde_json::json;
    let amounts = |rs: &[Resource]| -> serde_json::Map<String, serde_json::Value> {
        rs.iter()
            .map(|r| (r.name.clone(), json!(r.units as f64 / 10_000.0)))
            .collect()
    };
    let nodes: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| {
            let alive = n.state == NodeState::Alive as i32;
            json!({
                "node_id": n.node_id,
                "node_ip": n.node_ip,
                "hostname": n.hostname,
                "is_head": n.is_head,
                "state": if alive { "ALIVE" } else { "DEAD" },
                "total": amounts(&n.total),
                "available": amounts(&n.available),
                "demands": n.demands.iter().map(|d| json!({
                    "shape": amounts(&d.shape),
                    "count": d.count,
                    "spread": d.spread,
                })).collect::<Vec<_>>(),
                "death_cause": (!alive).then(|| n.death_cause.clone()),
            })
        })
        .collect();
    json!({
        "head": address,
        "cluster_id": cluster_id,
        "nodes": nodes,
        "autoscaler": autoscaler,
    })
}

/// The report, as `ray status` lays it out: nodes, then totals, then demand.
fn render(address: &str, cluster_id: &str, nodes: &[NodeInfo]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let alive: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Alive as i32)
        .collect();
    let _ = writeln!(
        out,
        "======== Cluster {cluster_id} (head {address}) ========"
    );
    let _ = writeln!(
        out,
        "Nodes: {} alive, {} dead",
        alive.len(),
        nodes.len() - alive.len()
    );
    for n in nodes {
        let role = if n.is_head { "head" } else { "node" };
        if n.state == NodeState::Alive as i32 {
            let _ = writeln!(
                out,
                " {} {role} {:<15} ALIVE  {}",
                n.node_id,
                n.node_ip,
                usage(&n.total, &n.available)
            );
        } else {
            let _ = writeln!(
                out,
                " {} {role} {:<15} DEAD   {}",
                n.node_id, n.node_ip, n.death_cause
            );
        }
    }
    let Totals {
        total,
        free,
        demand,
    } = totals(nodes);
    let _ = writeln!(out, "Resources (alive nodes, used/total):");
    for (name, units) in &total {
        let used = units - free.get(name).copied().unwrap_or(0);
        let _ = writeln!(out, " {}", amount(name, used, *units));
    }
    let _ = writeln!(out, "Demands:");
    if demand.is_empty() {
        let _ = writeln!(out, " (no resource demands)");
    }
    for (shape, count) in demand {
        match shape.as_str() {
            // What a node reports while a driver's program is on its way
            // to it for the driver's first work there.
            "{}" => {
                let _ = writeln!(out, " {count} driver program(s) on their way to a node");
            }
            _ => {
                let _ = writeln!(out, " {shape}: {count} waiting");
            }
        }
    }
    out
}

/// The live nodes' resources added up, and what waits for resources.
pub(crate) struct Totals {
    /// Units per resource.
    pub(crate) total: BTreeMap<String, i64>,
    /// Free units per resource.
    pub(crate) free: BTreeMap<String, i64>,
    /// Waiting requests per shape.
    pub(crate) demand: BTreeMap<String, u64>,
}

pub(crate) fn totals(nodes: &[NodeInfo]) -> Totals {
    let mut t = Totals {
        total: BTreeMap::new(),
        free: BTreeMap::new(),
        demand: BTreeMap::new(),
    };
    for n in nodes.iter().filter(|n| n.state == NodeState::Alive as i32) {
        for r in &n.total {
            *t.total.entry(r.name.clone()).or_default() += r.units;
        }
        for r in &n.available {
            *t.free.entry(r.name.clone()).or_default() += r.units;
        }
        for d in &n.demands {
            let key = match d.spread {
                // A strict-spread group's bundles.
                true => format!("{} each on a node of its own", shape(&d.shape)),
                false => shape(&d.shape),
            };
            *t.demand.entry(key).or_default() += d.count;
        }
    }
    t
}

/// A node's resources, `used/total` each.
pub(crate) fn usage(total: &[Resource], available: &[Resource]) -> String {
    total
        .iter()
        .map(|r| {
            let free = available
                .iter()
                .find(|a| a.name == r.name)
                .map(|a| a.units)
                .unwrap_or(0);
            amount(&r.name, r.units - free, r.units)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `used/total name`, memory in GiB, others in units.
pub(crate) fn amount(name: &str, used: i64, total: i64) -> String {
    let scale = 10_000.0;
    if name == "memory" {
        let gib = scale * (1u64 << 30) as f64;
        format!(
            "{:.1}/{:.1} GiB memory",
            used as f64 / gib,
            total as f64 / gib
        )
    } else {
        format!("{}/{} {name}", used as f64 / scale, total as f64 / scale)
    }
}

/// A shape as `{name: amount, ...}`.
pub(crate) fn shape(resources: &[Resource]) -> String {
    let parts: Vec<String> = resources
        .iter()
        .map(|r| format!("{}: {}", r.name, r.units as f64 / 10_000.0))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_gcs::pb::Demand;

    fn cpu(units: i64) -> Vec<Resource> {
        vec![Resource {
            name: "CPU".into(),
            units,
        }]
    }

    #[test]
    fn the_report_lists_nodes_totals_of_live_nodes_and_demand() {
        let nodes = vec![
            NodeInfo {
                node_id: "node-a".into(),
                node_ip: "10.0.0.1".into(),
                is_head: true,
                total: cpu(20_000),
                available: cpu(5_000),
                demands: vec![
                    Demand {
                        shape: cpu(10_000),
                        count: 3,
                        spread: false,
                    },
                    Demand {
                        shape: cpu(10_000),
                        count: 2,
                        spread: true,
                    },
                ],
                ..NodeInfo::default()
            },
            NodeInfo {
                node_id: "node-b".into(),
                node_ip: "10.0.0.2".into(),
                state: NodeState::Dead as i32,
                death_cause: "no heartbeat for 5.2 s".into(),
                total: cpu(40_000),
                ..NodeInfo::default()
            },
        ];
        let text = render("10.0.0.1:6380", "c1", &nodes);
        assert!(text.contains("Nodes: 1 alive, 1 dead"), "{text}");
        assert!(
            text.contains("node-a head 10.0.0.1        ALIVE  1.5/2 CPU"),
            "{text}"
        );
        assert!(
            text.contains("node-b node 10.0.0.2        DEAD   no heartbeat for 5.2 s"),
            "{text}"
        );
        assert!(
            text.contains("Resources (alive nodes, used/total):\n 1.5/2 CPU\n"),
            "{text}"
        );
        assert!(text.contains("{CPU: 1}: 3 waiting"), "{text}");
        assert!(
            text.contains("{CPU: 1} each on a node of its own: 2 waiting"),
            "{text}"
        );
    }
}
