//! The placement groups' records in the head's key-value table
//! ([`GroupRecord`] under [`GROUP_RECORD_PREFIX`]), written by each group's
//! home as the group is created, placed, moved and removed, and read by the
//! head to place again the groups whose home died.
//!
//! Writes leave in the background, one at a time in the order they were
//! made (a group's later record never lands before its earlier one), so
//! creating a group never waits for the head. A group placed over several
//! nodes is said to be created only once its record of where the bundles
//! are was written: a home that dies right after leaves the head what it
//! needs to place the group again. The head keeps the table on
//! its disk, so the records outlive a restart of the head too.

use prism_gcs::GcsClient;
use prism_protocol::ids::PlacementGroupId;
use prism_protocol::messages::{group_record_key, GroupRecord, GROUP_RECORD_PREFIX};
use tokio::sync::{mpsc, oneshot};

/// One change to the records; a put may carry who waits for it to be
/// written.
#[derive(Debug)]
enum Change {
    Put(String, Vec<u8>, Option<oneshot::Sender<()>>),
    Delete(String),
}

/// The writer of this node's group records.
#[derive(Debug)]
pub(crate) struct GroupRecords {
    changes: mpsc::UnboundedSender<Change>,
}

impl GroupRecords {
    /// Starts the writer on the current Tokio runtime.
    pub(crate) fn start(gcs: GcsClient) -> GroupRecords {
        let (changes, mut queue) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut gcs = gcs;
            while let Some(change) = queue.recv().await {
                let (done, waiter) = match change {
                    Change::Put(key, value, waiter) => {
                        (gcs.kv_put(key, value, true).await.map(|_| ()), waiter)
                    }
                    Change::Delete(key) => (gcs.kv_delete(key).await.map(|_| ()), None),
                };
                if let Some(waiter) = waiter {
                    let _ = waiter.send(());
                }
                if let Err(e) = done {
                    tracing::warn!(error = %e, "a placement group's record was not written to the head");
                }
            }
        });
        GroupRecords { changes }
    }

    /// Records a group (replacing its earlier record). The receiver
    /// returned is told once the write was tried (done, or failed and
    /// logged): for a caller that must not go on before the head has it.
    pub(crate) fn put(&self, record: &GroupRecord) -> oneshot::Receiver<()> {
        let (written, tried) = oneshot::channel();
        match serde_json::to_vec(record) {
            Ok(value) => {
                let key = group_record_key(record.spec.id);
                let _ = self.changes.send(Change::Put(key, value, Some(written)));
            }
            Err(e) => {
                tracing::warn!(group = %record.spec.id, error = %e, "a placement group's record could not be encoded")
            }
        }
        tried
    }

    /// Removes a group's record.
    pub(crate) fn forget(&self, id: PlacementGroupId) {
        let _ = self.changes.send(Change::Delete(group_record_key(id)));
    }

    /// Writes another record (a detached actor's) through the same queue,
    /// in order with this node's other writes.
    pub(crate) fn put_key(&self, key: String, value: Vec<u8>) {
        let _ = self.changes.send(Change::Put(key, value, None));
    }

    /// Removes another record through the same queue.
    pub(crate) fn delete_key(&self, key: String) {
        let _ = self.changes.send(Change::Delete(key));
    }
}

/// Every group recorded in the head's table. A record that cannot be read
/// is skipped with a warning.
pub(crate) async fn load(gcs: &mut GcsClient) -> Result<Vec<GroupRecord>, prism_gcs::GcsError> {
    let mut records = Vec::new();
    for key in gcs.kv_keys(GROUP_RECORD_PREFIX.to_string()).await? {
        let Some(raw) = gcs.kv_get(key.clone()).await? else {
            continue; // removed since it was listed
        };
        match serde_json::from_slice::<GroupRecord>(&raw) {
            Ok(record) => records.push(record),
            Err(e) => {
                tracing::warn!(%key, error = %e, "a placement group's record could not be read; skipped")
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::ids::JobId;
    use prism_protocol::messages::{PlacementGroupSpec, PlacementStrategy};
    use prism_protocol::resources::{Quantity, ResourceSet};

    #[test]
    fn a_record_reads_back_as_written() {
        let mut bundle = ResourceSet::new();
        bundle.set("CPU", Quantity::from_f64("CPU", 1.5).expect("a CPU amount"));
        let record = GroupRecord {
            spec: PlacementGroupSpec {
                id: PlacementGroupId::new(),
                name: Some("g".into()),
                bundles: vec![bundle.clone(), bundle],
                strategy: PlacementStrategy::StrictSpread,
            },
            job: JobId::new(),
            home: "node-a".into(),
            nodes: vec!["node-a".into(), "node-b".into()],
        };
        let raw = serde_json::to_vec(&record).expect("encodes");
        let back: GroupRecord = serde_json::from_slice(&raw).expect("decodes");
        assert_eq!(back.spec.id, record.spec.id);
        assert_eq!(back.spec.bundles, record.spec.bundles);
        assert_eq!(back.spec.strategy, record.spec.strategy);
        assert_eq!(back.job, record.job);
        assert_eq!(back.nodes, record.nodes);
    }
}
