//! The `podman` provider: each node of the cluster is a container on this
//! machine, on a network of its own where every container has a fixed
//! address (the head the subnet's second, workers the ones after), so that
//! the launcher names nodes by address as it does with SSH. Commands run
//! in a container through `podman exec` in place of SSH. The image needs
//! a POSIX shell and the usual tools (`deploy/image/build.sh` makes one,
//! the default `localhost/prism:dev`); the `prism` binary the launcher
//! runs is mounted in, read-only, so a container needs no copy of it.
//!
//! Podman itself holds the provider's state: the containers carry the
//! cluster's name, their node type and their address as labels.

use super::cluster_file::PodmanConfig;
use super::provider::{NodeProvider, ProviderNode, HEAD_TYPE_TAG};
use super::ssh::{bounded, last_lines, Bounded, Ran};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// How long one podman command (a container's start, a listing) may take.
const PODMAN_LIMIT: Duration = Duration::from_secs(120);
const LABEL_CLUSTER: &str = "prism-cluster";
const LABEL_TYPE: &str = "prism-node-type";
const LABEL_HOST: &str = "prism-host";
/// Where the launcher's binary is mounted in a container.
const BINARY_MOUNT: &str = "/opt/prism/bin";

/// The cluster's containers and how to run commands in them.
#[derive(Debug, Clone)]
pub(crate) struct Podman {
    cluster: String,
    config: PodmanConfig,
    head: String,
    workers: Vec<String>,
    binary: PathBuf,
    binary_id: String,
}

impl Podman {
    /// The containers of cluster `cluster`: the head at address `head`,
    /// workers at `workers`, running `binary` (whose build is
    /// `binary_id`).
    pub(crate) fn new(
        cluster: &str,
        config: PodmanConfig,
        head: &str,
        workers: &[String],
        binary: PathBuf,
        binary_id: &str,
    ) -> Podman {
        Podman {
            cluster: cluster.to_string(),
            config,
            head: head.to_string(),
            workers: workers.to_vec(),
            binary,
            binary_id: binary_id.to_string(),
        }
    }

    /// The container of the node at `host`.
    pub(crate) fn container(&self, host: &str) -> String {
        format!("prism-{}-{}", self.cluster, host.replace(['.', ':'], "-"))
    }

    fn podman(&self, what: &str, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new("podman");
        c.args(args);
        match bounded(c, None, PODMAN_LIMIT) {
            Err(Bounded::Spawn(e)) => Err(format!(
                "cannot run podman ({e}): install it (Debian: apt-get install podman), or use \
                 the ssh provider"
            )),
            Err(Bounded::TimedOut) => Err(format!(
                "podman {what} took longer than {} s and was stopped",
                PODMAN_LIMIT.as_secs()
            )),
            Ok(f) if f.status.success() => Ok(f.stdout),
            Ok(f) => Err(format!(
                "podman {what} failed: {}",
                last_lines(f.stderr.trim(), 10)
            )),
        }
    }

