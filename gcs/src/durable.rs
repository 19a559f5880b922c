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
//!
//! A head whose disk is not kept (a pod) keeps the same tables in Redis
//! instead ([`StateStore::Redis`], see `redis.rs`), as Ray's GCS does with
//! fault tolerance on.

use crate::pb::NodeInfo;
use crate::redis::{Redis, RedisPlace, Reply};
use crate::GcsError;
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

/// Where a control store keeps its durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateStore {
    /// A redb file on the head's disk.
    File(PathBuf),
    /// Hashes in a Redis server, under a namespace.
    Redis(RedisPlace),
}

impl std::fmt::Display for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateStore::File(path) => write!(f, "{}", path.display()),
            StateStore::Redis(place) => write!(f, "{place}"),
        }
    }
}

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

/// The file, Redis, or nothing when the control store keeps no state (an
/// embedded or test cluster).
#[derive(Debug)]
pub(crate) struct Durable {
    db: Option<(Database, PathBuf)>,
    redis: Option<Redis>,
    place: String,
}

impl Durable {
    /// State kept in memory only: every write succeeds and nothing is
    /// kept.
    pub(crate) fn none() -> Durable {
        Durable {
            db: None,
            redis: None,
            place: "memory".into(),
        }
    }

    /// Opens the state wherever `store` says, and reads everything in it.
    pub(crate) fn open_store(store: &StateStore) -> Result<(Durable, Restored), GcsError> {
        match store {
            StateStore::File(path) => Durable::open(path),
            StateStore::Redis(place) => {
                let failed = |message: String| GcsError::State {
                    place: place.to_string(),
                    message,
                };
                let redis = Redis::connect(place.clone()).map_err(failed)?;
                let durable = Durable {
                    db: None,
                    redis: Some(redis),
                    place: place.to_string(),
                };
                let restored = durable.read_redis().map_err(failed)?;
                Ok((durable, restored))
            }
        }
    }

    /// The token saved wherever `store` says, if any.
    pub(crate) fn saved_token_in(store: &StateStore) -> Result<Option<String>, GcsError> {
        match store {
            StateStore::File(path) => Durable::saved_token(path),
            StateStore::Redis(_) => Ok(Durable::open_store(store)?.1.token),
        }
    }

