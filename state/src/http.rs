//! The REST routes (Ray's State API): `GET /api/v0/{kind}` with `limit`
//! and `filter_keys`/`filter_predicates`/`filter_values`, and
//! `GET /api/v0/{kind}/summarize`, each answered in Ray's envelope
//! `{result, msg, data: {result: ...}}`; and `GET /api/v0/timeline`, the
//! tasks' trace in Chrome's format. The dashboard mounts them behind its
//! token check.

use crate::error::StateError;
use crate::head::StateApi;
use crate::query::{Kind, Query};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The routes over `api`.
pub fn router(api: Arc<StateApi>) -> Router {
    Router::new()
        .route("/api/v0/logs", get(logs))
        .route("/api/v0/logs/file", get(log_file))
        .route("/api/v0/timeline", get(timeline))
        .route("/api/v0/stack", get(stack))
        .route("/api/v0/{kind}", get(list))
        .route("/api/v0/{kind}/summarize", get(summarize))
        .with_state(api)
}

fn answer(data: Value) -> Response {
    Json(json!({ "result": true, "msg": "", "data": { "result": data } })).into_response()
}

fn refuse(e: StateError) -> Response {
    let status = match &e {
        StateError::BadRequest(_) => StatusCode::BAD_REQUEST,
        StateError::NotFound { .. } => StatusCode::NOT_FOUND,
        StateError::Connect(_) | StateError::Server { .. } => StatusCode::BAD_GATEWAY,
    };
    (
        status,
        Json(json!({ "result": false, "msg": e.to_string(), "data": {} })),
    )
        .into_response()
}

/// The query string's pairs, percent-decoded.
fn pairs(raw: Option<String>) -> Result<Vec<(String, String)>, StateError> {
    let raw = raw.unwrap_or_default();
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(text: &str) -> Result<String, StateError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        StateError::BadRequest(format!("the query has a bad escape in {text:?}"))
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| StateError::BadRequest(format!("the query value {text:?} is not UTF-8")))
}

async fn list(
    State(api): State<Arc<StateApi>>,
    Path(kind): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = match Kind::parse(&kind).and_then(|k| Query::from_pairs(k, &pairs(raw)?)) {
        Ok(q) => q,
        Err(e) => return refuse(e),
    };
    match api.list(&query).await {
        Ok(l) => answer(json!({
            "total": l.total,
            "num_after_truncation": l.num_after_truncation,
            "num_filtered": l.num_filtered,
            "result": l.rows,
            "partial_failure_warning": l.partial_failure_warning,
            "dropped_task_events": l.dropped,
            "warnings": Value::Null,
        })),
        Err(e) => refuse(e),
    }
}

/// The tasks' trace in Chrome's format (not in the envelope: the answer
/// is the file Perfetto loads), of the tasks the query's filters keep
/// (`limit` defaults to the most).
async fn timeline(State(api): State<Arc<StateApi>>, RawQuery(raw): RawQuery) -> Response {
    let pairs = match pairs(raw) {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    let limited = pairs.iter().any(|(k, _)| k == "limit");
    let query = match Query::from_pairs(Kind::Tasks, &pairs) {
        Ok(q) if limited => q,
        Ok(q) => Query {
            limit: crate::query::MAX_LIMIT,
            ..q
        },
        Err(e) => return refuse(e),
    };
    match api.list(&query).await {
        Ok(l) => Json(crate::timeline::chrome_trace(
            &l.rows,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        ))
        .into_response(),
        Err(e) => refuse(e),
    }
}

/// Stack dumps of the worker processes: `node_id` (an id or address) and
/// `pid` narrow them.
async fn stack(State(api): State<Arc<StateApi>>, RawQuery(raw): RawQuery) -> Response {
    let pairs = match pairs(raw) {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    let (mut node, mut pid) = (None, None);
    for (key, value) in pairs {
        match key.as_str() {
            "node_id" => node = Some(value),
            "pid" => match value.parse::<u32>() {
                Ok(p) => pid = Some(p),
                Err(_) => {
                    return refuse(StateError::BadRequest(format!(
                        "pid {value:?} is not a process id"
                    )))
                }
            },
            other => {
                return refuse(StateError::BadRequest(format!(
                    "unknown parameter {other:?}: give node_id and pid"
                )))
            }
        }
    }
    match api.stacks(node.as_deref(), pid).await {
        Ok(v) => answer(v),
        Err(e) => refuse(e),
    }
}

async fn logs(State(api): State<Arc<StateApi>>, RawQuery(raw): RawQuery) -> Response {
    let node = match pairs(raw) {
        Ok(p) => p.into_iter().find(|(k, _)| k == "node_id").map(|(_, v)| v),
        Err(e) => return refuse(e),
    };
    match api.logs(node.as_deref()).await {
        Ok(v) => answer(v),
        Err(e) => refuse(e),
    }
}

/// Passes a read on to the node named by `node_id` (its id or address);
/// the rest of the query is the node's.
async fn log_file(State(api): State<Arc<StateApi>>, RawQuery(raw): RawQuery) -> Response {
    let raw = raw.unwrap_or_default();
    let mut node = None;
    let mut rest = Vec::new();
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        match part.strip_prefix("node_id=") {
            Some(v) => match decode(v) {
                Ok(v) => node = Some(v),
                Err(e) => return refuse(e),
            },
            None => rest.push(part),
        }
    }
    let Some(node) = node else {
        return refuse(StateError::BadRequest(
            "name the node whose log to read (node_id=<id or address>)".into(),
        ));
    };
    match api.log_file(&node, &rest.join("&")).await {
        Ok(v) => answer(v),
        Err(e) => refuse(e),
    }
}

async fn summarize(State(api): State<Arc<StateApi>>, Path(kind): Path<String>) -> Response {
    match Kind::parse(&kind) {
        Ok(kind) => match api.summarize(kind).await {
            Ok(summary) => answer(json!({ "node_id_to_summary": { "cluster": summary } })),
            Err(e) => refuse(e),
        },
        Err(e) => refuse(e),
    }
}
