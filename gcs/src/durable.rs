//! The control store's durable state: what must outlive the head's
//! process, written to one file through redb before the call that changed
//! it is answered.
//!
//! It holds the cluster's id and token, the key-value table (and with it
//! the actors' checkpoints), the actor name directory, and the nodes that
//! are members now. A node's liveness is not kept: a control store that
//! starts again on the file counts every member as alive from that moment,
//! and marks dead those that do not send a heartbeat within the death
//! timeout. Dead nodes are not kept at all.
//!
//! redb was chosen over SQLite because it is pure Rust with one
//! dependency (libc), needs no C toolchain, and its commits are atomic
//! and checksummed: a process killed in the middle of one leaves the file
//! at the commit before. Every commit here is synced to disk
//! (`Durability::Immediate`), so a machine that loses power loses nothing
//! that was answered either.

use crate::pb::NodeInfo;
use crate::GcsError;
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// (namespace, name) to (actor id, node id).
const NAMES: TableDefinition<(&str, &str), (&str, &str)> = TableDefinition::new("names");
/// Node id to the node's `NodeInfo`, protobuf-encoded.
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");

const CLUSTER_ID: &str = "cluster_id";
const TOKEN: &str = "token";

/// What a control store finds in its file when it starts.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// The cluster's id, if the file has one.
    pub(crate) cluster_id: Option<String>,
    /// The cluster's token, if the file has one.
    pub(crate) token: Option<String>,
    /// The key-value table.
    pub(crate) kv: Vec<(String, Vec<u8>)>,
    /// The name directory: ((namespace, name), (actor id, node id)).
    pub(crate) names: Vec<((String, String), (String, String))>,
    /// The member nodes at the last change.
    pub(crate) nodes: Vec<NodeInfo>,
}

/// The file, or nothing when the control store keeps no state (an
/// embedded or test cluster).
#[derive(Debug)]
pub(crate) struct Durable {
    db: Option<(Database, PathBuf)>,
}

impl Durable {
    /// State kept in memory only: every write succeeds and nothing is
    /// kept.
    pub(crate) fn none() -> Durable {
        Durable { db: None }
    }

    /// Opens the state file at `path` (made, with its folder readable by
    /// this user only, when missing) and reads everything in it.
    pub(crate) fn open(path: &Path) -> Result<(Durable, Restored), GcsError> {
        let failed = |message: String| GcsError::State {
            path: path.to_path_buf(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            prism_protocol::guard::private_dir(dir).map_err(|e| failed(e.to_string()))?;
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => GcsError::StateInUse {
                path: path.to_path_buf(),
            },
            other => failed(format!("{other} (remove the file to start a new cluster)")),
        })?;
        restrict(path).map_err(|e| failed(format!("cannot make it private: {e}")))?;
        let durable = Durable {
            db: Some((db, path.to_path_buf())),
        };
        let restored = durable.read().map_err(failed)?;
        Ok((durable, restored))
    }

    /// The token saved in the state file at `path`, if the file exists and
    /// has one; nothing is created.
    pub(crate) fn saved_token(path: &Path) -> Result<Option<String>, GcsError> {
        if !path.exists() {
            return Ok(None);
        }
        let (durable, restored) = Durable::open(path)?;
        drop(durable);
        Ok(restored.token)
    }

