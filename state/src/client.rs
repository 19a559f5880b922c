//! A client of the head's state API, as `prism list`, `prism get` and
//! `prism summary` use it.

use crate::error::StateError;
use crate::fetch;
use crate::head::Listing;
use crate::query::{Kind, Query};
use serde_json::Value;
use std::time::Duration;

/// How long a query may take: the head asks every node.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A client of a head's state API.
///
/// ```no_run
/// # async fn demo() -> Result<(), prism_state::StateError> {
/// use prism_state::{Filter, Kind, Query, StateClient};
/// let client = StateClient::new("http://127.0.0.1:8265", Some("the-token".into()))?;
/// let mut query = Query::new(Kind::Actors);
/// query.filters.push(Filter::parse("state=ALIVE")?);
/// for actor in client.list(&query).await?.rows {
///     println!("{} {}", actor["actor_id"], actor["class_name"]);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StateClient {
    authority: String,
    token: Option<String>,
}

impl std::fmt::Debug for StateClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateClient")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl StateClient {
    /// A client of the dashboard at `address` (`http://HOST:PORT`).
    pub fn new(address: &str, token: Option<String>) -> Result<StateClient, StateError> {
        let authority = address
            .strip_prefix("http://")
            .ok_or_else(|| {
                StateError::BadRequest(format!(
                    "the address {address:?} is not the head's dashboard, http://HOST:PORT"
                ))
            })?
            .trim_end_matches('/')
            .to_string();
        Ok(StateClient { authority, token })
    }

    async fn call(&self, path: &str) -> Result<Value, StateError> {
        let (status, body) = fetch::get(&self.authority, path, self.token.as_deref(), TIMEOUT)
            .await
            .map_err(|e| {
                StateError::Connect(format!(
                    "{e} (is the head running, with its dashboard on that port? `prism status` \
                     on the head tells)"
                ))
            })?;
        let value: Value = serde_json::from_slice(&body).unwrap_or_else(
            |_| serde_json::json!({ "msg": String::from_utf8_lossy(&body).trim().to_string() }),
        );
        if status != 200 {
            let message = value["msg"].as_str().unwrap_or_default().to_string();
            return Err(match status {
                400 => StateError::BadRequest(message),
                401 => StateError::Server {
                    status,
                    message: format!(
                        "{message} (give the cluster token in PRISM_AUTH_TOKEN; on the head's \
                         machine it is found by itself)"
                    ),
                },
                _ => StateError::Server { status, message },
            });
        }
        Ok(value["data"]["result"].clone())
    }

    /// Every thread's stack of the worker processes (of the node whose id
    /// or address is `node`; of its worker `pid`), as
    /// [`StateApi::stacks`](crate::StateApi::stacks) answers.
    pub async fn stacks(&self, node: Option<&str>, pid: Option<u32>) -> Result<Value, StateError> {
        let mut path = "/api/v0/stack".to_string();
        let mut sep = '?';
        if let Some(node) = node {
            path.push_str(&format!("{sep}node_id={}", crate::query::encode(node)));
            sep = '&';
        }
        if let Some(pid) = pid {
            path.push_str(&format!("{sep}pid={pid}"));
        }
        self.call(&path).await
    }

    /// The rows `query` asks for.
    pub async fn list(&self, query: &Query) -> Result<Listing, StateError> {
        query.check()?;
        let data = self.call(&query.to_path()).await?;
        let count = |k: &str| data[k].as_u64().unwrap_or(0) as usize;
        Ok(Listing {
            rows: data["result"].as_array().cloned().unwrap_or_default(),
            total: count("total"),
            num_after_truncation: count("num_after_truncation"),
            num_filtered: count("num_filtered"),
            partial_failure_warning: data["partial_failure_warning"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            dropped: data["dropped_task_events"].as_u64().unwrap_or(0),
        })
    }

    /// The row of `kind` whose id is `id`.
    pub async fn get(&self, kind: Kind, id: &str) -> Result<Value, StateError> {
        let mut query = Query::new(kind);
        query.limit = 1;
        query.filters.push(crate::query::Filter {
            key: kind.id_field().to_string(),
            predicate: crate::query::Predicate::Equal,
            value: id.to_string(),
        });
        let listing = self.list(&query).await?;
        listing
            .rows
            .into_iter()
            .next()
            .ok_or_else(|| StateError::NotFound {
                kind: kind.name().replace('_', "-"),
                id: id.to_string(),
            })
    }

    /// The log files of every live node, or of the node whose id or
    /// address is `node`.
    pub async fn logs(&self, node: Option<&str>) -> Result<Value, StateError> {
        let path = match node {
            Some(n) => format!("/api/v0/logs?node_id={}", crate::query::encode(n)),
            None => "/api/v0/logs".to_string(),
        };
        self.call(&path).await
    }

    /// Reads a log file on `node` (its id or address); `query` is the
    /// node's: `name=<file>` or `worker_id=<id>&stream=out|err|log`, and
    /// `tail=<lines>` or `offset=<byte>`.
    pub async fn log_file(&self, node: &str, query: &str) -> Result<Value, StateError> {
        self.call(&format!(
            "/api/v0/logs/file?node_id={}&{query}",
            crate::query::encode(node)
        ))
        .await
    }

    /// The summary of `kind` (tasks, actors or objects).
    pub async fn summarize(&self, kind: Kind) -> Result<Value, StateError> {
        let data = self
            .call(&format!("/api/v0/{}/summarize", kind.name()))
            .await?;
        Ok(data["node_id_to_summary"]["cluster"].clone())
    }
}
