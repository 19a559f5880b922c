//! Where a cluster's machines come from: the [`NodeProvider`] trait, and
//! the `ssh` provider (Ray's `local`), a fixed list of machines reached
//! over SSH (the `podman` provider is in `podman.rs`). A provider of a cloud implements the same trait: it makes a
//! machine of a node type and names it by an address SSH reaches, lists
//! the machines it made for the cluster, and ends one.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A machine of the cluster, as its provider knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ProviderNode {
    /// Its address or host name, as SSH reaches it.
    pub(crate) host: String,
    /// Its node type in the cluster file.
    pub(crate) node_type: String,
}

/// Makes, lists and ends the machines of one cluster.
pub(crate) trait NodeProvider {
    /// The machines made for the cluster and not ended.
    fn nodes(&self) -> Result<Vec<ProviderNode>, String>;
    /// Makes `count` machines of `node_type`, each ready for commands
    /// over SSH; returns them. Fails, making none, when the provider
    /// cannot make that many.
    fn create_nodes(&mut self, node_type: &str, count: usize) -> Result<Vec<ProviderNode>, String>;
    /// Ends a machine (the launcher has stopped Prism on it first).
    fn terminate_node(&mut self, host: &str) -> Result<(), String>;
    /// Counts a machine found running a node of the cluster (started by
    /// another run of the launcher) as one of this provider's.
    fn adopt(&mut self, host: &str, node_type: &str) -> Result<(), String>;
    /// Ends what the provider made for the cluster beside its machines (a
    /// network), once `prism down` has ended every machine.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The `ssh` provider: the hosts of the cluster file, handed out in
/// order. Which are in use is kept in a file of this machine (the
/// launcher's folder for the cluster), so that `prism up` run again, and
/// `prism down`, know them.
pub(crate) struct SshProvider {
    head: String,
    workers: Vec<String>,
    state: PathBuf,
    used: BTreeMap<String, String>,
}

impl SshProvider {
    /// The provider of a cluster whose head is `head` and whose worker
    /// machines are `workers`, keeping its state in `state`.
    pub(crate) fn new(head: String, workers: Vec<String>, state: PathBuf) -> Result<Self, String> {
        let used = match std::fs::read(&state) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} is not the provider's state ({e}); remove it if no node runs",
                    state.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("{}: {e}", state.display())),
        };
        Ok(SshProvider {
            head,
            workers,
            state,
            used,
        })
    }

    fn save(&self) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(&self.used).map_err(|e| e.to_string())?;
        let part = self.state.with_extension("part");
        std::fs::write(&part, bytes)
            .and_then(|_| std::fs::rename(&part, &self.state))
            .map_err(|e| format!("{}: {e}", self.state.display()))
    }
}

impl NodeProvider for SshProvider {
    fn nodes(&self) -> Result<Vec<ProviderNode>, String> {
        Ok(self
            .used
            .iter()
            .map(|(host, node_type)| ProviderNode {
                host: host.clone(),
                node_type: node_type.clone(),
            })
            .collect())
    }

    fn create_nodes(&mut self, node_type: &str, count: usize) -> Result<Vec<ProviderNode>, String> {
        let free: Vec<String> = std::iter::once(&self.head)
            .chain(&self.workers)
            .filter(|h| !self.used.contains_key(*h))
            // The head's machine serves only the head.
            .filter(|h| (**h == self.head) == (node_type == HEAD_TYPE_TAG))
            .take(count)
            .cloned()
            .collect();
        if free.len() < count {
            return Err(format!(
                "the ssh provider has {} free machine(s) for {count} node(s) of type \
                 {node_type}: add hosts to provider.worker_ips",
                free.len()
            ));
        }
        let made: Vec<ProviderNode> = free
            .into_iter()
            .map(|host| ProviderNode {
                host,
                node_type: node_type.to_string(),
            })
            .collect();
        for n in &made {
            self.used.insert(n.host.clone(), n.node_type.clone());
        }
        self.save()?;
        Ok(made)
    }

    fn terminate_node(&mut self, host: &str) -> Result<(), String> {
        if self.used.remove(host).is_some() {
            self.save()?;
        }
        Ok(())
    }

    fn adopt(&mut self, host: &str, node_type: &str) -> Result<(), String> {
        if self.used.get(host).map(String::as_str) != Some(node_type) {
            self.used.insert(host.to_string(), node_type.to_string());
            self.save()?;
        }
        Ok(())
    }
}

/// The node type tag the launcher gives the head's machine.
pub(crate) const HEAD_TYPE_TAG: &str = "<head>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_handed_out_once_and_remembered() {
        let dir = std::env::temp_dir().join(format!("prism-ssh-provider-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder");
        let state = dir.join("nodes.json");
        let hosts = vec!["a".to_string(), "b".to_string()];
        let mut p = SshProvider::new("h".into(), hosts.clone(), state.clone()).expect("new");
        let head = p
            .create_nodes(HEAD_TYPE_TAG, 1)
            .expect("the head's machine");
        assert_eq!(head[0].host, "h");
        let one = p.create_nodes("worker", 1).expect("one worker");
        assert_eq!(one[0].host, "a");
        let err = p.create_nodes("worker", 2).expect_err("only b is left");
        assert!(err.contains("1 free machine"), "{err}");
        // Another run reads what this one made.
        let mut again = SshProvider::new("h".into(), hosts, state).expect("reads its state");
        assert_eq!(again.nodes().expect("nodes").len(), 2);
        again.terminate_node("a").expect("ends");
        assert_eq!(again.create_nodes("worker", 2).expect("two").len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
