//! A probe of every port a head listens on, as an attacker on the network
//! would run it: a thousand bad requests at each (garbage, oversized frame
//! headers, wrong tokens, bad HTTP, connections left silent), and then the
//! cluster must be healthy, its processes the same ones, and the head's
//! memory back within 10% of where it began.

mod common;

use common::{text, Machines};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Set in the child that probes from another host: the ports to probe,
/// "ip:port,ip:port".
const PROBE: &str = "PRISM_CLI_TEST_PROBE";
/// Bad requests sent to each port.
const PER_PORT: usize = 1_000;
/// Connections open at once.
const AT_ONCE: usize = 50;

/// The TCP ports listening in `host`'s namespace (the head's control
/// store, dashboard, raylet and its workers).
fn listening_ports(m: &Machines, host: usize) -> Vec<u16> {
    let out = m
        .net
        .command(host, "ss")
        .args(["-ltnH"])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let local = line.split_whitespace().nth(3)?;
            local.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// One bad request of kind `i % 6` at `address`; whatever happens to it is
/// fine as long as it ends.
fn bad_request(address: &str, i: usize) {
    let Ok(mut tcp) = TcpStream::connect_timeout(
        &address.parse().expect("an address"),
        Duration::from_secs(2),
    ) else {
        return;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(300)));
    let _ = tcp.set_write_timeout(Some(Duration::from_millis(300)));
    let payload: Vec<u8> = match i % 6 {
        // Garbage.
        0 => (0..512).map(|b| (b * 31 + i) as u8).collect(),
        // Prism's greeting with a wrong token.
        1 => {
            let mut hello = b"PRSM".to_vec();
            hello.extend_from_slice(&5u16.to_le_bytes());
            hello.extend_from_slice(b"wrong");
            hello
        }
        // A greeting announcing a 60 KiB token that never comes.
        2 => {
            let mut hello = b"PRSM".to_vec();
            hello.extend_from_slice(&u16::MAX.to_le_bytes());
            hello
        }
        // HTTP with a wrong token, and a request line of 64 KiB.
        3 => b"GET /api/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n".to_vec(),
        4 => {
            let mut line = b"GET /".to_vec();
            line.extend(std::iter::repeat_n(b'a', 64 << 10));
            line.extend_from_slice(b" HTTP/1.1\r\n\r\n");
            line
        }
        // Nothing at all: connect, wait, leave.
        _ => Vec::new(),
    };
    let _ = tcp.write_all(&payload);
    let mut buf = [0u8; 1024];
    let _ = tcp.read(&mut buf);
}

/// The probing child: every port, `PER_PORT` bad requests each.
fn probe(targets: &str) {
    for address in targets.split(',') {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..AT_ONCE {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= PER_PORT {
                        return;
                    }
                    bad_request(address, i);
                });
            }
        });
        println!("probed {address} with {PER_PORT} bad requests");
    }
}

#[test]
fn a_thousand_bad_requests_at_every_port_leave_the_head_healthy() {
    if let Ok(targets) = std::env::var(PROBE) {
        return probe(&targets);
    }
    let Some(m) = Machines::new("probe", 2) else {
        return;
    };
    // The dashboard on every interface, so that the probe reaches it too.
    let head = m.start_head_with(&[], &["--num-cpus", "1", "--dashboard-host", "0.0.0.0"]);
    let pid = m.node_pid(0);
    // Settled: the first workers started, the store warmed.
    std::thread::sleep(Duration::from_secs(2));
    let before = resident_kib(pid);
    let ports = listening_ports(&m, 0);
    assert!(
        ports.len() >= 3,
        "the head listens on its control store, dashboard and raylet ports at least: {ports:?}"
    );
    let targets: Vec<String> = ports.iter().map(|p| format!("{}:{p}", m.ip(0))).collect();
    let started = Instant::now();
    let said = m.run_driver(
        1,
        "a_thousand_bad_requests_at_every_port_leave_the_head_healthy",
        &head,
        &[(PROBE, targets.join(",").as_str())],
        Duration::from_secs(300),
    );
    assert_eq!(said.matches("probed ").count(), ports.len(), "{said}");
    eprintln!(
        "probed {} ports with {PER_PORT} bad requests each in {:?}",
        ports.len(),
        started.elapsed()
    );

    // The same process serves, and the cluster answers.
    assert_eq!(m.node_pid(0), pid, "the head was not restarted");
    let status = m.status(0);
    assert!(status.contains("Nodes: 1 alive"), "{status}");
    let out = m.prism(
        1,
        &["status", "--address", &head, "--token", &m.token()],
        &[],
    );
    assert!(
        out.status.success(),
        "another host still reaches it: {}",
        text(&out)
    );
    // Memory back within 10% once the connections are gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = resident_kib(pid);
    while after > before + before / 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        after = resident_kib(pid);
    }
    eprintln!("head resident memory: {before} KiB before, {after} KiB after");
    assert!(
        after <= before + before / 10,
        "the head's memory grew from {before} KiB to {after} KiB under the probe"
    );
}
