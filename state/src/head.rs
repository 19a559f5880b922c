//! The head's side: rows of the head's own tables (nodes, jobs) and of
//! every live node (asked over HTTP at its agent's address, with the
//! cluster token, all at once), filtered and cut to the query's limit;
//! and summaries.

use crate::error::StateError;
use crate::fetch;
use crate::query::{Kind, Query};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A live node the head asks for its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEndpoint {
    /// The node's id.
    pub node_id: String,
    /// Its address.
    pub node_ip: String,
    /// Where its agent (the metrics endpoint) serves, `HOST:PORT`.
    pub address: String,
}

/// Rows the head holds itself (nodes, jobs).
pub type Rows = Arc<dyn Fn() -> Vec<Value> + Send + Sync>;
/// The live nodes to ask.
pub type Endpoints = Arc<dyn Fn() -> Vec<NodeEndpoint> + Send + Sync>;

/// Where the head finds each kind's rows.
#[derive(Clone)]
pub struct Sources {
    /// The node table, as rows.
    pub nodes: Rows,
    /// The job table, as rows.
    pub jobs: Rows,
    /// The live nodes' agents.
    pub endpoints: Endpoints,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}

/// One answer to a list query, in the shape of Ray's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The rows, at most the query's limit.
    pub rows: Vec<Value>,
    /// Rows of the kind in the cluster.
    pub total: usize,
    /// Rows fetched from the nodes (each node sends at most a cap).
    pub num_after_truncation: usize,
    /// Rows fetched that the filters held for.
    pub num_filtered: usize,
    /// Nodes that did not answer, named; empty when all did.
    pub partial_failure_warning: String,
    /// Ended tasks the nodes no longer keep (tasks only).
    pub dropped: u64,
}

/// Rows one node sends at most when the query filters (the filters run
/// on the head).
const FILTERED_FETCH_CAP: usize = 100_000;

/// How long the head waits for a node.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the head waits for a node's stack dumps (each worker has 10 s
/// to answer its node).
const STACK_TIMEOUT: Duration = Duration::from_secs(15);

/// The head's state API.
pub struct StateApi {
    sources: Sources,
    token: String,
    /// The actors each node last listed, for when it dies: its actors
    /// are listed dead, with their node, from these.
    seen_actors: std::sync::Mutex<Vec<(NodeEndpoint, Vec<Value>)>>,
}

/// Nodes whose actors are remembered at most (the latest first kept).
const NODES_REMEMBERED: usize = 256;

impl std::fmt::Debug for StateApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateApi").finish_non_exhaustive()
    }
}

/// What one node answered for one kind.
struct NodeAnswer {
    node: NodeEndpoint,
    rows: Vec<Value>,
    total: usize,
    dropped: u64,
}

impl StateApi {
    /// A state API over `sources`, asking nodes with `token`.
    pub fn new(sources: Sources, token: String) -> StateApi {
        StateApi {
            sources,
            token,
            seen_actors: std::sync::Mutex::default(),
        }
    }

    /// Asks every live node for `path` at once: each answer with its
    /// node, and the nodes that did not answer, with why.
    async fn ask_nodes(&self, path: &str) -> (Vec<(NodeEndpoint, Value)>, Vec<String>) {
        let (mut answers, mut failed) = (Vec::new(), Vec::new());
        for (node, answer) in self
            .ask((self.sources.endpoints)(), path, NODE_TIMEOUT)
            .await
        {
            match (node, answer) {
                (Some(node), Ok(value)) => answers.push((node, value)),
                (Some(node), Err(e)) => {
                    failed.push(format!("{} ({}): {e}", node.node_id, node.node_ip))
                }
                (None, Err(e)) => failed.push(format!("a node's call stopped: {e}")),
                (None, Ok(_)) => {}
            }
        }
        (answers, failed)
    }

