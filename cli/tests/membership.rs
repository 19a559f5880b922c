//! A cluster's members through the `prism` command: a head started and
//! two nodes joined, shown by `prism status` and by the head's dashboard
//! (behind its token), a driver run on a joined node, nodes stopped one by
//! one; and a node killed or cut off marked dead within the timeout, then
//! joining again as a new node; and the head's control store, then the
//! whole head node, killed under a running driver and started again, the
//! cluster going on with its names, keys and actors.
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    actor_on, join_and_find_b_c, on, run_bounded, text, Machines, Where, DRIVER, FAST_DEATH, MARKS,
};
use prism_tests::{must, must_become, must_eventually};
use std::time::Duration;

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
    // The same for programs.
    let out = m.prism(1, &["status", "--format", "json"], &[]);
    let doc: serde_json::Value = must(
        serde_json::from_slice(&out.stdout),
        "prism status --format json prints JSON",
    );
    let nodes = doc["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 3, "{doc}");
    for host in 0..3 {
        let node = nodes
            .iter()
            .find(|n| n["node_ip"] == m.ip(host))
            .unwrap_or_else(|| panic!("node {host} is listed: {doc}"));
        assert_eq!(node["state"], "ALIVE", "{doc}");
        assert_eq!(node["total"]["CPU"], 1.0, "{doc}");
        assert_eq!(node["is_head"], host == 0, "{doc}");
    }

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

/// Waits (bounded) for the test to leave mark `name` in `marks`.
fn wait_mark(marks: &std::path::Path, name: &str) {
    must_eventually(
        &format!("the test marks {name}"),
        Duration::from_secs(120),
        || marks.join(name).exists(),
    );
}

/// The driver's part of the head test below, on host 1: it makes what
/// must outlive the head (a key, a named detached actor on host 2), then
/// for each outage works on while the head is down and checks, once it is
/// back, that all is there and that what needs the head works again.
fn outlive_the_head(marks: &std::path::Path) {
    let (b, c) = join_and_find_b_c();
    must(prism::kv::put("survives", b"v1"), "a key is written");
    let kept = must(
        Where::remote_with(actor_on(&c).name("kept").detached()),
        "a named detached actor is made on host 2",
    );
    let node_of = |w: &prism::ActorHandle<Where>| {
        must(prism::get(&must(w.node(), "called")), "the actor answers")
    };
    let kept_on = node_of(&kept);
    for phase in ["store", "head"] {
        must(
            std::fs::write(marks.join(format!("ready-{phase}")), ""),
            "ready",
        );
        wait_mark(marks, &format!("down-{phase}"));
        // The head is down (for "head", until the test starts it again):
        // the actor on host 2 and tasks on host 1 answer meanwhile.
        let mut answered = 0;
        for _ in 0..5 {
            assert_eq!(node_of(&kept), kept_on);
            let sum = must(
                prism::get(&must(add::remote_with(on(&b), 2, 3), "submitted")),
                "a task runs",
            );
            assert_eq!(sum, 5);
            answered += 2;
        }
        // A key read waits for the head and finds the value.
        let asked = std::time::Instant::now();
        let value = must(
            prism::kv::get("survives"),
            "the key is read once the head is back",
        );
        println!(
            "PHASE {phase} read waited {} ms",
            asked.elapsed().as_millis()
        );
        assert_eq!(value.as_deref(), Some(&b"v1"[..]));
        let found = must(
            prism::get_actor::<Where>("kept"),
            "the name is found once the head is back",
        );
        assert_eq!(node_of(&found), kept_on);
        let new_name = format!("after-{phase}");
        let fresh = must(
            Where::remote_with(actor_on(&c).name(new_name.clone())),
            "a new named actor is made after the head is back",
        );
        let _ = node_of(&fresh);
        must(
            prism::kv::put(&new_name, phase.as_bytes()),
            "a key is written after the head is back",
        );
        println!("PHASE {phase} answered={answered} kv=v1 named=ok new=ok");
    }
    for phase in ["store", "head"] {
        let key = format!("after-{phase}");
        let value = must(prism::kv::get(&key), "a key written between the outages");
        assert_eq!(value.as_deref(), Some(phase.as_bytes()));
        must(
            prism::get_actor::<Where>(&key),
            "an actor named between the outages",
        );
    }
    println!("ALL KEPT");
    prism::shutdown();
}

/// The pid of host 0's control store process (`prism gcs-server`).
fn control_store_pid(m: &Machines) -> Option<u32> {
    let temp = m.temps[0].display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args.iter().any(|a| a == "gcs-server") && args.contains(&temp)).then_some(pid)
    })
}

