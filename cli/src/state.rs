//! The state API: its sources on the head (the node and job tables, and
//! every live node's agent), and `prism list`, `prism get` and
//! `prism summary` (Ray's `ray list`, `ray get`, `ray summary`), which ask
//! the head's dashboard.

use crate::args::{
    GetArgs, ListArgs, MemoryArgs, OutputFormat, StackArgs, SummaryArgs, TimelineArgs,
};
use crate::common::runtime;
use prism_gcs::pb::NodeState;
use prism_gcs::{GcsServer, Token};
use prism_jobs::JobManager;
use prism_state::{Filter, Kind, NodeEndpoint, Query, Sources, StateApi, StateClient};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::Arc;

/// The head's state API over its control store and job manager.
pub(crate) fn api(gcs: &GcsServer, jobs: Arc<JobManager>, token: &Token) -> Arc<StateApi> {
    let view = gcs.view();
    let nodes = Arc::new(move || {
        view.nodes()
            .into_iter()
            .map(|n| {
                let total: serde_json::Map<String, Value> = n
                    .total
                    .iter()
                    .map(|r| (r.name.clone(), json!(r.units as f64 / 10_000.0)))
                    .collect();
                let alive = n.state == NodeState::Alive as i32;
                json!({
                    "node_id": n.node_id,
                    "node_ip": n.node_ip,
                    "node_name": n.hostname,
                    "is_head_node": n.is_head,
                    "state": if alive { "ALIVE" } else { "DEAD" },
                    "resources_total": total,
                    "death_cause": (!alive).then_some(n.death_cause),
                    "metrics_address": n.metrics_address,
                })
            })
            .collect()
    });
    let jobs = Arc::new(move || {
        jobs.list(0, usize::MAX)
            .into_iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect()
    });
    let view = gcs.view();
    let endpoints = Arc::new(move || {
        view.nodes()
            .into_iter()
            .filter(|n| n.state == NodeState::Alive as i32 && !n.metrics_address.is_empty())
            .map(|n| NodeEndpoint {
                node_id: n.node_id,
                node_ip: n.node_ip,
                address: n.metrics_address,
            })
            .collect()
    });
    Arc::new(StateApi::new(
        Sources {
            nodes,
            jobs,
            endpoints,
        },
        token.reveal().to_string(),
    ))
}

fn client(target: &crate::args::JobTarget) -> Result<StateClient, String> {
    let (address, token) = crate::jobs::dashboard_and_token(target, &target.temp.temp_dir)?;
    StateClient::new(&address, token).map_err(|e| e.to_string())
}

/// `prism list <kind>`.
pub(crate) fn list(args: ListArgs) -> Result<ExitCode, String> {
    let kind = Kind::parse(&args.kind).map_err(|e| e.to_string())?;
    let mut query = Query::new(kind);
    query.limit = args.limit;
    for f in &args.filter {
        query
            .filters
            .push(Filter::parse(f).map_err(|e| e.to_string())?);
    }
    query.check().map_err(|e| e.to_string())?;
    let client = client(&args.target)?;
    let listing = runtime()?
        .block_on(client.list(&query))
        .map_err(|e| e.to_string())?;
    match args.format {
        OutputFormat::Json => say!(
            "{}",
            serde_json::to_string_pretty(&listing.rows).map_err(|e| e.to_string())?
        ),
        OutputFormat::Table => {
            print!("{}", table(kind, &listing.rows, args.detail));
            say!(
                "\n{} of {} {} shown ({} matched the filters{}).",
                listing.rows.len(),
                listing.total,
                kind.name().replace('_', " "),
                listing.num_filtered,
                if kind == Kind::Tasks {
                    format!("; {} ended tasks are no longer kept", listing.dropped)
                } else {
                    String::new()
                }
            );
        }
    }
    if !listing.partial_failure_warning.is_empty() {
        eprintln!("prism: warning: {}", listing.partial_failure_warning);
    }
    Ok(ExitCode::SUCCESS)
}

