//! A job's program shipped between nodes: a node that lacks the driver's
//! binary fetches it from the driver's node once, and its workers run that
//! copy (functions sent as data resolve in it).
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{on, text, Machines, DRIVER};
use prism_tests::{must, must_eventually};
use std::time::Duration;

fn triple(x: u64) -> u64 {
    x * 3
}

/// Says where it runs, from which file, and what `f` makes of 14 (a
/// function sent as data resolves in a copy of the driver's program).
#[prism::remote]
fn run_shipped(f: prism::portable::PortableFn<fn(u64) -> u64>) -> (String, String, String) {
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    // SAFETY: the token was made by PortableFn::new in the driver.
    let value = match unsafe { f.resolve() } {
        Ok(f) => f(14).to_string(),
        Err(e) => e.to_string(),
    };
    (node, exe, value)
}

/// The shipping driver's part: it runs from a file the second host lacks.
fn ship() {
    let (b, _) = {
        must(
            prism::init(prism::Config::default()),
            "the driver joins its node",
        );
        let listed = must(prism::nodes(), "the nodes are listed");
        let b = must(
            listed
                .into_iter()
                .find(|n| n.node_ip == "10.77.0.2")
                .ok_or("absent"),
            "the second host is a node",
        );
        (b, ())
    };
    let token = prism::portable::PortableFn::new(triple as fn(u64) -> u64);
    for round in 0..2 {
        let made = must(
            run_shipped::remote_with(on(&b), token.clone()),
            "a task is submitted",
        );
        match prism::get(&made) {
            Ok((node, exe, value)) => println!(
                "SHIPPED {round} on_b={} exe={exe} value={value}",
                node == b.node_id
            ),
            Err(e) => println!("SHIPPED {round} failed: {e}"),
        }
    }
    prism::shutdown();
}

#[test]
fn a_node_without_the_drivers_binary_fetches_it_once_and_runs_it() {
    if std::env::var_os(DRIVER).is_some() {
        return ship();
    }
    let Some(m) = Machines::new("ship", 2) else {
        return;
    };
    let head = m.start_head(&[]);
    // The driver runs from a copy in a folder that the second host's node
    // sees empty.
    let bin = m.temps[0].join("driver-bin");
    must(std::fs::create_dir_all(&bin), "the driver's folder");
    let exe = bin.join("shipped-driver");
    must(
        std::fs::copy(must(std::env::current_exe(), "this test"), &exe),
        "the driver is copied",
    );
    let out = m.join_hiding(1, &head, &bin);
    assert!(out.status.success(), "the node joins: {}", text(&out));
    must_eventually(
        "both nodes are in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 2 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let test = "a_node_without_the_drivers_binary_fetches_it_once_and_runs_it";
    // Two jobs of the same program: the first fetches it, the second finds
    // the copy.
    for _ in 0..2 {
        let said = m.run_driver_from(
            &exe,
            0,
            test,
            &head,
            &[(DRIVER, "1")],
            Duration::from_secs(180),
        );
        println!("{said}");
        for round in 0..2 {
            let line = said
                .lines()
                .find(|l| l.starts_with(&format!("SHIPPED {round} ")))
                .unwrap_or("");
            assert!(line.contains("on_b=true"), "{said}");
            assert!(line.contains("value=42"), "{said}");
            assert!(
                line.contains("/programs/build-id-") && line.contains("/shipped-driver "),
                "the worker runs the node's copy: {said}"
            );
        }
    }
    let logs = must(
        std::fs::read_dir(m.temps[1].join("logs")),
        "the node's logs",
    );
    let fetches: Vec<String> = logs
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|log| {
            log.lines()
                .filter(|l| l.contains("fetched a job's program"))
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    println!("{}", fetches.join("\n"));
    assert_eq!(fetches.len(), 1, "the program is fetched once");
    // Only its runnable image travels: a test binary's debug sections,
    // most of its bytes, stay behind.
    let number = |key: &str| -> u64 {
        fetches[0]
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {}", fetches[0]))
    };
    assert!(
        number("bytes=") * 2 < number("of="),
        "the image is a fraction of the file: {}",
        fetches[0]
    );
}