#[test]
fn the_cluster_outlives_its_control_store_and_its_head_node() {
    if let Some(marks) = std::env::var_os(MARKS) {
        return outlive_the_head(std::path::Path::new(&marks));
    }
    let Some((m, head)) = common::nodes_up("headfail", 3, FAST_DEATH) else {
        return;
    };
    let marks = common::fresh_marks("headfail");
    let mut driver = m
        .net
        .command(1, must(std::env::current_exe(), "this test's binary"));
    driver.args([
        "--exact",
        "the_cluster_outlives_its_control_store_and_its_head_node",
        "--nocapture",
    ]);
    let (temp1, marks_text, address) = (
        m.temps[1].display().to_string(),
        marks.display().to_string(),
        head.clone(),
    );
    let waiter = std::thread::spawn(move || {
        let env = [
            (MARKS, marks_text.as_str()),
            ("PRISM_ADDRESS", address.as_str()),
            ("PRISM_TEMP_DIR", temp1.as_str()),
        ];
        run_bounded(driver, &env, Duration::from_secs(240))
    });

    // 1. The control store alone is killed; the head node starts it again.
    wait_mark(&marks, "ready-store");
    let store = must(
        control_store_pid(&m).ok_or("not found"),
        "the head runs its control store as a process of its own",
    );
    let head_pid = m.node_pid(0);
    prism_tests::kill(store);
    must(std::fs::write(marks.join("down-store"), ""), "mark");
    let again = must_become(
        "the control store is started again",
        Duration::from_secs(30),
        || control_store_pid(&m).filter(|p| *p != store),
    );
    assert_ne!(again, store);
    assert!(
        !prism_tests::is_gone(head_pid),
        "the head node's raylet lives on"
    );

    // 2. The whole head node is killed, and started again by hand.
    wait_mark(&marks, "ready-head");
    prism_tests::kill(head_pid);
    must_eventually(
        "the control store stops with its head node",
        Duration::from_secs(10),
        || control_store_pid(&m).is_none(),
    );
    must(std::fs::write(marks.join("down-head"), ""), "mark");
    // Down for a while: the driver's key read waits meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let restarted = m.start_head(FAST_DEATH);
    assert_eq!(restarted, head);

    let out = must(waiter.join().map_err(|_| "panicked"), "the driver ends");
    let said = text(&out);
    assert!(out.status.success(), "the driver must finish: {said}");
    for phase in ["store", "head"] {
        assert!(
            said.contains(&format!("PHASE {phase} answered=10 kv=v1 named=ok new=ok")),
            "{said}"
        );
    }
    assert!(said.contains("ALL KEPT"), "{said}");
    // The key was read while the head was down (2 s): the read waited for
    // it rather than failing.
    let waited: u64 = must(
        said.lines()
            .find_map(|l| l.strip_prefix("PHASE head read waited "))
            .and_then(|l| l.trim_end_matches(" ms").parse().ok())
            .ok_or("no such line"),
        "the driver says how long its read waited",
    );
    assert!(waited >= 500, "the read did not wait for the head: {said}");
    let status = m.status(0);
    assert!(status.contains("Nodes: 3 alive, 1 dead"), "{status}");
    assert!(status.contains("the head node started again"), "{status}");
    let _ = std::fs::remove_dir_all(&marks);
}

