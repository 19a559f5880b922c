//! The cluster file of `prism up` (Ray's cluster launcher's YAML): the
//! cluster's name, how its machines are reached, its node types, and what
//! runs on each machine before Prism starts. Read and checked here, before
//! anything runs anywhere, so that a mistake is named with its field.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The head's port, as `prism start --head` uses by default.
pub(crate) const HEAD_PORT: u16 = 6380;

/// A cluster file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterFile {
    /// Names the cluster: its folder on each machine and on this one.
    pub(crate) cluster_name: String,
    /// The most worker nodes, all types together (default: every worker
    /// host the provider lists).
    #[serde(default)]
    pub(crate) max_workers: Option<u32>,
    /// How long a worker node may idle before the autoscaler stops it.
    #[serde(default = "default_idle_timeout")]
    pub(crate) idle_timeout_minutes: f64,
    pub(crate) provider: ProviderConfig,
    #[serde(default)]
    pub(crate) auth: AuthConfig,
    /// Node types by name (default: `head` and `worker`, with the
    /// resources each machine has).
    #[serde(default)]
    pub(crate) available_node_types: BTreeMap<String, NodeType>,
    /// The type of the head node (default: `head`).
    #[serde(default)]
    pub(crate) head_node_type: Option<String>,
    /// Files and folders copied to every machine: remote path -> local
    /// path.
    #[serde(default)]
    pub(crate) file_mounts: BTreeMap<String, String>,
    /// Shell commands run on every machine before Prism starts there.
    #[serde(default)]
    pub(crate) setup_commands: Vec<String>,
    #[serde(default)]
    pub(crate) head_setup_commands: Vec<String>,
    #[serde(default)]
    pub(crate) worker_setup_commands: Vec<String>,
    /// The commands that start Prism on the head and on each worker
    /// (default: `prism start` with the node type's resources). Ray's
    /// names (`head_start_ray_commands`, `worker_start_ray_commands`) are
    /// read too.
    #[serde(default, alias = "head_start_ray_commands")]
    pub(crate) head_start_commands: Option<Vec<String>>,
    #[serde(default, alias = "worker_start_ray_commands")]
    pub(crate) worker_start_commands: Option<Vec<String>>,
}

fn default_idle_timeout() -> f64 {
    5.0
}

/// Where the machines are and how they are made.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderConfig {
    /// `ssh` (Ray's `local`: a fixed list of machines reached over SSH)
    /// or `podman` (containers on this machine).
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// The head's machine (an address or a host name).
    #[serde(default)]
    pub(crate) head_ip: Option<String>,
    /// The machines worker nodes may run on.
    #[serde(default)]
    pub(crate) worker_ips: Vec<String>,
    /// `podman`: the image the containers run (default
    /// `localhost/prism:dev`, which `deploy/image/build.sh` makes).
    #[serde(default)]
    pub(crate) image: Option<String>,
    /// `podman`: the network the containers share (default
    /// `prism-<cluster_name>`, made when missing).
    #[serde(default)]
    pub(crate) network: Option<String>,
    /// `podman`: the network's IPv4 range, such as `10.89.7.0/24` (default:
    /// a /24 in 10.89.0.0/16 chosen from the cluster's name). The head
    /// takes its second address, workers the ones after.
    #[serde(default)]
    pub(crate) subnet: Option<String>,
}

/// The checked settings of the `podman` provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodmanConfig {
    pub(crate) image: String,
    pub(crate) network: String,
    /// The range, `A.B.C.D/P`.
    pub(crate) subnet: String,
}

/// How many workers a `podman` cluster may have when its file does not say.
const PODMAN_DEFAULT_MAX_WORKERS: u32 = 2;

/// How the machines are logged into.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthConfig {
    /// The user (default: this one's name).
    #[serde(default)]
    pub(crate) ssh_user: Option<String>,
    /// The private key (default: ssh's own choice).
    #[serde(default)]
    pub(crate) ssh_private_key: Option<String>,
    /// The SSH port (default 22).
    #[serde(default)]
    pub(crate) ssh_port: Option<u16>,
}

