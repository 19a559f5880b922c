//! The state of the groups placed over several nodes from here
//! ([`PendingGroups`]): those not placed yet and their waiters, the groups
//! whose home is this node, and the groups whose bundles are being moved.
//! Placing them is in `crate::placement`.

use crate::reply::ReplyTo;
use parking_lot::Mutex;
use prism_protocol::ids::PlacementGroupId;
use prism_protocol::messages::PlacementGroupSpec;
use std::collections::{BTreeSet, HashMap};

/// Groups placed over several nodes whose home is this node and that are
/// not placed yet, with the callers waiting for them; and every group
/// created here, for listing.
#[derive(Debug, Default)]
pub(crate) struct PendingGroups {
    pub(super) groups: Mutex<HashMap<PlacementGroupId, (PlacementGroupSpec, Vec<ReplyTo>)>>,
    /// The groups whose home is this node, in creation order, until they
    /// are removed (or found gone when listed).
    pub(super) home: Mutex<Vec<PlacementGroupId>>,
    /// The groups whose bundles on dead nodes are being moved: one mover
    /// per group, which sees every node that died meanwhile.
    pub(super) moving: Mutex<BTreeSet<PlacementGroupId>>,
    /// At the head: whether a look for groups whose home died runs, and
    /// whether another was asked for meanwhile.
    pub(super) adopting: Mutex<(bool, bool)>,
    /// At the head: the groups taken up after their home died (each once).
    pub(super) adopted: Mutex<BTreeSet<PlacementGroupId>>,
}
