//! A node's metrics endpoint: `GET /metrics` in Prometheus's text format,
//! on the node's address at `--metrics-export-port` (Ray's flag), behind
//! the cluster token (`GET /api/local_raylet_healthz`, for health probes,
//! needs none) (`Authorization: Bearer`, which Prometheus sends from
//! a `credentials_file`). The head learns the address at registration and
//! lists it in the service-discovery file it writes for Prometheus.

use crate::dashboard::GuardedHttp;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prism_gcs::Token;
use prism_protocol::guard::{ConnectionLimits, GuardedListener};
use prism_protocol::rpc::constant_time_eq;
use prism_raylet::NodeView;
use std::net::SocketAddr;
use std::sync::Arc;

/// The metrics endpoint, bound but not yet serving (its address is told
/// to the head when the node registers).
pub(crate) struct Bound {
    listener: tokio::net::TcpListener,
    pub(crate) address: SocketAddr,
}

/// Binds `HOST:port` (`port` 0: a free one).
pub(crate) async fn bind(host: &str, port: u16) -> Result<Bound, String> {
    let at = format!("{host}:{port}");
    let address: SocketAddr = at.parse().map_err(|e| {
        format!("the metrics endpoint's address {at} is not an IP address and port: {e}")
    })?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "the metrics port {port} is taken on {host}: choose another with \
                 --metrics-export-port (0 picks a free one)"
            ),
            _ => format!("cannot listen for metrics on {at}: {e}"),
        })?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("the metrics endpoint's address: {e}"))?;
    Ok(Bound { listener, address })
}

struct Endpoint {
    view: NodeView,
    token: Token,
}

/// The endpoint serving in the background; dropped, it stops.
pub(crate) struct Serving {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Bound {
    /// Serves `metrics` until the returned handle is dropped.
    pub(crate) fn serve(self, view: NodeView, token: Token) -> Serving {
        let endpoint = Arc::new(Endpoint { view, token });
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/api/local_raylet_healthz", get(health))
            .route("/api/v0/local/logs", get(log_list))
            .route("/api/v0/local/logs/file", get(log_read))
            .route("/api/v0/local/stack", get(stack))
            .route("/api/v0/local/{kind}", get(rows))
            .with_state(endpoint);
        let listener = GuardedHttp(GuardedListener::new(
            self.listener,
            ConnectionLimits::from_env_or_default(),
            "the metrics endpoint",
        ));
        let address = self.address;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the metrics endpoint stopped serving");
            }
        });
        tracing::info!(%address, "metrics endpoint started");
        Serving { task }
    }
}

/// The node's health for probes (Ray's `/api/local_raylet_healthz`, as
/// KubeRay's probes ask it): `success` with 200, or 503 and why. Needs no
/// token: a probe has none, and the answer tells nothing else.
async fn health(State(e): State<Arc<Endpoint>>) -> Response {
    // Off the runtime's threads, and bounded: a scheduler that does not
    // answer makes the probe fail, not hang a thread per probe.
    let view = e.view.clone();
    let asked = tokio::task::spawn_blocking(move || view.health());
    match tokio::time::timeout(std::time::Duration::from_secs(2), asked).await {
        Ok(Ok(Ok(()))) => (StatusCode::OK, "success").into_response(),
        Ok(Ok(Err(why))) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        Ok(Err(_)) | Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node's scheduler did not answer within 2 s",
        )
            .into_response(),
    }
}

/// Whether the request carries the cluster token.
fn admitted(e: &Endpoint, headers: &HeaderMap) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.is_some_and(|b| constant_time_eq(b.as_bytes(), e.token.reveal().as_bytes()))
}

fn refused() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "the node's endpoint needs the cluster token: send `Authorization: Bearer <token>` \
         (in Prometheus: `authorization: {credentials_file: <the head's temp dir>/token}`)",
    )
        .into_response()
}

/// Every thread's stack of the node's worker processes (`pid=N`: of
/// that one): `{processes: [...]}`, a 404 when no worker has that pid.
async fn stack(
    State(e): State<Arc<Endpoint>>,
    Query(params): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !admitted(&e, &headers) {
        return refused();
    }
    let pid = match params.get("pid").map(|p| p.parse::<u32>()) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "pid must be a process id (a whole number)",
            )
                .into_response()
        }
    };
    let processes = e.view.stacks(pid).await;
    if let (Some(pid), true) = (pid, processes.is_empty()) {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "no worker process of this node has the pid {pid} (`prism list workers` lists \
                 them)"
            ),
        )
            .into_response();
    }
    axum::Json(serde_json::json!({ "processes": processes })).into_response()
}

/// The node's rows of one kind, for the head's state API:
/// `{rows, total, dropped}`; `task_counts` gives exact counts.
async fn rows(
    State(e): State<Arc<Endpoint>>,
    Path(kind): Path<String>,
    Query(params): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !admitted(&e, &headers) {
        return refused();
    }
    let limit = match params.get("limit").map(|l| l.parse::<usize>()) {
        None => usize::MAX,
        Some(Ok(l)) => l,
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "limit must be a whole number").into_response()
        }
    };
    let view = e.view.clone();
    let answer = tokio::task::spawn_blocking(move || {
        if kind == "task_counts" {
            let (counts, dropped) = view.task_counts();
            return Some(serde_json::json!({ "counts": counts, "dropped": dropped }));
        }
        view.rows(&kind, limit)
            .map(|r| serde_json::json!({ "rows": r.rows, "total": r.total, "dropped": r.dropped }))
    })
    .await;
    match answer {
        Ok(Some(value)) => axum::Json(value).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            format!(
                "a node lists {} and task_counts",
                prism_raylet::NODE_ROW_KINDS.join(", ")
            ),
        )
            .into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the rows could not be gathered: {err}"),
        )
            .into_response(),
    }
}

/// The node's log files.
async fn log_list(State(e): State<Arc<Endpoint>>, headers: HeaderMap) -> Response {
    if !admitted(&e, &headers) {
        return refused();
    }
    let dir = e.view.logs_dir();
    match tokio::task::spawn_blocking(move || crate::logs::list(&dir)).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// One read of a log file (see `crate::logs::LogRead`).
async fn log_read(
    State(e): State<Arc<Endpoint>>,
    Query(params): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !admitted(&e, &headers) {
        return refused();
    }
    let read = match crate::logs::LogRead::from_pairs(&params) {
        Ok(r) => r,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let dir = e.view.logs_dir();
    match tokio::task::spawn_blocking(move || read.run(&dir)).await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(why)) => (StatusCode::NOT_FOUND, why).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

async fn scrape(State(e): State<Arc<Endpoint>>, headers: HeaderMap) -> Response {
    if !admitted(&e, &headers) {
        return refused();
    }
    let view = e.view.clone();
    match tokio::task::spawn_blocking(move || view.metrics()).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                prism_protocol::exposition::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the metrics could not be gathered: {err}"),
        )
            .into_response(),
    }
}
