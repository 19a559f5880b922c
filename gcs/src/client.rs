//! A connection to the control store, presenting the cluster token (in
//! TLS when this process has it, see [`prism_protocol::tls`]).

use crate::auth::{Token, HEADER};
use crate::pb::gcs_client::GcsClient as Generated;
use crate::pb::*;
use crate::GcsError;
use prism_config::Backoff;
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How long connecting to the head may take before it counts as
/// unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Adds the token to every call.
#[derive(Debug, Clone)]
pub struct AddToken(MetadataValue<Ascii>);

impl tonic::service::Interceptor for AddToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert(HEADER, self.0.clone());
        Ok(request)
    }
}

/// A client of the control store. Cloning is cheap: clones share the
/// connection.
#[derive(Debug, Clone)]
pub struct GcsClient {
    address: String,
    inner: Generated<InterceptedService<Channel, AddToken>>,
    /// How long a call keeps trying while the head cannot be reached.
    patience: Duration,
}

type Inner = Generated<InterceptedService<Channel, AddToken>>;

/// The first wait between two tries of a call the head did not answer;
/// it doubles up to [`RETRY_WAIT_MAX`].
const RETRY_WAIT: Duration = Duration::from_millis(50);
const RETRY_WAIT_MAX: Duration = Duration::from_secs(1);

