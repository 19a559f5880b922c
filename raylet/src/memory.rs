//! The memory monitor: how full the node's memory is, read from the
//! kernel (the machine's `/proc/meminfo`, and the memory limit of the
//! raylet's cgroup when it has one), so the raylet can stop a task worker
//! before the kernel's out-of-memory killer picks a process itself (perhaps
//! the raylet or the driver).

use prism_protocol::error::Error;
use prism_protocol::ids::WorkerId;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What the memory monitor acts on (the node, which implements it).
pub(crate) trait Relief: Send + Sync + 'static {
    /// Stops the worker of the newest task lease, recording `reason` as
    /// why it exited; the worker and pid stopped, if there was one.
    fn stop_newest_task(self: &Arc<Self>, reason: &str) -> Option<(WorkerId, u32)>;
}

/// Reads the node's memory every `watch.refresh` (not at all when it is
/// zero) and, above `watch.threshold`, has `node` stop the worker of its
/// newest task lease (the task is retried like after any worker death),
/// until the node is gone.
pub(crate) fn watch<N: Relief>(watch: MemoryMonitorConfig, node: Weak<N>) {
    if watch.refresh.is_zero() {
        return;
    }
    let probe = Probe::new();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(watch.refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else {
                return;
            };
            let Some(memory) = probe.read() else {
                continue;
            };
            if memory.fraction() <= watch.threshold {
                continue;
            }
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            let reason = format!(
                "stopped by the memory monitor: the node's memory use, {:.2} GiB of {:.2} GiB \
                 ({:.1}%), passed memory_usage_threshold = {}; the newest task is stopped first",
                gib(memory.used),
                gib(memory.total),
                memory.fraction() * 100.0,
                watch.threshold
            );
            if let Some((worker, pid)) = node.stop_newest_task(&reason) {
                tracing::warn!(%worker, pid, %reason, "stopping a task worker");
            }
        }
    });
}

/// How the memory monitor watches a node.
#[derive(Debug, Clone)]
pub struct MemoryMonitorConfig {
    /// Fraction of memory in use, in (0, 1], above which the newest task's
    /// worker is stopped.
    pub threshold: f64,
    /// How often memory is read; zero turns the monitor off.
    pub refresh: Duration,
}

impl MemoryMonitorConfig {
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.threshold > 0.0 && self.threshold <= 1.0 {
            return Ok(());
        }
        Err(Error::invalid(
            "memory_usage_threshold",
            format!(
                "{}: give a fraction of the node's memory in (0, 1], such as 0.95",
                self.threshold
            ),
        ))
    }
}

/// Memory in use and in total, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MemoryUse {
    pub(crate) used: u64,
    pub(crate) total: u64,
}

impl MemoryUse {
    pub(crate) fn fraction(&self) -> f64 {
        self.used as f64 / self.total.max(1) as f64
    }
}

/// Where the node's memory is read from; the raylet's cgroup is found
/// once, at start-up.
#[derive(Debug)]
pub(crate) struct Probe {
    /// The cgroup folders that may hold the raylet's memory limit, each
    /// with its limit and usage files, in the order they are tried.
    groups: Vec<(std::path::PathBuf, &'static str, &'static str)>,
}

impl Probe {
    pub(crate) fn new() -> Probe {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Probe {
            groups: cgroup_dirs(&own, std::path::Path::new("/sys/fs/cgroup")),
        }
    }

    /// The fuller of the machine's memory and the raylet's cgroup's limit.
    pub(crate) fn read(&self) -> Option<MemoryUse> {
        let system = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| from_meminfo(&text));
        let group = self
            .groups
            .iter()
            .find_map(|(dir, limit, usage)| cgroup(dir, limit, usage));
        match (system, group) {
            (Some(s), Some(g)) if g.fraction() > s.fraction() => Some(g),
            (Some(s), _) => Some(s),
            (None, g) => g,
        }
    }
}

