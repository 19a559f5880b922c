//! The record a node process leaves on its machine, `<temp dir>/nodes/<pid>.json`:
//! how `prism stop` finds the node processes to stop, how `prism status`
//! finds the head, and how a driver finds the raylet of its own machine.

use prism_protocol::Error;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A node process running on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node process.
    pub pid: u32,
    /// When it started, in clock ticks since boot (`/proc/<pid>/stat`), so
    /// a reused pid is not taken for it.
    pub start_ticks: u64,
    /// The raylet's node id.
    pub node_id: String,
    /// The cluster's id.
    pub cluster_id: String,
    /// The head's control store, `HOST:PORT`.
    pub head: String,
    /// This node's address.
    pub node_ip: String,
    /// Whether this process runs the head.
    pub is_head: bool,
    /// The node's session directory.
    pub session_dir: PathBuf,
    /// The raylet's socket, for drivers on this machine.
    pub socket: PathBuf,
    /// The node's TLS files, when the cluster speaks TLS: drivers on this
    /// machine use them too.
    #[serde(default)]
    pub tls: Option<prism_protocol::tls::TlsFiles>,
    /// Where the head's dashboard listens, `ip:port`, if it has one.
    #[serde(default)]
    pub dashboard: Option<String>,
    /// A head's control-store state folder that ends with its cluster (the
    /// default one in the temp folder, not one the user named): `prism
    /// stop` removes it once the head is gone, even when it had to kill it.
    #[serde(default)]
    pub scratch_state: Option<PathBuf>,
}

impl NodeRecord {
    /// The folder records live in.
    pub fn dir(temp_dir: &Path) -> PathBuf {
        temp_dir.join("nodes")
    }

    /// This process's start time, for [`NodeRecord::start_ticks`].
    pub fn own_start_ticks() -> u64 {
        start_ticks(std::process::id()).unwrap_or(0)
    }

    /// Writes the record whole (a temporary file renamed into place), so a
    /// reader never sees half of one; its appearance means the node is up.
    pub fn write(&self, temp_dir: &Path) -> Result<PathBuf, Error> {
        let dir = Self::dir(temp_dir);
        prism_protocol::guard::private_dir(temp_dir)
            .and_then(|()| prism_protocol::guard::private_dir(&dir))
            .map_err(|e| Error::io(format!("keep node records in {}", dir.display()), e))?;
        let path = dir.join(format!("{}.json", self.pid));
        let tmp = dir.join(format!(".{}.json.tmp", self.pid));
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::io("encode the node record", e))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        Ok(path)
    }

    /// Removes this record.
    pub fn remove(&self, temp_dir: &Path) {
        let _ = std::fs::remove_file(Self::dir(temp_dir).join(format!("{}.json", self.pid)));
    }

    /// Whether its process still runs (the same process, not a reused pid).
    pub fn is_running(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks)
    }

    /// The records of node processes that still run, oldest first; records
    /// of processes that are gone are removed.
    pub fn list(temp_dir: &Path) -> Vec<NodeRecord> {
        let Ok(entries) = std::fs::read_dir(Self::dir(temp_dir)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            match serde_json::from_str::<NodeRecord>(&text) {
                Ok(record) if record.is_running() => out.push(record),
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out.sort_by_key(|r| r.start_ticks);
        out
    }
}

/// A process's start time in clock ticks since boot, field 22 of
/// `/proc/<pid>/stat`; `None` if it is gone (or a zombie).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: fields after it follow
    // the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (the state), so field 22 is fields[19].
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_running_processes_are_listed_and_stale_ones_removed() {
        let temp = std::env::temp_dir().join(format!("prism-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&temp);
        let me = NodeRecord {
            pid: std::process::id(),
            start_ticks: NodeRecord::own_start_ticks(),
            node_id: "node-1".into(),
            cluster_id: "c".into(),
            head: "10.0.0.1:6380".into(),
            node_ip: "10.0.0.1".into(),
            is_head: true,
            session_dir: temp.join("s"),
            socket: temp.join("s/sockets/raylet.sock"),
            tls: None,
            dashboard: None,
            scratch_state: None,
        };
        me.write(&temp).unwrap();
        // The same pid with another start time: a reused pid, not the node.
        let stale = NodeRecord {
            pid: 1,
            start_ticks: u64::MAX,
            ..me.clone()
        };
        stale.write(&temp).unwrap();
        assert_eq!(NodeRecord::list(&temp), vec![me.clone()]);
        assert!(!NodeRecord::dir(&temp).join("1.json").exists());
        me.remove(&temp);
        assert!(NodeRecord::list(&temp).is_empty());
        std::fs::remove_dir_all(&temp).unwrap();
    }
}