    /// Where the state is kept, if anywhere.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.db.as_ref().map(|(_, p)| p.as_path())
    }

    fn read(&self) -> Result<Restored, String> {
        let Some((db, _)) = &self.db else {
            return Ok(Restored::default());
        };
        let e = |e: redb::Error| e.to_string();
        let tx = db.begin_read().map_err(|x| e(x.into()))?;
        let mut restored = Restored::default();
        match tx.open_table(META) {
            Ok(meta) => {
                let get = |key: &str| -> Result<Option<String>, String> {
                    Ok(meta
                        .get(key)
                        .map_err(|x| e(x.into()))?
                        .map(|v| v.value().to_string()))
                };
                restored.cluster_id = get(CLUSTER_ID)?;
                restored.token = get(TOKEN)?;
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(x) => return Err(e(x.into())),
        }
        match tx.open_table(KV) {
            Ok(kv) => {
                for entry in kv.iter().map_err(|x| e(x.into()))? {
                    let (k, v) = entry.map_err(|x| e(x.into()))?;
                    restored
                        .kv
                        .push((k.value().to_string(), v.value().to_vec()));
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(x) => return Err(e(x.into())),
        }
        match tx.open_table(NAMES) {
            Ok(names) => {
                for entry in names.iter().map_err(|x| e(x.into()))? {
                    let (k, v) = entry.map_err(|x| e(x.into()))?;
                    let ((ns, name), (actor, node)) = (k.value(), v.value());
                    restored.names.push((
                        (ns.to_string(), name.to_string()),
                        (actor.to_string(), node.to_string()),
                    ));
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(x) => return Err(e(x.into())),
        }
        match tx.open_table(NODES) {
            Ok(nodes) => {
                for entry in nodes.iter().map_err(|x| e(x.into()))? {
                    let (k, v) = entry.map_err(|x| e(x.into()))?;
                    let info = NodeInfo::decode(v.value()).map_err(|x| {
                        format!("the record of node {} cannot be read: {x}", k.value())
                    })?;
                    restored.nodes.push(info);
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(x) => return Err(e(x.into())),
        }
        Ok(restored)
    }

    /// Runs `change` in one write transaction and commits it to disk.
    fn write(
        &self,
        what: &str,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), GcsError> {
        let Some((db, path)) = &self.db else {
            return Ok(());
        };
        let failed = |e: redb::Error| GcsError::State {
            path: path.clone(),
            message: format!("cannot save {what}: {e}"),
        };
        let tx = db.begin_write().map_err(|e| failed(e.into()))?;
        change(&tx).map_err(failed)?;
        tx.commit().map_err(|e| failed(e.into()))
    }

    /// Saves the cluster's id and token.
    pub(crate) fn save_identity(&self, cluster_id: &str, token: &str) -> Result<(), GcsError> {
        self.write("the cluster's id", |tx| {
            let mut meta = tx.open_table(META)?;
            meta.insert(CLUSTER_ID, cluster_id)?;
            meta.insert(TOKEN, token)?;
            Ok(())
        })
    }

    /// Saves a key's value.
    pub(crate) fn kv_put(&self, key: &str, value: &[u8]) -> Result<(), GcsError> {
        self.write("a key-value entry", |tx| {
            tx.open_table(KV)?.insert(key, value)?;
            Ok(())
        })
    }

    /// Removes a key.
    pub(crate) fn kv_delete(&self, key: &str) -> Result<(), GcsError> {
        self.write("a key-value deletion", |tx| {
            tx.open_table(KV)?.remove(key)?;
            Ok(())
        })
    }

    /// Saves who holds an actor name.
    pub(crate) fn name_put(
        &self,
        namespace: &str,
        name: &str,
        actor_id: &str,
        node_id: &str,
    ) -> Result<(), GcsError> {
        self.write("an actor name", |tx| {
            tx.open_table(NAMES)?
                .insert((namespace, name), (actor_id, node_id))?;
            Ok(())
        })
    }

    /// Saves a member node.
    pub(crate) fn node_put(&self, info: &NodeInfo) -> Result<(), GcsError> {
        // What changes every heartbeat is not kept.
        let mut kept = info.clone();
        kept.available.clear();
        kept.demands.clear();
        kept.last_heartbeat_ms_ago = 0;
        let bytes = kept.encode_to_vec();
        self.write("a node's membership", |tx| {
            tx.open_table(NODES)?
                .insert(info.node_id.as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Removes nodes that are no longer members.
    pub(crate) fn nodes_gone(&self, ids: &[&str]) -> Result<(), GcsError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.write("a node's departure", |tx| {
            let mut nodes = tx.open_table(NODES)?;
            for id in ids {
                nodes.remove(*id)?;
            }
            Ok(())
        })
    }
}

/// Makes the file readable and writable by its owner only: it holds the
/// token.
fn restrict(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::Resource;

    #[test]
    fn what_was_saved_is_read_back_by_the_next_open() {
        let dir = std::env::temp_dir().join(format!("prism-durable-{}", uuid::Uuid::new_v4()));
        let path = dir.join("state.redb");
        {
            let (d, restored) = Durable::open(&path).unwrap();
            assert!(restored.cluster_id.is_none() && restored.kv.is_empty());
            d.save_identity("c1", "tok").unwrap();
            d.kv_put("a", b"1").unwrap();
            d.kv_put("b", b"2").unwrap();
            d.kv_delete("a").unwrap();
            d.name_put("ns", "ctr", "actor1", "node1").unwrap();
            let node = NodeInfo {
                node_id: "node1".into(),
                total: vec![Resource {
                    name: "CPU".into(),
                    units: 10_000,
                }],
                available: vec![Resource {
                    name: "CPU".into(),
                    units: 5_000,
                }],
                ..NodeInfo::default()
            };
            d.node_put(&node).unwrap();
            d.node_put(&NodeInfo {
                node_id: "node2".into(),
                ..NodeInfo::default()
            })
            .unwrap();
            d.nodes_gone(&["node2"]).unwrap();
        }
        let (_d, r) = Durable::open(&path).unwrap();
        assert_eq!(r.cluster_id.as_deref(), Some("c1"));
        assert_eq!(r.token.as_deref(), Some("tok"));
        assert_eq!(r.kv, vec![("b".to_string(), b"2".to_vec())]);
        assert_eq!(
            r.names,
            vec![(
                ("ns".to_string(), "ctr".to_string()),
                ("actor1".to_string(), "node1".to_string())
            )]
        );
        assert_eq!(r.nodes.len(), 1);
        assert_eq!(r.nodes[0].node_id, "node1");
        assert_eq!(r.nodes[0].total.len(), 1);
        assert!(
            r.nodes[0].available.is_empty(),
            "free resources are not kept"
        );
        let err = Durable::saved_token(&path).unwrap_err().to_string();
        assert!(err.contains("open in another control store"), "{err}");
        drop(_d);
        assert_eq!(Durable::saved_token(&path).unwrap().as_deref(), Some("tok"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_file_that_is_not_a_state_file_is_refused_with_its_path() {
        let dir = std::env::temp_dir().join(format!("prism-durable-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.redb");
        std::fs::write(
            &path,
            b"not a database, just some bytes that are long enough",
        )
        .unwrap();
        let err = Durable::open(&path).unwrap_err().to_string();
        assert!(err.contains("state.redb"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
