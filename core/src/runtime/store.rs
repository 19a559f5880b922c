//! The store client: this process's mapping of the node's shared-memory
//! segment, and the raylet requests that create, seal, pin and release
//! objects in it.

use crate::Result;
use prism_object_store::Segment;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{
    CreateObject, GetObject, ObjectLocation, ObjectValue, Ownership, PullObject, ReleaseObject,
    SealObject,
};
use prism_protocol::rpc::Connection;
use std::path::Path;
use std::sync::{Arc, Weak};

/// The node's object store as this process sees it.
#[derive(Debug)]
pub(crate) struct StoreClient {
    raylet: Connection,
    segment: Segment,
    /// The node, in a multi-node cluster: objects written here say so.
    node: Option<String>,
}

/// Bytes of an object ready to decode.
pub(crate) enum Loaded {
    /// Carried in a message.
    Inline(bytes::Bytes),
    /// In the shared segment, pinned while this lives.
    Stored {
        ptr: *mut u8,
        len: usize,
        pin: PinGuard,
    },
}

// SAFETY: the pointer is into the shared segment, which is mapped for the
// process's life, and the range is sealed (immutable) and pinned while the
// `Loaded` lives.
unsafe impl Send for Loaded {}

impl Loaded {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Loaded::Inline(b) => b,
            // SAFETY: pinned, sealed, in bounds (checked by Segment::ptr).
            Loaded::Stored { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

/// Keeps a store object pinned; unpins on drop.
pub(crate) struct PinGuard {
    store: Weak<StoreClient>,
    id: ObjectId,
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(store) = self.store.upgrade() {
            let _ = store.raylet.notify(ReleaseObject { id: self.id });
        }
    }
}

impl StoreClient {
    /// Maps the segment at `path` of node `node` (`None` on a single
    /// node); requests go to `raylet`.
    pub(crate) fn open(
        raylet: Connection,
        path: &Path,
        node: Option<String>,
    ) -> Result<Arc<StoreClient>> {
        Ok(Arc::new(StoreClient {
            raylet,
            segment: Segment::open(path)?,
            node,
        }))
    }

    /// The node of this store, in a multi-node cluster.
    pub(crate) fn node(&self) -> Option<&String> {
        self.node.as_ref()
    }

    /// Whether a stored value is held by this node's store (else it must
    /// be pulled here first).
    pub(crate) fn holds(&self, holder: Option<&String>) -> bool {
        holder.is_none() || holder == self.node.as_ref()
    }

    /// Copies object `id` from the store of node `holder` into this one.
    pub(crate) async fn pull(
        &self,
        id: ObjectId,
        holder: String,
        size: u64,
        owner: &str,
    ) -> Result<()> {
        self.raylet
            .request(PullObject {
                id,
                node: holder,
                size,
                owner: owner.to_string(),
            })
            .await
    }

    /// Pins a sealed object and maps its bytes in.
    pub(crate) async fn load(self: &Arc<Self>, id: ObjectId) -> Result<Loaded> {
        let ObjectLocation { offset, size } = self.raylet.request(GetObject { id }).await?;
        let ptr = self.segment.ptr(offset, size)?;
        self.segment.prefault(offset, size);
        Ok(Loaded::Stored {
            ptr,
            len: size as usize,
            pin: PinGuard {
                store: Arc::downgrade(self),
                id,
            },
        })
    }

    /// Room for object `id` of `size` bytes: its offset in the segment.
    /// `owned`: this process owns it (a put), rather than a task's caller.
    pub(crate) async fn create(&self, id: ObjectId, size: u64, owner: Ownership) -> Result<u64> {
        let request = CreateObject { id, size, owner };
        Ok(self.raylet.request(request).await?.offset)
    }

    /// Copies `parts` back to back from `offset`.
    pub(crate) fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<()> {
        let mut at = offset;
        for p in parts {
            self.segment.write(at, p)?;
            at += p.len() as u64;
        }
        Ok(())
    }

    /// Marks object `id` complete and readable.
    pub(crate) async fn seal(&self, id: ObjectId) -> Result<()> {
        self.raylet.request(SealObject { id }).await
    }

    /// Writes `parts` back to back as object `id`, and seals it (`owned`
    /// as for [`StoreClient::create`]).
    pub(crate) async fn write(
        &self,
        id: ObjectId,
        parts: &[&[u8]],
        owner: Ownership,
    ) -> Result<ObjectValue> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let offset = self.create(id, size, owner).await?;
        self.write_parts(offset, parts)?;
        self.seal(id).await?;
        Ok(ObjectValue::InStore {
            size,
            node: self.node.clone(),
        })
    }
}
