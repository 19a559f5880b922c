//! The `prism` command end to end: real node processes on test hosts in
//! network namespaces (10.77.0.x, one per host), started, inspected,
//! killed, cut off and stopped through the command, as a user would.
//!
//! Needs root for the namespaces (CI runs as root); elsewhere each test
//! says it was skipped and why.

use prism_tests::{must, must_become, must_eventually};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use common::{run_bounded, text, Machines, DRIVER, FAST_DEATH};

fn line_of<'a>(status: &'a str, ip: &str) -> &'a str {
    status
        .lines()
        .find(|l| l.contains(&format!(" {ip} ")))
        .unwrap_or("")
}

#[prism::remote]
fn add(a: i64, b: i64) -> i64 {
    a + b
}

/// Sleeps so that tasks overlap, and says where it ran and what it got:
/// the sum of `data`, and `out` bytes made here.
#[prism::remote]
fn where_and_sum(data: Vec<u8>, out: usize) -> (String, u64, Vec<u8>) {
    std::thread::sleep(Duration::from_millis(400));
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    let sum = data.iter().map(|&b| b as u64).sum();
    (node, sum, vec![7u8; out])
}

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

    // SPREAD: one task per node, in turn, with every node free.
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

#[prism::actor]
struct Tally {
    total: u64,
}

#[prism::actor]
impl Tally {
    fn new() -> Self {
        Tally { total: 0 }
    }

    fn add(&mut self, n: u64) -> u64 {
        self.total += n;
        self.total
    }
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

#[prism::remote]
fn node_of() -> String {
    std::thread::sleep(Duration::from_millis(300));
    prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default()
}

/// The driver's part, run on a host by the test below.
fn drive() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let nodes = must(prism::nodes(), "the driver lists the nodes");
    let alive = nodes.iter().filter(|n| n.alive).count();
    println!("NODES alive={alive}");
    for n in &nodes {
        println!("NODE {} head={}", n.node_ip, n.is_head);
    }
    let sum = must(
        prism::get(&must(add::remote(1, 2), "a task is submitted")),
        "a task runs on the node",
    );
    println!("TASK {sum}");
    prism::shutdown();
}

/// Asks the head's dashboard (on host 0's loopback) what a browser and an
/// API client would, from a Python child on that host; returns what each
/// request got, one line each.
fn dashboard_requests(m: &Machines, token: &str) -> String {
    let script = r#"
import http.client, json, sys
token = sys.argv[1]
def get(path, headers={}):
    c = http.client.HTTPConnection("127.0.0.1", 8265, timeout=10)
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    return r, r.read()
r, body = get("/api/nodes")
print("nodes", r.status)
r, body = get("/api/nodes", {"Authorization": "Bearer " + token})
print("nodes with token", r.status, "alive=%d" % sum(n["alive"] for n in json.loads(body)))
r, body = get("/?token=" + token)
cookie = r.getheader("Set-Cookie") or ""
print("login", r.status, "cookie=%s" % cookie.startswith("prism_token="))
r, body = get("/", {"Cookie": cookie.split(";")[0]})
print("page", r.status, b"Prism cluster" in body)
r, body = get("/api/cluster_status", {"Authorization": "Bearer " + token})
s = json.loads(body)
print("status", r.status, "nodes_alive=%d" % s["nodes_alive"], "CPU=%s" % s["total"]["CPU"])
"#;
    let mut command = m.net.command(0, "python3");
    command.args(["-c", script, token]);
    let out = run_bounded(command, &[], Duration::from_secs(60));
    text(&out)
}

