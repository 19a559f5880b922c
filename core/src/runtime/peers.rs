//! Connections to other core workers (owners, leased workers, actors),
//! made once per address and reused while open.

use crate::Result;
use parking_lot::Mutex;
use prism_protocol::messages::Address;
use prism_protocol::rpc::{Connection, Endpoint, Handler};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Makes the handler that serves what a peer sends back on a connection
/// this process opened.
pub(crate) type MakeHandler = Box<dyn Fn() -> Arc<dyn Handler> + Send + Sync>;

/// The pool of peer connections.
pub(crate) struct Peers {
    /// This process's node: peers on it are reached by their socket, others
    /// over TCP.
    node: String,
    open: Mutex<HashMap<Address, Connection>>,
    /// Nodes the cluster's head declared dead.
    dead_nodes: Mutex<HashSet<String>>,
    make_handler: MakeHandler,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("open", &self.open.lock().len())
            .finish()
    }
}

impl Peers {
    pub(crate) fn new(node: String, make_handler: MakeHandler) -> Self {
        Peers {
            node,
            open: Mutex::new(HashMap::new()),
            dead_nodes: Mutex::new(HashSet::new()),
            make_handler,
        }
    }

    /// Gives up every connection to a process of `node` (it died).
    pub(crate) fn abandon_node(&self, node: &str) -> usize {
        self.dead_nodes.lock().insert(node.to_string());
        let mut open = self.open.lock();
        let gone: Vec<Address> = open
            .keys()
            .filter(|a| Endpoint::parse(a).node.as_deref() == Some(node))
            .cloned()
            .collect();
        for address in &gone {
            if let Some(conn) = open.remove(address) {
                conn.abandon();
            }
        }
        gone.len()
    }

    /// Whether the cluster's head declared `node` dead.
    pub(crate) fn is_dead(&self, node: &str) -> bool {
        self.dead_nodes.lock().contains(node)
    }

    /// The connection to the core worker at `address`.
    pub(crate) async fn get(&self, address: &str) -> Result<Connection> {
        if let Some(c) = self.open.lock().get(address) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = Connection::connect_to(address, Some(&self.node), (self.make_handler)()).await?;
        self.open.lock().insert(address.to_string(), conn.clone());
        Ok(conn)
    }
}
