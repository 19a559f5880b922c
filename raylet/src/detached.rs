//! Detached actors in a cluster: created again by the head when their node
//! dies, as Ray's GCS restarts them.
//!
//! A detached actor outlives its driver, so no owner is left to create it
//! again on another node (an owner does that for the actors it made). The
//! node running one that may restart records it in the head's key-value
//! table ([`DetachedRecord`] under [`DETACHED_RECORD_PREFIX`]): its spec
//! with the restarts counted, the job's program (its path there and its
//! identity), namespace and environment. The record is rewritten at each
//! restart on that node and removed when the actor is dead for good; the
//! node's writes go in order through one queue. A node that stops leaves
//! its records as they are. One in a placement-group bundle is left to its
//! owner, which creates it again in its bundle.
//!
//! When a node dies (and when the head starts), the head's raylet reads the
//! records naming nodes that are dead, and creates each actor that has
//! restarts left again, counting one: on the
//! head when it has room now, else on the live node with the most CPUs free
//! that has room (as a spillback chooses). It registers there as a lessee
//! of the actor's job, as a driver would, and serves the job's program to a
//! node that has neither the file at its path nor a copy, from the head's
//! own copy (`ReadProgram`); a head without one says so, and the node's
//! error names the program. The new node records the actor in turn, and
//! claims its name in the head's directory. Callers find it again as after
//! any restart on another node.

pub(crate) mod state;

use crate::membership::Membership;
use crate::placement::HeadRecords;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, NodeId};
use prism_protocol::messages::{
    ActorPlacement, ActorSpec, CreateActor, DetachedRecord, DriverRequest, ReadProgram,
    RegisterDriver, Request, Response, DETACHED_RECORD_PREFIX, PROGRAM_CHUNK,
};
use prism_protocol::program::Program;
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Handler};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How often, and how many times, the head tries again to create an actor
/// no live node has room for yet.
const PLACE_RETRY: Duration = Duration::from_secs(2);
const PLACE_TRIES: u32 = 30;

fn key(actor: ActorId) -> String {
    format!("{DETACHED_RECORD_PREFIX}{actor}")
}

/// A job's program file on this node, its namespace and its workers'
/// environment: what a detached actor's record keeps of its job.
pub(crate) type JobSetup = (PathBuf, String, BTreeMap<String, String>);

/// What creating detached actors again needs of this node: its resources
/// free now and in all (to choose where an actor goes).
pub(crate) trait LocalResources: Send + Sync + 'static {
    fn free_and_total(&self) -> (ResourceSet, ResourceSet);
}

/// The detached actors' records this node writes, and at the head the
/// creating again of those whose node died.
#[derive(Debug)]
pub(crate) struct Detached {
    node_id: NodeId,
    membership: Arc<OnceLock<Membership>>,
    records: Arc<HeadRecords>,
    /// The node's session folder, where its copies of programs are.
    session_dir: PathBuf,
    state: state::DetachedActors,
}

impl Detached {
    pub(crate) fn new(
        node_id: NodeId,
        membership: Arc<OnceLock<Membership>>,
        records: Arc<HeadRecords>,
        session_dir: PathBuf,
    ) -> Detached {
        Detached {
            node_id,
            membership,
            records,
            session_dir,
            state: state::DetachedActors::default(),
        }
    }

    /// The node stops: its records stay as they are in the head's table,
    /// for the head to create those actors again elsewhere.
    pub(crate) fn forget_all(&self) {
        self.state.records.lock().clear();
    }

