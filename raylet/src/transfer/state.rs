//! The node's transfers ([`Transfers`]): what they are built with, and
//! their state: pulls under way and who waits for them, idle bulk streams,
//! and the copies other nodes pulled. What they do is in
//! `crate::transfer`.

use crate::membership::Membership;
use crate::reply::ReplyTo;
use crate::store::StoreSide;
use parking_lot::Mutex;
use prism_protocol::ids::{NodeId, ObjectId};
use prism_protocol::tls::Stream;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The node's transfers: pulls under way, open streams, copies handed out.
#[derive(Debug)]
pub(crate) struct Transfers {
    /// This node.
    pub(super) node_id: NodeId,
    /// The node's store, which pulls write into and bulk streams read.
    pub(super) store: Arc<StoreSide>,
    /// The cluster, once the node joined one: where holders are found.
    pub(super) membership: Arc<OnceLock<Membership>>,
    /// Pulls under way, with who waits for each.
    pub(super) pulls: Mutex<HashMap<ObjectId, Vec<ReplyTo>>>,
    /// Idle bulk streams, per holder's TCP address.
    pub(super) idle: Mutex<HashMap<String, Vec<Stream>>>,
    /// The nodes that pulled a copy of an object held here.
    pub(super) copies: Mutex<HashMap<ObjectId, HashSet<String>>>,
    /// Bytes pulled into this store, and served to other nodes.
    pub(super) pulled_bytes: AtomicU64,
    pub(super) served_bytes: AtomicU64,
}

impl Transfers {
    /// The transfers of node `node_id`, whose store is `store`, in the
    /// cluster `membership` holds once the node joins one.
    pub(crate) fn new(
        node_id: NodeId,
        store: Arc<StoreSide>,
        membership: Arc<OnceLock<Membership>>,
    ) -> Self {
        Transfers {
            node_id,
            store,
            membership,
            pulls: Mutex::default(),
            idle: Mutex::default(),
            copies: Mutex::default(),
            pulled_bytes: AtomicU64::default(),
            served_bytes: AtomicU64::default(),
        }
    }

    /// The nodes that pulled copies of `ids`, forgetting them: each with
    /// the ids it holds.
    pub(crate) fn take_copies(&self, ids: &[ObjectId]) -> HashMap<String, Vec<ObjectId>> {
        let mut copies = self.copies.lock();
        let mut by_node: HashMap<String, Vec<ObjectId>> = HashMap::new();
        for id in ids {
            for node in copies.remove(id).into_iter().flatten() {
                by_node.entry(node).or_default().push(*id);
            }
        }
        by_node
    }

    /// Bytes this node pulled from others and served to others.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (
            self.pulled_bytes.load(Ordering::Relaxed),
            self.served_bytes.load(Ordering::Relaxed),
        )
    }
}
