//! Shared by the multi-process tests: start a group of ranks as copies of
//! the test binary and collect their exit codes and output.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Children that are killed when dropped.
struct Ranks {
    children: Vec<(usize, Child)>,
    logs: Vec<std::path::PathBuf>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for log in &self.logs {
            let _ = std::fs::remove_file(log);
        }
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("the loopback interface must give an ephemeral port")
}

/// Starts `ranks` of a group of `world` playing `role`; returns each rank's
/// exit code (None if killed at `limit`) and its output.
pub fn run_ranks(
    role: &str,
    world: usize,
    ranks: &[usize],
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<(usize, Option<i32>, String)> {
    // The master port is picked free and released before rank 0 binds it;
    // if something else took it meanwhile, try again with new ports.
    let mut results = Vec::new();
    for _attempt in 0..3 {
        results = run_ranks_once(role, world, ranks, env, limit);
        let port_taken = results
            .iter()
            .any(|(_, _, log)| log.contains("binding the rendezvous master port"));
        if !port_taken {
            break;
        }
    }
    results
}

fn run_ranks_once(
    role: &str,
    world: usize,
    ranks: &[usize],
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<(usize, Option<i32>, String)> {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let port = free_port();
    let second_port = free_port();
    let mut group = Ranks {
        children: Vec::new(),
        logs: Vec::new(),
    };
    for &rank in ranks {
        let log = std::env::temp_dir().join(format!(
            "prism-ranks-{}-{role}-{port}-{rank}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("temp dir is writable");
        let err = file.try_clone().expect("a log file handle clones");
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "rank_process", "--nocapture", "--test-threads=1"])
            .env("PRISM_TEST_ROLE", role)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("PRISM_TEST_SECOND_PORT", second_port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("the test binary can start itself");
        group.children.push((rank, child));
        group.logs.push(log);
    }
    let until = Instant::now() + limit;
    let mut codes: Vec<Option<Option<i32>>> = vec![None; ranks.len()];
    while codes.iter().any(Option::is_none) && Instant::now() < until {
        for (i, (_, child)) in group.children.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Ok(Some(status)) = child.try_wait() {
                    codes[i] = Some(status.code());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Vec::new();
    for (i, (rank, child)) in group.children.iter_mut().enumerate() {
        if codes[i].is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let text = std::fs::read_to_string(&group.logs[i]).unwrap_or_default();
        out.push((*rank, codes[i].flatten(), text));
    }
    out
}
