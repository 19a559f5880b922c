//! Ray's Jobs REST API over a [`JobManager`], as an axum router that the
//! head's dashboard serves (behind its token check).
//!
//! Errors answer with their status and a plain-text message, as Ray's
//! server does: Ray's clients show the body's text.

use crate::error::JobError;
use crate::manager::JobManager;
use crate::model::Submission;
use crate::packages::PackageName;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The Jobs API version this server speaks (Ray's `CURRENT_VERSION`).
pub const API_VERSION: &str = "4";
/// The Ray version whose Jobs API this server follows.
pub const RAY_VERSION: &str = "2.60.0";

/// A log-tail frame holds at most this many lines, or this many bytes.
const TAIL_LINES: usize = 10;
const TAIL_BYTES: usize = 20_000;
/// How often a tail looks for more of the log.
const TAIL_POLL: Duration = Duration::from_millis(50);

impl IntoResponse for JobError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(error = %self, "a jobs request failed");
        }
        (status, self.to_string()).into_response()
    }
}

/// The routes, for `manager`, with the session name `/api/version` gives.
pub fn router(manager: Arc<JobManager>, session_name: String) -> Router {
    let upload_limit = manager.packages().limit() as usize + 64 * 1024;
    let state = Arc::new(Api {
        manager,
        session_name,
    });
    Router::new()
        .route("/api/version", get(version))
        .route(
            "/api/packages/{protocol}/{name}",
            get(package_get)
                .put(package_put)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/api/jobs/", post(submit).get(list))
        .route("/api/jobs", post(submit).get(list))
        .route("/api/jobs/{id}", get(details).delete(delete))
        .route("/api/jobs/{id}/stop", post(stop))
        .route("/api/jobs/{id}/logs", get(logs))
        .route("/api/jobs/{id}/logs/tail", get(tail))
        .with_state(state)
}

struct Api {
    manager: Arc<JobManager>,
    session_name: String,
}

type S = State<Arc<Api>>;

async fn version(State(api): S) -> Response {
    Json(json!({
        "version": API_VERSION,
        "ray_version": RAY_VERSION,
        "ray_commit": format!("prism-{}", env!("CARGO_PKG_VERSION")),
        "session_name": api.session_name,
    }))
    .into_response()
}

async fn package_get(State(api): S, Path((protocol, name)): Path<(String, String)>) -> Response {
    let name = match PackageName::parse(&protocol, &name) {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    match api.manager.packages().read(&name) {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn package_put(
    State(api): S,
    Path((protocol, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let name = match PackageName::parse(&protocol, &name) {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    let manager = api.manager.clone();
    let stored = tokio::task::spawn_blocking(move || manager.packages().put(&name, &body)).await;
    match stored {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the upload stopped: {e}"),
        )
            .into_response(),
    }
}

async fn submit(State(api): S, body: Bytes) -> Response {
    let submission = match Submission::parse(&body) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    match api.manager.submit(submission) {
        Ok(id) => Json(json!({ "job_id": id, "submission_id": id })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `limit` and `offset` page the list (newest first); without them every
/// job is listed.
#[derive(serde::Deserialize)]
struct Page {
    limit: Option<usize>,
    offset: Option<usize>,
}

async fn list(
    State(api): S,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(page)) = page else {
        return JobError::BadRequest("limit and offset must be whole numbers".into())
            .into_response();
    };
    Json(
        api.manager
            .list(page.offset.unwrap_or(0), page.limit.unwrap_or(usize::MAX)),
    )
    .into_response()
}

async fn details(State(api): S, Path(id): Path<String>) -> Response {
    match api.manager.get(&id) {
        Ok(d) => Json(d).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn delete(State(api): S, Path(id): Path<String>) -> Response {
    match api.manager.delete(&id) {
        Ok(deleted) => Json(json!({ "deleted": deleted })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn stop(State(api): S, Path(id): Path<String>) -> Response {
    match api.manager.stop(&id) {
        Ok(stopped) => Json(json!({ "stopped": stopped })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn logs(State(api): S, Path(id): Path<String>) -> Response {
    match api.manager.logs(&id) {
        Ok(logs) => Json(json!({ "logs": logs })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tail(State(api): S, Path(id): Path<String>, ws: WebSocketUpgrade) -> Response {
    if let Err(e) = api.manager.logs_from(&id, 0, 0) {
        return e.into_response();
    }
    ws.on_upgrade(move |socket| follow(api, id, socket))
}

/// Sends the log as it grows, in frames of at most [`TAIL_LINES`] lines
/// or [`TAIL_BYTES`] bytes, and closes with 1000 once the job ended and
/// its log is sent.
async fn follow(api: Arc<Api>, id: String, mut socket: WebSocket) {
    let mut offset = 0u64;
    let mut pending = String::new();
    loop {
        let ended = api
            .manager
            .get(&id)
            .map(|d| d.status.is_terminal())
            .unwrap_or(true);
        let (text, next) = match api.manager.logs_from(&id, offset, 1 << 20) {
            Ok(read) => read,
            Err(_) => break,
        };
        offset = next;
        pending.push_str(&text);
        // Whole lines go out; a partial last line waits for its end, or
        // for the job's end.
        let cut = if ended && text.is_empty() {
            pending.len()
        } else {
            pending.rfind('\n').map_or(0, |i| i + 1)
        };
        let ready: String = pending.drain(..cut).collect();
        for frame in frames(&ready) {
            if socket.send(Message::Text(frame.into())).await.is_err() {
                return;
            }
        }
        if ended && text.is_empty() && pending.is_empty() {
            break;
        }
        if text.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep(TAIL_POLL) => {}
                incoming = socket.recv() => {
                    if !matches!(incoming, Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Text(_) | Message::Binary(_)))) {
                        return;
                    }
                }
            }
        }
    }
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "the job ended".into(),
        })))
        .await;
}

/// Splits text into frames of at most [`TAIL_LINES`] lines and about
/// [`TAIL_BYTES`] bytes (a longer line is split at a character boundary).
fn frames(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut lines = 0;
    for line in text.split_inclusive('\n') {
        let mut line = line;
        while !line.is_empty() {
            if lines == TAIL_LINES
                || (current.len() + line.len() > TAIL_BYTES && !current.is_empty())
            {
                out.push(std::mem::take(&mut current));
                lines = 0;
            }
            let mut take = line.len().min(TAIL_BYTES - current.len());
            while !line.is_char_boundary(take) {
                take -= 1;
            }
            if take == 0 {
                out.push(std::mem::take(&mut current));
                lines = 0;
                continue;
            }
            current.push_str(&line[..take]);
            line = &line[take..];
            if line.is_empty() {
                lines += 1;
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_hold_ten_lines_or_twenty_thousand_bytes() {
        let text: String = (0..25).map(|i| format!("line {i}\n")).collect();
        let f = frames(&text);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].lines().count(), 10);
        assert_eq!(f.concat(), text);
        let long = "é".repeat(15_000) + "\n";
        let f = frames(&long);
        assert!(
            f.iter().all(|x| x.len() <= TAIL_BYTES),
            "{:?}",
            f.iter().map(String::len).collect::<Vec<_>>()
        );
        assert_eq!(f.concat(), long);
    }
}