    /// Makes the cluster's network when it is missing; one that exists
    /// must hold the cluster's subnet.
    fn ensure_network(&self) -> Result<(), String> {
        let net = &self.config.network;
        let names = self.podman("network ls", &["network", "ls", "--format", "{{.Name}}"])?;
        if names.lines().any(|l| l.trim() == net) {
            let inspect = self.podman("network inspect", &["network", "inspect", net])?;
            let parsed: serde_json::Value = serde_json::from_str(&inspect)
                .map_err(|e| format!("podman network inspect {net} gave no JSON: {e}"))?;
            let subnets: Vec<String> = parsed
                .as_array()
                .and_then(|a| a.first())
                .and_then(|n| n["subnets"].as_array())
                .map(|s| {
                    s.iter()
                        .filter_map(|s| s["subnet"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            if !subnets.contains(&self.config.subnet) {
                return Err(format!(
                    "the podman network {net} exists with the range(s) {subnets:?}, not \
                     provider.subnet {}: set provider.subnet to its range, or \
                     provider.network to another name",
                    self.config.subnet
                ));
            }
            return Ok(());
        }
        self.podman(
            "network create",
            &[
                "network",
                "create",
                "--subnet",
                &self.config.subnet,
                "--label",
                &format!("{LABEL_CLUSTER}={}", self.cluster),
                net,
            ],
        )
        .map(drop)
        .map_err(|e| {
            format!(
                "{e}\nIf another network uses the range {}, set provider.subnet to a free one",
                self.config.subnet
            )
        })
    }

    /// Starts the container of a node of `node_type` at `host`, with the
    /// launcher's binary mounted in and linked where the launcher's
    /// scripts look for it.
    fn create(&self, host: &str, node_type: &str) -> Result<(), String> {
        let name = self.container(host);
        let mount = format!(
            "{}:{BINARY_MOUNT}/{}/prism:ro",
            self.binary.display(),
            self.binary_id
        );
        let labels = [
            format!("{LABEL_CLUSTER}={}", self.cluster),
            format!("{LABEL_TYPE}={node_type}"),
            format!("{LABEL_HOST}={host}"),
        ];
        let mut args = vec![
            "run",
            "-d",
            "--replace", // a stopped container of the same name
            "--init",    // reaps the nodes' processes
            "--name",
            &name,
            "--hostname",
            &name,
            "--network",
            &self.config.network,
            "--ip",
            host,
        ];
        for l in &labels {
            args.extend(["--label", l.as_str()]);
        }
        args.extend([
            "-v",
            &mount,
            "--entrypoint",
            "sleep",
            &self.config.image,
            "2147483647",
        ]);
        let image = &self.config.image;
        // An image of this machine's own (`localhost/`) is never pulled.
        if image.starts_with("localhost/")
            && self
                .podman("image exists", &["image", "exists", image])
                .is_err()
        {
            return Err(format!(
                "the image {image} is not on this machine: build it with `bash \
                 deploy/image/build.sh` (or name another in provider.image)"
            ));
        }
        self.podman("run", &args).map_err(|e| {
            if e.contains("image not known") || e.contains("initializing source") {
                format!(
                    "the image {image} could not be found or pulled: build it with `bash \
                     deploy/image/build.sh` (or name another in provider.image). {e}"
                )
            } else if e.contains("container-init") || e.contains("catatonit") {
                format!("{e}\npodman's --init needs catatonit (Debian: apt-get install catatonit)")
            } else {
                e
            }
        })?;
        let link = format!(
            "set -e\nmkdir -p \"$HOME/.prism/bin/{id}\"\n\
             ln -sf {BINARY_MOUNT}/{id}/prism \"$HOME/.prism/bin/{id}/prism\"\n",
            id = self.binary_id
        );
        self.run(host, "linking prism", &link, None, PODMAN_LIMIT)
            .map(drop)
    }

    fn remove(&self, host: &str) -> Result<(), String> {
        self.podman(
            "rm",
            &[
                "rm",
                "--force",
                "--ignore",
                "-t",
                "2",
                &self.container(host),
            ],
        )
        .map(drop)
    }

    /// The cluster's running containers.
    fn listed(&self) -> Result<Vec<ProviderNode>, String> {
        let filter = format!("label={LABEL_CLUSTER}={}", self.cluster);
        let out = self.podman("ps", &["ps", "--filter", &filter, "--format", "json"])?;
        let parsed: serde_json::Value = serde_json::from_str(out.trim())
            .map_err(|e| format!("podman ps gave no JSON ({e}): {}", last_lines(&out, 3)))?;
        Ok(parsed
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|c| {
                let labels = &c["Labels"];
                Some(ProviderNode {
                    host: labels[LABEL_HOST].as_str()?.to_string(),
                    node_type: labels[LABEL_TYPE].as_str()?.to_string(),
                })
            })
            .collect())
    }

    /// Runs `script` with `sh` in the container of `host`, feeding it
    /// `input`, for at most `limit`. `step` names it in errors.
    pub(crate) fn run(
        &self,
        host: &str,
        step: &str,
        script: &str,
        input: Option<&mut dyn std::io::Read>,
        limit: Duration,
    ) -> Result<Ran, String> {
        let name = self.container(host);
        let mut c = Command::new("podman");
        c.arg("exec");
        if input.is_some() {
            c.arg("-i");
        }
        c.args([&name, "sh", "-c", script]);
        let f = match bounded(c, input, limit) {
            Ok(f) => f,
            Err(Bounded::Spawn(e)) => {
                return Err(format!(
                    "cannot run podman ({e}): install it (Debian: apt-get install podman)"
                ))
            }
            Err(Bounded::TimedOut) => {
                return Err(format!(
                    "{step} in {name} took longer than {} s and was stopped",
                    limit.as_secs()
                ))
            }
        };
        if f.status.success() {
            return Ok(Ran { stdout: f.stdout });
        }
        let why = last_lines(f.stderr.trim(), 20);
        Err(match f.status.code() {
            // podman exec's own failures: no such container, or not
            // running.
            Some(125) => format!(
                "the container {name} of node {host} does not run ({why}); `prism up` makes it \
                 again"
            ),
            Some(126) | Some(127) if why.contains("sh") => format!(
                "the image {} has no `sh` to run {step} with ({why}): use an image with a \
                 POSIX shell, such as deploy/image/build.sh's",
                self.config.image
            ),
            code => format!(
                "{step} in {name} failed (exit status {}): {why}",
                code.unwrap_or(-1)
            ),
        })
    }

    /// Replaces this process with `podman exec` running `script` in the
    /// container of `host`, with a terminal when this process has one.
    /// Returns only on failure.
    pub(crate) fn hand_over(&self, host: &str, script: &str) -> std::io::Error {
        use std::io::IsTerminal;
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("podman");
        c.args(["exec", "-i"]);
        if std::io::stdin().is_terminal() {
            c.arg("-t");
        }
        c.args([&self.container(host), "sh", "-c", script]);
        c.exec()
    }

    /// Removes the cluster's network when no container of the cluster is
    /// left and the launcher made it.
    fn remove_network(&self) -> Result<(), String> {
        if !self.listed()?.is_empty() {
            return Ok(());
        }
        let net = &self.config.network;
        let filter = format!("label={LABEL_CLUSTER}={}", self.cluster);
        let ours = self.podman(
            "network ls",
            &[
                "network",
                "ls",
                "--filter",
                &filter,
                "--format",
                "{{.Name}}",
            ],
        )?;
        if ours.lines().any(|l| l.trim() == net) {
            self.podman("network rm", &["network", "rm", net])?;
        }
        Ok(())
    }
}

/// The `podman` provider: containers of this machine.
pub(crate) struct PodmanProvider {
    podman: Podman,
}

impl PodmanProvider {
    pub(crate) fn new(podman: Podman) -> PodmanProvider {
        PodmanProvider { podman }
    }
}

impl NodeProvider for PodmanProvider {
    fn nodes(&self) -> Result<Vec<ProviderNode>, String> {
        self.podman.listed()
    }

    fn create_nodes(&mut self, node_type: &str, count: usize) -> Result<Vec<ProviderNode>, String> {
        let p = &self.podman;
        let used: Vec<String> = p.listed()?.into_iter().map(|n| n.host).collect();
        let free: Vec<String> = if node_type == HEAD_TYPE_TAG {
            vec![p.head.clone()]
        } else {
            p.workers.clone()
        }
        .into_iter()
        .filter(|h| !used.contains(h))
        .take(count)
        .collect();
        if free.len() < count {
            return Err(format!(
                "the podman provider has room for {} more node(s) of type {node_type}, not \
                 {count}: raise max_workers",
                free.len()
            ));
        }
        p.ensure_network()?;
        let mut made: Vec<ProviderNode> = Vec::new();
        for host in free {
            if let Err(e) = p.create(&host, node_type) {
                let _ = p.remove(&host);
                for n in &made {
                    let _ = p.remove(&n.host);
                }
                return Err(e);
            }
            made.push(ProviderNode {
                host,
                node_type: node_type.to_string(),
            });
        }
        Ok(made)
    }

    fn terminate_node(&mut self, host: &str) -> Result<(), String> {
        self.podman.remove(host)
    }

    fn adopt(&mut self, _host: &str, _node_type: &str) -> Result<(), String> {
        // The containers' labels say what each is.
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.podman.remove_network()
    }
}
