//! The control store's gRPC service.

use crate::auth::{self, Token};
use crate::durable::{Durable, StateStore};
use crate::pb::gcs_server::{Gcs, GcsServer as Service};
use crate::pb::*;
use crate::table::{Beat, NodeTable};
use crate::validate;
use crate::GcsError;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// How the control store runs.
#[derive(Debug, Clone)]
pub struct GcsSettings {
    /// The token every call must carry.
    pub token: Token,
    /// How often nodes send heartbeats.
    pub heartbeat_period: Duration,
    /// A node silent this long is marked dead.
    pub node_death_timeout: Duration,
    /// Where the durable state is kept (see the crate docs); `None` keeps
    /// it in memory only, to end with the process.
    pub state: Option<StateStore>,
}

impl GcsSettings {
    /// Settings with `token`, a heartbeat every `heartbeat_period`, and
    /// death after `node_death_timeout` of silence (their defaults are the
    /// table's `heartbeat_period_ms` and `node_death_timeout_ms`), kept in
    /// memory only until `state` is set.
    pub fn new(token: Token, heartbeat_period: Duration, node_death_timeout: Duration) -> Self {
        GcsSettings {
            token,
            heartbeat_period,
            node_death_timeout,
            state: None,
        }
    }

    /// The token saved in the state `store`, if there is one: a head
    /// started again on its state resumes its cluster with that token.
    pub fn saved_token(store: &StateStore) -> Result<Option<Token>, GcsError> {
        match Durable::saved_token_in(store)? {
            Some(t) => Token::parse(&t).map(Some).map_err(|_| GcsError::State {
                place: store.to_string(),
                message: "the token saved there is not a cluster token (remove it to start a \
                          new cluster)"
                    .into(),
            }),
            None => Ok(None),
        }
    }
}

/// The service's state.
#[derive(Debug)]
struct State {
    cluster_id: String,
    settings: GcsSettings,
    nodes: Mutex<NodeTable>,
    /// Processes that exited, passed on with heartbeats' answers.
    exits: Mutex<crate::exits::ExitLog>,
    kv: Mutex<crate::KvTable>,
    /// Actor names: (namespace, name) to (actor id, node id).
    names: Mutex<std::collections::HashMap<(String, String), (String, String)>>,
    /// What outlives the process; written before a change is answered,
    /// under the lock of the table it changes.
    durable: Durable,
}

/// A change that could not be saved: the call fails and nothing changed.
fn unsaved(e: GcsError) -> Status {
    tracing::error!(error = %e, "a change could not be saved; the call fails");
    Status::aborted(e.to_string())
}

/// How long [`GcsServer::shutdown`] lets open connections finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A running control store. Stop it with [`GcsServer::shutdown`].
#[derive(Debug)]
pub struct GcsServer {
    state: Arc<State>,
    address: SocketAddr,
    cluster_id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    watcher: tokio::task::JoinHandle<()>,
}