/// One kind of node: what it offers and how many of it run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeType {
    /// Resources it offers (`CPU`, `GPU`, `memory`, `object_store_memory`
    /// and any custom ones); the machine's own when not given.
    #[serde(default)]
    pub(crate) resources: BTreeMap<String, f64>,
    #[serde(default)]
    pub(crate) min_workers: u32,
    #[serde(default)]
    pub(crate) max_workers: Option<u32>,
    /// Ray's per-type node config (instance types of a cloud): unused by
    /// the `ssh` provider, accepted so that Ray's files read.
    #[serde(default)]
    #[serde(rename = "node_config")]
    pub(crate) _node_config: Option<serde_norway::Value>,
}

/// A checked cluster file, with its defaults filled in.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    pub(crate) file: ClusterFile,
    /// Where the file is (local paths in it are relative to its folder).
    pub(crate) dir: PathBuf,
    pub(crate) head_type: String,
    /// The worker type each worker host serves, in the provider's order.
    pub(crate) worker_type: String,
    pub(crate) head_ip: String,
    pub(crate) max_workers: u32,
    /// The `podman` provider's settings (none for `ssh`).
    pub(crate) podman: Option<PodmanConfig>,
}

impl Cluster {
    /// Reads and checks the cluster file at `path`.
    pub(crate) fn load(path: &Path) -> Result<Cluster, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the cluster file {}: {e}", path.display()))?;
        let file: ClusterFile = serde_norway::from_str(&text)
            .map_err(|e| format!("the cluster file {} is not valid: {e}", path.display()))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Cluster::check(file, dir).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Fills in the defaults and checks what a run would trip on.
    pub(crate) fn check(mut file: ClusterFile, dir: PathBuf) -> Result<Cluster, String> {
        let name_ok = !file.cluster_name.is_empty()
            && file
                .cluster_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(format!(
                "cluster_name {:?} must be letters, digits, '-' and '_' (it names folders)",
                file.cluster_name
            ));
        }
        let podman = match file.provider.kind.as_str() {
            "ssh" | "local" => {
                let p = &file.provider;
                for (field, given) in [
                    ("image", p.image.is_some()),
                    ("network", p.network.is_some()),
                    ("subnet", p.subnet.is_some()),
                ] {
                    if given {
                        return Err(format!(
                            "provider.{field} is a setting of the podman provider, not of \
                             {:?}: remove it",
                            p.kind
                        ));
                    }
                }
                None
            }
            "podman" => Some(podman_provider(&mut file)?),
            other => {
                return Err(format!(
                    "provider type {other:?} is not known: this version has `ssh` (Ray's \
                     `local`: machines reached over SSH) and `podman` (containers on this \
                     machine); a provider of your own plugs in through the `NodeProvider` \
                     trait (docs/launcher.md)"
                ))
            }
        };
        let head_ip = file
            .provider
            .head_ip
            .clone()
            .filter(|h| !h.trim().is_empty())
            .ok_or("provider.head_ip is missing: the machine the head runs on")?;
        let mut seen = std::collections::BTreeSet::new();
        for host in std::iter::once(&head_ip).chain(&file.provider.worker_ips) {
            if host.trim().is_empty() || host.contains(char::is_whitespace) {
                return Err(format!(
                    "{host:?} in provider is not a host name or address"
                ));
            }
            if !seen.insert(host.clone()) {
                return Err(format!(
                    "host {host} is listed twice in provider (head_ip and worker_ips name \
                     each machine once)"
                ));
            }
        }
        let head_type = file
            .head_node_type
            .clone()
            .unwrap_or_else(|| "head".to_string());
        if file.available_node_types.is_empty() {
            file.available_node_types
                .insert(head_type.clone(), NodeType::default());
            file.available_node_types.insert(
                "worker".into(),
                NodeType {
                    min_workers: file.provider.worker_ips.len() as u32,
                    ..NodeType::default()
                },
            );
        }
        if !file.available_node_types.contains_key(&head_type) {
            return Err(format!(
                "head_node_type {head_type:?} is not one of available_node_types ({})",
                names(&file.available_node_types)
            ));
        }
        let workers: Vec<&String> = file
            .available_node_types
            .keys()
            .filter(|t| **t != head_type)
            .collect();
        let worker_type = match workers.as_slice() {
            [] if file.provider.worker_ips.is_empty() => head_type.clone(),
            [] => {
                return Err(
                    "provider.worker_ips lists machines but available_node_types has no \
                     worker type: add one (resources, min_workers, max_workers)"
                        .into(),
                )
            }
            [one] => (*one).clone(),
            _ => {
                return Err(format!(
                    "the {} provider's machines are all alike: give one worker type, not {}",
                    file.provider.kind,
                    workers.len()
                ))
            }
        };
        for (name, t) in &file.available_node_types {
            for (resource, amount) in &t.resources {
                if !amount.is_finite() || *amount < 0.0 {
                    return Err(format!(
                        "node type {name}: resource {resource} is {amount}; give a number \
                         zero or more"
                    ));
                }
            }
            if let Some(max) = t.max_workers {
                if t.min_workers > max {
                    return Err(format!(
                        "node type {name}: min_workers {} is more than max_workers {max}",
                        t.min_workers
                    ));
                }
            }
        }
        let hosts = file.provider.worker_ips.len() as u32;
        let max_workers = file.max_workers.unwrap_or(hosts);
        for (name, t) in &file.available_node_types {
            let grows = t.max_workers.unwrap_or(max_workers) > t.min_workers;
            if *name != head_type && grows && t.resources.is_empty() {
                return Err(format!(
                    "node type {name} may grow past its min_workers: give its resources \
                     (such as {{CPU: 4}}), which the autoscaler packs waiting work onto"
                ));
            }
        }
        let min: u32 = file
            .available_node_types
            .iter()
            .filter(|(n, _)| **n != head_type)
            .map(|(_, t)| t.min_workers)
            .sum();
        if min > max_workers.min(hosts) {
            return Err(format!(
                "the node types want {min} workers at least, but max_workers is {max_workers} \
                 and provider.worker_ips lists {hosts} machine(s)"
            ));
        }
        for local in file.file_mounts.values() {
            let path = resolve(&dir, local);
            if !path.exists() {
                return Err(format!(
                    "file_mounts names {}, which does not exist here",
                    path.display()
                ));
            }
        }
        if !(file.idle_timeout_minutes.is_finite() && file.idle_timeout_minutes >= 0.0) {
            return Err(format!(
                "idle_timeout_minutes is {}; give a number of minutes, zero or more",
                file.idle_timeout_minutes
            ));
        }
        Ok(Cluster {
            head_type,
            worker_type,
            head_ip,
            max_workers,
            dir,
            file,
            podman,
        })
    }

    /// Whether an autoscaler runs for the cluster: a worker type may have
    /// more nodes than its `min_workers`.
    pub(crate) fn autoscales(&self) -> bool {
        self.file
            .available_node_types
            .iter()
            .filter(|(n, _)| **n != self.head_type)
            .any(|(_, t)| t.max_workers.unwrap_or(self.max_workers) > t.min_workers)
    }

    /// The head's address, HOST:PORT.
    pub(crate) fn head_address(&self) -> String {
        format!("{}:{HEAD_PORT}", self.head_ip)
    }

    /// The worker hosts started by `prism up`: the worker type's
    /// `min_workers` first hosts (at least one per host when the type
    /// asks for none and the cluster caps nothing), bounded by
    /// `max_workers`.
    pub(crate) fn initial_workers(&self) -> Vec<String> {
        if self.worker_type == self.head_type {
            return Vec::new();
        }
        let t = &self.file.available_node_types[&self.worker_type];
        let n = t
            .min_workers
            .min(self.max_workers)
            .min(t.max_workers.unwrap_or(u32::MAX)) as usize;
        self.file
            .provider
            .worker_ips
            .iter()
            .take(n)
            .cloned()
            .collect()
    }

    /// A node type's `prism start` resource flags.
    pub(crate) fn resource_flags(&self, node_type: &str) -> String {
        let Some(t) = self.file.available_node_types.get(node_type) else {
            return String::new();
        };
        let mut flags = Vec::new();
        let mut custom = serde_json::Map::new();
        for (name, amount) in &t.resources {
            match name.as_str() {
                "CPU" => flags.push(format!("--num-cpus {}", amount.floor() as u64)),
                "GPU" => flags.push(format!("--num-gpus {}", amount.floor() as u64)),
                "memory" => flags.push(format!("--memory {}", amount.floor() as u64)),
                "object_store_memory" => {
                    flags.push(format!("--object-store-memory {}", amount.floor() as u64))
                }
                other => {
                    custom.insert(other.to_string(), serde_json::json!(amount));
                }
            }
        }
        if !custom.is_empty() {
            flags.push(format!(
                "--resources {}",
                shell_quote(&serde_json::Value::Object(custom).to_string())
            ));
        }
        flags.join(" ")
    }

    /// The environment a node starts with: in a cluster the autoscaler
    /// may grow, work that fits no live node waits for one (as demand the
    /// autoscaler sees) instead of failing at once.
    fn start_env(&self) -> &'static str {
        if self.autoscales() {
            "PRISM_INFEASIBLE_WAIT_MS=${PRISM_INFEASIBLE_WAIT_MS:-600000} "
        } else {
            ""
        }
    }

    /// The commands that start Prism on the head.
    pub(crate) fn head_start(&self) -> Vec<String> {
        self.file.head_start_commands.clone().unwrap_or_else(|| {
            vec![format!(
                "{}\"$PRISM\" start --head --port {HEAD_PORT} --node-ip-address \"$PRISM_NODE_IP\" {}{}",
                self.start_env(),
                // The autoscaler of containers runs outside the head's
                // container and reads the state API through the network.
                if self.podman.is_some() {
                    "--dashboard-host \"$PRISM_NODE_IP\" "
                } else {
                    ""
                },
                self.resource_flags(&self.head_type)
            )]
        })
    }

    /// The commands that start Prism on a worker.
    pub(crate) fn worker_start(&self) -> Vec<String> {
        self.file.worker_start_commands.clone().unwrap_or_else(|| {
            vec![format!(
                "{}\"$PRISM\" start --address \"$PRISM_HEAD_ADDRESS\" --node-ip-address \
                 \"$PRISM_NODE_IP\" --token-file \"$PRISM_CLUSTER_DIR/token\" {}",
                self.start_env(),
                self.resource_flags(&self.worker_type)
            )]
        })
    }

    /// A fingerprint of what `prism up` puts on a machine of `role`
    /// (`head` or `worker`): when it is unchanged and the node runs, the
    /// machine is left as it is.
    pub(crate) fn fingerprint(&self, role: &str, binary_id: &str) -> Result<String, String> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (role, binary_id, &self.file.setup_commands).hash(&mut h);
        match role {
            "head" => (&self.file.head_setup_commands, self.head_start()).hash(&mut h),
            _ => (
                &self.file.worker_setup_commands,
                self.worker_start(),
                &self.head_ip,
            )
                .hash(&mut h),
        }
        for (remote, local) in &self.file.file_mounts {
            remote.hash(&mut h);
            hash_tree(&resolve(&self.dir, local), &mut h)?;
        }
        Ok(format!("{:016x}", h.finish()))
    }
}

