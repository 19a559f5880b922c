//! The head's dashboard: a web page (one HTML file built into the binary,
//! no other asset) with views of the cluster's nodes, jobs and their logs,
//! actors, tasks, placement groups and charts of the head's short history,
//! updated every 2 s from the JSON routes (`/api/cluster_status`,
//! `/api/nodes`, `/api/actors`, `/api/history`, the state API's
//! `/api/v0/...` and the Jobs API), served in the control store's process.
//!
//! It asks for the cluster token, as every other way in does: a request
//! carries it as `Authorization: Bearer <token>`, or the `prism_token`
//! cookie that opening `/?token=<token>` once sets (a value made from the
//! token, not the token). Others get 401 and a
//! page that says how to get in. It listens on 127.0.0.1 unless
//! `--dashboard-host` says otherwise, as Ray's does.

use crate::status::{totals, Totals};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prism_gcs::pb::{NodeInfo, NodeState, Resource};
use prism_gcs::{GcsView, Token};
use prism_protocol::guard::{GuardedListener, QuietTimeout};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;

const COOKIE: &str = "prism_token";

struct Dashboard {
    gcs: GcsView,
    token: Token,
    history: Arc<crate::history::History>,
}

/// The page, built into the binary.
const PAGE: &str = include_str!("../assets/dashboard.html");

/// A dashboard serving in the background; dropped, it stops.
pub(crate) struct Running {
    pub(crate) address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    sampling: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
        self.sampling.abort();
    }
}

/// The APIs a dashboard serves beside its own routes, each behind its
/// token check.
#[derive(Default)]
pub(crate) struct Apis {
    /// Ray's Jobs API.
    pub(crate) jobs: Option<Arc<prism_jobs::JobManager>>,
    /// Ray's State API.
    pub(crate) state: Option<Arc<prism_state::StateApi>>,
}

/// Listens on `address` and serves the dashboard (and the APIs given)
/// until dropped.
pub(crate) async fn start(
    address: SocketAddr,
    gcs: GcsView,
    token: Token,
    apis: Apis,
) -> std::io::Result<Running> {
    let limits = prism_protocol::guard::ConnectionLimits::from_env_or_default();
    let listener = GuardedHttp(GuardedListener::new(
        tokio::net::TcpListener::bind(address).await?,
        limits,
        "the dashboard",
    ));
    let bound = listener.0.local_addr()?;
    let session = gcs.cluster_id().to_string();
    let (history, sampling) = crate::history::start(gcs.clone(), apis.state.clone());
    let dashboard = Arc::new(Dashboard {
        gcs,
        token,
        history,
    });
    let mut app = Router::new()
        .route("/", get(page))
        .route("/api/nodes", get(nodes))
        .route("/api/cluster_status", get(cluster_status))
        .route("/api/actors", get(actors))
        .route("/metrics", get(metrics))
        .route("/api/history", get(history_json))
        .route("/api/gcs_healthz", get(gcs_health))
        .with_state(dashboard.clone());
    if let Some(jobs) = apis.jobs {
        // Ray's Jobs API, behind the same token check.
        let api = prism_jobs::router(jobs, session).route_layer(
            axum::middleware::from_fn_with_state(dashboard.clone(), admit_or_refuse),
        );
        app = app.merge(api);
    }
    if let Some(state) = apis.state {
        let api = prism_state::router(state).route_layer(axum::middleware::from_fn_with_state(
            dashboard,
            admit_or_refuse,
        ));
        app = app.merge(api);
    }
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the dashboard stopped serving");
        }
    });
    tracing::info!(address = %bound, "dashboard started");
    Ok(Running {
        address: bound,
        task,
        sampling,
    })
}

/// The dashboard's listener: connections within the limits, each closed
/// when quiet (see `prism_protocol::guard`).
pub(crate) struct GuardedHttp(pub(crate) GuardedListener);

impl axum::serve::Listener for GuardedHttp {
    type Io = QuietTimeout<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        self.0.accept().await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl Dashboard {
    /// Whether the request carries the token in its header, or the
    /// dashboard's cookie.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let token = self.token.reveal().as_bytes();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let pass = self.cookie_value();
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .find(|c| prism_protocol::rpc::constant_time_eq(c.as_bytes(), pass.as_bytes()));
        cookie.is_some()
            || bearer.is_some_and(|b| prism_protocol::rpc::constant_time_eq(b.as_bytes(), token))
    }