    /// Records a detached actor this node took. The record is written at
    /// once; the program's identity (named off the runtime's threads) is
    /// added when known. Every write of this node's records goes through
    /// one ordered queue, each made under the records' lock, so a later
    /// state never lands before an earlier one. Nothing outside a cluster,
    /// nor for an actor that may not restart, nor for one in a
    /// placement-group bundle (its owner creates it again in its bundle).
    pub(crate) fn record(
        self: &Arc<Self>,
        spec: &ActorSpec,
        setup: impl FnOnce() -> Option<JobSetup>,
    ) {
        if self.membership.get().is_none()
            || spec.options.max_restarts == 0
            || spec.options.placement.is_some()
        {
            return;
        }
        let Some((executable, namespace, env_vars)) = setup() else {
            return;
        };
        let actor = spec.actor_id;
        let record = DetachedRecord {
            spec: spec.clone(),
            node: self.node_id.to_string(),
            executable: executable.clone(),
            program: None,
            namespace,
            env_vars,
        };
        {
            let mut records = self.state.records.lock();
            self.write_record(&record);
            records.insert(actor, record);
        }
        let node = self.clone();
        tokio::spawn(async move {
            let program = tokio::task::spawn_blocking(move || Program::of(&executable).ok())
                .await
                .ok()
                .flatten();
            let mut records = node.state.records.lock();
            if let Some(record) = records.get_mut(&actor) {
                record.program = program;
                node.write_record(record);
            }
        });
    }

    /// Queues `record` for the head's table (call under the records' lock).
    fn write_record(&self, record: &DetachedRecord) {
        let Some(writer) = self.records.get() else {
            return;
        };
        match serde_json::to_vec(record) {
            Ok(value) => writer.put_key(key(record.spec.actor_id), value),
            Err(e) => {
                tracing::warn!(actor = %record.spec.actor_id, error = %e, "a detached actor's record could not be encoded")
            }
        }
    }

    /// A detached actor recorded here restarted on this node: its record
    /// counts the restart.
    pub(crate) fn restarted(&self, actor: ActorId, restarts: u32) {
        let mut records = self.state.records.lock();
        if let Some(record) = records.get_mut(&actor) {
            record.spec.restarts = restarts;
            self.write_record(record);
        }
    }

    /// An actor is dead for good here: its record (if detached) goes.
    pub(crate) fn ended(&self, actor: ActorId) {
        let mut records = self.state.records.lock();
        if records.remove(&actor).is_some() {
            if let Some(writer) = self.records.get() {
                writer.delete_key(key(actor));
            }
        }
    }