/// Hashes a file's or a folder's names and contents.
fn hash_tree(path: &Path, h: &mut impl std::hash::Hasher) -> Result<(), String> {
    use std::hash::Hash;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            e.file_name().hash(h);
            hash_tree(&e, h)?;
        }
    } else {
        std::fs::read(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .hash(h);
    }
    Ok(())
}

/// Checks the `podman` provider's settings and gives the file the
/// addresses its containers take: the head the subnet's second, the workers
/// the next `max_workers` (the first is the network's gateway).
fn podman_provider(file: &mut ClusterFile) -> Result<PodmanConfig, String> {
    let p = &mut file.provider;
    if p.head_ip.is_some() || !p.worker_ips.is_empty() {
        return Err(
            "the podman provider gives its containers addresses in provider.subnet: remove \
             provider.head_ip and provider.worker_ips"
                .into(),
        );
    }
    let name = &file.cluster_name;
    let subnet = match &p.subnet {
        Some(s) => s.trim().to_string(),
        None => {
            // FNV-1a: the same range for the same name on every run.
            let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            format!("10.89.{}.0/24", 10 + h % 240)
        }
    };
    let (base, prefix) = parse_subnet(&subnet)?;
    let usable = (1u64 << (32 - prefix)).saturating_sub(4);
    let max_workers = file.max_workers.unwrap_or(PODMAN_DEFAULT_MAX_WORKERS);
    if u64::from(max_workers) > usable {
        return Err(format!(
            "provider.subnet {subnet} has room for {usable} workers, and max_workers is \
             {max_workers}: give a wider subnet"
        ));
    }
    file.max_workers = Some(max_workers);
    let addr = |i: u32| std::net::Ipv4Addr::from(u32::from(base) + i).to_string();
    p.head_ip = Some(addr(2));
    p.worker_ips = (0..max_workers).map(|i| addr(3 + i)).collect();
    let image = p
        .image
        .clone()
        .unwrap_or_else(|| "localhost/prism:dev".into());
    let network = p.network.clone().unwrap_or_else(|| format!("prism-{name}"));
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:/@".contains(c))
    };
    if !ok(&image) {
        return Err(format!("provider.image {image:?} is not an image name"));
    }
    if !ok(&network) || network.contains(['/', ':', '@']) {
        return Err(format!(
            "provider.network {network:?} must be letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(PodmanConfig {
        image,
        network,
        subnet,
    })
}

