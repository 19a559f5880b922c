//! `prism stop`: this machine's node processes, asked to leave (SIGTERM),
//! then killed if they have not stopped after the grace period.

use crate::args::StopArgs;
use prism_raylet::NodeRecord;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub(crate) fn run(args: StopArgs) -> Result<ExitCode, String> {
    let temp = &args.temp.temp_dir;
    if temp.exists() {
        // Records in a folder another user controls could name any process.
        prism_protocol::guard::private_dir(temp)
            .and_then(|()| prism_protocol::guard::private_dir(&NodeRecord::dir(temp)))
            .map_err(|e| e.to_string())?;
    }
    let (records, foreign): (Vec<NodeRecord>, Vec<NodeRecord>) = NodeRecord::list(temp)
        .into_iter()
        .partition(|r| is_node_process(r.pid));
    for r in &foreign {
        eprintln!(
            "prism: the record of node {} names pid {}, which is not a Prism node of yours; \
             it is left alone and its record removed",
            r.node_id, r.pid
        );
        r.remove(temp);
    }
    if records.is_empty() {
        say!(
            "No Prism node runs on this machine (none recorded in {}).",
            NodeRecord::dir(temp).display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Other nodes first, so that they can still tell the head they leave.
    let (heads, others): (Vec<NodeRecord>, Vec<NodeRecord>) =
        records.into_iter().partition(|r| r.is_head);
    let grace = Duration::from_secs(args.grace_period);
    let mut stopped = 0;
    for group in [others, heads] {
        if group.is_empty() {
            continue;
        }
        let signal = if args.force {
            libc::SIGKILL
        } else {
            libc::SIGTERM
        };
        for r in &group {
            // SAFETY: kill has no memory-safety preconditions; the record
            // was checked to be this very process (pid and start time).
            unsafe { libc::kill(r.pid as libc::pid_t, signal) };
        }
        let left = wait_gone(&group, grace);
        for r in &left {
            eprintln!(
                "prism: {} (pid {}) did not stop within {} s; killing it",
                r.node_id,
                r.pid,
                grace.as_secs()
            );
            // SAFETY: as above.
            unsafe { libc::kill(r.pid as libc::pid_t, libc::SIGKILL) };
        }
        let still = wait_gone(&left, Duration::from_secs(5));
        for r in &group {
            if still.iter().any(|s| s.pid == r.pid) {
                eprintln!("prism: {} (pid {}) is still running", r.node_id, r.pid);
                continue;
            }
            r.remove(temp);
            forget_scratch_state(r, temp);
            stopped += 1;
            let role = if r.is_head { "head node" } else { "node" };
            say!(
                "Stopped {role} {} (pid {}, session {}).",
                r.node_id,
                r.pid,
                r.session_dir.display()
            );
        }
        if !still.is_empty() {
            return Ok(ExitCode::FAILURE);
        }
    }
    say!("Stopped {stopped} Prism node process(es) on this machine.");
    Ok(ExitCode::SUCCESS)
}

/// Removes a stopped head's default state folder: its cluster ended, even
/// when the head had to be killed (a head that stops by itself removes it
/// too). Only a `head-*` folder in this temp folder is touched.
fn forget_scratch_state(record: &NodeRecord, temp: &std::path::Path) {
    let Some(dir) = &record.scratch_state else {
        return;
    };
    let ours = dir.parent() == Some(temp)
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("head-"));
    if !ours {
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!(
                "prism: could not remove the head's state in {}: {e}",
                dir.display()
            );
        }
    }
}

/// Waits up to `limit` for the processes to end; returns those still
/// running.
fn wait_gone(records: &[NodeRecord], limit: Duration) -> Vec<NodeRecord> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<NodeRecord> = records.iter().filter(|r| r.is_running()).cloned().collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a node process of this user: `prism start ... --block`
/// (what `prism start` runs in the background), owned by this user. A
/// record naming anything else is not acted on.
fn is_node_process(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let Ok(meta) = std::fs::metadata(&proc_dir) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return false;
    }
    let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.contains(&&b"start"[..]) && args.contains(&&b"--block"[..])
}
