//! A counted local reference: one of this process's handles on an object,
//! released when the last clone of it is dropped.
//!
//! The public [`ObjectRef`](crate::ObjectRef) wraps one; the runtime keeps
//! them too (a streaming call's values not taken yet, an actor call's hold
//! on its actor's handle) without knowing the value's type.

use prism_protocol::ids::ObjectId;
use prism_protocol::messages::ObjectRefInfo;
use std::sync::{Arc, Weak};

/// Whoever counts local references: told when one is dropped.
pub(crate) trait RefOwner: Send + Sync {
    /// The handle on `id` was dropped.
    fn release_local(self: Arc<Self>, id: ObjectId);
}

/// One counted local handle on an object.
pub(crate) struct LocalRef {
    pub(crate) info: ObjectRefInfo,
    owner: Weak<dyn RefOwner>,
}

impl LocalRef {
    /// A handle whose local count was taken already; its drop gives the
    /// count back to `owner` (if it still runs).
    pub(crate) fn counted(info: ObjectRefInfo, owner: Weak<dyn RefOwner>) -> Arc<LocalRef> {
        Arc::new(LocalRef { info, owner })
    }
}

impl Drop for LocalRef {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            owner.release_local(self.info.id);
        }
    }
}
