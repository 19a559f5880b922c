//! Session directories and per-process log files.
//!
//! Each `init` without an address makes a session directory,
//! `<temp_dir>/session_<unix-seconds>_<pid>`, and points
//! `<temp_dir>/session_latest` at it. Inside, `logs/` holds one `tracing`
//! log per process (`driver-<pid>.log`, which also carries the embedded
//! raylet's events, and `worker-<id>.log`) plus every worker's captured
//! stdout and stderr (`worker-<id>.out`, `.err`); `sockets/` holds the Unix
//! sockets. The level is set by `PRISM_LOG` (a `tracing` filter, default
//! `info`).

use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Makes a fresh session directory and updates `session_latest`; of the
/// sessions that ended, the newest `kept` stay and older ones are removed.
pub(crate) fn new_session_dir(temp_dir: &Path, kept: usize) -> Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = format!(
        "session_{secs}_{}_{:04x}",
        std::process::id(),
        rand_suffix()
    );
    let dir = temp_dir.join(&name);
    prism_protocol::guard::private_dir(temp_dir)
        .map_err(|e| Error::io(format!("use {} for sessions", temp_dir.display()), e))?;
    std::fs::create_dir_all(dir.join("logs"))
        .map_err(|e| Error::io(format!("create session directory {}", dir.display()), e))?;
    // Its sockets and logs are this user's alone: other users of the
    // machine can neither connect to the raylet nor read the output.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io(format!("make {} private", dir.display()), e))?;
    let latest = temp_dir.join("session_latest");
    let _ = std::fs::remove_file(&latest);
    let _ = std::os::unix::fs::symlink(&name, &latest);
    for old in ended_sessions(temp_dir).into_iter().rev().skip(kept) {
        if let Err(e) = std::fs::remove_dir_all(&old) {
            tracing::debug!(session = %old.display(), error = %e, "could not remove an old session");
        }
    }
    Ok(dir)
}

/// The session folders of `temp_dir` whose process has ended, oldest
/// first. A session is named `session_<unix-seconds>_<pid>_<suffix>` by the
/// process that made it (a driver, or a node); it is in use while that
/// process lives.
fn ended_sessions(temp_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(temp_dir) else {
        return Vec::new();
    };
    let mut ended: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let mut parts = name.strip_prefix("session_")?.split('_');
            let secs: u64 = parts.next()?.parse().ok()?;
            let pid: u32 = parts.next()?.parse().ok()?;
            let is_dir = entry.file_type().ok()?.is_dir();
            let alive = Path::new(&format!("/proc/{pid}")).exists();
            (is_dir && !alive).then(|| (secs, entry.path()))
        })
        .collect();
    ended.sort();
    ended.into_iter().map(|(_, path)| path).collect()
}

fn rand_suffix() -> u16 {
    (uuid::Uuid::new_v4().as_u128() & 0xffff) as u16
}

/// Sends this process's `tracing` events to `logs/<file_name>` unless the
/// program installed its own subscriber.
pub(crate) fn init_file_logging(session_dir: &Path, file_name: &str) {
    let path = session_dir.join("logs").join(file_name);
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRISM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_beyond_the_newest_kept_are_removed_and_live_ones_stay() {
        let temp = std::env::temp_dir().join(format!("prism-sessions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&temp);
        // Ended: a pid above any the kernel hands out.
        let dead = 4_194_304 + 7;
        for secs in 100..112 {
            std::fs::create_dir_all(temp.join(format!("session_{secs}_{dead}_abcd/logs")))
                .expect("make an old session");
        }
        // In use: this process's, older than all of them.
        let live = temp.join(format!("session_50_{}_beef", std::process::id()));
        std::fs::create_dir_all(&live).expect("make a live session");
        let new = new_session_dir(&temp, 3).expect("a new session");
        let mut left: Vec<String> = std::fs::read_dir(&temp)
            .expect("read")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("session_") && n != "session_latest")
            .collect();
        left.sort();
        let old: Vec<&String> = left
            .iter()
            .filter(|n| n.contains(&format!("_{dead}_")))
            .collect();
        assert_eq!(old.len(), 3, "the newest 3 ended sessions stay: {left:?}");
        assert!(
            old.iter().all(|n| n.starts_with("session_109_")
                || n.starts_with("session_110_")
                || n.starts_with("session_111_")),
            "{left:?}"
        );
        assert!(live.exists(), "a session in use is never removed");
        assert!(new.exists());
        std::fs::remove_dir_all(&temp).expect("clean up");
    }
}
