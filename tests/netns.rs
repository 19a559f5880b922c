//! Test hosts in network namespaces: each host has its own network stack
//! and address (10.77.0.<n>/24) on a bridge that lives in a namespace of
//! its own, so tests never touch the machine's own interfaces. A host can
//! be cut off (its link taken down) and joined again. Everything is removed
//! when the [`Network`] is dropped. Needs root (CI runs as root) and
//! iproute2's `ip`.

use std::process::Command;

/// A bridge and the hosts on it.
#[derive(Debug)]
pub struct Network {
    switch: String,
    hosts: Vec<Host>,
}

/// One test host.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its namespace, for `ip netns exec`.
    pub ns: String,
    /// Its address.
    pub ip: String,
    /// Its link's end on the bridge.
    port: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Network {
    /// Whether namespaces can be made here (root, with `ip`).
    pub fn available() -> Result<(), String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        ip(&["netns", "list"])
    }

    /// Makes `n` hosts, named after `tag` and this process's pid so that
    /// concurrent tests never share one.
    pub fn create(tag: &str, n: usize) -> Result<Network, String> {
        Network::available()?;
        let base = format!("p{}{tag}", std::process::id());
        let switch = format!("{base}-sw");
        let mut net = Network {
            switch: switch.clone(),
            hosts: Vec::new(),
        };
        ip(&["netns", "add", &switch])?;
        ip(&["-n", &switch, "link", "set", "lo", "up"])?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let ns = format!("{base}-h{i}");
            let port = format!("v{i}");
            let addr = format!("10.77.0.{}", i + 1);
            ip(&["netns", "add", &ns])?;
            net.hosts.push(Host {
                ns: ns.clone(),
                ip: addr.clone(),
                port: port.clone(),
            });
            ip(&[
                "link", "add", &port, "netns", &switch, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &switch, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The hosts, in order (host 0 is 10.77.0.1).
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A command that runs `program` on host `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].ns]).arg(program);
        c
    }

    /// The processes in host `i`'s namespace, with their names
    /// (`/proc/<pid>/comm`).
    pub fn processes(&self, i: usize) -> Vec<(i32, String)> {
        let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.hosts[i].ns])
            .output()
        else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                Some((pid.parse().ok()?, comm.trim().to_string()))
            })
            .collect()
    }

    /// Kills (SIGKILL) every process left in the hosts' namespaces: what a
    /// failed test left running there.
    pub fn kill_all(&self) {
        for i in 0..self.hosts.len() {
            for (pid, _) in self.processes(i) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    /// Takes host `i`'s link down: nothing reaches it, nothing leaves it.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &self.hosts[i].port,
            "down",
        ])
    }

    /// Brings host `i`'s link back.
    pub fn join(&self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].port, "up"])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = ip(&["netns", "del", &self.switch]);
    }
}