/// `prism get <kind> <id>`.
pub(crate) fn get(args: GetArgs) -> Result<ExitCode, String> {
    let kind = Kind::parse(&args.kind).map_err(|e| e.to_string())?;
    let client = client(&args.target)?;
    let row = runtime()?
        .block_on(client.get(kind, &args.id))
        .map_err(|e| e.to_string())?;
    say!(
        "{}",
        serde_json::to_string_pretty(&row).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

/// `prism summary <kind>`.
pub(crate) fn summary(args: SummaryArgs) -> Result<ExitCode, String> {
    let kind = Kind::parse(&args.kind).map_err(|e| e.to_string())?;
    let client = client(&args.target)?;
    let summary = runtime()?
        .block_on(client.summarize(kind))
        .map_err(|e| e.to_string())?;
    match args.format {
        OutputFormat::Json => say!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?
        ),
        OutputFormat::Table => say!("{}", summary_text(kind, &summary)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `prism memory`: the stores' objects, node by node, with totals.
pub(crate) fn memory(args: MemoryArgs) -> Result<ExitCode, String> {
    let mut query = Query::new(Kind::Objects);
    query.limit = args.limit;
    query.check().map_err(|e| e.to_string())?;
    let client = client(&args.target)?;
    let listing = runtime()?
        .block_on(client.list(&query))
        .map_err(|e| e.to_string())?;
    let mut by_node: std::collections::BTreeMap<String, Vec<Value>> =
        std::collections::BTreeMap::new();
    for row in listing.rows {
        let node = format!(
            "{} ({})",
            row["node_id"].as_str().unwrap_or("?"),
            row["node_ip"].as_str().unwrap_or("?")
        );
        by_node.entry(node).or_default().push(row);
    }
    let bytes = |rows: &[Value]| -> u64 {
        rows.iter()
            .map(|r| r["object_size"].as_u64().unwrap_or(0))
            .sum()
    };
    if args.format == OutputFormat::Json {
        let nodes: serde_json::Map<String, Value> = by_node
            .iter()
            .map(|(node, rows)| {
                (
                    node.clone(),
                    json!({ "objects": rows, "total_objects": rows.len(), "total_bytes": bytes(rows) }),
                )
            })
            .collect();
        say!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "nodes": nodes, "total_objects": listing.total })
            )
            .map_err(|e| e.to_string())?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let columns = [
        "object_id",
        "object_size",
        "reference_type",
        "location",
        "pins",
        "owner",
    ];
    let mut all_bytes = 0;
    for (node, rows) in &by_node {
        let size = bytes(rows);
        all_bytes += size;
        say!(
            "Node {node}: {} objects, {:.1} MiB",
            rows.len(),
            size as f64 / (1 << 20) as f64
        );
        let kept: Vec<Value> = rows
            .iter()
            .map(|r| {
                columns
                    .iter()
                    .map(|c| (c.to_string(), r[*c].clone()))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            })
            .collect();
        print!("{}", table(Kind::Objects, &kept, false));
        say!("");
    }
    say!(
        "{} objects in the stores, {:.1} MiB in all ({} shown).",
        listing.total,
        all_bytes as f64 / (1 << 20) as f64,
        by_node.values().map(Vec::len).sum::<usize>()
    );
    if !listing.partial_failure_warning.is_empty() {
        eprintln!("prism: warning: {}", listing.partial_failure_warning);
    }
    Ok(ExitCode::SUCCESS)
}

/// `prism timeline`: the trace of the latest tasks (of one job) written
/// to a file.
pub(crate) fn timeline(args: TimelineArgs) -> Result<ExitCode, String> {
    let mut query = Query::new(Kind::Tasks);
    query.limit = args.limit;
    if let Some(job) = &args.job {
        query
            .filters
            .push(Filter::parse(&format!("job_id={job}")).map_err(|e| e.to_string())?);
    }
    query.check().map_err(|e| e.to_string())?;
    let client = client(&args.target)?;
    let listing = runtime()?
        .block_on(client.list(&query))
        .map_err(|e| e.to_string())?;
    let now = prism_protocol::clock::unix_us();
    let trace = prism_state::chrome_trace(&listing.rows, now);
    let runs = trace
        .as_array()
        .map_or(0, |t| t.iter().filter(|e| e["ph"] == "X").count());
    let path = args
        .output
        .unwrap_or_else(|| format!("prism-timeline-{}.json", now / 1_000_000).into());
    let text = serde_json::to_vec(&trace).map_err(|e| e.to_string())?;
    std::fs::write(&path, text)
        .map_err(|e| format!("cannot write the timeline to {}: {e}", path.display()))?;
    say!(
        "Wrote {runs} task runs (of {} tasks listed, {} kept in the cluster) to {}: open it in \
         https://ui.perfetto.dev or chrome://tracing.",
        listing.rows.len(),
        listing.total,
        path.display()
    );
    if listing.dropped > 0 {
        say!(
            "{} ended tasks are no longer kept (raise task_events_kept to keep more).",
            listing.dropped
        );
    }
    if !listing.partial_failure_warning.is_empty() {
        eprintln!("prism: warning: {}", listing.partial_failure_warning);
    }
    Ok(ExitCode::SUCCESS)
}

/// `prism stack`: every thread's stack of the worker processes asked for.
pub(crate) fn stack(args: StackArgs) -> Result<ExitCode, String> {
    let client = client(&args.target)?;
    let rt = runtime()?;
    // An actor or a task names its process: its node and pid.
    let (node, pid) = if let Some(actor) = &args.actor {
        let row = rt
            .block_on(client.get(Kind::Actors, actor))
            .map_err(|e| e.to_string())?;
        let pid = row["pid"].as_u64().ok_or_else(|| {
            format!(
                "actor {actor} has no process now (it is {}): nothing to dump",
                row["state"].as_str().unwrap_or("not alive")
            )
        })?;
        (
            row["node_id"].as_str().map(str::to_string),
            Some(pid as u32),
        )
    } else if let Some(task) = &args.task {
        let row = rt
            .block_on(client.get(Kind::Tasks, task))
            .map_err(|e| e.to_string())?;
        if row["state"] != "RUNNING" {
            return Err(format!(
                "task {task} is not running (it is {}): only a running task's process is dumped",
                row["state"].as_str().unwrap_or("unknown")
            ));
        }
        let pid = row["worker_pid"].as_u64().map(|p| p as u32);
        (row["node_id"].as_str().map(str::to_string), pid)
    } else {
        (args.node.clone(), args.pid)
    };
    let node = match (node, pid) {
        // A pid alone is on the head's node, as `prism stack` on the head.
        (None, Some(_)) => Some(head_node(&rt, &client)?),
        (node, _) => node,
    };
    let answer = rt
        .block_on(client.stacks(node.as_deref(), pid))
        .map_err(|e| e.to_string())?;
    if args.format == OutputFormat::Json {
        say!(
            "{}",
            serde_json::to_string_pretty(&answer).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", stack_text(&answer));
    }
    if let Some(w) = answer["partial_failure_warning"]
        .as_str()
        .filter(|w| !w.is_empty())
    {
        eprintln!("prism: warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The head node's id.
fn head_node(rt: &tokio::runtime::Runtime, client: &StateClient) -> Result<String, String> {
    let mut query = Query::new(Kind::Nodes);
    query
        .filters
        .push(Filter::parse("is_head_node=true").map_err(|e| e.to_string())?);
    let listing = rt
        .block_on(client.list(&query))
        .map_err(|e| e.to_string())?;
    listing
        .rows
        .first()
        .and_then(|r| r["node_id"].as_str())
        .map(str::to_string)
        .ok_or_else(|| "the cluster has no head node to find the pid on: give --node".to_string())
}

/// Stack dumps as text, process by process and thread by thread.
fn stack_text(answer: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut processes = 0;
    for node in answer["nodes"].as_array().into_iter().flatten() {
        for p in node["processes"].as_array().into_iter().flatten() {
            processes += 1;
            let _ = write!(
                out,
                "Process {} ({}, node {} {})",
                p["pid"],
                p["worker_id"].as_str().unwrap_or("?"),
                node["node_id"].as_str().unwrap_or("?"),
                node["node_ip"].as_str().unwrap_or("")
            );
            if let Some(actor) = p["actor_id"].as_str() {
                let _ = write!(out, ", actor {actor}");
            }
            let running: Vec<&str> = p["running"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if !running.is_empty() {
                let _ = write!(out, ", running {}", running.join(", "));
            }
            out.push_str(":\n");
            if let Some(e) = p["error"].as_str() {
                let _ = writeln!(out, "  no dump: {e}");
            }
            for t in p["threads"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "  Thread {} {:?} [{}]",
                    t["tid"],
                    t["name"].as_str().unwrap_or(""),
                    t["state"].as_str().unwrap_or("")
                );
                if let Some(note) = t["note"].as_str() {
                    let _ = writeln!(out, "    ({note})");
                }
                for (i, f) in t["frames"].as_array().into_iter().flatten().enumerate() {
                    let function = f["function"].as_str().unwrap_or("??");
                    let _ = match (f["file"].as_str(), f["line"].as_u64()) {
                        (Some(file), Some(line)) => {
                            writeln!(out, "    {i:>3}: {function}\n         at {file}:{line}")
                        }
                        _ => writeln!(
                            out,
                            "    {i:>3}: {function} ({})",
                            f["address"].as_str().unwrap_or("")
                        ),
                    };
                }
            }
            out.push('\n');
        }
    }
    let _ = writeln!(out, "{processes} worker process(es) dumped.");
    out
}

/// A field as a table cell.
fn cell(value: &Value) -> String {
    let text = match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() > 60 {
        format!("{}...", one_line.chars().take(57).collect::<String>())
    } else {
        one_line
    }
}

/// Rows as an aligned table: the kind's main columns, or every field with
/// `detail`.
fn table(kind: Kind, rows: &[Value], detail: bool) -> String {
    let columns: Vec<String> = if detail {
        let mut all: Vec<String> = kind.columns().iter().map(|c| c.to_string()).collect();
        for row in rows {
            for key in row.as_object().into_iter().flat_map(|o| o.keys()) {
                if !all.contains(key) {
                    all.push(key.clone());
                }
            }
        }
        all
    } else {
        kind.columns().iter().map(|c| c.to_string()).collect()
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&r[c.as_str()])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |values: Vec<String>| -> String {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    out.push_str(&line(columns.iter().map(|c| c.to_uppercase()).collect()));
    for row in cells {
        out.push_str(&line(row));
    }
    out
}

/// A summary as text: one line per function or class, its counts by
/// state.
fn summary_text(kind: Kind, summary: &Value) -> String {
    let mut out = String::new();
    if let Some(groups) = summary["summary"].as_object() {
        for (name, group) in groups {
            let counts = match group.get("state_counts").and_then(Value::as_object) {
                Some(states) => states
                    .iter()
                    .map(|(s, n)| format!("{s}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                None => group
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| format!("{k}: {v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default(),
            };
            out.push_str(&format!("{name}  {counts}\n"));
        }
    }
    match kind {
        Kind::Tasks => out.push_str(&format!(
            "{} tasks ended in all; {} of them are no longer kept as rows (`prism list tasks`).",
            summary["total_tasks"], summary["dropped_task_events"]
        )),
        Kind::Actors => out.push_str(&format!("{} actors in all.", summary["total_actors"])),
        _ => out.push_str(&format!("{} objects in all.", summary["total_objects"])),
    }
    if let Some(w) = summary["partial_failure_warning"]
        .as_str()
        .filter(|w| !w.is_empty())
    {
        out.push_str(&format!("\nwarning: {w}"));
    }
    out
}
