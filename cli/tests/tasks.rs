//! Tasks across nodes: spillback over three nodes with a large argument
//! and results crossing them, SPREAD, node affinity (and an affinity to no
//! live node), a custom resource only one node has, an actor called from
//! another node, a streaming task's values pulled from its node; a task
//! whose node dies or is cut off runs again on another node; an idle
//! worker leased on another node goes back when a client there waits; and
//! a running task on another node is cancelled with its worker.
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    node_of, nodes_up, on, run_bounded, text, where_and_sum, Machines, Tally, DRIVER, FAST_DEATH,
    MARKS,
};
use prism_tests::{must, must_become, must_eventually};
use std::time::Duration;

/// `n` blocks of 300 KiB (stored in the store of the node that makes
/// them), each with that node's id.
#[prism::remote(num_returns = "streaming")]
fn blocks_from_here(n: u8) -> impl Iterator<Item = (String, Vec<u8>)> {
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    (0..n).map(move |i| (node.clone(), vec![i; 300 << 10]))
}

/// The spreading driver's part, run on the head by the test below.
fn spread() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let (total, _) = must(prism::cluster_resources(), "the cluster's resources");
    println!("CPUS {}", total.get("CPU").as_f64());
    // 20 MB, far over the inline limit: stored on this node, and read by
    // tasks on other nodes through their owner (this driver).
    let data: Vec<u8> = (0..20_000_000u32).map(|i| (i % 251) as u8).collect();
    let expected: u64 = data.iter().map(|&b| b as u64).sum();
    let shared = must(prism::put(data), "the big object is stored");
    let refs: Vec<_> = (0..6)
        .map(|_| {
            must(
                where_and_sum::remote(&shared, 5_000_000),
                "a task is submitted",
            )
        })
        .collect();
    let mut nodes = std::collections::BTreeSet::new();
    for r in &refs {
        let (node, sum, out) = must(prism::get(r), "the task's result arrives");
        assert_eq!(sum, expected, "the task on {node} read the object whole");
        assert!(
            out.len() == 5_000_000 && out.iter().all(|&b| b == 7),
            "the result from {node} is whole"
        );
        nodes.insert(node);
    }
    println!("SPILLED over {} nodes", nodes.len());

    // SPREAD: one task per node, in turn, with every node free. It goes by
    // this node's view, which hears of the CPUs the tasks above freed with
    // the nodes' next heartbeats.
    must_eventually(
        "this node's view shows every CPU free again",
        Duration::from_secs(10),
        || {
            prism::available_resources()
                .is_ok_and(|free| free.get("CPU").as_f64() >= total.get("CPU").as_f64())
        },
    );
    let spread = prism::TaskOptions::new().scheduling_strategy(prism::SchedulingStrategy::Spread);
    let refs: Vec<_> = (0..3)
        .map(|_| {
            must(
                node_of::remote_with(spread.clone()),
                "a SPREAD task is submitted",
            )
        })
        .collect();
    let spread_nodes: std::collections::BTreeSet<String> = refs
        .iter()
        .map(|r| must(prism::get(r), "a SPREAD task runs"))
        .collect();
    println!("SPREAD over {} nodes", spread_nodes.len());

    // Node affinity, by the id prism::nodes() gives.
    let listed = must(prism::nodes(), "the nodes are listed");
    let third = must(
        listed
            .iter()
            .find(|n| n.node_ip == "10.77.0.3")
            .ok_or("absent"),
        "the third host is a node",
    );
    let third_id = must(
        prism::NodeId::parse(&third.node_id).ok_or("bad id"),
        "a node id",
    );
    let pinned = |node_id, soft| {
        prism::TaskOptions::new()
            .scheduling_strategy(prism::SchedulingStrategy::NodeAffinity { node_id, soft })
    };
    let ran = must(
        prism::get(&must(
            node_of::remote_with(pinned(third_id, false)),
            "submitted",
        )),
        "a pinned task runs",
    );
    println!("PINNED ran on the third host: {}", ran == third.node_id);
    let nowhere = must(
        node_of::remote_with(pinned(prism::NodeId::new(), false)),
        "submitted",
    );
    if let Err(e) = prism::get(&nowhere) {
        println!("PINNED elsewhere: {e}");
    }

    // A custom resource only the second host has steers the task there.
    let accel = prism::TaskOptions::new().resource("accel", 1.0);
    let ran = must(
        prism::get(&must(node_of::remote_with(accel), "submitted")),
        "a task needing accel runs",
    );
    let second = listed
        .iter()
        .find(|n| n.node_ip == "10.77.0.2")
        .map(|n| n.node_id.clone());
    println!("ACCEL ran on the second host: {}", Some(ran) == second);

    // An actor here, called by a task pinned to the third host.
    let tally = must(Tally::remote(), "the actor starts");
    let from_there = must(
        prism::get(&must(
            add_to_tally::remote_with(pinned(third_id, false), tally.clone(), 5),
            "submitted",
        )),
        "a task on another node calls the actor",
    );
    let total = must(
        prism::get(&must(tally.add(1), "called")),
        "the actor answers",
    );
    println!(
        "ACTOR called from the third host: {} then {total}",
        from_there.1
    );
    println!(
        "ACTOR caller ran on the third host: {}",
        from_there.0 == third.node_id
    );

    // A streaming task on the third host: its values stay in that node's
    // store, and this driver pulls each as its reference arrives.
    let stream = must(
        blocks_from_here::remote_with(pinned(third_id, false), 4),
        "a streaming task is submitted",
    );
    let mut whole = true;
    let mut count = 0u8;
    for value in stream {
        let (node, bytes) = must(
            prism::get(&must(value, "a value arrives")),
            "a value is pulled from the third host",
        );
        whole &=
            node == third.node_id && bytes.len() == 300 << 10 && bytes.iter().all(|&b| b == count);
        count += 1;
    }
    println!("STREAM from the third host: {count} values, whole: {whole}");
    prism::shutdown();
}