impl GcsClient {
    /// Connects to the head at `address` (`HOST:PORT`).
    pub async fn connect(address: &str, token: &Token) -> Result<GcsClient, GcsError> {
        crate::check_address(address)?;
        let tls = prism_protocol::tls::current();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|_| GcsError::BadAddress {
                address: address.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = &tls {
            // The head's certificate must name the address dialled.
            let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
            let pem = crate::pem::Pem::read(tls.files())?;
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(pem.ca))
                .identity(Identity::from_pem(pem.cert, pem.key))
                .domain_name(host.trim_start_matches('[').trim_end_matches(']'));
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| GcsError::Tls { message: chain(&e) })?;
        }
        let speaks_tls = tls.is_some();
        let channel = endpoint.connect().await.map_err(|e| {
            let reason = chain(&e);
            if speaks_tls && reason.contains("certificate") {
                GcsError::Tls {
                    message: format!(
                        "the handshake with the head at {address} failed ({reason}): the \
                         head's and this node's certificates must both be signed by the CA \
                         given with --tls-ca, and each must name its node's IP address"
                    ),
                }
            } else {
                GcsError::Unreachable {
                    address: address.to_string(),
                    reason,
                }
            }
        })?;
        let header =
            MetadataValue::try_from(format!("Bearer {}", token.reveal())).map_err(|_| {
                GcsError::BadToken {
                    reason: "cannot travel in a header",
                }
            })?;
        Ok(GcsClient {
            address: address.to_string(),
            inner: Generated::with_interceptor(channel, AddToken(header)),
            patience: Duration::ZERO,
        })
    }

    /// Makes every call but heartbeats keep trying for up to `patience`
    /// while the head cannot be reached (it is restarting), and then fail
    /// with [`GcsError::HeadDown`]. Zero, the default, tries once.
    pub fn with_patience(mut self, patience: Duration) -> GcsClient {
        self.patience = patience;
        self
    }

    /// Makes `call` with `send`, again while the head cannot be reached
    /// and the client's patience lasts.
    async fn patiently<T, F, Fut>(&self, call: &'static str, mut send: F) -> Result<T, GcsError>
    where
        F: FnMut(Inner) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = Backoff::new(RETRY_WAIT, RETRY_WAIT_MAX)
            .until(std::time::Instant::now() + self.patience);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let reply = send(self.inner.clone()).await;
            match self.answer(call, reply) {
                Err(GcsError::Unreachable { reason, .. }) if !self.patience.is_zero() => {
                    let Some(pause) = backoff.next_pause() else {
                        return Err(GcsError::HeadDown {
                            address: self.address.clone(),
                            waited: self.patience,
                            tries,
                            reason,
                        });
                    };
                    if tries == 1 {
                        tracing::warn!(address = %self.address, call, "the head does not answer; trying again until it does");
                    }
                    tokio::time::sleep(pause).await;
                }
                other => return other,
            }
        }
    }

    /// The head's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Joins the cluster as `node`.
    pub async fn register_node(&mut self, node: NodeInfo) -> Result<RegisterNodeReply, GcsError> {
        let request = RegisterNodeRequest { node: Some(node) };
        self.patiently("RegisterNode", |mut c| {
            let request = request.clone();
            async move { c.register_node(request).await }
        })
        .await
    }

    /// Reports the node's free resources and waiting demand. The answer
    /// carries the whole view of live nodes (a node that holds none).
    pub async fn heartbeat(
        &mut self,
        node_id: &str,
        available: Vec<Resource>,
        demands: Vec<Demand>,
    ) -> Result<HeartbeatReply, GcsError> {
        self.heartbeat_since(node_id, available, demands, (0, 0), Exits::default())
            .await
    }

    /// As [`heartbeat`](Self::heartbeat), for a node whose view is at
    /// `(epoch, version)` (of an earlier answer): the answer carries only
    /// what changed since, unless its `full_view` says otherwise. It also
    /// tells `exits`, and its answer the other nodes' exits since.
    pub async fn heartbeat_since(
        &mut self,
        node_id: &str,
        available: Vec<Resource>,
        demands: Vec<Demand>,
        (view_epoch, view_version): (u64, u64),
        exits: Exits,
    ) -> Result<HeartbeatReply, GcsError> {
        let reply = self
            .inner
            .heartbeat(HeartbeatRequest {
                node_id: node_id.to_string(),
                available,
                demands,
                view_epoch,
                view_version,
                exited: exits.exited,
                exits_from: exits.from,
            })
            .await;
        self.answer("Heartbeat", reply)
    }

    /// Leaves the cluster on purpose.
    pub async fn unregister_node(&mut self, node_id: &str, reason: &str) -> Result<(), GcsError> {
        let request = UnregisterNodeRequest {
            node_id: node_id.to_string(),
            reason: reason.to_string(),
        };
        self.patiently("UnregisterNode", |mut c| {
            let request = request.clone();
            async move { c.unregister_node(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Every node the cluster has had, in the order they joined.
    pub async fn get_nodes(&mut self) -> Result<Vec<NodeInfo>, GcsError> {
        self.patiently("GetNodes", |mut c| async move {
            c.get_nodes(GetNodesRequest {}).await
        })
        .await
        .map(|r| r.nodes)
    }

    /// The cluster's id and timing settings.
    pub async fn cluster_info(&mut self) -> Result<GetClusterInfoReply, GcsError> {
        self.patiently("GetClusterInfo", |mut c| async move {
            c.get_cluster_info(GetClusterInfoRequest {}).await
        })
        .await
    }

    /// Stores `value` under `key` in the cluster's key-value table unless
    /// the key exists and `overwrite` is false; true if the key was new.
    pub async fn kv_put(
        &mut self,
        key: String,
        value: Vec<u8>,
        overwrite: bool,
    ) -> Result<bool, GcsError> {
        let request = KvPutRequest {
            key,
            value,
            overwrite,
        };
        self.patiently("KvPut", |mut c| {
            let request = request.clone();
            async move { c.kv_put(request).await }
        })
        .await
        .map(|r| r.added)
    }

    /// The value of `key` in the cluster's key-value table.
    pub async fn kv_get(&mut self, key: String) -> Result<Option<Vec<u8>>, GcsError> {
        self.patiently("KvGet", |mut c| {
            let key = key.clone();
            async move { c.kv_get(KvGetRequest { key }).await }
        })
        .await
        .map(|r| r.found.then_some(r.value))
    }

    /// Deletes `key`; true if it existed.
    pub async fn kv_delete(&mut self, key: String) -> Result<bool, GcsError> {
        self.patiently("KvDelete", |mut c| {
            let key = key.clone();
            async move { c.kv_delete(KvDeleteRequest { key }).await }
        })
        .await
        .map(|r| r.deleted)
    }

    /// The keys starting with `prefix`, sorted.
    pub async fn kv_keys(&mut self, prefix: String) -> Result<Vec<String>, GcsError> {
        self.patiently("KvKeys", |mut c| {
            let prefix = prefix.clone();
            async move { c.kv_keys(KvKeysRequest { prefix }).await }
        })
        .await
        .map(|r| r.keys)
    }

    /// Registers actor `actor_id` on node `node_id` as the holder of
    /// `name` in `namespace` (taking it over from `replace` if given): the
    /// reply says whether it was, or who holds it.
    pub async fn register_actor_name(
        &mut self,
        namespace: &str,
        name: &str,
        actor_id: &str,
        node_id: &str,
        replace: Option<&str>,
    ) -> Result<RegisterActorNameReply, GcsError> {
        let request = RegisterActorNameRequest {
            namespace: namespace.to_string(),
            name: name.to_string(),
            actor_id: actor_id.to_string(),
            node_id: node_id.to_string(),
            replace_actor_id: replace.unwrap_or_default().to_string(),
        };
        self.patiently("RegisterActorName", |mut c| {
            let request = request.clone();
            async move { c.register_actor_name(request).await }
        })
        .await
    }

    /// Who holds `name` in `namespace`: a live node's actor, the last
    /// holder whose node died (when and why), or nobody.
    pub async fn lookup_actor_name(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<NameHolder, GcsError> {
        let request = LookupActorNameRequest {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.patiently("LookupActorName", |mut c| {
            let request = request.clone();
            async move { c.lookup_actor_name(request).await }
        })
        .await
        .map(|r| match r {
            r if r.found => NameHolder::Alive {
                actor_id: r.actor_id,
                node_id: r.node_id,
            },
            r if r.node_died => NameHolder::NodeDied {
                actor_id: r.actor_id,
                node_id: r.node_id,
                died_at_ms: r.node_died_at_unix_ms,
                cause: r.node_death_cause,
            },
            _ => NameHolder::Free,
        })
    }

    fn answer<T>(
        &self,
        call: &'static str,
        reply: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, GcsError> {
        reply.map(tonic::Response::into_inner).map_err(|status| {
            let address = self.address.clone();
            match status.code() {
                tonic::Code::Unauthenticated => GcsError::Unauthenticated {
                    address,
                    message: status.message().to_string(),
                },
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => GcsError::Unreachable {
                    address,
                    reason: format!("{call}: {}", status.message()),
                },
                // The head never answers these itself: the connection
                // broke off under the call, as when one side speaks TLS and
                // the other does not, or the head refused this node's
                // certificate.
                tonic::Code::Cancelled | tonic::Code::Internal | tonic::Code::Unknown => {
                    GcsError::BrokeOff {
                        address,
                        call,
                        message: status.message().to_string(),
                        hint: if prism_protocol::tls::current().is_some() {
                            "this node speaks TLS: does the head, and was this node's \
                             certificate signed by the CA the head was given (--tls-ca)?"
                        } else {
                            "if the cluster speaks TLS, give this node its certificate, key \
                             and the cluster's CA with --tls-cert, --tls-key and --tls-ca \
                             (or PRISM_TLS_CERT, PRISM_TLS_KEY and PRISM_TLS_CA)"
                        },
                    }
                }
                code => GcsError::Call {
                    address,
                    call,
                    code,
                    message: status.message().to_string(),
                },
            }
        })
    }
}

/// What a heartbeat tells of exited processes: those of its node that
/// exited since the last heartbeat, and where it goes on in the log of
/// the other nodes' exits (the last answer's `exits_next`; 0 for none).
///
/// ```
/// let exits = prism_gcs::Exits {
///     exited: vec!["10.0.0.2:41000".into()],
///     from: 0,
/// };
/// assert_eq!(exits.exited.len(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exits {
    /// Addresses of this node's processes that exited.
    pub exited: Vec<String>,
    /// Where to go on in the log of exits.
    pub from: u64,
}

/// What the head's directory of names says of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameHolder {
    /// No actor holds it, and none held it on a node that died.
    Free,
    /// An actor on a live node holds it.
    Alive {
        /// The actor.
        actor_id: String,
        /// Its node.
        node_id: String,
    },
    /// Its last holder was on a node that died.
    NodeDied {
        /// The actor.
        actor_id: String,
        /// The node.
        node_id: String,
        /// When the node was marked dead (milliseconds since the Unix
        /// epoch).
        died_at_ms: u64,
        /// Why.
        cause: String,
    },
}

/// An error with its causes, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
