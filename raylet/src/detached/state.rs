//! The state of the detached actors' records ([`DetachedActors`]): what
//! this node recorded for the actors it runs, and, at the head, the
//! connections it holds to the nodes it created actors on again. The
//! behaviour is in `crate::detached`.

use parking_lot::Mutex;
use prism_protocol::ids::ActorId;
use prism_protocol::messages::DetachedRecord;
use prism_protocol::rpc::Connection;
use std::collections::HashMap;

/// Detached actors' records and the head's lessee connections.
#[derive(Debug, Default)]
pub(crate) struct DetachedActors {
    /// The records this node wrote for the detached actors it runs.
    pub(crate) records: Mutex<HashMap<ActorId, DetachedRecord>>,
    /// At the head: its connection to the node each actor it created
    /// again runs on, until the actor ends there.
    pub(crate) lessees: Mutex<HashMap<ActorId, Connection>>,
    /// At the head: the actors being created again now.
    pub(crate) restarting: Mutex<std::collections::HashSet<ActorId>>,
}
