//! The node's transfers ([`Transfers`]): what they are built with, and
//! their state: pulls under way and who waits for them, idle bulk streams,
//! and the copies other nodes pulled. What they do is in
//! `crate::transfer`.

use super::pulls::PullBook;
use crate::membership::Membership;
use crate::reply::ReplyTo;
use crate::store::StoreSide;
use parking_lot::Mutex;
use prism_protocol::ids::{NodeId, ObjectId};
use prism_protocol::tls::Stream;
use std::collections::HashMap;
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
    /// Pulls under way, with who waits for each, and the copies other
    /// nodes pulled of objects held here.
    pub(super) book: Mutex<PullBook<ReplyTo>>,
    /// Idle bulk streams, per holder's TCP address.
    pub(super) idle: Mutex<HashMap<String, Vec<Stream>>>,
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
            book: Mutex::default(),
            idle: Mutex::default(),
            pulled_bytes: AtomicU64::default(),
            served_bytes: AtomicU64::default(),
        }
    }

    /// The nodes that pulled copies of `ids`, forgetting them: each with
    /// the ids it holds.
    pub(crate) fn take_copies(&self, ids: &[ObjectId]) -> HashMap<String, Vec<ObjectId>> {
        self.book.lock().take_copies(ids)
    }

    /// Bytes this node pulled from others and served to others.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (
            self.pulled_bytes.load(Ordering::Relaxed),
            self.served_bytes.load(Ordering::Relaxed),
        )
    }
}
