//! Tasks' lives in Chrome's trace event format (`prism timeline`),
//! loadable in Perfetto (ui.perfetto.dev) or `chrome://tracing`: one
//! process per node and one thread per worker process, each run of a
//! task or actor call a complete event (`"ph": "X"`) on its worker's
//! thread, and the time from its submission to its start an async span
//! (`"b"`/`"e"`) beside it. Times are microseconds since the Unix epoch,
//! as the trace format counts them.

use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The trace of the task rows `rows` (as `GET /api/v0/tasks` lists them);
/// rows with no run (their owner's view only) are left out. `now_us`
/// ends the runs still going.
///
/// ```
/// use serde_json::json;
/// let rows = vec![json!({
///     "task_id": "t1", "name": "add", "state": "FINISHED", "type": "NORMAL_TASK",
///     "job_id": "01", "node_id": "n1", "node_ip": "10.0.0.1", "worker_pid": 42,
///     "submitted_us": 900, "start_us": 1000, "end_us": 1500,
/// })];
/// let trace = prism_state::chrome_trace(&rows, 2000);
/// let run = trace.as_array().unwrap().iter().find(|e| e["ph"] == "X").unwrap();
/// assert_eq!((run["name"].as_str(), run["ts"].as_u64(), run["dur"].as_u64()), (Some("add"), Some(1000), Some(500)));
/// assert_eq!(run["tid"], 42);
/// ```
pub fn chrome_trace(rows: &[Value], now_us: u64) -> Value {
    let mut nodes: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut workers: BTreeMap<(usize, u64), ()> = BTreeMap::new();
    let mut events = Vec::new();
    for row in rows {
        let (Some(start), Some(pid)) = (row["start_us"].as_u64(), row["worker_pid"].as_u64())
        else {
            continue;
        };
        let node_id = row["node_id"].as_str().unwrap_or("unknown").to_string();
        let next = nodes.len() + 1;
        let ip = row["node_ip"].as_str().unwrap_or("").to_string();
        let node = nodes.entry(node_id).or_insert((next, ip)).0;
        workers.insert((node, pid), ());
        let end = row["end_us"].as_u64().unwrap_or(now_us).max(start);
        let name = row["name"].as_str().unwrap_or("?");
        let category = row["type"].as_str().unwrap_or("NORMAL_TASK");
        let mut args = json!({
            "task_id": row["task_id"],
            "state": row["state"],
            "job_id": row["job_id"],
        });
        for key in ["actor_id", "error_message", "worker_id", "retries"] {
            if !row[key].is_null() {
                args[key] = row[key].clone();
            }
        }
        events.push(json!({
            "name": name, "cat": category, "ph": "X", "ts": start, "dur": end - start,
            "pid": node, "tid": pid, "args": args,
        }));
        if let Some(submitted) = row["submitted_us"].as_u64().filter(|s| *s <= start) {
            let id = row["task_id"].as_str().unwrap_or("?");
            let waiting = format!("{name} (submitted, waiting to run)");
            for (phase, ts) in [("b", submitted), ("e", start)] {
                events.push(json!({
                    "name": waiting, "cat": "scheduling", "ph": phase, "ts": ts,
                    "id": id, "pid": node, "tid": pid,
                }));
            }
        }
    }
    for (node_id, (node, ip)) in &nodes {
        let label = if ip.is_empty() {
            format!("node {node_id}")
        } else {
            format!("node {node_id} ({ip})")
        };
        events
            .push(json!({"name": "process_name", "ph": "M", "pid": node, "args": {"name": label}}));
    }
    for (node, pid) in workers.keys() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": node, "tid": pid,
            "args": {"name": format!("worker {pid}")},
        }));
    }
    Value::Array(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_go_on_their_node_and_worker_and_rows_without_a_run_are_left_out() {
        let rows = vec![
            json!({"task_id": "a", "name": "f", "node_id": "n1", "worker_pid": 7,
                   "start_us": 10, "end_us": 20, "submitted_us": 5, "state": "FINISHED"}),
            json!({"task_id": "b", "name": "g", "node_id": "n2", "worker_pid": 8,
                   "start_us": 30, "state": "RUNNING", "type": "ACTOR_TASK", "actor_id": "x"}),
            json!({"task_id": "c", "name": "h", "state": "FAILED"}),
        ];
        let trace = chrome_trace(&rows, 100);
        let events = trace.as_array().cloned().unwrap_or_default();
        let runs: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[0]["pid"].as_u64(), runs[1]["pid"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(runs[1]["dur"], 70, "a running one ends now");
        assert_eq!(runs[1]["cat"], "ACTOR_TASK");
        assert_eq!(runs[1]["args"]["actor_id"], "x");
        assert_eq!(events.iter().filter(|e| e["ph"] == "b").count(), 1);
        let names: Vec<&Value> = events.iter().filter(|e| e["ph"] == "M").collect();
        assert_eq!(names.len(), 4, "two nodes, two workers");
    }
}