#[test]
fn a_head_on_a_new_disk_resumes_its_cluster_from_redis() {
    let Some(m) = Machines::new("redis", 2) else {
        return;
    };
    // Redis on the head's host, as a service beside a head pod would be.
    let mut redis = m.net.command(0, "redis-server");
    redis
        .args(["--port", "6390", "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Killed when the test ends, passed or not.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _redis = match redis.spawn() {
        Ok(child) => Killed(child),
        Err(e) => {
            eprintln!("skipped: redis-server cannot run here ({e}); .ci/run installs it");
            return;
        }
    };
    must_eventually("redis-server answers", Duration::from_secs(10), || {
        let mut ping = m.net.command(0, "redis-cli");
        ping.args(["-p", "6390", "ping"]);
        text(&run_bounded(ping, &[], Duration::from_secs(5))).contains("PONG")
    });
    let with_redis = ["--num-cpus", "1", "--redis-address", "127.0.0.1:6390"];
    let head = common::run_bounded_until_started(&m, &with_redis);
    assert!(m.join(1, &head).status.success());
    let before = must_become("both nodes are up", Duration::from_secs(20), || {
        let s = m.status(0);
        s.contains("Nodes: 2 alive").then_some(s)
    });
    let cluster_line = before.lines().next().unwrap_or("").to_string();
    let (head_pid, node_pid) = (m.node_pid(0), m.node_pid(1));

    // The head's machine is lost with its disk: a new one starts with an
    // empty temp folder and no token, and finds both in Redis.
    prism_tests::kill(head_pid);
    must_eventually("the head is gone", Duration::from_secs(10), || {
        prism_tests::is_gone(head_pid)
    });
    std::thread::sleep(Duration::from_millis(500));
    must(std::fs::remove_dir_all(&m.temps[0]), "the old disk is gone");
    let again = common::run_bounded_until_started(&m, &with_redis);
    assert_eq!(again, head);
    let after = must_become(
        "the joined node is taken back and the old head marked dead",
        Duration::from_secs(20),
        || {
            let s = m.status(0);
            s.contains("Nodes: 2 alive, 1 dead").then_some(s)
        },
    );
    assert_eq!(
        after.lines().next().unwrap_or(""),
        cluster_line,
        "the same cluster: {after}"
    );
    assert!(after.contains("the head node started again"), "{after}");
    assert_eq!(m.node_pid(1), node_pid, "the joined node ran on throughout");
    assert!(!prism_tests::is_gone(node_pid));
}

#[test]
fn a_node_started_before_its_head_waits_for_it_and_one_given_a_wrong_address_says_so() {
    let Some(m) = Machines::new("early", 2) else {
        return;
    };
    let token_file = m.temps[1].with_file_name("prism-cli-early-token");
    must(
        std::fs::write(&token_file, "early-bird-token\n"),
        "the token file",
    );
    let token_path = token_file.display().to_string();
    let head = format!("{}:6380", m.ip(0));
    let ip1 = m.ip(1).to_string();
    let joined = std::thread::scope(|scope| {
        let early = scope.spawn(|| {
            m.prism(
                1,
                &[
                    "start",
                    "--address",
                    &head,
                    "--token-file",
                    &token_path,
                    "--node-ip-address",
                    &ip1,
                    "--num-cpus",
                    "1",
                ],
                &[("PRISM_HEAD_RECONNECT_TIMEOUT_MS", "30000")],
            )
        });
        // The head comes up two seconds later.
        std::thread::sleep(Duration::from_secs(2));
        let started_head = m.start_head_with(
            FAST_DEATH,
            &["--num-cpus", "1", "--token-file", &token_path],
        );
        assert_eq!(started_head, head);
        must(
            early.join().map_err(|_| "panicked"),
            "the early node's start",
        )
    });
    assert!(joined.status.success(), "{}", text(&joined));
    must_eventually("both nodes are alive", Duration::from_secs(10), || {
        m.status(0).contains("Nodes: 2 alive")
    });
    let logs = m.temps[1].join("logs");
    let logged: String = must(std::fs::read_dir(&logs), "the early node's logs")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    assert!(
        logged.contains("waiting for the head") && logged.contains("the head answers"),
        "{logged}"
    );

    // Nothing listens at this address: the node gives up when its patience
    // is spent, and says why.
    let wrong = format!("{}:6399", m.ip(0));
    let given_up = std::time::Instant::now();
    let out = m.prism(
        1,
        &["start", "--address", &wrong, "--token-file", &token_path],
        &[("PRISM_HEAD_RECONNECT_TIMEOUT_MS", "1500")],
    );
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains(&format!("the head at {wrong} could not be reached"))
            && said.contains("PRISM_HEAD_RECONNECT_TIMEOUT_MS"),
        "{said}"
    );
    assert!(given_up.elapsed() < Duration::from_secs(20), "{said}");
    let _ = std::fs::remove_file(&token_file);
}