/// `A.B.C.D/P` as its first address and P (16 to 28).
fn parse_subnet(subnet: &str) -> Result<(std::net::Ipv4Addr, u32), String> {
    let bad = || {
        format!(
            "provider.subnet {subnet:?} is not an IPv4 range: give one such as 10.89.7.0/24 \
             (a prefix from /16 to /28)"
        )
    };
    let (ip, prefix) = subnet.split_once('/').ok_or_else(bad)?;
    let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| bad())?;
    let prefix: u32 = prefix.parse().map_err(|_| bad())?;
    if !(16..=28).contains(&prefix) {
        return Err(bad());
    }
    let mask = u32::MAX << (32 - prefix);
    if u32::from(ip) & !mask != 0 {
        return Err(format!(
            "provider.subnet {subnet}: the address must be the range's first, {}/{prefix}",
            std::net::Ipv4Addr::from(u32::from(ip) & mask)
        ));
    }
    Ok((ip, prefix))
}

fn names(types: &BTreeMap<String, NodeType>) -> String {
    types.keys().cloned().collect::<Vec<_>>().join(", ")
}

/// A local path of the cluster file, relative to its folder; `~` is the
/// home folder.
pub(crate) fn resolve(dir: &Path, path: &str) -> PathBuf {
    if let Some(rest) = path.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    dir.join(path)
}

