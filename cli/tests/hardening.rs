//! The defects a probe of a running cluster found, each through real
//! processes: tokens on command lines, output into a closed pipe, folders
//! and node records planted by someone else, a temp folder shared by
//! users, and a flood of wrong tokens filling the head's log.

mod common;

use common::{text, Machines, PRISM};
use prism_raylet::NodeRecord;
use std::os::fd::FromRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("prism-hardening-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The command line of process `pid`, its arguments joined by spaces.
fn command_line(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).replace('\0', " ")
}

#[test]
fn a_joined_nodes_token_is_on_no_command_line() {
    let Some(m) = Machines::new("tok", 3) else {
        return;
    };
    let head = m.start_head(&[]);
    let token = m.token();
    // Host 1 joins the old way (--token T), host 2 with --token-file.
    let out = m.join(1, &head);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("can be read by every user"),
        "--token on a command line is warned about: {}",
        text(&out)
    );
    let file = scratch("token-file");
    std::fs::create_dir_all(&file).expect("mkdir");
    let token_file = file.join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token file");
    let ip = m.ip(2).to_string();
    let out = m.prism(
        2,
        &[
            "start",
            "--address",
            &head,
            "--token-file",
            token_file.to_str().expect("utf-8"),
            "--node-ip-address",
            &ip,
            "--num-cpus",
            "1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    for host in 0..3 {
        let pid = m.node_pid(host);
        let line = command_line(pid);
        assert!(
            line.contains("--block"),
            "the node process of host {host}: {line}"
        );
        assert!(
            !line.contains(&token),
            "host {host}'s node process shows the token on its command line: {line}"
        );
    }
    // The head tells joiners to keep it off the command line too.
    assert!(m.status(2).contains("Nodes: 3 alive"), "{}", m.status(2));
    let _ = std::fs::remove_dir_all(&file);
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // A pipe whose reader is gone before the command writes: every write
    // fails with EPIPE, as in `prism stop | head -0`.
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just made and are owned here.
    let (reader, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    drop(reader);
    let temp = scratch("pipe");
    let out = Command::new(PRISM)
        .args(["stop", "--temp-dir"])
        .arg(&temp)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run prism stop");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    let _ = std::fs::remove_dir_all(&temp);
}

#[test]
fn another_user_gets_a_temp_folder_of_their_own_by_default() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running as another user needs root");
        return;
    }
    // The binary where that user may run it.
    let dir = scratch("otheruser");
    std::fs::create_dir_all(&dir).expect("a folder");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = dir.join("prism");
    std::fs::copy(PRISM, &exe).expect("copy the binary");
    let as_nobody = |args: &[&str]| {
        let out = Command::new(&exe)
            .args(args)
            .env_remove("PRISM_TEMP_DIR")
            .env_remove("PRISM_AUTH_TOKEN")
            .env_remove("PRISM_ADDRESS")
            .current_dir("/")
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run prism as nobody");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let said = as_nobody(&["stop"]);
    assert!(
        said.contains("none recorded in /tmp/prism-65534/nodes"),
        "{said}"
    );
    let said = as_nobody(&["status"]);
    assert!(
        said.contains("none recorded in /tmp/prism-65534/nodes"),
        "{said}"
    );
    // Root's stays /tmp/prism.
    assert_eq!(
        prism_protocol::guard::default_temp_dir(),
        std::path::PathBuf::from("/tmp/prism")
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all("/tmp/prism-65534");
}

#[test]
fn a_planted_node_record_does_not_make_stop_signal_another_process() {
    let temp = scratch("planted");
    // A process that is not a Prism node, and a record naming it with its
    // real start time, as anyone can read it from /proc.
    let mut victim = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("start sleep");
    let ticks = prism_raylet::start_ticks(victim.id()).expect("its start time");
    let record = NodeRecord {
        pid: victim.id(),
        start_ticks: ticks,
        node_id: "node-planted".into(),
        cluster_id: String::new(),
        head: "127.0.0.1:6380".into(),
        node_ip: "127.0.0.1".into(),
        is_head: true,
        session_dir: temp.clone(),
        socket: temp.join("raylet.sock"),
        tls: None,
        dashboard: None,
        scratch_state: None,
    };
    record.write(&temp).expect("plant the record");
    let out = Command::new(PRISM)
        .args(["stop", "--grace-period", "1", "--temp-dir"])
        .arg(&temp)
        .output()
        .expect("run prism stop");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("not a Prism node of yours"), "{said}");
    assert!(
        victim.try_wait().expect("wait").is_none(),
        "prism stop must not signal a process its records name unless it is a node: {said}"
    );
    let _ = victim.kill();
    let _ = victim.wait();

    // A temp folder that another user made (and so controls) is refused.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&temp, Some(65534), Some(65534)).expect("chown");
        let out = Command::new(PRISM)
            .args(["stop", "--temp-dir"])
            .arg(&temp)
            .output()
            .expect("run prism stop");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(said.contains("belongs to user id 65534"), "{said}");
        assert!(
            said.contains("--temp-dir"),
            "the error says what to do: {said}"
        );
    }
    let _ = std::fs::remove_dir_all(&temp);
}

#[test]
fn a_flood_of_wrong_tokens_leaves_a_few_log_lines_and_a_healthy_head() {
    let Some(m) = Machines::new("flood", 1) else {
        return;
    };
    let head = m.start_head(&[]);
    for _ in 0..40 {
        let out = m.prism(0, &["status", "--address", &head, "--token", "wrong"], &[]);
        assert!(!out.status.success());
    }
    let logs = m.temps[0].join("logs");
    let lines: usize = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|t| t.matches("with a wrong cluster token").count())
        .sum();
    assert!(lines >= 1, "the first refusal is logged");
    assert!(
        lines <= 4,
        "40 refused calls must not give 40 log lines (got {lines}); they are logged a line per \
         interval with the count held back"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        m.status(0).contains("Nodes: 1 alive"),
        "the head is healthy"
    );
}

#[test]
fn a_head_stopped_even_by_force_leaves_no_state_behind() {
    let Some(m) = Machines::new("forcestop", 1) else {
        return;
    };
    let state = m.temps[0].join("head-6380");
    for force in [false, true] {
        m.start_head(&[]);
        assert!(
            state.join("state.redb").exists(),
            "the head keeps its state in {}",
            state.display()
        );
        let args: &[&str] = if force {
            &["stop", "--force"]
        } else {
            &["stop"]
        };
        let out = m.prism(0, args, &[]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            !state.exists(),
            "a stopped head's cluster ended (force: {force}): {}",
            text(&out)
        );
    }
}
