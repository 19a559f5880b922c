//! A job's entrypoint as a process: started through the shell in a
//! process group of its own, its output appended to the job's log, its
//! exit status written to a file beside it (so that a head started again
//! learns how a job it did not start ended), and stopped by signals to the
//! whole group.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// How long a stopped job is given after SIGTERM before SIGKILL (Ray's
/// grace, 3 s).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);

/// What a job's process needs.
pub(crate) struct Launch<'a> {
    pub(crate) entrypoint: &'a str,
    pub(crate) cwd: &'a Path,
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) log: &'a Path,
    pub(crate) exit_status: &'a Path,
}

/// Starts the entrypoint. The outer shell runs it with `sh -c`, then
/// writes its status; a signal to the group ends both, and then no status
/// is written.
pub(crate) fn spawn(launch: &Launch<'_>) -> std::io::Result<tokio::process::Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.log)?;
    let err = log.try_clone()?;
    let mut command = tokio::process::Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(
            r#"/bin/sh -c "$1"; s=$?; echo "$s" > "$2.partial" && mv "$2.partial" "$2"; exit "$s""#,
        )
        .arg("prism-job")
        .arg(launch.entrypoint)
        .arg(launch.exit_status)
        .current_dir(launch.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(false);
    // The control store's own settings are not the job's.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PRISM_") {
            command.env_remove(&key);
        }
    }
    command.envs(launch.env);
    command.spawn()
}

/// When process `pid` started, in clock ticks since boot, if it runs (the
/// node records' own reading of `/proc/<pid>/stat`).
pub(crate) use prism_raylet::start_ticks;

/// Whether the process `pid` that started at `ticks` still runs.
pub(crate) fn still_runs(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// Sends `signal` to the process group `pgid`; false when none is left.
pub(crate) fn signal_group(pgid: u32, signal: i32) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill has no memory effects; a negative pid names a group.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Whether a process of group `pgid` still runs (zombies waiting for
/// the init process to reap them do not count).
pub(crate) fn group_runs(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return signal_group(pgid, 0);
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return false;
        };
        // Fields from the third: state, parent, process group.
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let group = fields.nth(1);
        state.is_some_and(|s| s != "Z" && s != "X") && group == Some(pgid.to_string().as_str())
    })
}

/// The exit status a job's outer shell wrote, if it did.
pub(crate) fn written_status(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_gone_one_has_none() {
        let me = std::process::id();
        let ticks = start_ticks(me).expect("this process runs");
        assert!(still_runs(me, ticks));
        assert!(!still_runs(me, ticks + 1));
        assert_eq!(start_ticks(u32::MAX - 1), None);
    }
}