/// Calls `tally` `n` times from wherever it runs; returns its node and the
/// last total.
#[prism::remote]
fn add_to_tally(tally: prism::ActorHandle<Tally>, n: u64) -> (String, u64) {
    let mut last = 0;
    for _ in 0..n {
        let r = tally.add(1).expect("the call is sent");
        last = prism::get(&r).expect("the actor answers");
    }
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    (node, last)
}

#[test]
fn tasks_spill_spread_and_pin_over_nodes_and_large_objects_cross_them() {
    if std::env::var_os(DRIVER).is_some() {
        return spread();
    }
    let Some(m) = Machines::new("spread", 3) else {
        return;
    };
    let head = m.start_head(&[]);
    let accel = m.join_with(1, &head, &["--resources", r#"{"accel": 1}"#]);
    assert!(accel.status.success(), "{}", text(&accel));
    assert!(m.join(2, &head).status.success());
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 3 alive"),
    );
    // One heartbeat later every raylet has the others in its view.
    std::thread::sleep(Duration::from_millis(1200));
    let said = m.run_driver(
        0,
        "tasks_spill_spread_and_pin_over_nodes_and_large_objects_cross_them",
        &head,
        &[(DRIVER, "1")],
        Duration::from_secs(120),
    );
    assert!(
        said.contains("CPUS 3"),
        "the driver sees the cluster's CPUs: {said}"
    );
    assert!(said.contains("SPILLED over 3 nodes"), "{said}");
    assert!(said.contains("SPREAD over 3 nodes"), "{said}");
    assert!(
        said.contains("PINNED ran on the third host: true"),
        "{said}"
    );
    assert!(
        said.contains("PINNED elsewhere: ") && said.contains("not a live node"),
        "{said}"
    );
    assert!(
        said.contains("ACCEL ran on the second host: true"),
        "{said}"
    );
    assert!(
        said.contains("ACTOR called from the third host: 5 then 6"),
        "{said}"
    );
    assert!(
        said.contains("ACTOR caller ran on the third host: true"),
        "{said}"
    );
    assert!(
        said.contains("STREAM from the third host: 4 values, whole: true"),
        "{said}"
    );
}

/// Holds its node's CPU.
#[prism::remote]
fn hold_cpu(ms: u64) -> u32 {
    std::thread::sleep(Duration::from_millis(ms));
    0
}

/// Says where it runs (a file named after its node, in `dir`), then works
/// for `ms`; returns its node.
#[prism::remote]
fn marked_work(dir: String, ms: u64) -> String {
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    let _ = std::fs::write(std::path::Path::new(&dir).join(&node), "");
    std::thread::sleep(Duration::from_millis(ms));
    node
}

/// The driver's part of the node-death test.
fn survive(dir: String) {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let _held = must(hold_cpu::remote(120_000), "the local CPU is held");
    std::thread::sleep(Duration::from_millis(300));
    let done = must(marked_work::remote(dir, 3_000), "the task is submitted");
    let node = must(
        prism::get(&done),
        "the task finishes despite its first node dying",
    );
    println!("RESULT {node}");
    println!("RETRIES {}", prism::retry_stats().task_retries);
    prism::shutdown();
}

#[test]
fn a_task_whose_node_dies_runs_again_on_another_node() {
    if let Some(dir) = std::env::var_os(MARKS) {
        return survive(dir.to_string_lossy().into_owned());
    }
    task_survives_its_node("a_task_whose_node_dies_runs_again_on_another_node", false);
}

#[test]
fn a_task_whose_node_is_cut_off_runs_again_on_another_node() {
    if let Some(dir) = std::env::var_os(MARKS) {
        return survive(dir.to_string_lossy().into_owned());
    }
    task_survives_its_node(
        "a_task_whose_node_is_cut_off_runs_again_on_another_node",
        true,
    );
}

/// Starts a task that spills to another node, then kills that node's
/// process (or cuts its link), and checks the task finishes elsewhere.
fn task_survives_its_node(test: &'static str, cut: bool) {
    let tag = if cut { "cut" } else { "retry" };
    let Some(m) = Machines::new(tag, 3) else {
        return;
    };
    let head = m.start_head(FAST_DEATH);
    for host in [1, 2] {
        assert!(m.join(host, &head).status.success());
    }
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 3 alive"),
    );
    std::thread::sleep(Duration::from_millis(600));
    let marks = std::env::temp_dir().join(format!("prism-cli-marks-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marks);
    must(std::fs::create_dir_all(&marks), "the marks folder");
    let mut driver = m
        .net
        .command(0, must(std::env::current_exe(), "this test's binary"));
    driver.args(["--exact", test, "--nocapture"]);
    let temp0 = m.temps[0].display().to_string();
    let marks_text = marks.display().to_string();
    let address = head.clone();
    let waiter = std::thread::spawn(move || {
        let env = [
            (MARKS, marks_text.as_str()),
            ("PRISM_ADDRESS", address.as_str()),
            ("PRISM_TEMP_DIR", temp0.as_str()),
        ];
        run_bounded(driver, &env, Duration::from_secs(90))
    });
    // The task starts on host 1 or 2: kill that node's process, or cut it
    // off (its connections then stay open: the callers learn of its death
    // from the head, through their raylet).
    let first = must_become(
        "the task starts on another node",
        Duration::from_secs(30),
        || {
            std::fs::read_dir(&marks)
                .ok()?
                .flatten()
                .next()
                .map(|e| e.file_name().to_string_lossy().into_owned())
        },
    );
    let host = must(
        (1..3)
            .find(|&h| {
                prism_raylet::NodeRecord::list(&m.temps[h])
                    .iter()
                    .any(|r| r.node_id == first)
            })
            .ok_or("no host runs it"),
        "the node is one of the other hosts",
    );
    if cut {
        must(m.net.cut(host), "the node's link goes down");
    } else {
        prism_tests::kill(m.node_pid(host));
    }
    let out = must(waiter.join().map_err(|_| "panicked"), "the driver finishes");
    let said = text(&out);
    assert!(out.status.success(), "the driver must finish: {said}");
    let result = said
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_default()
        .to_string();
    assert!(
        !result.is_empty() && result != first,
        "ran again elsewhere: {said}"
    );
    assert!(said.contains("RETRIES 1"), "{said}");
    let _ = std::fs::remove_dir_all(&marks);
}

/// Runs `n` one-CPU tasks pinned to its own node; returns how many ran.
#[prism::remote(num_cpus = 0)]
fn client_on_its_node(n: u32) -> u32 {
    let here = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    let node_id = prism::NodeId::parse(&here).expect("its node's id");
    let pinned =
        prism::TaskOptions::new().scheduling_strategy(prism::SchedulingStrategy::NodeAffinity {
            node_id,
            soft: false,
        });
    let refs: Vec<_> = (0..n)
        .map(|_| node_of::remote_with(pinned.clone()).expect("submitted"))
        .collect();
    prism::get_many_timeout(&refs, Duration::from_secs(60))
        .expect("its tasks get the node's CPU")
        .len() as u32
}

/// The driver's part of the test below: it keeps idle workers for ten
/// minutes.
fn keep_a_remote_worker_idle() {
    let config = prism::Config {
        lease_idle_ms: 600_000,
        ..prism::Config::default()
    };
    must(prism::init(config), "the driver joins its node");
    let listed = must(prism::nodes(), "the nodes are listed");
    let other = must(
        listed.iter().find(|n| !n.is_head).cloned().ok_or("absent"),
        "the second host is a node",
    );
    // The driver leases the other node's one CPU, then keeps it idle.
    let ran = must(
        prism::get(&must(node_of::remote_with(on(&other)), "submitted")),
        "a task runs on the other node",
    );
    assert_eq!(ran, other.node_id);
    let client = must(
        client_on_its_node::remote_with(on(&other), 3),
        "the client is submitted",
    );
    let n = must(
        prism::get_timeout(&client, Duration::from_secs(60)),
        "a client on that node gets its CPU while the driver keeps its idle worker",
    );
    println!("CLIENT ran {n}");
    prism::shutdown();
}

/// A worker a driver leased on another node and keeps idle goes back when
/// a client of that node waits for its CPU: the node's raylet says so
/// over the driver's lessee connection (`LeasesWanted`).
#[test]
fn a_worker_kept_idle_on_another_node_goes_back_when_a_client_there_waits() {
    if std::env::var_os(DRIVER).is_some() {
        return keep_a_remote_worker_idle();
    }
    let Some((m, head)) = nodes_up("idle", 2, &[]) else {
        return;
    };
    let said = m.run_driver(
        0,
        "a_worker_kept_idle_on_another_node_goes_back_when_a_client_there_waits",
        &head,
        &[(DRIVER, "1")],
        Duration::from_secs(120),
    );
    assert!(said.contains("CLIENT ran 3"), "{said}");
}

/// Reports its pid to the driver's folder `dir` (on a shared file
/// system: the hosts share this machine's), then sleeps `ms`.
#[prism::remote]
fn report_then_sleep(dir: String, ms: u64) -> u32 {
    let pid = std::process::id();
    let _ = std::fs::write(std::path::Path::new(&dir).join("pid"), pid.to_string());
    std::thread::sleep(Duration::from_millis(ms));
    pid
}

/// The driver's part of the test below.
fn cancel_on_another_node(dir: String) {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let listed = must(prism::nodes(), "the nodes are listed");
    let other = must(
        listed.iter().find(|n| !n.is_head).cloned().ok_or("absent"),
        "the second host is a node",
    );
    let running = must(
        report_then_sleep::remote_with(on(&other), dir.clone(), 600_000),
        "submitted",
    );
    let pid: u32 = must_become("the task starts there", Duration::from_secs(30), || {
        std::fs::read_to_string(std::path::Path::new(&dir).join("pid"))
            .ok()?
            .parse()
            .ok()
    });
    must(prism::cancel(&running, true), "the cancel is sent");
    match prism::get_timeout(&running, Duration::from_secs(30)) {
        Err(e @ prism::Error::TaskCancelled { .. }) => println!("CANCELLED {e}"),
        other => println!("NOT CANCELLED {other:?}"),
    }
    let gone = prism_tests::wait_until(Duration::from_secs(30), || prism_tests::is_gone(pid));
    println!("WORKER GONE {gone}");
    let next = must(
        prism::get(&must(node_of::remote_with(on(&other)), "submitted")),
        "the node runs the next task",
    );
    println!("NEXT ran there: {}", next == other.node_id);
    prism::shutdown();
}

/// A running task on another node, cancelled with `force`: the owner
/// sends `CancelTask` over its connection to that worker, which exits.
#[test]
fn a_task_running_on_another_node_is_cancelled_with_its_worker() {
    if let Some(dir) = std::env::var_os(MARKS) {
        return cancel_on_another_node(dir.to_string_lossy().into_owned());
    }
    let Some((m, head)) = nodes_up("cancel", 2, &[]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("prism-cli-cancel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    must(std::fs::create_dir_all(&dir), "the marks folder");
    let dir_text = dir.display().to_string();
    let said = m.run_driver(
        0,
        "a_task_running_on_another_node_is_cancelled_with_its_worker",
        &head,
        &[(MARKS, dir_text.as_str())],
        Duration::from_secs(120),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        said.contains("CANCELLED task") && said.contains("force"),
        "{said}"
    );
    assert!(said.contains("WORKER GONE true"), "{said}");
    assert!(said.contains("NEXT ran there: true"), "{said}");
}

/// The node a task runs on.
#[prism::remote]
fn my_node() -> String {
    prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default()
}

/// The driver of `work_pinned_to_a_node_that_just_joined_runs_there`:
/// a task, an actor and a placement group pinned to (or spread over) the
/// node named by `PRISM_TEST_NEW_NODE`, before this node's view has it.
fn pin_to_new_node() {
    must(prism::init(prism::Config::default()), "the driver joins");
    let new = std::env::var("PRISM_TEST_NEW_NODE").unwrap_or_default();
    let node_id = must(prism::NodeId::parse(&new).ok_or("bad id"), "a node id");
    let pinned = prism::SchedulingStrategy::NodeAffinity {
        node_id,
        soft: false,
    };
    let ran = must(
        prism::get(&must(
            my_node::remote_with(prism::TaskOptions::new().scheduling_strategy(pinned)),
            "submitted",
        )),
        "the pinned task runs",
    );
    println!("TASK ran on the new node: {}", ran == new);
    let actor = must(
        Tally::remote_with(prism::ActorOptions::new().scheduling_strategy(pinned)),
        "the pinned actor is created",
    );
    println!(
        "ACTOR answers: {}",
        must(prism::get(&must(actor.add(2), "called")), "it answers")
    );
    let bundle = || prism::Bundle::new().resource("CPU", 1.0);
    let group = must(
        prism::placement_group(
            vec![bundle(), bundle()],
            prism::PlacementStrategy::StrictSpread,
        ),
        "a group over both nodes",
    );
    println!(
        "GROUP placed: {}",
        must(group.wait(Duration::from_secs(30)), "it is placed")
    );
    prism::shutdown();
}

/// Work pinned to a node its driver's node has not heard of yet (the node
/// joined after that node's last heartbeat) is not refused: the node looks
/// again with a fresh view. Heartbeats every 3 s make the window wide.
#[test]
fn work_pinned_to_a_node_that_just_joined_runs_there() {
    if std::env::var_os(DRIVER).is_some() {
        return pin_to_new_node();
    }
    let Some(m) = Machines::new("fresh", 2) else {
        return;
    };
    let slow = [
        ("PRISM_HEARTBEAT_PERIOD_MS", "3000"),
        ("PRISM_NODE_DEATH_TIMEOUT_MS", "30000"),
    ];
    let head = m.start_head(&slow);
    // The head's node has beaten at least once, and its next beat is
    // seconds away.
    std::thread::sleep(Duration::from_millis(500));
    let joined = m.join(1, &head);
    assert!(joined.status.success(), "{}", text(&joined));
    let new = must(
        prism_raylet::NodeRecord::list(&m.temps[1])
            .first()
            .map(|r| r.node_id.clone())
            .ok_or("no record"),
        "the new node's record",
    );
    let said = m.run_driver(
        0,
        "work_pinned_to_a_node_that_just_joined_runs_there",
        &head,
        &[(DRIVER, "1"), ("PRISM_TEST_NEW_NODE", new.as_str())],
        Duration::from_secs(60),
    );
    assert!(said.contains("TASK ran on the new node: true"), "{said}");
    assert!(said.contains("ACTOR answers: 2"), "{said}");
    assert!(said.contains("GROUP placed: true"), "{said}");
}
