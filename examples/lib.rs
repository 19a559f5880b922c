//! Runnable Prism programs; see the `[[example]]` entries of this package:
//! `cargo run --release --example quickstart`, `pi`, `pipeline`,
//! `microbenchmark`, `scaling`, `recovery`, `spill`, `chaos`. This library
//! holds what the benchmarks share.

/// Reading process facts from `/proc`, for the memory figures.
pub mod proc_stats {
    /// The processes whose parent is this process (its workers).
    pub fn children() -> Vec<u32> {
        let me = std::process::id().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let ppid = stat
                    .rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .to_string();
                (ppid == me).then_some(pid)
            })
            .collect()
    }

    /// A `kB` field of a `/proc/<pid>/` file (`status`, `smaps_rollup`), 0 if absent.
    pub fn field_kib(pid: u32, file: &str, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Proportional set size of a process, in KiB.
    pub fn pss_kib(pid: u32) -> u64 {
        field_kib(pid, "smaps_rollup", "Pss:")
    }
}