/// The folders where the raylet's cgroup (named by `own`, the text of
/// `/proc/self/cgroup`) keeps its memory limit under `root`: cgroup v2's
/// group (`memory.max`, `memory.current`), v1's memory controller's group
/// (`memory.limit_in_bytes`, `memory.usage_in_bytes`), then each
/// hierarchy's root, which is the container's own group when it runs
/// without a cgroup namespace.
fn cgroup_dirs(
    own: &str,
    root: &std::path::Path,
) -> Vec<(std::path::PathBuf, &'static str, &'static str)> {
    const V2: (&str, &str) = ("memory.max", "memory.current");
    const V1: (&str, &str) = ("memory.limit_in_bytes", "memory.usage_in_bytes");
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            dirs.push((root.join(path), V2.0, V2.1));
        } else if controllers.split(',').any(|c| c == "memory") {
            dirs.push((root.join("memory").join(path), V1.0, V1.1));
            dirs.push((root.join("memory"), V1.0, V1.1));
        }
    }
    dirs.push((root.to_path_buf(), V2.0, V2.1));
    dirs
}

/// `MemTotal - MemAvailable` of `MemTotal`, as Ray counts it.
fn from_meminfo(text: &str) -> Option<MemoryUse> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some(MemoryUse {
        used: total.saturating_sub(available),
        total,
    })
}

/// A cgroup's limit and usage (from the files named `limit` and `usage`
/// in `dir`), when it has a limit: v2's "max" and v1's page-rounded
/// i64::MAX mean none.
fn cgroup(dir: &std::path::Path, limit: &str, usage: &str) -> Option<MemoryUse> {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let total = read(limit).filter(|t| *t < 1 << 60)?;
    let used = read(usage)?;
    Some(MemoryUse { used, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_use_is_total_minus_available() {
        let text = "MemTotal:       1000 kB\nMemFree:  100 kB\nMemAvailable:    250 kB\n";
        let m = from_meminfo(text).unwrap();
        assert_eq!((m.used, m.total), (750 * 1024, 1000 * 1024));
        assert!((m.fraction() - 0.75).abs() < 1e-9);
        assert!(from_meminfo("MemTotal: 5 kB\n").is_none());
        assert!(
            Probe::new().read().is_some_and(|m| m.total > 0),
            "this machine's memory is readable"
        );
    }

    #[test]
    fn a_containers_limit_is_read_from_cgroup_v2_or_v1() {
        let root = std::env::temp_dir().join(format!("prism-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        };
        // v1 without a cgroup namespace: the group's path is not there, the
        // mount's root is the container's own group.
        write("memory/memory.limit_in_bytes", "1073741824\n");
        write("memory/memory.usage_in_bytes", "268435456\n");
        // v2 at the (hybrid) root has no limit.
        write("memory.max", "max\n");
        let own = "4:memory:/kubepods/pod1/c1\nbad line\n0::/\n";
        let probe = Probe {
            groups: cgroup_dirs(own, &root),
        };
        let found = probe
            .groups
            .iter()
            .find_map(|(dir, limit, usage)| cgroup(dir, limit, usage));
        assert_eq!(
            found,
            Some(MemoryUse {
                used: 256 << 20,
                total: 1 << 30
            })
        );
        // v2 inside a namespace.
        write("memory.max", "536870912\n");
        write("memory.current", "134217728\n");
        let v2 = cgroup_dirs("0::/\n", &root);
        let found = v2
            .iter()
            .find_map(|(dir, limit, usage)| cgroup(dir, limit, usage));
        assert_eq!(
            found.map(|m| (m.used, m.total)),
            Some((128 << 20, 512 << 20))
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_threshold_outside_zero_to_one_is_refused_by_name() {
        let bad = MemoryMonitorConfig {
            threshold: 1.2,
            refresh: Duration::from_millis(250),
        };
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("memory_usage_threshold"));
        let zero = MemoryMonitorConfig {
            threshold: 0.0,
            ..bad.clone()
        };
        assert!(zero.check().is_err());
        let good = MemoryMonitorConfig {
            threshold: 0.95,
            ..bad
        };
        assert!(good.check().is_ok());
    }
}
