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

/// Makes a fresh session directory and updates `session_latest`.
pub(crate) fn new_session_dir(temp_dir: &Path) -> Result<PathBuf> {
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
    Ok(dir)
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