    /// What the cookie holds: a value made from the token, not the token
    /// itself (a browser sends a host's cookies to every port of it, so
    /// other web services of the machine see it; it opens this dashboard
    /// and nothing else).
    fn cookie_value(&self) -> String {
        use sha2::Digest;
        let mut hash = sha2::Sha256::new();
        hash.update(b"prism dashboard cookie\0");
        hash.update(self.token.reveal().as_bytes());
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Passes a request that carries the token on; refuses the rest.
async fn admit_or_refuse(
    State(d): State<Arc<Dashboard>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if d.admits(request.headers()) {
        next.run(request).await
    } else {
        refused_text()
    }
}

/// The address that logs a browser in: the dashboard with the token,
/// percent-encoded.
pub(crate) fn login_url(at: &str, token: &str) -> String {
    let encoded: String = token
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("http://{at}/?token={encoded}")
}

/// A query value with its `%XX` escapes (and `+` for space) decoded.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
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
    String::from_utf8(out).ok()
}

/// When a refusal was last logged, in seconds since the Unix epoch: one
/// line per 10 s at most, so that requests cannot flood the log.
static LAST_REFUSAL_LOGGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A refusal in plain text, as Ray's job server answers (its clients
/// show the body).
fn refused_text() -> Response {
    log_refusal();
    (StatusCode::UNAUTHORIZED, REFUSED).into_response()
}

const REFUSED: &str = "this dashboard needs the cluster token: open /?token=<token> once (the token \
                       `prism start --head` printed, saved in <temp dir>/token on the head), or send \
                       `Authorization: Bearer <token>`";

/// Logs a refusal, once per 10 s at most.
fn log_refusal() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let last = LAST_REFUSAL_LOGGED.load(std::sync::atomic::Ordering::Relaxed);
    if now >= last + 10
        && LAST_REFUSAL_LOGGED
            .compare_exchange(
                last,
                now,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        tracing::warn!(
            "refused a dashboard request without the cluster token (logged once per 10 s)"
        );
    }
}

fn refused(api: bool) -> Response {
    let why = REFUSED;
    log_refusal();
    if api {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({ "error": why })),
        )
            .into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Html(format!(
                "<!doctype html><title>Prism</title><h1>Prism</h1><p>{}</p>",
                escape(why)
            )),
        )
            .into_response()
    }
}

async fn page(State(d): State<Arc<Dashboard>>, headers: HeaderMap, uri: Uri) -> Response {
    let given = uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("token="))
            .map(|v| percent_decode(v).unwrap_or_default())
    });
    if let Some(given) = given {
        if !prism_protocol::rpc::constant_time_eq(given.as_bytes(), d.token.reveal().as_bytes()) {
            return refused(false);
        }
        // Kept in a cookie, and taken out of the address bar.
        return (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_string()),
                (
                    header::SET_COOKIE,
                    format!(
                        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                        d.cookie_value()
                    ),
                ),
            ],
        )
            .into_response();
    }
    if !d.admits(&headers) {
        return refused(false);
    }
    Html(PAGE).into_response()
}

/// The head's short history, for the page's charts.
async fn history_json(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if !d.admits(&headers) {
        return refused(true);
    }
    axum::Json(d.history.json()).into_response()
}

/// The cluster's own gauges, for Prometheus (each node serves its own).
async fn metrics(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    use prism_protocol::exposition::{Exposition, Kind, CONTENT_TYPE};
    if !d.admits(&headers) {
        return refused_text();
    }
    let nodes = d.gcs.nodes();
    let mut out = Exposition::new(d.gcs.cluster_id());
    out.family(
        "ray_cluster_active_nodes",
        Kind::Gauge,
        "Live nodes of the cluster, by type (head or worker).",
    );
    for (kind, head) in [("head", true), ("worker", false)] {
        let count = nodes
            .iter()
            .filter(|n| is_alive(n) && n.is_head == head)
            .count();
        out.sample(
            "ray_cluster_active_nodes",
            &[("node_type", kind)],
            count as f64,
        );
    }
    out.single(
        "prism_cluster_dead_nodes",
        Kind::Gauge,
        "Nodes the head has marked dead and still lists.",
        nodes.iter().filter(|n| !is_alive(n)).count() as f64,
    );
    out.single(
        "prism_cluster_named_actors",
        Kind::Gauge,
        "Names held in the cluster's actor name directory.",
        d.gcs.named_actors().len() as f64,
    );
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], out.finish()).into_response()
}

