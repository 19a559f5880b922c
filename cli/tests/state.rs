//! The state API through real parts: a head started by `prism start
//! --head` (loopback, ports picked free), a driver (this test binary)
//! joining it with actors (one killed), tasks (one failing), an object in
//! the store and a placement group; `prism list`, `prism get` and
//! `prism summary` run as commands against the head's dashboard, which
//! asks the node's agent; and bad queries, on the command line and over
//! raw HTTP, answered clearly while the server keeps serving.

mod common;

use common::head::{http, Head};
use common::{run_bounded, text, PRISM};
use prism::{ActorOptions, Bundle, PlacementStrategy};
use prism_tests::{must, must_become};
use serde_json::Value;
use std::process::{Command, Output};
use std::time::Duration;

/// Set in this binary when it runs as the driver.
const STATE_DRIVER: &str = "PRISM_STATE_TEST_DRIVER";
/// The head's temp folder, for the driver's `prism` commands.
const STATE_TEMP: &str = "PRISM_STATE_TEST_TEMP";

const SQUARES: i64 = 20;

#[prism::remote]
fn square_for_state(x: i64) -> i64 {
    x * x
}

#[prism::remote]
fn explode_for_state() -> i64 {
    panic!("exploded on purpose")
}

/// Asked for with 3 CPUs: waits while the long task runs.
#[prism::remote]
fn all_cpus_for_state() -> i64 {
    9
}

/// Runs for `ms`: listed as RUNNING meanwhile, and found by `prism stack`.
#[prism::remote]
fn linger_for_state(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

#[prism::actor]
struct StateKeeper {
    n: u64,
}

#[prism::actor]
impl StateKeeper {
    fn new() -> Self {
        StateKeeper { n: 0 }
    }

    fn bump(&mut self) -> u64 {
        self.n += 1;
        println!("keeper bumped to {}", self.n);
        self.n
    }
}

/// `prism <args> --temp-dir <temp>`.
fn prism(temp: &str, args: &[&str]) -> Output {
    let mut command = Command::new(PRISM);
    command.args(args).args(["--temp-dir", temp]);
    run_bounded(command, &[], Duration::from_secs(60))
}

/// `prism list <kind> --format json <more>`: the rows.
fn list(temp: &str, kind: &str, more: &[&str]) -> Vec<Value> {
    let mut args = vec!["list", kind, "--format", "json"];
    args.extend_from_slice(more);
    let out = prism(temp, &args);
    assert!(out.status.success(), "prism list {kind}: {}", text(&out));
    let rows: Value = must(
        serde_json::from_slice(&out.stdout),
        "prism list prints JSON",
    );
    rows.as_array().cloned().unwrap_or_default()
}

fn named<'a>(rows: &'a [Value], field: &str, part: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r[field].as_str().is_some_and(|v| v.contains(part)))
        .collect()
}