/// `s` as one word for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Cluster, String> {
        let file: ClusterFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        Cluster::check(file, PathBuf::from("."))
    }

    #[test]
    fn a_minimal_file_gets_a_head_and_one_worker_per_host() {
        let c = parse(
            "cluster_name: lab\nprovider: {type: local, head_ip: 10.0.0.1, worker_ips: [10.0.0.2, 10.0.0.3]}\n",
        )
        .expect("a minimal file reads");
        assert_eq!(c.head_type, "head");
        assert_eq!(c.worker_type, "worker");
        assert_eq!(c.initial_workers(), vec!["10.0.0.2", "10.0.0.3"]);
        assert_eq!(c.head_address(), "10.0.0.1:6380");
        assert!(c.head_start()[0].contains("--head"));
        assert!(c.worker_start()[0].contains("$PRISM_HEAD_ADDRESS"));
    }

    #[test]
    fn node_types_give_resources_and_counts() {
        let c = parse(
            "cluster_name: lab\nmax_workers: 1\nprovider: {type: ssh, head_ip: h, worker_ips: [a, b]}\n\
             available_node_types:\n  head: {resources: {CPU: 1}}\n  \
             gpu: {resources: {CPU: 2, GPU: 1, accel: 0.5}, min_workers: 1, max_workers: 2}\n\
             head_node_type: head\n",
        )
        .expect("reads");
        assert_eq!(c.worker_type, "gpu");
        assert_eq!(c.initial_workers(), vec!["a"]);
        let flags = c.resource_flags("gpu");
        assert!(
            flags.contains("--num-cpus 2") && flags.contains("--num-gpus 1"),
            "{flags}"
        );
        assert!(flags.contains(r#"--resources '{"accel":0.5}'"#), "{flags}");
        assert_eq!(c.resource_flags("head"), "--num-cpus 1");
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            ("cluster_name: 'a b'\nprovider: {type: ssh, head_ip: h}\n", "cluster_name"),
            ("cluster_name: a\nprovider: {type: aws, head_ip: h}\n", "provider type \"aws\""),
            ("cluster_name: a\nprovider: {type: ssh}\n", "head_ip is missing"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h, worker_ips: [h]}\n", "listed twice"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h}\nhead_node_type: x\navailable_node_types: {y: {}}\n", "head_node_type \"x\""),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h, worker_ips: [w]}\navailable_node_types: {head: {}, w: {min_workers: 3}}\n", "want 3 workers"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h}\nfile_mounts: {/x: /no/such/file}\n", "does not exist"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h}\nmin_workerz: 1\n", "unknown field"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h}\navailable_node_types: {head: {resources: {CPU: -1}}}\n", "zero or more"),
            ("cluster_name: a\nprovider: {type: ssh, head_ip: h, worker_ips: [w]}\navailable_node_types: {head: {}, w: {max_workers: 1}}\n", "give its resources"),
        ];
        for (text, want) in cases {
            let e = parse(text).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn the_podman_provider_gives_addresses_in_its_subnet() {
        let c = parse(
            "cluster_name: lab\nmax_workers: 3\nprovider: {type: podman, subnet: 10.89.7.0/24}\n\
             available_node_types: {head: {}, w: {resources: {CPU: 1}, max_workers: 3}}\n",
        )
        .expect("reads");
        assert_eq!(c.head_ip, "10.89.7.2");
        assert_eq!(
            c.file.provider.worker_ips,
            ["10.89.7.3", "10.89.7.4", "10.89.7.5"]
        );
        let p = c.podman.as_ref().expect("podman settings");
        assert_eq!(p.image, "localhost/prism:dev");
        assert_eq!(p.network, "prism-lab");
        assert!(c.head_start()[0].contains("--dashboard-host"));
        // The same name, the same range; another name, most likely another.
        let a = parse("cluster_name: lab\nprovider: {type: podman}\n").expect("reads");
        let again = parse("cluster_name: lab\nprovider: {type: podman}\n").expect("reads");
        assert_eq!(a.head_ip, again.head_ip);
        assert!(a.head_ip.starts_with("10.89.") && a.head_ip.ends_with(".2"));
        assert_eq!(a.max_workers, 2);
        for (text, says) in [
            (
                "cluster_name: a\nprovider: {type: podman, head_ip: h}\n",
                "remove provider.head_ip",
            ),
            (
                "cluster_name: a\nprovider: {type: podman, subnet: 10.89.7.1/24}\n",
                "range's first",
            ),
            (
                "cluster_name: a\nprovider: {type: podman, subnet: 10.89.7.0/30}\n",
                "/16 to /28",
            ),
            (
                "cluster_name: a\nprovider: {type: podman, subnet: fe80::/64}\n",
                "not an IPv4 range",
            ),
            (
                "cluster_name: a\nmax_workers: 20\nprovider: {type: podman, subnet: 10.1.1.0/28}\n",
                "room for 12",
            ),
            (
                "cluster_name: a\nprovider: {type: ssh, head_ip: h, image: x}\n",
                "provider.image is a setting of the podman",
            ),
            (
                "cluster_name: a\nprovider: {type: podman, network: 'a/b'}\n",
                "provider.network",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn the_fingerprint_follows_what_is_put_on_a_machine() {
        let a = parse("cluster_name: a\nprovider: {type: ssh, head_ip: h, worker_ips: [w]}\n")
            .expect("reads");
        let b = parse("cluster_name: a\nprovider: {type: ssh, head_ip: h, worker_ips: [w]}\nsetup_commands: [echo hi]\n").expect("reads");
        let fa = a.fingerprint("worker", "id1").expect("hashes");
        assert_eq!(fa, a.fingerprint("worker", "id1").expect("hashes"));
        assert_ne!(fa, a.fingerprint("worker", "id2").expect("hashes"));
        assert_ne!(fa, b.fingerprint("worker", "id1").expect("hashes"));
        assert_ne!(fa, a.fingerprint("head", "id1").expect("hashes"));
    }
}
