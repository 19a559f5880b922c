//! This process as a lessee of other nodes' raylets: one registered
//! connection per node, shared by the task submitter (leases spilled to
//! another node) and the owner of actors created on other nodes.

use super::peers::Peers;
use crate::{Error, Result};
use parking_lot::Mutex;
use prism_protocol::ids::JobId;
use prism_protocol::messages::{Address, RegisterDriver};
use prism_protocol::program::Program;
use prism_protocol::rpc::Connection;
use std::collections::HashMap;
use std::sync::Arc;

/// Registrations of this job with other nodes' raylets.
#[derive(Debug)]
pub(crate) struct Lessee {
    peers: Arc<Peers>,
    /// This process's address, as the raylets reach it.
    address: Address,
    job_id: JobId,
    log_to_driver: bool,
    namespace: String,
    /// The job's environment variables for its workers.
    env_vars: std::collections::BTreeMap<String, String>,
    /// Other nodes' raylets, registered once each.
    open: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Connection>>>>,
}

impl Lessee {
    pub(crate) fn new(
        peers: Arc<Peers>,
        address: Address,
        job_id: JobId,
        log_to_driver: bool,
        namespace: String,
        env_vars: std::collections::BTreeMap<String, String>,
    ) -> Self {
        Lessee {
            peers,
            address,
            job_id,
            log_to_driver,
            namespace,
            env_vars,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A registered connection to another node's raylet. Registrations
    /// with different nodes go on at once (one may wait while that node
    /// fetches this program); two callers for one node share one.
    pub(crate) async fn connect(&self, address: &str) -> Result<Connection> {
        let cell = {
            let mut open = self.open.lock();
            let cell = open.entry(address.to_string()).or_default();
            if cell.get().is_some_and(|c| c.is_closed()) {
                *cell = Arc::new(tokio::sync::OnceCell::new());
            }
            cell.clone()
        };
        cell.get_or_try_init(|| self.register_at(address))
            .await
            .cloned()
    }

    /// Connects to the raylet at `address` and registers there as a lessee
    /// of this job.
    async fn register_at(&self, address: &str) -> Result<Connection> {
        let conn = self.peers.get(address).await?;
        // The node runs its copy of this program if it lacks the file; a
        // program that cannot be named leaves the node to find the file at
        // the same path. (Named once, off the runtime's threads: a binary
        // without a build id is hashed whole.)
        let program = tokio::task::spawn_blocking(|| Program::this().ok().cloned())
            .await
            .ok()
            .flatten();
        conn.request(RegisterDriver {
            address: self.address.clone(),
            pid: std::process::id(),
            executable: std::env::current_exe()
                .map_err(|e| Error::io("find this program's executable", e))?,
            cwd: std::env::current_dir().map_err(|e| Error::io("read the working directory", e))?,
            log_to_driver: self.log_to_driver,
            namespace: self.namespace.clone(),
            job_id: Some(self.job_id),
            program,
            env_vars: self.env_vars.clone(),
            submission_id: None,
        })
        .await?;
        Ok(conn)
    }
}