impl GcsServer {
    /// Listens on `address` (port 0 picks a free one) and serves until
    /// shut down, in TLS when this process has it (see
    /// [`prism_protocol::tls`]). A port in use is [`GcsError::PortInUse`].
    pub async fn start(address: SocketAddr, settings: GcsSettings) -> Result<GcsServer, GcsError> {
        let listener =
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| match source.kind() {
                    std::io::ErrorKind::AddrInUse => GcsError::PortInUse { address },
                    _ => GcsError::Io {
                        action: format!("listen on {address}"),
                        source,
                    },
                })?;
        let bound = listener.local_addr().map_err(|source| GcsError::Io {
            action: "read the listening address".into(),
            source,
        })?;
        let (durable, restored) = match &settings.state {
            Some(store) => Durable::open_store(store)?,
            None => (Durable::none(), Default::default()),
        };
        if let (Some(saved), Some(place)) = (&restored.token, durable.place()) {
            if saved != settings.token.reveal() {
                return Err(GcsError::TokenMismatch {
                    place: place.to_string(),
                    cluster_id: restored.cluster_id.clone().unwrap_or_default(),
                });
            }
        }
        let resumed = restored.cluster_id.is_some();
        let cluster_id = restored
            .cluster_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        durable.save_identity(&cluster_id, settings.token.reveal())?;
        let now = Instant::now();
        let mut nodes = NodeTable::default();
        let members = restored.nodes.len();
        for info in restored.nodes {
            nodes.restore(info, now);
        }
        let mut kv = crate::KvTable::default();
        let keys = restored.kv.len();
        for (key, value) in restored.kv {
            kv.put(key, value.into(), true);
        }
        let names: std::collections::HashMap<_, _> = restored.names.into_iter().collect();
        if let (true, Some(place)) = (resumed, durable.place()) {
            tracing::info!(
                cluster = %cluster_id,
                state = %place,
                members,
                keys,
                names = names.len(),
                "resumed the cluster from its saved state; members that do not send a heartbeat \
                 within the death timeout are marked dead"
            );
        }
        let state = Arc::new(State {
            cluster_id: cluster_id.clone(),
            settings: settings.clone(),
            nodes: Mutex::new(nodes),
            exits: Mutex::default(),
            kv: Mutex::new(kv),
            names: Mutex::new(names),
            durable,
        });
        let watcher = tokio::spawn(watch_heartbeats(Arc::downgrade(&state)));
        let service =
            Service::with_interceptor(Handler(state.clone()), auth::check(settings.token));
        let limits = prism_protocol::guard::ConnectionLimits::from_env_or_default();
        let incoming = crate::incoming::Incoming::new(prism_protocol::guard::GuardedListener::new(
            listener,
            limits,
            "the control store",
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = prism_protocol::tls::current() {
            let pem = crate::pem::Pem::read(tls.files())?;
            let config = tonic::transport::ServerTlsConfig::new()
                .identity(tonic::transport::Identity::from_pem(pem.cert, pem.key))
                .client_ca_root(tonic::transport::Certificate::from_pem(pem.ca));
            builder = builder.tls_config(config).map_err(|e| GcsError::Tls {
                message: format!(
                    "the certificate {} and key {} cannot serve TLS: {e} (give the node's \
                     PEM certificate and its own private key)",
                    tls.files().cert.display(),
                    tls.files().key.display()
                ),
            })?;
        }
        let served = tokio::spawn(async move {
            let result = builder
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "the control store stopped serving");
            }
        });
        tracing::info!(address = %bound, cluster = %cluster_id, "control store started");
        Ok(GcsServer {
            state: state.clone(),
            address: bound,
            cluster_id,
            stop: Some(stop),
            served,
            watcher,
        })
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The cluster's id, made at start.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// A read-only view of the tables, for the head's own dashboard: it
    /// reads them in the process, with no call.
    pub fn view(&self) -> GcsView {
        GcsView(self.state.clone())
    }

    /// Stops serving and waits until the server has stopped: calls in
    /// progress are answered, for up to [`SHUTDOWN_GRACE`]; connections
    /// still open then are dropped (a peer whose machine left the network
    /// never closes its own).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.watcher.abort();
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.served)
            .await
            .is_err()
        {
            tracing::warn!(
                grace_s = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period are dropped"
            );
            self.served.abort();
            let _ = (&mut self.served).await;
        }
    }
}

/// What the control store knows now, read in its own process (see
/// [`GcsServer::view`]).
#[derive(Debug, Clone)]
pub struct GcsView(Arc<State>);

/// A named actor, as the head's directory of names holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NamedActor {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The actor's id.
    pub actor_id: String,
    /// The node that holds it.
    pub node_id: String,
}

impl GcsView {
    /// The cluster's id.
    pub fn cluster_id(&self) -> &str {
        &self.0.cluster_id
    }

