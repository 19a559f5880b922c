//! The memory monitor: how full the node's memory is, read from the
//! kernel (the machine's `/proc/meminfo`, and the memory limit of the
//! raylet's cgroup when it has one), so the raylet can stop a task worker
//! before the kernel's out-of-memory killer picks a process itself (perhaps
//! the raylet or the driver).

use prism_protocol::error::Error;
use std::time::Duration;

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
    cgroup_dir: Option<std::path::PathBuf>,
}

impl Probe {
    pub(crate) fn new() -> Probe {
        let cgroup_dir = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|own| {
                let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
                Some(std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')))
            });
        Probe { cgroup_dir }
    }

    /// The fuller of the machine's memory and the raylet's cgroup's limit.
    pub(crate) fn read(&self) -> Option<MemoryUse> {
        let system = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| from_meminfo(&text));
        let group = self.cgroup_dir.as_deref().and_then(cgroup);
        match (system, group) {
            (Some(s), Some(g)) if g.fraction() > s.fraction() => Some(g),
            (Some(s), _) => Some(s),
            (None, g) => g,
        }
    }
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

/// The cgroup (v2) limit and usage, when the group at `dir` has a limit.
fn cgroup(dir: &std::path::Path) -> Option<MemoryUse> {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let total = read("memory.max")?; // "max" (no limit) does not parse
    let used = read("memory.current")?;
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