    /// At the head: creates again, elsewhere, the detached actors recorded
    /// on nodes that are dead and that have restarts left (see the
    /// module's docs). Run when a node dies, and once when the head starts
    /// (a head started again finds those its earlier self ran, and those
    /// of nodes that died while it was down). An actor being created again
    /// is not started twice.
    pub(crate) fn restart_orphans(self: &Arc<Self>, local: Arc<dyn LocalResources>) {
        let Some(m) = self.membership.get() else {
            return;
        };
        if !m.is_head() {
            return;
        }
        let node = self.clone();
        let mut gcs = m.gcs();
        tokio::spawn(async move {
            let Some(m) = node.membership.get() else {
                return;
            };
            // A head that just started has no view of the live nodes until
            // its first heartbeat's answer.
            let view_by = std::time::Instant::now() + Duration::from_secs(10);
            while m.cluster_resources().is_none() && std::time::Instant::now() < view_by {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let keys = match gcs.kv_keys(DETACHED_RECORD_PREFIX.to_string()).await {
                Ok(keys) => keys,
                Err(e) => {
                    tracing::warn!(error = %e, "the detached actors' records could not be read");
                    return;
                }
            };
            if keys.is_empty() {
                return;
            }
            let nodes = match m.nodes().await {
                Ok(nodes) => nodes,
                Err(e) => {
                    tracing::warn!(error = %e, "the cluster's nodes could not be read");
                    return;
                }
            };
            for listed in keys {
                let Ok(Some(raw)) = gcs.kv_get(listed.clone()).await else {
                    continue;
                };
                let record: DetachedRecord = match serde_json::from_slice(&raw) {
                    Ok(record) => record,
                    Err(e) => {
                        tracing::warn!(key = %listed, error = %e, "a detached actor's record could not be read; skipped");
                        continue;
                    }
                };
                // Alive in the head's table (the head keeps its members
                // across restarts; a node it no longer lists is dead).
                if nodes.iter().any(|n| n.node_id == record.node && n.alive) {
                    continue;
                }
                // Placed in a bundle: its owner creates it again there.
                if record.spec.options.placement.is_some() {
                    continue;
                }
                let actor = record.spec.actor_id;
                if !node.state.restarting.lock().insert(actor) {
                    continue;
                }
                let node = node.clone();
                let local = local.clone();
                let mut gcs = gcs.clone();
                tokio::spawn(async move {
                    // Read again now that this look has it: another look may
                    // have created it again meanwhile.
                    let fresh = gcs
                        .kv_get(key(actor))
                        .await
                        .ok()
                        .flatten()
                        .and_then(|raw| serde_json::from_slice::<DetachedRecord>(&raw).ok());
                    if let Some(record) = fresh.filter(|r| r.node == record.node) {
                        node.clone().restart_one(&*local, record).await;
                    }
                    node.state.restarting.lock().remove(&actor);
                });
            }
        });
    }

    /// Creates one detached actor again (or, without restarts left, drops
    /// its record: it died with its node).
    async fn restart_one(self: Arc<Self>, local: &dyn LocalResources, mut record: DetachedRecord) {
        let Some(m) = self.membership.get() else {
            return;
        };
        let actor = record.spec.actor_id;
        let max = record.spec.options.max_restarts;
        if max >= 0 && i64::from(record.spec.restarts) >= max {
            tracing::warn!(%actor, node = %record.node, restarts = record.spec.restarts, "a detached actor died with its node and has no restarts left");
            let _ = m.gcs().kv_delete(key(actor)).await;
            return;
        }
        record.spec.restarts += 1;
        let shape = record.spec.options.resources.clone();
        let here = self.node_id.to_string();
        for _ in 0..PLACE_TRIES {
            let (free, total) = local.free_and_total();
            let target = if free.contains(&shape) {
                m.raylet_of(&here).map(|raylet| (raylet, here.clone()))
            } else {
                m.spill_target(&shape, false, &total).ok().flatten()
            };
            let Some((raylet, target)) = target else {
                tokio::time::sleep(PLACE_RETRY).await;
                continue;
            };
            // Recorded on its new node before it is created there, so that
            // neither a later look nor a late write makes it a second time
            // (and that node's own record, or its end, comes after this).
            let from = std::mem::replace(&mut record.node, target.clone());
            put(m.gcs(), &record).await;
            match self.create_on(&raylet, &record).await {
                Ok(conn) => {
                    tracing::warn!(%actor, class = %record.spec.class, %from, to = %target, restart = record.spec.restarts, "a detached actor's node died; the head created it again");
                    // Kept open while the actor lives there: the node tells
                    // this connection when it ends for good.
                    self.state.lessees.lock().insert(actor, conn);
                    return;
                }
                Err(e) => {
                    tracing::warn!(%actor, node = %target, error = %e, "a detached actor could not be created again there; trying again");
                    // Back on the dead node, where a later look finds it.
                    record.node = from;
                    put(m.gcs(), &record).await;
                    tokio::time::sleep(PLACE_RETRY).await;
                }
            }
        }
        tracing::error!(%actor, class = %record.spec.class, "a detached actor whose node died could not be created again on any node");
    }

    /// Registers at the raylet at `raylet` as a lessee of the actor's job
    /// and creates the actor there.
    async fn create_on(
        self: &Arc<Self>,
        raylet: &str,
        record: &DetachedRecord,
    ) -> Result<Connection, Error> {
        let source = Arc::new(ProgramSource {
            detached: self.clone(),
            program: record.program.clone(),
            path: record.executable.clone(),
            found: Arc::default(),
        });
        let here = self.node_id.to_string();
        let conn = Connection::connect_to(raylet, Some(&here), source).await?;
        conn.request(RegisterDriver {
            address: record.spec.owner.clone(),
            pid: std::process::id(),
            executable: record.executable.clone(),
            cwd: self.session_dir.clone(),
            log_to_driver: false,
            namespace: record.namespace.clone(),
            job_id: Some(record.spec.job),
            program: record.program.clone(),
            env_vars: record.env_vars.clone(),
            submission_id: None,
        })
        .await?;
        match conn
            .request(CreateActor {
                spec: record.spec.clone(),
            })
            .await?
        {
            ActorPlacement::Accepted => Ok(conn),
            ActorPlacement::Elsewhere { .. } => Err(Error::SentOnAgain {
                node_id: prism_protocol::rpc::Endpoint::parse(raylet)
                    .node
                    .unwrap_or_else(|| raylet.to_string()),
                what: "a detached actor".into(),
            }),
        }
    }
}

/// Records (or replaces) a detached actor's record in the head's table.
async fn put(mut gcs: prism_gcs::GcsClient, record: &DetachedRecord) {
    let value = match serde_json::to_vec(record) {
        Ok(value) => value,
        Err(e) => {
            tracing::warn!(actor = %record.spec.actor_id, error = %e, "a detached actor's record could not be encoded");
            return;
        }
    };
    if let Err(e) = gcs.kv_put(key(record.spec.actor_id), value, true).await {
        tracing::warn!(actor = %record.spec.actor_id, error = %e, "a detached actor's record was not written to the head");
    }
}

/// The head's side of a connection to a node it created a detached actor
/// on: serves the job's program from a file the head holds, and forgets
/// the connection when the actor ends there.
#[derive(Clone)]
struct ProgramSource {
    detached: Arc<Detached>,
    program: Option<Program>,
    path: PathBuf,
    /// The file found to hold the program, looked for once.
    found: Arc<std::sync::OnceLock<Option<PathBuf>>>,
}

impl ProgramSource {
    /// A file on the head's machine holding the program: its path there,
    /// or the head's own copy of it.
    fn file(&self, program: &Program) -> Option<PathBuf> {
        self.found.get_or_init(|| self.find(program)).clone()
    }