    /// Asks `endpoints` for `path` at once, each within `timeout`: each
    /// node with its JSON answer, or why there is none (a status other
    /// than 200 is [`StateError::Server`]); no node for a call that stopped.
    async fn ask(
        &self,
        endpoints: Vec<NodeEndpoint>,
        path: &str,
        timeout: Duration,
    ) -> Vec<(Option<NodeEndpoint>, Result<Value, StateError>)> {
        let calls: Vec<_> = endpoints
            .into_iter()
            .map(|node| {
                let token = self.token.clone();
                let path = path.to_string();
                tokio::spawn(async move {
                    let answer = fetch::get(&node.address, &path, Some(&token), timeout).await;
                    let parsed = answer.and_then(|(status, body)| {
                        if status != 200 {
                            return Err(StateError::Server {
                                status,
                                message: String::from_utf8_lossy(&body).into_owned(),
                            });
                        }
                        serde_json::from_slice::<Value>(&body).map_err(|e| {
                            StateError::Connect(format!("an answer that is not JSON: {e}"))
                        })
                    });
                    (node, parsed)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            out.push(match call.await {
                Ok((node, answer)) => (Some(node), answer),
                Err(e) => (None, Err(StateError::Connect(e.to_string()))),
            });
        }
        out
    }

    /// Rows of `kind` from every node, each with its node.
    async fn node_rows(&self, kind: Kind, cap: usize) -> (Vec<NodeAnswer>, Vec<String>) {
        let path = format!("/api/v0/local/{}?limit={cap}", kind.name());
        let (answers, failed) = self.ask_nodes(&path).await;
        let answers = answers
            .into_iter()
            .map(|(node, value)| {
                let rows = value["rows"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|mut row| {
                        if let Value::Object(fields) = &mut row {
                            // A task's node is where it ran: the row of
                            // its owner's node says only how it ended.
                            let ran_here = fields
                                .remove("ran_here")
                                .is_none_or(|here| here.as_bool() == Some(true));
                            if ran_here {
                                fields.insert("node_id".into(), json!(node.node_id));
                                fields.insert("node_ip".into(), json!(node.node_ip));
                            }
                        }
                        row
                    })
                    .collect();
                NodeAnswer {
                    node,
                    rows,
                    total: value["total"].as_u64().unwrap_or(0) as usize,
                    dropped: value["dropped"].as_u64().unwrap_or(0),
                }
            })
            .collect();
        (answers, failed)
    }

    /// The log files of every live node (or of the node whose id or
    /// address is `node`): `{nodes: [{node_id, node_ip, files}]}`.
    pub async fn logs(&self, node: Option<&str>) -> Result<Value, StateError> {
        let (answers, failed) = self.ask_nodes("/api/v0/local/logs").await;
        let nodes: Vec<Value> = answers
            .into_iter()
            .filter(|(n, _)| node.is_none_or(|w| n.node_id == w || n.node_ip == w))
            .map(|(n, v)| json!({"node_id": n.node_id, "node_ip": n.node_ip, "files": v["files"]}))
            .collect();
        if let (Some(w), true) = (node, nodes.is_empty()) {
            return Err(StateError::NotFound {
                kind: "nodes".into(),
                id: w.to_string(),
            });
        }
        Ok(json!({ "nodes": nodes, "partial_failure_warning": failed.join("; ") }))
    }

    /// Every thread's stack of the worker processes of every live node
    /// (of the node whose id or address is `node`; of its worker `pid`):
    /// `{nodes: [{node_id, node_ip, processes}], partial_failure_warning}`.
    pub async fn stacks(&self, node: Option<&str>, pid: Option<u32>) -> Result<Value, StateError> {
        if pid.is_some() && node.is_none() {
            return Err(StateError::BadRequest(
                "a pid names a process on one node: give the node too (node_id=<id or address>)"
                    .into(),
            ));
        }
        let endpoints: Vec<NodeEndpoint> = (self.sources.endpoints)()
            .into_iter()
            .filter(|n| node.is_none_or(|w| n.node_id == w || n.node_ip == w))
            .collect();
        if let (Some(w), true) = (node, endpoints.is_empty()) {
            return Err(StateError::NotFound {
                kind: "nodes".into(),
                id: w.to_string(),
            });
        }
        let path = match pid {
            Some(pid) => format!("/api/v0/local/stack?pid={pid}"),
            None => "/api/v0/local/stack".to_string(),
        };
        let (mut nodes, mut failed) = (Vec::new(), Vec::new());
        for (node, answer) in self.ask(endpoints, &path, STACK_TIMEOUT).await {
            match (node, answer) {
                (Some(n), Ok(value)) => nodes.push(json!({"node_id": n.node_id,
                    "node_ip": n.node_ip, "processes": value["processes"]})),
                (
                    _,
                    Err(StateError::Server {
                        status: 404,
                        message,
                    }),
                ) if pid.is_some() => return Err(StateError::BadRequest(message)),
                (Some(n), Err(e)) => failed.push(format!("{} ({}): {e}", n.node_id, n.node_ip)),
                (None, Err(e)) => failed.push(format!("a node's call stopped: {e}")),
                (None, Ok(_)) => {}
            }
        }
        Ok(json!({ "nodes": nodes, "partial_failure_warning": failed.join("; ") }))
    }

    /// Reads a log file on the node whose id or address is `node`, as the
    /// node's agent reads it (`query`: its `name` or `worker_id` and
    /// `stream`, and `tail` or `offset`).
    pub async fn log_file(&self, node: &str, query: &str) -> Result<Value, StateError> {
        let endpoint = (self.sources.endpoints)()
            .into_iter()
            .find(|n| n.node_id == node || n.node_ip == node)
            .ok_or_else(|| StateError::NotFound {
                kind: "nodes".into(),
                id: node.to_string(),
            })?;
        let path = format!("/api/v0/local/logs/file?{query}");
        let (status, body) =
            fetch::get(&endpoint.address, &path, Some(&self.token), NODE_TIMEOUT).await?;
        match status {
            200 => serde_json::from_slice(&body).map_err(|e| {
                StateError::Connect(format!("a node answered something else than JSON: {e}"))
            }),
            400 | 404 => Err(StateError::BadRequest(
                String::from_utf8_lossy(&body).into_owned(),
            )),
            _ => Err(StateError::Server {
                status,
                message: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    /// Lists what `query` asks for.
    pub async fn list(&self, query: &Query) -> Result<Listing, StateError> {
        query.check()?;
        let mut listing = Listing::default();
        let fetched: Vec<Value> = if query.kind.from_nodes() {
            let cap = if query.filters.is_empty() {
                query.limit
            } else {
                FILTERED_FETCH_CAP
            };
            let (answers, failed) = self.node_rows(query.kind, cap).await;
            if !failed.is_empty() {
                listing.partial_failure_warning = format!(
                    "{} node(s) did not answer, their rows are missing: {}",
                    failed.len(),
                    failed.join("; ")
                );
            }
            if query.kind == Kind::Actors {
                self.remember(&answers);
            }
            let mut rows = Vec::new();
            for answer in answers {
                listing.total += answer.total;
                listing.dropped += answer.dropped;
                rows.extend(answer.rows);
            }
            if query.kind == Kind::Actors {
                let gone = self.actors_of_gone_nodes(&rows);
                listing.total += gone.len();
                rows.extend(gone);
            }
            if query.kind == Kind::Tasks {
                rows = join_tasks(rows);
                // Running ones first, then the latest to end.
                rows.sort_by_key(|r| {
                    std::cmp::Reverse(r["end_time_ms"].as_u64().unwrap_or(u64::MAX))
                });
            }
            rows
        } else {
            let rows = match query.kind {
                Kind::Nodes => (self.sources.nodes)(),
                _ => (self.sources.jobs)(),
            };
            listing.total = rows.len();
            rows
        };
        listing.num_after_truncation = fetched.len();
        let kept: Vec<Value> = fetched.into_iter().filter(|r| query.keep(r)).collect();
        listing.num_filtered = kept.len();
        listing.rows = kept.into_iter().take(query.limit).collect();
        Ok(listing)
    }

    /// Asks every live node for its actors and remembers them, so that
    /// the actors of a node that dies later are listed dead (the head's
    /// history calls this every few seconds while the cluster has more
    /// than one node).
    pub async fn remember_actors(&self) {
        if (self.sources.endpoints)().len() > 1 {
            let (answers, _) = self.node_rows(Kind::Actors, crate::query::MAX_LIMIT).await;
            self.remember(&answers);
        }
    }

    fn remember(&self, answers: &[NodeAnswer]) {
        let Ok(mut seen) = self.seen_actors.lock() else {
            return;
        };
        for answer in answers {
            seen.retain(|(node, _)| node.node_id != answer.node.node_id);
            seen.push((answer.node.clone(), answer.rows.clone()));
        }
        let over = seen.len().saturating_sub(NODES_REMEMBERED);
        seen.drain(..over);
    }

    /// The remembered actors of nodes no longer alive, as dead (those not
    /// listed anew by a live node: an actor restarted elsewhere is listed
    /// from there).
    fn actors_of_gone_nodes(&self, live_rows: &[Value]) -> Vec<Value> {
        let live: std::collections::HashSet<String> = (self.sources.endpoints)()
            .into_iter()
            .map(|n| n.node_id)
            .collect();
        let listed: std::collections::HashSet<&str> = live_rows
            .iter()
            .filter_map(|r| r["actor_id"].as_str())
            .collect();
        let Ok(seen) = self.seen_actors.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (node, rows) in seen.iter().filter(|(n, _)| !live.contains(&n.node_id)) {
            for row in rows {
                if row["actor_id"]
                    .as_str()
                    .is_some_and(|id| listed.contains(id))
                {
                    continue;
                }
                let mut row = row.clone();
                if row["state"] != "DEAD" {
                    row["state"] = json!("DEAD");
                    row["death_cause"] = json!(format!(
                        "its node {} ({}) died with it",
                        node.node_id, node.node_ip
                    ));
                }
                out.push(row);
            }
        }
        out
    }

    /// A summary of `kind` (tasks, actors or objects): tasks by function
    /// and state (exact counts, and how many ended tasks are no longer
    /// kept), actors by class and state, objects by node.
    pub async fn summarize(&self, kind: Kind) -> Result<Value, StateError> {
        match kind {
            Kind::Tasks => {
                let (answers, failed) = self.ask_nodes("/api/v0/local/task_counts").await;
                let mut by_name: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
                let (mut total, mut dropped) = (0u64, 0u64);
                for (_, value) in answers {
                    dropped += value["dropped"].as_u64().unwrap_or(0);
                    for c in value["counts"].as_array().into_iter().flatten() {
                        let name = c["name"].as_str().unwrap_or_default().to_string();
                        let state = c["state"].as_str().unwrap_or_default().to_string();
                        let count = c["count"].as_u64().unwrap_or(0);
                        if state == "FINISHED" || state == "FAILED" {
                            total += count;
                        }
                        let states = by_name.entry(name).or_default();
                        let now = states.get(&state).and_then(Value::as_u64).unwrap_or(0);
                        states.insert(state, json!(now + count));
                    }
                }
                let summary: Map<String, Value> = by_name
                    .into_iter()
                    .map(|(name, states)| (name, json!({ "state_counts": states })))
                    .collect();
                Ok(json!({
                    "summary": summary,
                    "total_tasks": total,
                    "dropped_task_events": dropped,
                    "partial_failure_warning": failed.join("; "),
                }))
            }
            Kind::Actors => {
                let listing = self.list(&all_of(Kind::Actors)).await?;
                let mut by_class: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
                for row in &listing.rows {
                    let class = row["class_name"].as_str().unwrap_or_default().to_string();
                    let state = row["state"].as_str().unwrap_or_default().to_string();
                    let states = by_class.entry(class).or_default();
                    let now = states.get(&state).and_then(Value::as_u64).unwrap_or(0);
                    states.insert(state, json!(now + 1));
                }
                let summary: Map<String, Value> = by_class
                    .into_iter()
                    .map(|(class, states)| (class, json!({ "state_counts": states })))
                    .collect();
                Ok(json!({
                    "summary": summary,
                    "total_actors": listing.total,
                    "partial_failure_warning": listing.partial_failure_warning,
                }))
            }
            Kind::Objects => {
                let listing = self.list(&all_of(Kind::Objects)).await?;
                let mut by_node: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                for row in &listing.rows {
                    let node = row["node_id"].as_str().unwrap_or_default().to_string();
                    let entry = by_node.entry(node).or_default();
                    entry.0 += 1;
                    entry.1 += row["object_size"].as_u64().unwrap_or(0);
                }
                let summary: Map<String, Value> = by_node
                    .into_iter()
                    .map(|(node, (count, bytes))| {
                        (
                            node,
                            json!({ "total_objects": count, "total_size_bytes": bytes }),
                        )
                    })
                    .collect();
                Ok(json!({
                    "summary": summary,
                    "total_objects": listing.total,
                    "partial_failure_warning": listing.partial_failure_warning,
                }))
            }
            other => Err(StateError::BadRequest(format!(
                "there is no summary of {}: summaries are of tasks, actors and objects",
                other.name()
            ))),
        }
    }
}

/// Joins the rows of one task from several nodes (its owner's, which
/// says how it ended, and the one where it ran) into one: the owner's
/// outcome, the run's node, worker and times.
fn join_tasks(rows: Vec<Value>) -> Vec<Value> {
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut joined: Vec<Value> = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(id) = row["task_id"].as_str().map(str::to_string) else {
            joined.push(row);
            continue;
        };
        let Some(&i) = at.get(&id) else {
            at.insert(id, joined.len());
            joined.push(row);
            continue;
        };
        let (Value::Object(into), Value::Object(from)) = (&mut joined[i], row) else {
            continue;
        };
        let owners = from.get("returned_us").is_some_and(|v| !v.is_null());
        for (key, value) in from {
            let outcome = matches!(key.as_str(), "state" | "error_message" | "retries");
            let empty = into.get(&key).is_none_or(Value::is_null);
            if !value.is_null() && (empty || (owners && outcome)) {
                into.insert(key, value);
            }
        }
    }
    joined
}

/// A query for every row of `kind` (up to the largest limit).
fn all_of(kind: Kind) -> Query {
    Query {
        kind,
        filters: Vec::new(),
        limit: crate::query::MAX_LIMIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's agent on loopback, answering its actors.
    async fn agent(rows: Value) -> String {
        use axum::routing::get;
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("a loopback port: {e}"),
        };
        let address = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let answer = json!({"rows": rows, "total": 1, "dropped": 0});
        let app = axum::Router::new().route(
            "/api/v0/local/actors",
            get(move || {
                let answer = answer.clone();
                async move { axum::Json(answer) }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        address
    }

    #[tokio::test]
    async fn the_actors_of_a_node_that_died_are_listed_dead_with_their_node() {
        let address = agent(json!([
            {"actor_id": "a1", "state": "ALIVE", "class_name": "C", "pid": 7},
            {"actor_id": "a2", "state": "DEAD", "death_cause": "killed"},
        ]))
        .await;
        let node = NodeEndpoint {
            node_id: "node-1".into(),
            node_ip: "10.0.0.2".into(),
            address,
        };
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let live = alive.clone();
        let api = StateApi::new(
            Sources {
                nodes: Arc::new(Vec::new),
                jobs: Arc::new(Vec::new),
                endpoints: Arc::new(move || {
                    if live.load(std::sync::atomic::Ordering::SeqCst) {
                        vec![node.clone()]
                    } else {
                        Vec::new()
                    }
                }),
            },
            "token".into(),
        );
        let listed = api.list(&all_of(Kind::Actors)).await;
        let rows = listed.map(|l| l.rows).unwrap_or_default();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0]["state"], "ALIVE");
        alive.store(false, std::sync::atomic::Ordering::SeqCst);
        let rows = api
            .list(&all_of(Kind::Actors))
            .await
            .map(|l| l.rows)
            .unwrap_or_default();
        assert_eq!(
            rows.len(),
            2,
            "still listed once the node is gone: {rows:?}"
        );
        assert_eq!(rows[0]["state"], "DEAD");
        assert_eq!(rows[0]["node_id"], "node-1");
        assert_eq!(rows[0]["pid"], 7);
        let cause = rows[0]["death_cause"].as_str().unwrap_or_default();
        assert!(
            cause.contains("node-1") && cause.contains("died"),
            "{cause}"
        );
        assert_eq!(rows[1]["death_cause"], "killed", "its own cause kept");
    }

    #[test]
    fn a_task_owned_on_one_node_and_run_on_another_is_one_row() {
        let owner = json!({"task_id": "t", "state": "FAILED", "error_message": "boom",
            "retries": 1, "returned_us": 9, "worker_pid": null, "end_time_ms": 9});
        let ran = json!({"task_id": "t", "state": "FINISHED", "error_message": null,
            "retries": null, "returned_us": null, "worker_pid": 42, "node_id": "n2",
            "end_time_ms": 5});
        let other = json!({"task_id": "u", "state": "RUNNING"});
        let rows = join_tasks(vec![ran, other, owner]);
        assert_eq!(rows.len(), 2);
        let t = &rows[0];
        assert_eq!(t["state"], "FAILED", "the owner says how it ended");
        assert_eq!(t["error_message"], "boom");
        assert_eq!(t["retries"], 1);
        assert_eq!(t["worker_pid"], 42, "where it ran");
        assert_eq!(t["node_id"], "n2");
        assert_eq!(rows[1]["task_id"], "u");
    }
}