#[test]
fn the_cli_starts_a_head_joins_two_nodes_shows_them_and_stops_everything() {
    if std::env::var_os(DRIVER).is_some() {
        return drive();
    }
    let Some(m) = Machines::new("e2e", 3) else {
        return;
    };
    let head = m.start_head(&[]);
    for host in [1, 2] {
        let out = m.join(host, &head);
        assert!(
            out.status.success(),
            "node {host} must join: {}",
            text(&out)
        );
        assert!(
            text(&out).contains("joined the cluster at 10.77.0.1:6380"),
            "{}",
            text(&out)
        );
    }
    let status = m.status(2);
    assert!(status.contains("Nodes: 3 alive, 0 dead"), "{status}");
    // A node's sockets and logs are its user's alone.
    use std::os::unix::fs::PermissionsExt;
    for host in 0..3 {
        let record = &prism_raylet::NodeRecord::list(&m.temps[host])[0];
        let mode = must(std::fs::metadata(&record.session_dir), "the session exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{}", record.session_dir.display());
    }
    for host in 0..3 {
        assert!(
            line_of(&status, m.ip(host)).contains("ALIVE  0/1 CPU"),
            "{status}"
        );
    }
    assert!(line_of(&status, m.ip(0)).contains("head"), "{status}");
    assert!(status.contains(" 0/3 CPU"), "{status}");

    // The head's dashboard, on the head's loopback, asks for the token.
    let token = m.token();
    let seen = dashboard_requests(&m, &token);
    assert!(seen.contains("nodes 401"), "{seen}");
    assert!(seen.contains("nodes with token 200 alive=3"), "{seen}");
    assert!(seen.contains("login 303 cookie=True"), "{seen}");
    assert!(seen.contains("page 200 True"), "{seen}");
    assert!(seen.contains("status 200 nodes_alive=3 CPU=3.0"), "{seen}");

    // A driver on host 1 joins through that host's node.
    let said = m.run_driver(
        1,
        "the_cli_starts_a_head_joins_two_nodes_shows_them_and_stops_everything",
        &head,
        &[(DRIVER, "1")],
        Duration::from_secs(60),
    );
    assert!(said.contains("NODES alive=3"), "{said}");
    assert!(said.contains("NODE 10.77.0.1 head=true"), "{said}");
    assert!(said.contains("NODE 10.77.0.3 head=false"), "{said}");
    assert!(said.contains("TASK 3"), "{said}");

    // Stopping a node: it leaves, and the head says so.
    let pid1 = m.node_pid(1);
    let out = m.prism(1, &["stop"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Stopped 1 Prism node process(es)"),
        "{}",
        text(&out)
    );
    // Its leader thread may have exited a moment before its others.
    must_eventually("the node process is gone", Duration::from_secs(10), || {
        prism_tests::is_gone(pid1)
    });
    let status = m.status(0);
    assert!(status.contains("Nodes: 2 alive, 1 dead"), "{status}");
    assert!(
        line_of(&status, m.ip(1)).contains("DEAD   stopped by prism stop"),
        "{status}"
    );

    let (pid0, pid2) = (m.node_pid(0), m.node_pid(2));
    for host in [2, 0] {
        let out = m.prism(host, &["stop"], &[]);
        assert!(out.status.success(), "{}", text(&out));
    }
    must_eventually(
        "every node process is gone",
        Duration::from_secs(10),
        || prism_tests::is_gone(pid0) && prism_tests::is_gone(pid2),
    );
    let out = m.prism(0, &["stop"], &[]);
    assert!(
        text(&out).contains("No Prism node runs on this machine"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_node_killed_or_cut_off_is_marked_dead_within_the_timeout() {
    let Some(m) = Machines::new("death", 3) else {
        return;
    };
    let head = m.start_head(FAST_DEATH);
    for host in [1, 2] {
        assert!(m.join(host, &head).status.success());
    }
    assert!(m.status(0).contains("Nodes: 3 alive"));

    // A raylet that dies: SIGKILL, so it cannot say goodbye.
    prism_tests::kill(m.node_pid(1));
    let status = must_become(
        "the killed node is marked dead",
        Duration::from_secs(20),
        || {
            let s = m.status(0);
            line_of(&s, m.ip(1)).contains("DEAD").then_some(s)
        },
    );
    assert!(
        line_of(&status, m.ip(1)).contains("no heartbeat for"),
        "{status}"
    );
    assert!(line_of(&status, m.ip(2)).contains("ALIVE"), "{status}");

    // A node cut off from the network.
    let pid2 = m.node_pid(2);
    must(m.net.cut(2), "host 2's link goes down");
    let status = must_become(
        "the cut-off node is marked dead",
        Duration::from_secs(20),
        || {
            let s = m.status(0);
            line_of(&s, m.ip(2)).contains("DEAD").then_some(s)
        },
    );
    assert!(status.contains("Nodes: 1 alive, 2 dead"), "{status}");
    // Back on the network, it learns it was given up and stops, to be
    // started again as a new node.
    must(m.net.join(2), "host 2's link comes back");
    must_eventually("the given-up node stops", Duration::from_secs(20), || {
        prism_raylet::start_ticks(pid2).is_none()
    });
    let out = m.join(2, &head);
    assert!(out.status.success(), "it joins again: {}", text(&out));
    let status = m.status(0);
    assert!(status.contains("Nodes: 2 alive, 2 dead"), "{status}");
}

#[test]
fn wrong_tokens_missing_tokens_and_a_taken_port_are_clear_errors() {
    let Some(m) = Machines::new("auth", 2) else {
        return;
    };
    let head = m.start_head(&[]);
    let ip = m.ip(1).to_string();

    let out = m.prism(
        1,
        &[
            "start",
            "--address",
            &head,
            "--token",
            "not-the-token",
            "--node-ip-address",
            &ip,
        ],
        &[],
    );
    assert!(!out.status.success());
    let said = text(&out);
    assert!(said.contains("refused this connection"), "{said}");
    assert!(
        said.contains("wrong cluster token") && said.contains("PRISM_AUTH_TOKEN"),
        "{said}"
    );

    let out = m.prism(1, &["start", "--address", &head], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no cluster token"), "{}", text(&out));

    let out = m.prism(1, &["status", "--address", &head, "--token", "wrong"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("refused this connection"),
        "{}",
        text(&out)
    );
    // The refusals are in the head's log.
    let logs = m.temps[0].join("logs");
    let logged = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .any(|t| t.contains("refused a connection with a wrong cluster token"));
    assert!(
        logged,
        "the head logs refused connections in {}",
        logs.display()
    );

    let out = m.prism(0, &["start", "--head", "--port", "6380"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("port is in use"), "{}", text(&out));
    assert!(
        m.status(0).contains("Nodes: 1 alive, 0 dead"),
        "nothing joined"
    );
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

const MARKS: &str = "PRISM_CLI_TEST_MARKS";

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

/// Node affinity to `node` (with `soft`, falling back elsewhere when it is
/// gone).
fn affinity(node: &prism::NodeInfo, soft: bool) -> prism::SchedulingStrategy {
    let node_id = must(
        prism::NodeId::parse(&node.node_id).ok_or("bad id"),
        "a node id",
    );
    prism::SchedulingStrategy::NodeAffinity { node_id, soft }
}

/// Options that run a task on `node` and nowhere else.
fn on(node: &prism::NodeInfo) -> prism::TaskOptions {
    prism::TaskOptions::new().scheduling_strategy(affinity(node, false))
}

/// Options that prefer `node` and run elsewhere when it is gone.
fn prefer(node: &prism::NodeInfo) -> prism::TaskOptions {
    prism::TaskOptions::new().scheduling_strategy(affinity(node, true))
}

/// Options that place an actor on `node`.
fn actor_on(node: &prism::NodeInfo) -> prism::ActorOptions {
    prism::ActorOptions::new().scheduling_strategy(affinity(node, false))
}

/// A driver's start: it joins its node and finds the nodes of the second
/// and third hosts.
fn join_and_find_b_c() -> (prism::NodeInfo, prism::NodeInfo) {
    // Not the default namespace: the job's workers on B and C must be told
    // it, or they name and look up actors elsewhere.
    must(
        prism::init(prism::Config::default().namespace("cluster-tests")),
        "the driver joins its node",
    );
    let listed = must(prism::nodes(), "the nodes are listed");
    let host = |ip: &str| {
        must(
            listed
                .iter()
                .find(|n| n.node_ip == ip)
                .cloned()
                .ok_or("absent"),
            "the host is a node",
        )
    };
    (host("10.77.0.2"), host("10.77.0.3"))
}

/// Three hosts: the head (started with `head_env`) and two nodes joined,
/// each in every raylet's view. `None` where namespaces cannot be made.
fn three_nodes(tag: &str, head_env: &[(&str, &str)]) -> Option<(Machines, String)> {
    nodes_up(tag, 3, head_env)
}

/// `hosts` hosts: the head (started with `head_env`) and the others
/// joined, each in every raylet's view. `None` where namespaces cannot be
/// made.
fn nodes_up(tag: &str, hosts: usize, head_env: &[(&str, &str)]) -> Option<(Machines, String)> {
    let m = Machines::new(tag, hosts)?;
    let head = m.start_head(head_env);
    for host in 1..hosts {
        let out = m.join(host, &head);
        assert!(out.status.success(), "the node joins: {}", text(&out));
    }
    let alive = format!("Nodes: {hosts} alive");
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains(&alive),
    );
    // One heartbeat later every raylet has the others in its view.
    std::thread::sleep(Duration::from_millis(1200));
    Some((m, head))
}

/// Runs the driver part of `test` (this binary, in driver mode) on the
/// head's host and returns what it printed.
fn drive_on_head(m: &Machines, head: &str, test: &str) -> String {
    m.run_driver(0, test, head, &[(DRIVER, "1")], Duration::from_secs(180))
}

/// `bytes` bytes made where it runs.
#[prism::remote]
fn fill(bytes: usize) -> Vec<u8> {
    (0..bytes).map(|i| (i % 251) as u8).collect()
}

/// Two blocks of `bytes` bytes made where it runs, each its own object
/// (the second shifted by one).
#[prism::remote(num_returns = 2)]
fn fill_pair(bytes: usize) -> (Vec<u8>, Vec<u8>) {
    let block: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let shifted = block.iter().map(|b| b + 1).collect();
    (block, shifted)
}

/// A small number (carried inline, not stored).
#[prism::remote]
fn size_of_block(size: usize) -> usize {
    size
}

/// Each byte of `data` plus one.
#[prism::remote]
fn shift(data: Vec<u8>) -> Vec<u8> {
    data.iter().map(|b| b.wrapping_add(1)).collect()
}

/// The sum of `data`, and the bytes this node pulled from others so far.
#[prism::remote]
fn checksum(data: Vec<u8>) -> (u64, u64) {
    let sum = data.iter().map(|&b| b as u64).sum();
    let pulled = prism::object_store_stats()
        .map(|s| s.pulled_bytes_total)
        .unwrap_or(0);
    (sum, pulled)
}

/// How many objects this node's store holds.
#[prism::remote]
fn objects_here() -> u64 {
    prism::object_store_stats()
        .map(|s| s.num_objects)
        .unwrap_or(u64::MAX)
}

/// The pulling driver's part, run on the head by the test below.
fn pull() {
    const SIZE: usize = 100_000_000;
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Made and stored on B; owned by this driver on A.
    let made = must(fill::remote_with(on(b), SIZE), "submitted");
    // Three readers on C: the first pulls a copy into C's store, the
    // others read that copy.
    let reads: Vec<_> = (0..3)
        .map(|_| must(checksum::remote_with(on(c), &made), "submitted"))
        .collect();
    let mut whole = true;
    let mut pulled_on_c = 0;
    for r in &reads {
        let (sum, pulled) = must(prism::get(r), "a reader on C finishes");
        whole &= sum == expected;
        pulled_on_c = pulled_on_c.max(pulled);
    }
    let once = |pulled: u64| pulled >= SIZE as u64 && pulled < 2 * SIZE as u64;
    println!("C read whole: {whole}, pulled once: {}", once(pulled_on_c));
    // Two gets at once on this node share one pull.
    let getters: Vec<_> = (0..2)
        .map(|_| {
            let made = made.clone();
            std::thread::spawn(move || {
                prism::get(&made)
                    .map(|d| d.len() == SIZE && d[SIZE - 1] == ((SIZE - 1) % 251) as u8)
            })
        })
        .collect();
    let both = getters
        .into_iter()
        .all(|g| matches!(g.join(), Ok(Ok(true))));
    let pulled_here = must(prism::object_store_stats(), "this node's store").pulled_bytes_total;
    println!(
        "A read whole twice: {both}, pulled once: {}",
        once(pulled_here)
    );
    // Freed with the object: its primary on B and the copies on A and C.
    drop((made, reads));
    let counts = || -> Vec<u64> {
        let here = must(prism::object_store_stats(), "this store").num_objects;
        let mut all = vec![here];
        for node in [b, c] {
            let asked = must(objects_here::remote_with(on(node)), "submitted");
            all.push(must(prism::get(&asked), "the count arrives"));
        }
        all
    };
    let started = Instant::now();
    let mut last = counts();
    while last.iter().any(|&n| n > 0) && started.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        last = counts();
    }
    println!("FREED everywhere: {last:?}");
    // An object whose node dies, and whose task may not run again
    // (max_retries 0), is lost, and the error names the node.
    let doomed = must(fill::remote_with(on(b).max_retries(0), SIZE), "submitted");
    must(
        prism::wait(std::slice::from_ref(&doomed), 1, None),
        "the object is made",
    );
    let _ = must(end_my_node::remote_with(on(b)), "submitted");
    std::thread::sleep(Duration::from_millis(500));
    match prism::get(&doomed) {
        Ok(_) => println!("LOST: no, it was read"),
        Err(e) => println!(
            "LOST naming its node: {} ({e})",
            e.to_string().contains(&b.node_id)
        ),
    }
    prism::shutdown();
}

/// The driver's part of the test below: an object on B whose first chunk
/// B fails to serve is still read whole on A.
#[cfg(feature = "failpoints")]
fn pull_through_a_broken_stream() {
    const SIZE: usize = 20_000_000;
    let (b, _) = join_and_find_b_c();
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Not rebuilt from its lineage: only the retried pull can read it.
    let made = must(fill::remote_with(on(&b).max_retries(0), SIZE), "submitted");
    let read = prism::get(&made).map(|d| d.iter().map(|&x| x as u64).sum::<u64>());
    println!(
        "READ whole: {} ({read:?})",
        matches!(read, Ok(sum) if sum == expected)
    );
    let pulled = must(prism::object_store_stats(), "this store").pulled_bytes_total;
    println!(
        "PULLED once: {}",
        pulled >= SIZE as u64 && pulled < 2 * SIZE as u64
    );
    prism::shutdown();
}

/// With the raylets' fail points built in (`--features failpoints`): node
/// B breaks the first bulk stream it serves, and the pull is tried again.
#[cfg(feature = "failpoints")]
#[test]
fn a_pull_whose_stream_breaks_is_tried_again() {
    const TEST: &str = "a_pull_whose_stream_breaks_is_tried_again";
    if std::env::var_os(DRIVER).is_some() {
        return pull_through_a_broken_stream();
    }
    let Some(m) = Machines::new("brokenpull", 3) else {
        return;
    };
    let head = m.start_head(&[]);
    let b = m.join_env(1, &head, &[], &[("FAILPOINTS", "chunk_transfer=1*return")]);
    assert!(b.status.success(), "B joins: {}", text(&b));
    let c = m.join(2, &head);
    assert!(c.status.success(), "C joins: {}", text(&c));
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 3 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let said = drive_on_head(&m, &head, TEST);
    assert!(said.contains("READ whole: true"), "{said}");
    assert!(said.contains("PULLED once: true"), "{said}");
}

/// Kills the node process this task runs under (its workers' parent).
#[prism::remote]
fn end_my_node() {
    // SAFETY: kill and getppid have no memory-safety preconditions; the
    // parent is this test's node process on its own test host.
    unsafe { libc::kill(libc::getppid(), libc::SIGKILL) };
}

#[test]
fn objects_are_pulled_between_nodes_once_and_freed_with_their_object() {
    if std::env::var_os(DRIVER).is_some() {
        return pull();
    }
    let Some((m, head)) = three_nodes("pull", &[]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "objects_are_pulled_between_nodes_once_and_freed_with_their_object",
    );
    assert!(
        said.contains("C read whole: true, pulled once: true"),
        "{said}"
    );
    assert!(
        said.contains("A read whole twice: true, pulled once: true"),
        "{said}"
    );
    assert!(said.contains("FREED everywhere: [0, 0, 0]"), "{said}");
    assert!(said.contains("LOST naming its node: true"), "{said}");
}

/// Says which node it runs on.
#[prism::actor]
struct Where {}

#[prism::actor]
impl Where {
    fn new() -> Self {
        Where {}
    }

    fn node(&self) -> String {
        prism::runtime_context()
            .map(|c| c.node_id.to_string())
            .unwrap_or_default()
    }

    /// Ends this actor for good.
    fn leave(&self) -> Result<(), String> {
        prism::exit_actor().map_err(|e| e.to_string())
    }

    /// Crashes its process.
    fn crash(&self) {
        std::process::exit(3);
    }
}

/// Asks `w` for its node, crashes it, and asks again once it restarted.
#[prism::remote]
fn crash_between(w: prism::ActorHandle<Where>) -> (String, String) {
    let node = |w: &prism::ActorHandle<Where>| {
        w.node()
            .and_then(|n| prism::get(&n))
            .unwrap_or_else(|e| format!("failed: {e}"))
    };
    let before = node(&w);
    let _ = w.crash().and_then(|r| prism::get(&r));
    (before, node(&w))
}

/// Finds the actor named `name` from wherever it runs, and asks its node.
#[prism::remote]
fn find_named(name: String) -> String {
    match prism::get_actor::<Where>(&name).and_then(|w| prism::get(&w.node()?)) {
        Ok(node) => node,
        Err(e) => format!("not found: {e}"),
    }
}

/// Tries to create an actor named `name` from wherever it runs.
#[prism::remote]
fn take_name(name: String) -> String {
    match Where::remote_with(prism::ActorOptions::new().name(name)) {
        Ok(_) => "created".into(),
        Err(e) => e.to_string(),
    }
}

/// Holds the results of tasks it ran elsewhere: it owns them.
#[prism::actor]
struct Keeper {
    kept: Vec<prism::ObjectRef<Vec<u8>>>,
}

#[prism::actor]
impl Keeper {
    fn new() -> Self {
        Keeper { kept: Vec::new() }
    }

    /// Runs a task on node `node_id` that stores 1 MiB there, and keeps
    /// its result.
    fn keep_result_on(&mut self, node_id: String) -> Result<(), String> {
        let node_id = prism::NodeId::parse(&node_id).ok_or("bad node id")?;
        let there = prism::TaskOptions::new().scheduling_strategy(
            prism::SchedulingStrategy::NodeAffinity {
                node_id,
                soft: false,
            },
        );
        let r = fill::remote_with(there, 1 << 20).map_err(|e| e.to_string())?;
        prism::wait(std::slice::from_ref(&r), 1, None).map_err(|e| e.to_string())?;
        self.kept.push(r);
        Ok(())
    }
}

/// Asks `w` for its node after `ms` milliseconds.
#[prism::remote]
fn node_later(w: prism::ActorHandle<Where>, ms: u64) -> String {
    std::thread::sleep(Duration::from_millis(ms));
    match w.node().and_then(|n| prism::get(&n)) {
        Ok(node) => node,
        Err(e) => format!("failed: {e}"),
    }
}

/// The actor driver's part, run on the head by the test below.
fn place_actors() {
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let node_of = |w: &prism::ActorHandle<Where>| {
        must(prism::get(&must(w.node(), "called")), "the actor answers")
    };
    // Placed on B by node affinity, with a name.
    let on_b = must(
        Where::remote_with(actor_on(b).name("where-b")),
        "the actor is created",
    );
    println!("PLACED on B: {}", node_of(&on_b) == b.node_id);
    // SPREAD: one actor per node.
    let spread = prism::ActorOptions::new().scheduling_strategy(prism::SchedulingStrategy::Spread);
    let spread_actors: Vec<_> = (0..3)
        .map(|_| must(Where::remote_with(spread.clone()), "created"))
        .collect();
    let nodes: std::collections::BTreeSet<String> = spread_actors.iter().map(node_of).collect();
    println!("SPREAD actors over {} nodes", nodes.len());
    // Its name is found, and taken, from another node.
    let found = must(
        prism::get(&must(
            find_named::remote_with(on(c), "where-b".to_string()),
            "submitted",
        )),
        "the lookup runs",
    );
    println!("FOUND from C: {}", found == b.node_id);
    let duplicate = must(
        prism::get(&must(
            take_name::remote_with(on(c), "where-b".to_string()),
            "submitted",
        )),
        "the creation runs",
    );
    println!("DUPLICATE from C: {duplicate}");
    // Two creations of one name at once, from two nodes: one wins.
    let racers: Vec<_> = [b, c]
        .into_iter()
        .map(|n| {
            must(
                take_name::remote_with(on(n), "raced".to_string()),
                "submitted",
            )
        })
        .collect();
    let won = racers
        .iter()
        .filter(|r| must(prism::get(*r), "a racer finishes") == "created")
        .count();
    println!("RACE won by {won}");
    // Killed from here, on its node.
    must(prism::kill(&on_b), "the actor is killed");
    let after = prism::get(&must(on_b.node(), "called"));
    println!("KILLED on B: {}", after.is_err());
    // An actor whose node dies: its callers' error names the node.
    let on_c = must(Where::remote_with(actor_on(c)), "created");
    node_of(&on_c);
    // One that may restart, named, placed on C by a soft affinity: when C
    // dies, its owner (this driver) creates it again on another node.
    let moving = prism::ActorOptions::new()
        .scheduling_strategy(affinity(c, true))
        .max_restarts(1)
        .name("moving");
    let moved = must(Where::remote_with(moving.clone()), "created");
    println!("MOVING starts on C: {}", node_of(&moved) == c.node_id);
    // One just like it that ended itself before C dies: its node tells
    // its owner, which must not bring it back.
    // One with a single restart, spent on C by a crash that a task on B
    // causes (its owner never looks): C's node tells the owner, which
    // must not create it again when C dies.
    let once = must(Where::remote_with(moving.clone().name("once")), "created");
    let (before, after) = must(
        prism::get(&must(crash_between::remote_with(on(b), once.clone()), "s")),
        "the task on B runs",
    );
    println!(
        "ONCE restarted on C: {}",
        before == c.node_id && after == c.node_id
    );
    let left = must(Where::remote_with(moving.name("gone")), "created");
    node_of(&left);
    must(prism::get(&must(left.leave(), "called")), "it leaves");
    // A caller on B that is not its owner calls it while C dies.
    let later = must(
        node_later::remote_with(on(b), moved.clone(), 1000),
        "submitted",
    );
    let _ = must(end_my_node::remote_with(on(c)), "submitted");
    std::thread::sleep(Duration::from_millis(500));
    match prism::get(&must(on_c.node(), "called")) {
        Ok(_) => println!("NODE DIED: the actor still answered"),
        Err(e) => println!(
            "NODE DIED names its node: {} ({e})",
            e.to_string().contains(&c.node_id)
        ),
    }
    match prism::get(&must(moved.node(), "called")) {
        Ok(now) => {
            println!("MOVED off C: {}", now != c.node_id && !now.is_empty());
            let found = prism::get(&must(
                find_named::remote_with(on(b), "moving".to_string()),
                "submitted",
            ));
            println!(
                "MOVED found by name: {} ({found:?})",
                found.as_deref() == Ok(now.as_str())
            );
            let from_b = prism::get(&later);
            println!(
                "MOVED called from B: {} ({from_b:?})",
                from_b.as_deref() == Ok(now.as_str())
            );
        }
        Err(e) => println!("MOVED failed: {e}"),
    }
    match prism::get(&must(once.node(), "called")) {
        Ok(node) => println!("ONCE came back on {node}"),
        Err(e) => println!("ONCE stays dead: true ({e})"),
    }
    match prism::get(&must(left.node(), "called")) {
        Ok(node) => println!("LEFT came back on {node}"),
        Err(e) => println!("LEFT stays gone: true ({e})"),
    }
    drop(spread_actors);
    prism::shutdown();
}

#[test]
fn actors_are_placed_on_other_nodes_named_cluster_wide_and_die_with_their_node() {
    if std::env::var_os(DRIVER).is_some() {
        return place_actors();
    }
    let Some((m, head)) = three_nodes("actors", FAST_DEATH) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "actors_are_placed_on_other_nodes_named_cluster_wide_and_die_with_their_node",
    );
    assert!(said.contains("PLACED on B: true"), "{said}");
    assert!(said.contains("SPREAD actors over 3 nodes"), "{said}");
    assert!(said.contains("FOUND from C: true"), "{said}");
    assert!(
        said.contains("DUPLICATE from C: ") && said.contains("already exists"),
        "{said}"
    );
    assert!(said.contains("RACE won by 1"), "{said}");
    assert!(said.contains("KILLED on B: true"), "{said}");
    assert!(said.contains("NODE DIED names its node: true"), "{said}");
    assert!(said.contains("MOVING starts on C: true"), "{said}");
    assert!(said.contains("MOVED off C: true"), "{said}");
    assert!(said.contains("MOVED found by name: true"), "{said}");
    assert!(said.contains("MOVED called from B: true"), "{said}");
    assert!(said.contains("LEFT stays gone: true"), "{said}");
    assert!(said.contains("ONCE restarted on C: true"), "{said}");
    assert!(said.contains("ONCE stays dead: true"), "{said}");
}

/// Makes a group of one CPU bundle from wherever it runs (its home is
/// that node) and returns its id.
#[prism::remote]
fn make_group() -> String {
    let bundle = prism::Bundle::new().num_cpus(1.0);
    match prism::placement_group(vec![bundle], prism::PlacementStrategy::Pack) {
        Ok(g) => g.id().to_string(),
        Err(e) => format!("failed: {e}"),
    }
}

/// The placement-group driver's part, run on the head by the test below.
fn place_groups() {
    use prism::{Bundle, PlacementStrategy};
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let one_cpu = || Bundle::new().num_cpus(1.0);
    let group = must(
        prism::placement_group(
            vec![one_cpu(), one_cpu(), one_cpu()],
            PlacementStrategy::StrictSpread,
        ),
        "the group is accepted",
    );
    must(group.ready(), "the group is created");
    let nodes = must(group.bundle_nodes(), "the bundles' nodes");
    let distinct: std::collections::BTreeSet<&String> = nodes.iter().collect();
    println!("STRICT_SPREAD over {} nodes", distinct.len());
    let mut on_their_nodes = nodes.len() == 3;
    for (i, node) in nodes.iter().enumerate() {
        let options = prism::TaskOptions::new().placement_group(&group, Some(i));
        let ran = must(
            prism::get(&must(node_of::remote_with(options), "submitted")),
            "a task in a bundle runs",
        );
        on_their_nodes &= &ran == node;
    }
    println!("BUNDLE tasks on their nodes: {on_their_nodes}");
    let actor = must(
        Where::remote_with(prism::ActorOptions::new().placement_group(&group, Some(2))),
        "an actor in a bundle starts",
    );
    let actor_node = must(
        prism::get(&must(actor.node(), "called")),
        "the actor answers",
    );
    println!(
        "BUNDLE actor on its node: {}",
        nodes.get(2) == Some(&actor_node)
    );
    // A group made by a task on another node (pending: every CPU is
    // reserved) is listed from here, next to this driver's.
    let options = prism::TaskOptions::new().placement_group(&group, Some(2));
    let other = must(
        prism::get(&must(make_group::remote_with(options), "submitted")),
        "the task runs",
    );
    let listed = must(prism::list_placement_groups(), "the groups are listed");
    let ids: Vec<String> = listed.iter().map(|(_, g, _)| g.id().to_string()).collect();
    println!(
        "LISTED both: {}",
        ids.contains(&group.id().to_string()) && ids.contains(&other)
    );
    for (_, g, _) in &listed {
        if g.id().to_string() == other {
            must(
                prism::remove_placement_group(g),
                "the other group is removed",
            );
        }
    }
    match prism::placement_group(vec![one_cpu(); 4], PlacementStrategy::StrictSpread) {
        Ok(_) => println!("FOUR bundles: accepted"),
        Err(e) => println!("FOUR bundles: {e}"),
    }
    drop(actor);
    must(
        prism::remove_placement_group(&group),
        "the group is removed",
    );
    let started = Instant::now();
    let mut free = 0.0;
    while started.elapsed() < Duration::from_secs(15) {
        let (_, available) = must(prism::cluster_resources(), "the cluster's resources");
        free = available.get("CPU").as_f64();
        if free >= 3.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("FREED CPUs: {free}");
    prism::shutdown();
}

#[test]
fn a_strict_spread_group_reserves_one_bundle_on_each_of_three_nodes() {
    if std::env::var_os(DRIVER).is_some() {
        return place_groups();
    }
    let Some((m, head)) = three_nodes("groups", &[("PRISM_HEARTBEAT_PERIOD_MS", "200")]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "a_strict_spread_group_reserves_one_bundle_on_each_of_three_nodes",
    );
    assert!(said.contains("STRICT_SPREAD over 3 nodes"), "{said}");
    assert!(said.contains("BUNDLE tasks on their nodes: true"), "{said}");
    assert!(said.contains("BUNDLE actor on its node: true"), "{said}");
    assert!(said.contains("LISTED both: true"), "{said}");
    assert!(
        said.contains("FOUR bundles: no node can ever satisfy"),
        "{said}"
    );
    assert!(said.contains("FREED CPUs: 3"), "{said}");
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SpreadConfig {
    epochs: u32,
    /// A folder every host sees, where each rank writes its node.
    marks: String,
}

#[derive(serde::Serialize)]
struct SpreadMetrics {
    epoch: u32,
    rank_sum: f64,
}

/// A training error from an I/O error.
fn failed(e: std::io::Error) -> prism_train::TrainError {
    prism_train::TrainError::Metrics(e.to_string())
}

/// A worker's context, its process group and its node's id.
fn worker_start() -> Result<
    (
        prism_train::TrainContext,
        std::sync::Arc<prism_train::collective::ProcessGroup>,
        String,
    ),
    prism_train::TrainError,
> {
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    Ok((ctx, group, node))
}

/// A training loop that all-reduces its rank and checkpoints each epoch.
fn spread_loop(config: SpreadConfig) -> Result<(), prism_train::TrainError> {
    let (ctx, group, node) = worker_start()?;
    let mark = PathBuf::from(&config.marks).join(format!("rank{}", ctx.world_rank()));
    std::fs::write(mark, node).map_err(failed)?;
    for epoch in 0..config.epochs {
        let mut x = [ctx.world_rank() as f64];
        group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
        let dir = std::env::temp_dir().join(format!(
            "prism-cli-spread-ckpt-{}-{epoch}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        std::fs::write(dir.join(format!("rank{}", ctx.world_rank())), "weights").map_err(failed)?;
        prism_train::report(
            SpreadMetrics {
                epoch,
                rank_sum: x[0],
            },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The training driver's part, run on the head by the test below.
fn train_over_nodes() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let base = std::env::temp_dir().join(format!("prism-cli-train-{}", std::process::id()));
    let marks = base.join("marks");
    must(std::fs::create_dir_all(&marks), "the marks folder");
    let config = SpreadConfig {
        epochs: 2,
        marks: marks.display().to_string(),
    };
    let result = prism_train::Trainer::new(spread_loop, config)
        .scaling_config(
            prism_train::ScalingConfig::new(3)
                .placement_strategy(prism::PlacementStrategy::StrictSpread),
        )
        .run_config(prism_train::RunConfig::new("spread").storage_path(base.join("runs")))
        .fit()
        .into_result();
    match result {
        Ok(r) => {
            let sum = r.metrics.as_ref().map(|m| m["rank_sum"].clone());
            println!("TRAINED rank_sum {sum:?}");
            let saved = r
                .checkpoint
                .as_ref()
                .is_some_and(|c| (0..3).all(|i| c.path().join(format!("rank{i}")).exists()));
            println!("CHECKPOINT holds every rank's file: {saved}");
        }
        Err(e) => println!("TRAIN failed: {e}"),
    }
    let nodes: std::collections::BTreeSet<String> = (0..3)
        .filter_map(|i| std::fs::read_to_string(marks.join(format!("rank{i}"))).ok())
        .collect();
    println!("WORKERS on {} nodes", nodes.len());
    let _ = std::fs::remove_dir_all(&base);
    prism::shutdown();
}

#[test]
fn the_trainer_runs_three_workers_on_three_nodes_with_a_checkpoint() {
    if std::env::var_os(DRIVER).is_some() {
        return train_over_nodes();
    }
    let Some((m, head)) = three_nodes("train", &[("PRISM_HEARTBEAT_PERIOD_MS", "200")]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "the_trainer_runs_three_workers_on_three_nodes_with_a_checkpoint",
    );
    assert!(
        said.contains("TRAINED rank_sum Some(Number(3.0))"),
        "{said}"
    );
    assert!(
        said.contains("CHECKPOINT holds every rank's file: true"),
        "{said}"
    );
    assert!(said.contains("WORKERS on 3 nodes"), "{said}");
}

/// The rebuilding driver's part, run on the head by the test below.
fn rebuild_lost() {
    const SIZE: usize = 20_000_000;
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Two objects made and stored on B, owned by this driver.
    let first = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let second = must(fill::remote_with(prefer(b), SIZE), "submitted");
    must(
        prism::wait(&[first.clone(), second.clone()], 2, None),
        "both are made",
    );
    // Two chains on B, each a task taking the result of another by
    // reference. The first chain's base is dropped once its second task
    // ran (its value is freed, its lineage kept); the second's is kept.
    let base = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let shifted = must(shift::remote_with(prefer(b), &base), "submitted");
    let kept_base = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let kept_shifted = must(shift::remote_with(prefer(b), &kept_base), "submitted");
    must(
        prism::wait(&[shifted.clone(), kept_shifted.clone()], 2, None),
        "both chains are made",
    );
    // A stored result whose task took a small ready object by reference
    // (passed on as a value).
    let size = must(size_of_block::remote(SIZE), "submitted");
    must(prism::get(&size), "the size is ready");
    let sized = must(fill::remote_with(prefer(b), &size), "submitted");
    must(prism::wait(std::slice::from_ref(&sized), 1, None), "made");
    // Two results of one task, both stored on B.
    let (pair_first, pair_second) = must(fill_pair::remote_with(prefer(b), SIZE), "submitted");
    must(
        prism::wait(&[pair_first.clone(), pair_second.clone()], 2, None),
        "the pair is made",
    );
    drop(base);
    // An actor on B owns a result stored on C: it goes when B dies.
    let on_c_now = || {
        must(
            prism::get(&must(objects_here::remote_with(on(c)), "s")),
            "counted",
        )
    };
    let before = on_c_now();
    let keeper = must(Keeper::remote_with(actor_on(b)), "created");
    must(
        prism::get(&must(keeper.keep_result_on(c.node_id.clone()), "called")),
        "the keeper runs its task and keeps the result",
    );
    println!("KEPT on C: {}", on_c_now() == before + 1);
    // B dies with all of them.
    let held = on_c_now();
    let _ = must(end_my_node::remote_with(on(b)), "submitted");
    std::thread::sleep(Duration::from_millis(2500));
    // Nothing else changed on C meanwhile: only the keeper's result went.
    let deadline = Instant::now() + Duration::from_secs(10);
    while on_c_now() >= held && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("FREED with its owner's node: {}", on_c_now() == held - 1);
    // This driver reads the first: its task runs again elsewhere.
    let data = must(prism::get(&first), "the lost object is made again");
    let sum: u64 = data.iter().map(|&b| b as u64).sum();
    println!(
        "OWNER read it whole: {}",
        data.len() == SIZE && sum == expected
    );
    // A task on C reads the second: its owner (this driver) makes it again.
    let read = must(checksum::remote_with(on(c), &second), "submitted");
    let (sum, _) = must(prism::get(&read), "the reader on C finishes");
    println!("BORROWER read it whole: {}", sum == expected);
    // Each chain's end is made again, and so is its base first (freed) or
    // when the task made again finds it lost (kept).
    let expected_shifted: u64 = (0..SIZE).map(|i| (i % 251) as u64 + 1).sum();
    for (name, end) in [("FREED", &shifted), ("KEPT", &kept_shifted)] {
        match prism::get(end) {
            Ok(data) => {
                let sum: u64 = data.iter().map(|&b| b as u64).sum();
                println!("CHAIN {name} base made again: {}", sum == expected_shifted);
            }
            Err(e) => println!("CHAIN {name} failed: {e}"),
        }
    }
    drop(kept_base);
    match prism::get(&sized) {
        Ok(data) => println!("SIZED made again: {}", data.len() == SIZE),
        Err(e) => println!("SIZED failed: {e}"),
    }
    // Reading the second result runs the task again, which makes the
    // first (lost with it) again too: one run for both, read here and on C
    // (one of which is not where it ran).
    let pair = prism::get(&pair_second).and_then(|second| {
        let on_c = prism::get(&checksum::remote_with(on(c), &pair_first)?)?.0;
        Ok((prism::get(&pair_first)?, second, on_c))
    });
    match pair {
        Ok((first, second, on_c)) => {
            let sum = |data: &[u8]| data.iter().map(|&b| b as u64).sum::<u64>();
            let whole = sum(&first) == expected && sum(&second) == expected_shifted;
            println!("PAIR made again: {}", whole && on_c == expected);
        }
        Err(e) => println!("PAIR failed: {e}"),
    }
    println!("REBUILT {}", prism::retry_stats().objects_rebuilt);
    prism::shutdown();
}

#[test]
fn objects_lost_with_their_node_are_made_again_from_their_lineage() {
    if std::env::var_os(DRIVER).is_some() {
        return rebuild_lost();
    }
    let Some((m, head)) = three_nodes("lineage", FAST_DEATH) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "objects_lost_with_their_node_are_made_again_from_their_lineage",
    );
    assert!(said.contains("OWNER read it whole: true"), "{said}");
    assert!(said.contains("BORROWER read it whole: true"), "{said}");
    assert!(said.contains("CHAIN FREED base made again: true"), "{said}");
    assert!(said.contains("CHAIN KEPT base made again: true"), "{said}");
    assert!(said.contains("KEPT on C: true"), "{said}");
    assert!(said.contains("FREED with its owner's node: true"), "{said}");
    assert!(said.contains("SIZED made again: true"), "{said}");
    assert!(said.contains("PAIR made again: true"), "{said}");
    assert!(said.contains("REBUILT 8"), "{said}");
}

/// Adds the node each block task ran on, and spends a little CPU so that
/// the tasks outgrow one node.
fn tag_node(batch: prism_train::data::Batch) -> Result<prism_train::data::Batch, String> {
    std::thread::sleep(Duration::from_millis(20));
    let node = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .map_err(|e| e.to_string())?;
    let n = batch.num_rows();
    batch
        .with_column("node", prism_train::data::Column::Str(vec![node; n]))
        .map_err(|e| e.to_string())
}

/// Reads one split; returns its ids.
#[prism::remote]
fn read_split(split: prism_train::data::DataIterator) -> Result<Vec<i64>, String> {
    let mut ids = Vec::new();
    for batch in split.iter_batches(500, false).map_err(|e| e.to_string())? {
        ids.extend_from_slice(
            batch
                .map_err(|e| e.to_string())?
                .i64("id")
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(ids)
}

/// The driver's part: a pipeline whose block tasks run on several nodes,
/// a shuffle across them, and a split read by tasks elsewhere.
fn pipeline_over_nodes() {
    use prism_train::data::LazyDataset;
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let n = 40_000usize;
    let ds = must(
        LazyDataset::range(n).map_batches(tag_node, 1000),
        "a map_batches step",
    );
    let mut ids = Vec::new();
    let mut nodes = std::collections::BTreeSet::new();
    for batch in must(ds.iter_batches(700, false), "the pipeline starts") {
        let batch = must(batch, "a batch arrives");
        ids.extend_from_slice(must(batch.i64("id"), "an id column"));
        nodes.extend(must(batch.str("node"), "a node column").iter().cloned());
    }
    println!(
        "STREAMED in order: {}, block tasks on {} nodes",
        ids == (0..n as i64).collect::<Vec<_>>(),
        nodes.len()
    );
    let shuffled = LazyDataset::range(n).random_shuffle(3);
    let mut got: Vec<i64> = Vec::new();
    for batch in must(shuffled.iter_batches(1000, false), "the shuffle starts") {
        got.extend_from_slice(must(must(batch, "a shuffled batch").i64("id"), "ids"));
    }
    let moved = got != (0..n as i64).collect::<Vec<_>>();
    got.sort_unstable();
    println!(
        "SHUFFLED every row once: {}, moved: {moved}",
        got == (0..n as i64).collect::<Vec<_>>()
    );
    let splits = must(ds.streaming_split(2, true), "a streaming split");
    let readers: Vec<_> = splits
        .into_iter()
        .map(|s| must(read_split::remote(s), "a reader task"))
        .collect();
    let mut all: Vec<i64> = Vec::new();
    let mut counts = Vec::new();
    for r in &readers {
        let part = must(prism::get(r), "a split is read");
        counts.push(part.len());
        all.extend(part);
    }
    all.sort_unstable();
    println!(
        "SPLIT equal: {}, every row once: {}",
        counts[0] == counts[1],
        all == (0..n as i64).collect::<Vec<_>>()
    );
    prism::shutdown();
}

#[test]
fn a_data_pipeline_runs_its_blocks_shuffle_and_splits_over_nodes() {
    if std::env::var_os(DRIVER).is_some() {
        return pipeline_over_nodes();
    }
    let Some((m, head)) = three_nodes("data", &[]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "a_data_pipeline_runs_its_blocks_shuffle_and_splits_over_nodes",
    );
    assert!(said.contains("STREAMED in order: true"), "{said}");
    assert!(
        !said.contains("block tasks on 1 nodes") && said.contains("block tasks on"),
        "{said}"
    );
    assert!(
        said.contains("SHUFFLED every row once: true, moved: true"),
        "{said}"
    );
    assert!(
        said.contains("SPLIT equal: true, every row once: true"),
        "{said}"
    );
}

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
}

/// Writes a CA, and a certificate and key naming each of `ips` signed by
/// it, into `dir`: `ca.pem`, and `<ip>.pem` and `<ip>.key` per address.
fn make_certificates(dir: &std::path::Path, ips: &[&str]) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    must(std::fs::create_dir_all(dir), "the certificates' folder");
    let mut params = must(CertificateParams::new(Vec::<String>::new()), "CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = must(
        CertifiedIssuer::self_signed(params, must(KeyPair::generate(), "a CA key")),
        "the CA",
    );
    must(
        std::fs::write(dir.join("ca.pem"), ca.pem()),
        "the CA is saved",
    );
    for ip in ips {
        let key = must(KeyPair::generate(), "a node key");
        let cert = must(
            must(CertificateParams::new(vec![ip.to_string()]), "node params").signed_by(&key, &ca),
            "the node's certificate",
        );
        must(
            std::fs::write(dir.join(format!("{ip}.pem")), cert.pem()),
            "saved",
        );
        must(
            std::fs::write(dir.join(format!("{ip}.key")), key.serialize_pem()),
            "saved",
        );
    }
}

/// `--tls-*` flags for `ip`'s certificate in `dir`, trusting `ca`.
fn tls_flags(dir: &std::path::Path, ip: &str, ca: &std::path::Path) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        dir.join(format!("{ip}.pem")).display().to_string(),
        "--tls-key".into(),
        dir.join(format!("{ip}.key")).display().to_string(),
        "--tls-ca".into(),
        ca.display().to_string(),
    ]
}

/// The TLS driver's part: a task on the other node reads a large object
/// from this one and makes one this driver reads back, over TLS.
fn over_tls() {
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
    let data: Vec<u8> = (0..20_000_000u32).map(|i| (i % 251) as u8).collect();
    let expected: u64 = data.iter().map(|&b| b as u64).sum();
    let shared = must(prism::put(data), "the object is stored");
    let made = must(
        where_and_sum::remote_with(on(&b), &shared, 5_000_000),
        "a task is submitted",
    );
    match prism::get(&made) {
        Ok((node, sum, out)) => println!(
            "TLS on_b={} sum_ok={} back={}",
            node == b.node_id,
            sum == expected,
            out.len() == 5_000_000 && out.iter().all(|&x| x == 7)
        ),
        Err(e) => println!("TLS failed: {e}"),
    }
    // Two Trainer workers on the two nodes all-reduce over a TLS link.
    let base = std::env::temp_dir().join(format!("prism-cli-tls-train-{}", std::process::id()));
    let result = prism_train::Trainer::new(tls_loop, ())
        .scaling_config(
            prism_train::ScalingConfig::new(2)
                .placement_strategy(prism::PlacementStrategy::StrictSpread),
        )
        .run_config(prism_train::RunConfig::new("tls").storage_path(base.join("runs")))
        .fit()
        .into_result();
    match result {
        Ok(r) => {
            let linked = r.metrics.as_ref().map(|m| {
                let (sum, links) = (&m["sum"], &m["encrypted_links"]);
                format!("sum {sum} encrypted_links {links}")
            });
            println!("TLS TRAINED {linked:?}");
        }
        Err(e) => println!("TLS TRAIN failed: {e}"),
    }
    let _ = std::fs::remove_dir_all(&base);
    prism::shutdown();
}

/// All-reduces the ranks once and reports the sum with the number of this
/// rank's links in TLS.
fn tls_loop(_: ()) -> Result<(), prism_train::TrainError> {
    let (ctx, group, _) = worker_start()?;
    let mut x = [ctx.world_rank() as f64 + 1.0];
    group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
    #[derive(serde::Serialize)]
    struct Linked {
        sum: f64,
        encrypted_links: usize,
    }
    let linked = Linked {
        sum: x[0],
        encrypted_links: group.encrypted_links(),
    };
    prism_train::report(linked, None)
}

#[test]
fn a_cluster_with_tls_runs_work_across_nodes_and_refuses_nodes_without_its_ca() {
    if std::env::var_os(DRIVER).is_some() {
        return over_tls();
    }
    let Some(m) = Machines::new("tls", 3) else {
        return;
    };
    let certs = m.temps[0].join("certs");
    let (a, b, c) = (
        m.ip(0).to_string(),
        m.ip(1).to_string(),
        m.ip(2).to_string(),
    );
    make_certificates(&certs, &[&a, &b]);
    let other_ca = m.temps[0].join("other-ca");
    make_certificates(&other_ca, &[&c]);
    let ca = certs.join("ca.pem");
    let flags = tls_flags(&certs, &a, &ca);
    let mut extra = vec!["--num-cpus", "1"];
    extra.extend(flags.iter().map(String::as_str));
    let head = m.start_head_with(&[], &extra);
    let flags = tls_flags(&certs, &b, &ca);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = m.join_with(1, &head, &flags);
    assert!(out.status.success(), "the node joins: {}", text(&out));
    must_eventually(
        "both nodes are in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 2 alive"),
    );
    // `prism status` on the second machine speaks TLS as its node does.
    assert!(m.status(1).contains("Nodes: 2 alive"));
    std::thread::sleep(Duration::from_millis(1200));
    let said = m.run_driver(
        0,
        "a_cluster_with_tls_runs_work_across_nodes_and_refuses_nodes_without_its_ca",
        &head,
        &[(DRIVER, "1")],
        Duration::from_secs(180),
    );
    assert!(
        said.contains("TLS on_b=true sum_ok=true back=true"),
        "{said}"
    );
    assert!(
        said.contains("TLS TRAINED Some(\"sum 3.0 encrypted_links 1\")"),
        "the workers' link between the nodes runs TLS: {said}"
    );
    // A node without TLS, and one whose certificate another CA signed,
    // are refused, and say why.
    let out = m.join(2, &head);
    assert!(!out.status.success(), "a plain node must be refused");
    let plain = text(&out);
    assert!(plain.contains("--tls-cert"), "{plain}");
    let flags = tls_flags(&other_ca, &c, &other_ca.join("ca.pem"));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = m.join_with(2, &head, &flags);
    assert!(
        !out.status.success(),
        "a node of another CA must be refused"
    );
    let rogue = text(&out);
    assert!(rogue.contains("signed by the CA"), "{rogue}");
    println!("{plain}\n{rogue}");
    assert!(m.status(0).contains("Nodes: 2 alive, 0 dead"));
}

/// A head that marks a silent node dead within 1.5 s (one CPU, for the
/// driver) and three nodes offering one `resource` each, all in every
/// raylet's view. `None` where namespaces cannot be made.
fn head_and_three(tag: &str, resource: &str) -> Option<(Machines, String)> {
    let m = Machines::new(tag, 4)?;
    let head = m.start_head_with(FAST_DEATH, &["--num-cpus", "1"]);
    let offer = format!("{{\"{resource}\": 1}}");
    for host in 1..4 {
        let out = m.join_with(host, &head, &["--resources", &offer]);
        assert!(out.status.success(), "the node joins: {}", text(&out));
    }
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 4 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));
    Some((m, head))
}

/// An empty marks folder for this test process.
fn fresh_marks(tag: &str) -> PathBuf {
    let marks = std::env::temp_dir().join(format!("prism-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marks);
    must(std::fs::create_dir_all(&marks), "the marks folder");
    marks
}

/// Runs this binary's `test` as a driver on the head's host, in the
/// background (the test meanwhile kills nodes), with `marks` to talk
/// through.
fn drive_in_background(
    m: &Machines,
    test: &'static str,
    head: &str,
    marks: &std::path::Path,
) -> std::thread::JoinHandle<std::process::Output> {
    let mut driver = m
        .net
        .command(0, must(std::env::current_exe(), "this test's binary"));
    driver.args(["--exact", test, "--nocapture"]);
    let temp0 = m.temps[0].display().to_string();
    let marks = marks.display().to_string();
    let address = head.to_string();
    std::thread::spawn(move || {
        let env = [
            (DRIVER, "1"),
            (MARKS, marks.as_str()),
            ("PRISM_ADDRESS", address.as_str()),
            ("PRISM_TEMP_DIR", temp0.as_str()),
        ];
        run_bounded(driver, &env, Duration::from_secs(150))
    })
}

/// What a background driver said, once it finished well.
fn finished(waiter: std::thread::JoinHandle<std::process::Output>) -> String {
    let out = must(waiter.join().map_err(|_| "panicked"), "the driver finishes");
    let said = text(&out);
    assert!(out.status.success(), "the driver must finish: {said}");
    said
}

/// The host whose node is `node_id`.
fn host_of(m: &Machines, node_id: &str) -> usize {
    must(
        (0..m.temps.len())
            .find(|&h| {
                prism_raylet::NodeRecord::list(&m.temps[h])
                    .iter()
                    .any(|r| r.node_id == node_id)
            })
            .ok_or("no host runs it"),
        "the node is one of the hosts",
    )
}

#[derive(serde::Serialize)]
struct SurviveMetrics {
    epoch: u32,
    total: f64,
}

/// Adds 1 per rank into a running total each epoch (2 per epoch with two
/// workers), checkpointing it; a restarted group resumes from the latest
/// checkpoint, so the final total is right only if no epoch was lost or
/// counted twice.
fn surviving_loop(config: SpreadConfig) -> Result<(), prism_train::TrainError> {
    let (ctx, group, node) = worker_start()?;
    std::fs::write(PathBuf::from(&config.marks).join(&node), "").map_err(failed)?;
    let (mut start, mut total) = (0, 0.0);
    if let Some(c) = prism_train::get_checkpoint()? {
        let saved = std::fs::read_to_string(c.path().join("state")).map_err(failed)?;
        let (epoch, sum) = saved.split_once(' ').unwrap_or(("0", "0"));
        start = epoch.parse::<u32>().unwrap_or(0) + 1;
        total = sum.parse().unwrap_or(0.0);
    }
    for epoch in start..config.epochs {
        let mut x = [1.0f64];
        group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
        total += x[0];
        std::thread::sleep(Duration::from_millis(100));
        let dir = std::env::temp_dir().join(format!(
            "prism-cli-survive-ckpt-{}-{epoch}-{}",
            std::process::id(),
            ctx.world_rank()
        ));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        std::fs::write(dir.join("state"), format!("{epoch} {total}")).map_err(failed)?;
        prism_train::report(
            SurviveMetrics { epoch, total },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

const SURVIVE_EPOCHS: u32 = 40;

/// The driver's part: two workers on two of the three worker nodes, one
/// of which the test kills.
fn train_through_node_death() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = std::env::var(MARKS).unwrap_or_default();
    let storage = PathBuf::from(&marks).with_extension("runs");
    let result = prism_train::Trainer::new(
        surviving_loop,
        SpreadConfig {
            epochs: SURVIVE_EPOCHS,
            marks,
        },
    )
    .scaling_config(prism_train::ScalingConfig::new(2).resources_per_worker("worker", 1.0))
    .run_config(
        prism_train::RunConfig::new("survive")
            .storage_path(&storage)
            .failure_config(prism_train::FailureConfig::new(3)),
    )
    .fit();
    let failures = result.num_failures;
    match result.into_result() {
        Ok(r) => {
            let total = r.metrics.as_ref().map(|m| m["total"].clone());
            println!("TRAINED total={total:?} failures={failures}");
        }
        Err(e) => println!("TRAIN failed after {failures} failures: {e}"),
    }
    let _ = std::fs::remove_dir_all(&storage);
    prism::shutdown();
}

#[test]
fn the_trainer_survives_a_worker_nodes_death_resuming_from_its_checkpoint() {
    if std::env::var_os(DRIVER).is_some() {
        return train_through_node_death();
    }
    let Some((m, head)) = head_and_three("survive", "worker") else {
        return;
    };
    let marks = fresh_marks("survive");
    let waiter = drive_in_background(
        &m,
        "the_trainer_survives_a_worker_nodes_death_resuming_from_its_checkpoint",
        &head,
        &marks,
    );
    // Both workers run, on two of the three worker nodes: after a few
    // epochs, one of those nodes dies.
    let first: Vec<String> = must_become("both workers start", Duration::from_secs(60), || {
        let names: Vec<String> = std::fs::read_dir(&marks)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (names.len() == 2).then_some(names)
    });
    std::thread::sleep(Duration::from_millis(1500));
    prism_tests::kill(m.node_pid(host_of(&m, &first[0])));
    let said = finished(waiter);
    println!("{said}");
    let total = 2.0 * f64::from(SURVIVE_EPOCHS);
    assert!(
        said.contains(&format!("TRAINED total=Some(Number({total:?}))")),
        "every epoch counted once: {said}"
    );
    assert!(
        said.lines()
            .any(|l| l.starts_with("TRAINED") && !l.ends_with("failures=0")),
        "the group was restarted: {said}"
    );
    // The restarted group ran on the worker node that was left over.
    let nodes = std::fs::read_dir(&marks).map(|d| d.count()).unwrap_or(0);
    assert_eq!(nodes, 3, "the third worker node took over: {said}");
    let _ = std::fs::remove_dir_all(&marks);
    let _ = std::fs::remove_dir_all(marks.with_extension("runs"));
}

/// The driver's part: a STRICT_SPREAD group of two bundles over two of
/// three slot nodes, an actor in each; the node of bundle 0 is killed by
/// the test, and the bundle and its tasks go to the third.
fn move_group() {
    use prism::{Bundle, PlacementStrategy};
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = PathBuf::from(std::env::var(MARKS).unwrap_or_default());
    let slot = || Bundle::new().resource("slot", 1.0);
    let group = must(
        prism::placement_group(vec![slot(), slot()], PlacementStrategy::StrictSpread),
        "the group is asked for",
    );
    assert!(must(
        group.wait(Duration::from_secs(30)),
        "the group is placed"
    ));
    let before = must(group.bundle_nodes(), "the bundles' nodes");
    let moving = must(
        Where::remote_with(
            prism::ActorOptions::new()
                .placement_group(&group, Some(0))
                .max_restarts(1),
        ),
        "an actor in bundle 0",
    );
    let staying = must(
        Tally::remote_with(prism::ActorOptions::new().placement_group(&group, Some(1))),
        "an actor in bundle 1",
    );
    let first = must(prism::get(&must(moving.node(), "asked")), "it answers");
    must(prism::get(&must(staying.add(7), "asked")), "it answers");
    // Written whole, then renamed: the test never reads half a name.
    must(
        std::fs::write(marks.join("victim.part"), &before[0]),
        "the victim is named",
    );
    must(
        std::fs::rename(marks.join("victim.part"), marks.join("victim")),
        "the victim is named",
    );
    must_eventually("the test killed the node", Duration::from_secs(60), || {
        marks.join("killed").exists()
    });
    let after = must_become("bundle 0 moves", Duration::from_secs(30), || {
        group
            .bundle_nodes()
            .ok()
            .filter(|n| n.len() == 2 && n[0] != before[0])
    });
    let third = after[0] != before[1] && after[1] == before[1];
    // An actor of the moved bundle is not created again (yet): its callers
    // are told it died with its node.
    let now = prism::get(&must(moving.node(), "asked")).unwrap_or_else(|e| e.to_string());
    let kept = prism::get(&must(staying.add(1), "asked")).unwrap_or(0);
    let task = prism::get(&must(
        node_of::remote_with(
            prism::TaskOptions::new()
                .placement_group(&group, Some(0))
                .num_cpus(0.0),
        ),
        "a task in bundle 0",
    ))
    .unwrap_or_else(|e| e.to_string());
    println!(
        "MOVED first_on_victim={} to_third={third} actor_dead_naming_node={} kept={kept} task_on_new={} ({task}; actor: {now})",
        first == before[0],
        now.contains("is dead") && now.contains(&before[0]),
        task == after[0]
    );
    prism::shutdown();
}

#[test]
fn a_placement_groups_bundles_on_a_dead_node_are_placed_again() {
    if std::env::var_os(DRIVER).is_some() {
        return move_group();
    }
    let Some((m, head)) = head_and_three("pgmove", "slot") else {
        return;
    };
    let marks = fresh_marks("pgmove");
    let waiter = drive_in_background(
        &m,
        "a_placement_groups_bundles_on_a_dead_node_are_placed_again",
        &head,
        &marks,
    );
    let victim = must_become("the driver names the node", Duration::from_secs(60), || {
        std::fs::read_to_string(marks.join("victim")).ok()
    });
    prism_tests::kill(m.node_pid(host_of(&m, &victim)));
    must(
        std::fs::write(marks.join("killed"), ""),
        "the driver is told",
    );
    let said = finished(waiter);
    assert!(
        said.contains(
            "MOVED first_on_victim=true to_third=true actor_dead_naming_node=true kept=8 task_on_new=true"
        ),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&marks);
}