    fn find(&self, program: &Program) -> Option<PathBuf> {
        let name = self.path.file_name()?;
        let copy = self
            .detached
            .session_dir
            .join("programs")
            .join(program.folder_name())
            .join(name);
        [self.path.clone(), copy]
            .into_iter()
            .find(|f| Program::of(f).is_ok_and(|p| p.same_image(program)))
    }

    fn read(&self, read: &ReadProgram) -> Result<bytes::Bytes, Error> {
        use std::io::{Read, Seek, SeekFrom};
        let refuse = |reason: String| Error::ProgramUnavailable {
            holder: "the head".into(),
            reason,
        };
        let program = match &self.program {
            Some(p) if p.id == read.id => p,
            _ => return Err(refuse(format!("it does not serve program {}", read.id))),
        };
        if read.len > PROGRAM_CHUNK || read.offset > program.image_len() {
            return Err(refuse(format!(
                "a program read of {} bytes at {} is out of bounds (its image has {} bytes)",
                read.len,
                read.offset,
                program.image_len()
            )));
        }
        let file = self.file(program).ok_or_else(|| {
            refuse(format!(
                "it has no copy of the job's program {} ({}): install it at that path on \
                 every node, so that a detached actor can be created again anywhere",
                program.id,
                self.path.display()
            ))
        })?;
        let len = read.len.min(program.image_len() - read.offset) as usize;
        let mut chunk = vec![0u8; len];
        let mut f = std::fs::File::open(&file)
            .map_err(|e| Error::io(format!("open {}", file.display()), e))?;
        f.seek(SeekFrom::Start(read.offset))
            .and_then(|_| f.read_exact(&mut chunk))
            .map_err(|e| Error::io(format!("read {}", file.display()), e))?;
        Ok(chunk.into())
    }
}

impl Handler for ProgramSource {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        match request {
            Request::Driver(DriverRequest::ReadProgram(read)) => {
                let this = self.clone();
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || {
                    conn.respond(id, Response::from_result(this.read(&read)))
                });
            }
            Request::Driver(DriverRequest::ActorEnded(ended)) => {
                self.detached.state.lessees.lock().remove(&ended.actor_id);
            }
            _ if id.is_some() => conn.respond(
                id,
                Response::Error(Error::NotServed {
                    service: "the head's connection for a detached actor".into(),
                    request: "anything but program reads".into(),
                }),
            ),
            _ => {}
        }
    }
}