    /// Opens the state file at `path` (made, with its folder readable by
    /// this user only, when missing) and reads everything in it.
    pub(crate) fn open(path: &Path) -> Result<(Durable, Restored), GcsError> {
        let failed = |message: String| GcsError::State {
            place: path.display().to_string(),
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
            redis: None,
            place: path.display().to_string(),
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
    pub(crate) fn place(&self) -> Option<&str> {
        (self.db.is_some() || self.redis.is_some()).then_some(self.place.as_str())
    }

    fn read_redis(&self) -> Result<Restored, String> {
        let Some(redis) = &self.redis else {
            return Ok(Restored::default());
        };
        let text =
            |b: Vec<u8>| String::from_utf8(b).map_err(|_| "a key that is not text".to_string());
        let mut restored = Restored::default();
        for (k, v) in redis.hgetall("meta")? {
            match text(k)?.as_str() {
                CLUSTER_ID => restored.cluster_id = Some(text(v)?),
                TOKEN => restored.token = Some(text(v)?),
                _ => {}
            }
        }
        for (k, v) in redis.hgetall("kv")? {
            restored.kv.push((text(k)?, v));
        }
        restored.kv.sort();
        for (k, v) in redis.hgetall("names")? {
            let (namespace, name) = split_pair(&text(k)?)?;
            let (actor, node) = split_pair(&text(v)?)?;
            restored.names.push(((namespace, name), (actor, node)));
        }
        for (k, v) in redis.hgetall("nodes")? {
            let info = NodeInfo::decode(v.as_slice()).map_err(|x| {
                format!(
                    "the record of node {} cannot be read: {x}",
                    String::from_utf8_lossy(&k)
                )
            })?;
            restored.nodes.push(info);
        }
        Ok(restored)
    }

    /// Runs one Redis command for a change.
    fn redis_write(&self, what: &str, args: &[&[u8]]) -> Result<(), GcsError> {
        let Some(redis) = &self.redis else {
            return Ok(());
        };
        redis
            .command(args)
            .map(|_: Reply| ())
            .map_err(|e| GcsError::State {
                place: self.place.clone(),
                message: format!("cannot save {what}: {e}"),
            })
    }

    fn hash(&self, table: &str) -> Vec<u8> {
        self.redis
            .as_ref()
            .map(|r| r.hash(table))
            .unwrap_or_default()
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
            place: path.display().to_string(),
            message: format!("cannot save {what}: {e}"),
        };
        let tx = db.begin_write().map_err(|e| failed(e.into()))?;
        change(&tx).map_err(failed)?;
        tx.commit().map_err(|e| failed(e.into()))
    }

    /// Saves the cluster's id and token.
    pub(crate) fn save_identity(&self, cluster_id: &str, token: &str) -> Result<(), GcsError> {
        let meta = self.hash("meta");
        self.redis_write(
            "the cluster's id",
            &[
                b"HSET",
                &meta,
                CLUSTER_ID.as_bytes(),
                cluster_id.as_bytes(),
                TOKEN.as_bytes(),
                token.as_bytes(),
            ],
        )?;
        self.write("the cluster's id", |tx| {
            let mut meta = tx.open_table(META)?;
            meta.insert(CLUSTER_ID, cluster_id)?;
            meta.insert(TOKEN, token)?;
            Ok(())
        })
    }

    /// Saves a key's value.
    pub(crate) fn kv_put(&self, key: &str, value: &[u8]) -> Result<(), GcsError> {
        let kv = self.hash("kv");
        self.redis_write("a key-value entry", &[b"HSET", &kv, key.as_bytes(), value])?;
        self.write("a key-value entry", |tx| {
            tx.open_table(KV)?.insert(key, value)?;
            Ok(())
        })
    }

    /// Removes a key.
    pub(crate) fn kv_delete(&self, key: &str) -> Result<(), GcsError> {
        let kv = self.hash("kv");
        self.redis_write("a key-value deletion", &[b"HDEL", &kv, key.as_bytes()])?;
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
        let names = self.hash("names");
        let field = join_pair(namespace, name);
        let value = join_pair(actor_id, node_id);
        self.redis_write(
            "an actor name",
            &[b"HSET", &names, field.as_bytes(), value.as_bytes()],
        )?;
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
        let nodes = self.hash("nodes");
        self.redis_write(
            "a node's membership",
            &[b"HSET", &nodes, info.node_id.as_bytes(), &bytes],
        )?;
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
        let nodes = self.hash("nodes");
        let mut args: Vec<&[u8]> = vec![b"HDEL", &nodes];
        args.extend(ids.iter().map(|id| id.as_bytes()));
        self.redis_write("a node's departure", &args)?;
        self.write("a node's departure", |tx| {
            let mut nodes = tx.open_table(NODES)?;
            for id in ids {
                nodes.remove(*id)?;
            }
            Ok(())
        })
    }
}

/// Two strings as one, the first's length first, so that any bytes may
/// be in either: `"<len>:<a><b>"`.
fn join_pair(a: &str, b: &str) -> String {
    format!("{}:{a}{b}", a.len())
}

fn split_pair(text: &str) -> Result<(String, String), String> {
    let bad = || format!("{text:?} is not a pair this control store wrote");
    let (len, rest) = text.split_once(':').ok_or_else(bad)?;
    let len: usize = len.parse().map_err(|_| bad())?;
    if !rest.is_char_boundary(len.min(rest.len())) || len > rest.len() {
        return Err(bad());
    }
    let (a, b) = rest.split_at(len);
    Ok((a.to_string(), b.to_string()))
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
    fn pairs_of_any_text_come_apart_as_they_went_in() {
        for (a, b) in [
            ("ns", "ctr"),
            ("", "x"),
            ("a:b", ":c"),
            ("é", "ü"),
            ("", ""),
        ] {
            assert_eq!(
                split_pair(&join_pair(a, b)).unwrap(),
                (a.to_string(), b.to_string())
            );
        }
        assert!(split_pair("x").is_err());
        assert!(split_pair("9:ab").is_err());
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