/// The control store's health for probes (Ray's `/api/gcs_healthz`):
/// `success` while its node table answers and lists a live head node (503
/// until the head's own node has joined). Needs no token: a probe has
/// none, and the answer tells nothing else.
async fn gcs_health(State(d): State<Arc<Dashboard>>) -> Response {
    if d.gcs.nodes().iter().any(|n| n.is_head && is_alive(n)) {
        (StatusCode::OK, "success").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the control store lists no live head node yet",
        )
            .into_response()
    }
}

async fn nodes(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if !d.admits(&headers) {
        return refused(true);
    }
    let nodes: Vec<Value> = d.gcs.nodes().iter().map(node_json).collect();
    axum::Json(Value::Array(nodes)).into_response()
}

async fn cluster_status(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if !d.admits(&headers) {
        return refused(true);
    }
    let nodes = d.gcs.nodes();
    let alive = nodes.iter().filter(|n| is_alive(n)).count();
    let Totals {
        total,
        free,
        demand,
    } = totals(&nodes);
    let scaled = |m: &std::collections::BTreeMap<String, i64>| -> Value {
        m.iter()
            .map(|(k, v)| (k.clone(), json!(*v as f64 / 10_000.0)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    axum::Json(json!({
        "cluster_id": d.gcs.cluster_id(),
        "nodes_alive": alive,
        "nodes_dead": nodes.len() - alive,
        "total": scaled(&total),
        "available": scaled(&free),
        "demands": demand
            .iter()
            .map(|(shape, count)| json!({ "shape": shape, "waiting": count }))
            .collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn actors(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if !d.admits(&headers) {
        return refused(true);
    }
    let actors: Vec<Value> = d
        .gcs
        .named_actors()
        .into_iter()
        .map(|a| {
            json!({
                "namespace": a.namespace,
                "name": a.name,
                "actor_id": a.actor_id,
                "node_id": a.node_id,
            })
        })
        .collect();
    axum::Json(Value::Array(actors)).into_response()
}

fn is_alive(n: &NodeInfo) -> bool {
    n.state == NodeState::Alive as i32
}

fn resources_json(resources: &[Resource]) -> Value {
    resources
        .iter()
        .map(|r| (r.name.clone(), json!(r.units as f64 / 10_000.0)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn node_json(n: &NodeInfo) -> Value {
    json!({
        "node_id": n.node_id,
        "node_ip": n.node_ip,
        "hostname": n.hostname,
        "is_head": n.is_head,
        "alive": is_alive(n),
        "death_cause": n.death_cause,
        "total": resources_json(&n.total),
        "available": resources_json(&n.available),
        "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago,
        "pid": n.pid,
    })
}

/// Text made safe inside HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_lists_nodes_and_actors_with_their_text_escaped() {
        let node = NodeInfo {
            node_id: "node-1".into(),
            node_ip: "10.0.0.1".into(),
            is_head: true,
            state: NodeState::Alive as i32,
            total: vec![Resource {
                name: "CPU".into(),
                units: 20_000,
            }],
            available: vec![Resource {
                name: "CPU".into(),
                units: 10_000,
            }],
            ..Default::default()
        };
        let dead = NodeInfo {
            node_id: "node-2".into(),
            state: NodeState::Dead as i32,
            death_cause: "no heartbeat <5 s>".into(),
            ..Default::default()
        };
        let actor = prism_gcs::NamedActor {
            namespace: "ns".into(),
            name: "a&b".into(),
            actor_id: "x".into(),
            node_id: "node-1".into(),
        };
        assert_eq!(escape(&actor.name), "a&amp;b");
        assert!(!is_alive(&dead));
        assert!(PAGE.contains("/api/v0/"), "the page asks the state API");
        assert_eq!(
            login_url("127.0.0.1:8265", "a&b%c"),
            "http://127.0.0.1:8265/?token=a%26b%25c"
        );
        assert_eq!(percent_decode("a%26b%25c+d").as_deref(), Some("a&b%c d"));
        assert_eq!(percent_decode("bad%2"), None);
        let json = node_json(&node);
        assert_eq!(json["total"]["CPU"], json!(2.0));
        assert_eq!(json["alive"], json!(true));
    }
}