#[test]
fn state_driver() {
    let Some(temp) = std::env::var_os(STATE_TEMP) else {
        return;
    };
    if std::env::var_os(STATE_DRIVER).is_none() {
        return;
    }
    let temp = temp.to_string_lossy().into_owned();
    must(prism::init(prism::Config::default()), "the driver joins");
    let keeper = must(
        StateKeeper::remote_with(ActorOptions::new().name("state-keeper")),
        "an actor",
    );
    must(prism::get(&must(keeper.bump(), "a call")), "it answers");
    let doomed = must(StateKeeper::remote(), "a second actor");
    must(prism::get(&must(doomed.bump(), "a call")), "it answers");
    must(prism::kill(&doomed), "the second actor is killed");
    let refs: Vec<_> = (0..SQUARES)
        .map(|i| must(square_for_state::remote(i), "a task"))
        .collect();
    for r in &refs {
        must(prism::get(r), "a square");
    }
    assert!(prism::get(&must(explode_for_state::remote(), "a task")).is_err());
    let object = must(prism::put(vec![7u8; 2 << 20]), "a 2 MiB object");
    let group = must(
        prism::placement_group(vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack),
        "a placement group",
    );
    assert!(must(group.wait(Duration::from_secs(10)), "it is placed"));
    let lingering = must(linger_for_state::remote(8_000), "a long task");
    // 3 of the 4 CPUs (the group holds one, the long task one): it waits
    // for the long task to end.
    let waiting = must(
        all_cpus_for_state::remote_with(prism::TaskOptions::new().num_cpus(3.0)),
        "a task that waits for CPUs",
    );
    // Owners report ended tasks about once a second.
    std::thread::sleep(Duration::from_millis(1500));

    let actors = list(&temp, "actors", &[]);
    let alive = named(&actors, "name", "state-keeper");
    assert_eq!(alive.len(), 1, "{actors:?}");
    assert_eq!(alive[0]["state"], "ALIVE", "{actors:?}");
    assert!(
        alive[0]["pid"].as_u64().is_some_and(|p| p > 0),
        "{actors:?}"
    );
    assert!(alive[0]["node_id"]
        .as_str()
        .is_some_and(|n| n.starts_with("node-")));
    let dead = list(&temp, "actors", &["--filter", "state=dead"]);
    assert_eq!(dead.len(), 1, "only the killed actor: {dead:?}");
    assert!(
        dead[0]["death_cause"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "a dead actor says why: {dead:?}"
    );
    let not_dead = list(&temp, "actors", &["--filter", "state!=DEAD"]);
    assert!(
        not_dead.iter().all(|a| a["state"] != "DEAD"),
        "{not_dead:?}"
    );

    let tasks = list(&temp, "tasks", &["--limit", "1000"]);
    let squares = named(&tasks, "name", "square_for_state");
    assert_eq!(squares.len() as i64, SQUARES, "{tasks:?}");
    assert!(squares.iter().all(|t| t["state"] == "FINISHED"));
    let failed = list(&temp, "tasks", &["--filter", "state=FAILED"]);
    let exploded = named(&failed, "name", "explode_for_state");
    assert_eq!(exploded.len(), 1, "{failed:?}");
    assert!(
        exploded[0]["error_message"]
            .as_str()
            .is_some_and(|e| e.contains("exploded on purpose")),
        "a failed task carries its error: {failed:?}"
    );
    let limited = list(&temp, "tasks", &["--limit", "3"]);
    assert_eq!(limited.len(), 3, "{limited:?}");
    // Where and when each ran: the executing node and worker.
    for t in &squares {
        assert!(t["worker_pid"].as_u64().is_some_and(|p| p > 0), "{t}");
        assert!(t["node_id"]
            .as_str()
            .is_some_and(|n| n.starts_with("node-")));
        assert_eq!(t["type"], "NORMAL_TASK", "{t}");
        let (created, start, end) = (
            t["creation_time_ms"].as_u64().unwrap_or(0),
            t["start_time_ms"].as_u64().unwrap_or(0),
            t["end_time_ms"].as_u64().unwrap_or(0),
        );
        assert!(created > 0 && created <= start && start <= end, "{t}");
    }
    // Actor calls (the killed actor's last run may not have been
    // reported by its worker: its owner's row says how it ended).
    let calls = named(&tasks, "name", "bump");
    assert!(
        calls.iter().any(|c| c["type"] == "ACTOR_TASK")
            && calls
                .iter()
                .all(|c| c["type"] == "ACTOR_TASK" || c["type"].is_null()),
        "actor calls: {calls:?}"
    );
    assert!(
        named(&tasks, "name", "StateKeeper::__init__")
            .iter()
            .all(|c| c["type"] == "ACTOR_CREATION_TASK"),
        "{tasks:?}"
    );
    // A task waiting for CPUs is listed as waiting, with no node yet.
    let pending = list(
        &temp,
        "tasks",
        &["--filter", "state=PENDING_NODE_ASSIGNMENT"],
    );
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0]["name"]
        .as_str()
        .is_some_and(|n| n.contains("all_cpus_for_state")));
    assert!(pending[0]["node_id"].is_null(), "{pending:?}");
    // A task running now is listed as RUNNING, first.
    let running = list(&temp, "tasks", &["--filter", "state=RUNNING"]);
    let lingering_rows = named(&running, "name", "linger_for_state");
    assert_eq!(lingering_rows.len(), 1, "{running:?}");
    assert!(lingering_rows[0]["end_time_ms"].is_null());
    // Its worker's stacks, taken while it runs: one thread sleeps in it.
    let lingering_id = lingering_rows[0]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let out = prism(&temp, &["stack", "--task", &lingering_id]);
    assert!(out.status.success(), "{}", text(&out));
    let dump = text(&out);
    assert!(
        dump.contains("linger_for_state") && dump.contains("1 worker process(es) dumped"),
        "{dump}"
    );
    let out = prism(&temp, &["stack", "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let all: Value = must(serde_json::from_slice(&out.stdout), "JSON");
    let processes: usize = all["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| n["processes"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(processes >= 2, "the task's worker and the actor's: {all}");
    for (args, says) in [
        (vec!["stack", "--pid", "1"], "no worker process"),
        (
            vec![
                "stack",
                "--task",
                squares[0]["task_id"].as_str().unwrap_or(""),
            ],
            "is not running",
        ),
        (
            vec!["stack", "--node", "node-nosuch"],
            "no nodes has the id",
        ),
    ] {
        let out = prism(&temp, &args);
        assert!(!out.status.success(), "{args:?} must fail: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }

    // The timeline: every square's run on its node's worker.
    let trace_path = format!("{temp}/timeline.json");
    let out = prism(&temp, &["timeline", "-o", &trace_path]);
    assert!(out.status.success(), "{}", text(&out));
    let trace: Value = must(
        serde_json::from_slice(&must(std::fs::read(&trace_path), "the trace")),
        "the trace is JSON",
    );
    let events = trace.as_array().cloned().unwrap_or_default();
    let runs: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["ph"] == "X"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("square_for_state"))
        })
        .collect();
    assert_eq!(runs.len() as i64, SQUARES, "{trace}");
    let worker_pids: Vec<u64> = squares
        .iter()
        .filter_map(|t| t["worker_pid"].as_u64())
        .collect();
    for run in &runs {
        assert!(
            run["ts"].as_u64().is_some_and(|t| t > 0) && run["dur"].is_u64(),
            "{run}"
        );
        assert!(
            run["tid"]
                .as_u64()
                .is_some_and(|p| worker_pids.contains(&p)),
            "{run}"
        );
    }
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "process_name"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "b" && e["cat"] == "scheduling"));
    let out = prism(&temp, &["timeline", "--job", "nosuch", "-o", &trace_path]);
    assert!(text(&out).contains("Wrote 0 task runs"), "{}", text(&out));

    let objects = list(&temp, "objects", &[]);
    assert!(
        objects
            .iter()
            .any(|o| o["object_size"].as_u64().is_some_and(|s| s >= 2 << 20)),
        "the 2 MiB object is in the store: {objects:?}"
    );
    let out = prism(&temp, &["memory"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("PUT") && text(&out).contains("MiB in all"),
        "prism memory: {}",
        text(&out)
    );
    let workers = list(&temp, "workers", &[]);
    assert!(workers.iter().any(|w| w["state"] == "ACTOR"), "{workers:?}");
    let groups = list(&temp, "placement-groups", &[]);
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["state"], "CREATED");
    let nodes = list(&temp, "nodes", &[]);
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["state"], "ALIVE");
    let jobs = list(&temp, "jobs", &[]);
    assert!(jobs.iter().any(|j| j["type"] == "DRIVER"), "{jobs:?}");

    // One row by its id.
    let id = alive[0]["actor_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let out = prism(&temp, &["get", "actors", &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("StateKeeper"), "{}", text(&out));

    // Logs: the actor's output, from its worker's file, by the actor's id.
    let out = prism(&temp, &["logs", "--actor", &id, "--tail", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("keeper bumped to 1"), "{}", text(&out));
    let out = prism(&temp, &["logs"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = text(&out);
    let file = listed
        .split_whitespace()
        .find(|w| w.starts_with("worker-") && w.ends_with(".out"))
        .map(str::to_string);
    assert!(file.is_some(), "the node's files are listed: {listed}");
    let out = prism(&temp, &["logs", &file.unwrap_or_default(), "--tail", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).lines().count() <= 1,
        "one line at most: {}",
        text(&out)
    );

    // Summaries: exact counts.
    let out = prism(&temp, &["summary", "tasks", "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Value = must(serde_json::from_slice(&out.stdout), "JSON");
    let by_name = summary["summary"].as_object().cloned().unwrap_or_default();
    let square = by_name
        .iter()
        .find(|(name, _)| name.contains("square_for_state"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert_eq!(square["state_counts"]["FINISHED"], SQUARES, "{summary}");
    let out = prism(&temp, &["summary", "actors"]);
    assert!(text(&out).contains("StateKeeper"), "{}", text(&out));
    // A table, by default.
    let out = prism(&temp, &["list", "actors"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("CLASS_NAME") && text(&out).contains("ALIVE"));

    must(prism::get(&lingering), "the long task ends");
    assert_eq!(must(prism::get(&waiting), "then the waiting one runs"), 9);
    drop(object);
    drop(group);
    println!("STATE DRIVER DONE");
    prism::shutdown();
}

#[test]
fn prism_list_get_and_summary_show_the_clusters_state() {
    if std::env::var_os(STATE_DRIVER).is_some() {
        return;
    }
    let head = Head::start_with("state", 4);
    let temp = head.temp.display().to_string();
    let exe = must(std::env::current_exe(), "this test's binary");
    let mut driver = Command::new(exe);
    driver.args(["--exact", "state_driver", "--nocapture"]);
    let out = run_bounded(
        driver,
        &[
            (STATE_DRIVER, "1"),
            (STATE_TEMP, &temp),
            ("PRISM_ADDRESS", &head.address),
            ("PRISM_TEMP_DIR", &temp),
        ],
        Duration::from_secs(180),
    );
    assert!(
        out.status.success() && text(&out).contains("STATE DRIVER DONE"),
        "the driver's checks: {}",
        text(&out)
    );

    // The node's log is plain text: no terminal colour codes.
    let logs = must(std::fs::read_dir(head.temp.join("logs")), "the node's logs");
    let mut seen = 0;
    for entry in logs.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("prism-node-") {
            let log = must(std::fs::read(entry.path()), "a node log");
            assert!(!log.is_empty(), "{name} is written");
            assert!(!log.contains(&0x1b), "{name} holds escape codes");
            seen += 1;
        }
    }
    assert_eq!(seen, 1, "the head's node log");

    // After the driver: its tasks are still listed, its actors dead.
    let tasks = list(
        &temp,
        "tasks",
        &["--filter", "state=FINISHED", "--limit", "1000"],
    );
    assert!(
        named(&tasks, "name", "square_for_state").len() as i64 == SQUARES,
        "{tasks:?}"
    );
    // They die as their processes stop, which the node sees a moment
    // after the driver's exit.
    let actors = must_become(
        "the job's actors ended with it",
        Duration::from_secs(20),
        || {
            let actors = list(&temp, "actors", &[]);
            (actors.len() == 2 && actors.iter().all(|a| a["state"] == "DEAD")).then_some(actors)
        },
    );
    assert_eq!(actors.len(), 2);

    // Bad queries: clear errors, on the command line.
    for (args, says) in [
        (vec!["list", "widgets"], "unknown kind"),
        (vec!["list", "actors", "--filter", "state"], "not key=value"),
        (
            vec!["list", "actors", "--filter", "colour=red"],
            "no field \"colour\"",
        ),
        (vec!["list", "actors", "--limit", "0"], "out of range"),
        (vec!["list", "tasks", "--limit", "10001"], "out of range"),
        (
            vec!["get", "actors", "no-such-actor"],
            "no actors has the id",
        ),
        (vec!["summary", "nodes"], "no summary of nodes"),
        (vec!["logs", "../token"], "is not a log file's name"),
        (vec!["logs", "absent.log"], "no log file"),
        (vec!["logs", "--node", "node-nosuch"], "no nodes has the id"),
        (
            vec!["logs", "--actor", "actor-nosuch"],
            "no actors has the id",
        ),
    ] {
        let out = prism(&temp, &args);
        assert!(!out.status.success(), "{args:?} must fail: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    // And over HTTP: 400 in Ray's envelope, 401 without the token.
    let token = head.token.clone();
    for path in [
        "/api/v0/widgets",
        "/api/v0/actors?limit=-1",
        "/api/v0/actors?limit=1&filter_keys=state",
        "/api/v0/actors?filter_keys=state&filter_predicates=%3C&filter_values=x",
        "/api/v0/actors?bogus=1",
        "/api/v0/actors?filter_keys=%ZZ&filter_predicates=%3D&filter_values=x",
        "/api/v0/workers/summarize",
    ] {
        let (status, body) = http(&head.dashboard, "GET", path, Some(&token), b"");
        assert_eq!(status, 400, "{path}: {body}");
        let value: Value = must(serde_json::from_str(&body), "a JSON envelope");
        assert_eq!(value["result"], false, "{path}: {body}");
        assert!(
            value["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{path}: {body}"
        );
    }
    let (status, _) = http(&head.dashboard, "GET", "/api/v0/actors", None, b"");
    assert_eq!(status, 401);
    let (status, body) = http(
        &head.dashboard,
        "GET",
        "/api/v0/nodes?limit=5",
        Some(&token),
        b"",
    );
    assert_eq!(status, 200, "the server keeps serving: {body}");
    let value: Value = must(serde_json::from_str(&body), "JSON");
    assert_eq!(value["result"], true);
    assert_eq!(value["data"]["result"]["total"], 1, "{body}");
}