    /// Every node, alive or dead, as `GetNodes` answers.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.0.nodes.lock().snapshot(Instant::now())
    }

    /// The named actors, by namespace and name.
    pub fn named_actors(&self) -> Vec<NamedActor> {
        let mut actors: Vec<NamedActor> = self
            .0
            .names
            .lock()
            .iter()
            .map(|((namespace, name), (actor_id, node_id))| NamedActor {
                namespace: namespace.clone(),
                name: name.clone(),
                actor_id: actor_id.clone(),
                node_id: node_id.clone(),
            })
            .collect();
        actors.sort();
        actors
    }

    /// Deletes `keys` from the key-value table (and its durable copy);
    /// returns how many were there. One that cannot be deleted from the
    /// durable state is left in both, and the error said.
    pub fn kv_delete_keys(&self, keys: &[String]) -> Result<usize, GcsError> {
        let mut kv = self.0.kv.lock();
        let mut deleted = 0;
        for key in keys {
            if kv.get(key).is_some() {
                self.0.durable.kv_delete(key)?;
                kv.delete(key);
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// The key-value table's entries whose keys start with `prefix`, in
    /// key order.
    pub fn kv_entries(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let kv = self.0.kv.lock();
        kv.keys(prefix)
            .into_iter()
            .filter_map(|k| kv.get(&k).map(|v| (k, v.to_vec())))
            .collect()
    }
}

/// Marks nodes dead when their heartbeats stop, checking a few times per
/// heartbeat period.
async fn watch_heartbeats(state: std::sync::Weak<State>) {
    let period = match state.upgrade() {
        Some(s) => (s.settings.heartbeat_period / 2).max(Duration::from_millis(10)),
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else { return };
        let dead = {
            let mut nodes = state.nodes.lock();
            let dead = nodes.check_deaths(Instant::now(), state.settings.node_death_timeout);
            let ids: Vec<&str> = dead.iter().map(|(id, _)| id.as_str()).collect();
            if let Err(e) = state.durable.nodes_gone(&ids) {
                // Read back later, such a node is marked dead again.
                tracing::warn!(error = %e, "could not save that nodes died");
            }
            dead
        };
        for (node, cause) in dead {
            tracing::warn!(%node, %cause, "node marked dead");
        }
    }
}

#[derive(Debug, Clone)]
struct Handler(Arc<State>);

#[tonic::async_trait]
impl Gcs for Handler {
    async fn register_node(
        &self,
        request: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeReply>, Status> {
        let node = request
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("RegisterNode without a node"))?;
        validate::node(&node)?;
        let id = node.node_id.clone();
        let ip = node.node_ip.clone();
        {
            let mut nodes = self.0.nodes.lock();
            let replaced = nodes
                .register(node, Instant::now())
                .map_err(Status::already_exists)?;
            let saved = match nodes.get(&id) {
                Some(info) => self.0.durable.node_put(info),
                None => Ok(()),
            };
            if let Err(e) = saved {
                nodes.forget(&id);
                return Err(unsaved(e));
            }
            let replaced: Vec<&str> = replaced.iter().map(String::as_str).collect();
            if let Err(e) = self.0.durable.nodes_gone(&replaced) {
                tracing::warn!(error = %e, "could not save that the old head node is gone");
            }
        }
        tracing::info!(node = %id, %ip, "node joined");
        Ok(Response::new(RegisterNodeReply {
            cluster_id: self.0.cluster_id.clone(),
            heartbeat_period_ms: self.0.settings.heartbeat_period.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let beat = request.into_inner();
        validate::heartbeat(&beat.node_id, &beat.available, &beat.demands)?;
        validate::exited(&beat.exited)?;
        let now = Instant::now();
        let (outcome, view) = {
            let mut table = self.0.nodes.lock();
            let outcome = table.heartbeat(&beat.node_id, beat.available, beat.demands, now);
            let view = (outcome == Beat::Alive)
                .then(|| table.view_update(beat.view_epoch, beat.view_version));
            (outcome, view.unwrap_or_default())
        };
        // Exits go on to the other nodes; a node whose view is of another
        // run of this store hears of none before it has this run's view.
        let (exited, exits_next) = {
            let mut log = self.0.exits.lock();
            if outcome == Beat::Alive {
                log.record(&beat.node_id, beat.exited, now);
            }
            let from = if beat.view_epoch == view.epoch {
                beat.exits_from
            } else {
                0
            };
            (log.since(&beat.node_id, from), log.next())
        };
        let (alive, death_cause) = match outcome {
            Beat::Alive => (true, String::new()),
            Beat::Dead(cause) => (false, cause),
            Beat::Unknown => (false, "this cluster never had the node".to_string()),
        };
        Ok(Response::new(HeartbeatReply {
            alive,
            death_cause,
            nodes: view.nodes,
            full_view: view.full,
            gone: view.gone,
            view_epoch: view.epoch,
            view_version: view.version,
            exited,
            exits_next,
        }))
    }

    async fn unregister_node(
        &self,
        request: Request<UnregisterNodeRequest>,
    ) -> Result<Response<UnregisterNodeReply>, Status> {
        let r = request.into_inner();
        validate::id("node_id", &r.node_id)?;
        validate::text("reason", &r.reason, validate::MAX_TEXT_BYTES)?;
        let reason = if r.reason.is_empty() {
            "stopped".to_string()
        } else {
            r.reason
        };
        let mut nodes = self.0.nodes.lock();
        if nodes.mark_dead(&r.node_id, reason.clone()) {
            if let Err(e) = self.0.durable.nodes_gone(&[r.node_id.as_str()]) {
                tracing::warn!(error = %e, "could not save that a node left");
            }
            tracing::info!(node = %r.node_id, %reason, "node left");
        }
        Ok(Response::new(UnregisterNodeReply {}))
    }

    async fn get_nodes(
        &self,
        _request: Request<GetNodesRequest>,
    ) -> Result<Response<GetNodesReply>, Status> {
        let nodes = self.0.nodes.lock().snapshot(Instant::now());
        Ok(Response::new(GetNodesReply { nodes }))
    }

    async fn get_cluster_info(
        &self,
        _request: Request<GetClusterInfoRequest>,
    ) -> Result<Response<GetClusterInfoReply>, Status> {
        Ok(Response::new(GetClusterInfoReply {
            cluster_id: self.0.cluster_id.clone(),
            heartbeat_period_ms: self.0.settings.heartbeat_period.as_millis() as u64,
            node_death_timeout_ms: self.0.settings.node_death_timeout.as_millis() as u64,
        }))
    }

    async fn kv_put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutReply>, Status> {
        let r = request.into_inner();
        validate::key("key", &r.key)?;
        let mut kv = self.0.kv.lock();
        let added = kv.get(&r.key).is_none();
        if added || r.overwrite {
            self.0.durable.kv_put(&r.key, &r.value).map_err(unsaved)?;
            kv.put(r.key, r.value.into(), true);
        }
        Ok(Response::new(KvPutReply { added }))
    }

    async fn kv_get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetReply>, Status> {
        let key = request.into_inner().key;
        validate::key("key", &key)?;
        let value = self.0.kv.lock().get(&key);
        Ok(Response::new(KvGetReply {
            found: value.is_some(),
            value: value.map(|v| v.to_vec()).unwrap_or_default(),
        }))
    }

    async fn kv_delete(
        &self,
        request: Request<KvDeleteRequest>,
    ) -> Result<Response<KvDeleteReply>, Status> {
        let key = request.into_inner().key;
        validate::key("key", &key)?;
        let mut kv = self.0.kv.lock();
        let deleted = kv.get(&key).is_some();
        if deleted {
            self.0.durable.kv_delete(&key).map_err(unsaved)?;
            kv.delete(&key);
        }
        Ok(Response::new(KvDeleteReply { deleted }))
    }

    async fn kv_keys(
        &self,
        request: Request<KvKeysRequest>,
    ) -> Result<Response<KvKeysReply>, Status> {
        let prefix = request.into_inner().prefix;
        validate::key("prefix", &prefix)?;
        let keys = self.0.kv.lock().keys(&prefix);
        Ok(Response::new(KvKeysReply { keys }))
    }

    async fn register_actor_name(
        &self,
        request: Request<RegisterActorNameRequest>,
    ) -> Result<Response<RegisterActorNameReply>, Status> {
        let r = request.into_inner();
        validate::key("namespace", &r.namespace)?;
        validate::key("name", &r.name)?;
        validate::id("actor_id", &r.actor_id)?;
        validate::id("node_id", &r.node_id)?;
        if !r.replace_actor_id.is_empty() {
            validate::id("replace_actor_id", &r.replace_actor_id)?;
        }
        let key = (r.namespace, r.name);
        let nodes = self.0.nodes.lock();
        let mut names = self.0.names.lock();
        let free = match names.get(&key) {
            None => true,
            Some((actor, node)) => {
                *actor == r.actor_id
                    || (!r.replace_actor_id.is_empty() && *actor == r.replace_actor_id)
                    || !nodes.is_alive(node)
            }
        };
        if free {
            self.0
                .durable
                .name_put(&key.0, &key.1, &r.actor_id, &r.node_id)
                .map_err(unsaved)?;
            names.insert(key, (r.actor_id, r.node_id));
            return Ok(Response::new(RegisterActorNameReply {
                registered: true,
                ..RegisterActorNameReply::default()
            }));
        }
        let (holder_actor_id, holder_node_id) = names.get(&key).cloned().unwrap_or_default();
        Ok(Response::new(RegisterActorNameReply {
            registered: false,
            holder_actor_id,
            holder_node_id,
        }))
    }

    async fn lookup_actor_name(
        &self,
        request: Request<LookupActorNameRequest>,
    ) -> Result<Response<LookupActorNameReply>, Status> {
        let r = request.into_inner();
        validate::key("namespace", &r.namespace)?;
        validate::key("name", &r.name)?;
        let nodes = self.0.nodes.lock();
        let held = self.0.names.lock().get(&(r.namespace, r.name)).cloned();
        Ok(Response::new(match held {
            Some((actor_id, node_id)) if nodes.is_alive(&node_id) => LookupActorNameReply {
                found: true,
                actor_id,
                node_id,
                ..LookupActorNameReply::default()
            },
            Some((actor_id, node_id)) => match nodes.get(&node_id) {
                Some(node) => LookupActorNameReply {
                    found: false,
                    node_died: true,
                    node_death_cause: node.death_cause.clone(),
                    node_died_at_unix_ms: node.died_at_unix_ms,
                    actor_id,
                    node_id,
                },
                // A node long forgotten: nothing to say of it.
                None => LookupActorNameReply::default(),
            },
            None => LookupActorNameReply::default(),
        }))
    }
}
