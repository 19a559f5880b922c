//! Metrics through real parts: a head and a joined node on two test hosts
//! (network namespaces, 10.77.0.x), each serving `/metrics` behind the
//! token; the head's discovery file listing them; `promtool check metrics`
//! on every endpoint's answer; and Debian's `prometheus` (installed by
//! `.ci/run`) scraping the cluster through that file, its HTTP API then
//! answering the count of tasks a driver ran. Needs root for the
//! namespaces and `prometheus` on the PATH; elsewhere it says it was
//! skipped and why. Every query of the Grafana dashboard in
//! `docs/grafana/` is asked of that Prometheus too.

mod common;

use common::{nodes_up, run_bounded, DRIVER};
use prism_tests::{must, must_eventually};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Tasks the driver runs, all of which succeed.
const ADDS: i64 = 30;

#[prism::remote]
fn add_for_metrics(a: i64, b: i64) -> i64 {
    a + b
}

#[prism::remote]
fn fail_for_metrics() -> i64 {
    panic!("this task fails on purpose")
}

#[prism::actor]
struct MetricsCounter {
    n: u64,
}

#[prism::actor]
impl MetricsCounter {
    fn new() -> Self {
        MetricsCounter { n: 0 }
    }

    fn bump(&mut self) -> u64 {
        self.n += 1;
        self.n
    }
}

/// The driver's part: `ADDS` tasks that finish and one that fails.
fn drive() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let refs: Vec<_> = (0..ADDS)
        .map(|i| must(add_for_metrics::remote(i, 1), "a task is submitted"))
        .collect();
    let sum: i64 = refs
        .iter()
        .map(|r| must(prism::get(r), "a task runs"))
        .sum();
    println!("SUM {sum}");
    let failed = must(fail_for_metrics::remote(), "a task is submitted");
    assert!(prism::get(&failed).is_err(), "the task fails");
    let counter = must(MetricsCounter::remote(), "an actor");
    must(prism::get(&must(counter.bump(), "a call")), "it answers");
    prism::shutdown();
}

/// `GET http://<at>/<path>` from host 0 (with the token when given): the
/// status, then the body.
fn get(m: &common::Machines, at: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let script = r#"
import http.client, sys
at, path, token = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = at.rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=10)
c.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
r = c.getresponse()
sys.stdout.write("%d\n" % r.status)
sys.stdout.write(r.read().decode())
"#;
    let mut command = m.net.command(0, "python3");
    command.args(["-c", script, at, path, token.unwrap_or("")]);
    let out = run_bounded(command, &[], Duration::from_secs(30));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, body) = said.split_once('\n').unwrap_or(("0", ""));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The lint findings `promtool check metrics` may report on Prism's
/// output: Ray's own label names are CamelCase (`SessionName`, `State`,
/// ...) and two of Ray's gauges end in `_total` and `_count`. Anything else (above all
/// a parse error) fails the test.
fn only_rays_names(findings: &str) -> bool {
    findings.lines().all(|l| {
        l.trim().is_empty()
            || l.ends_with("label names should be written in 'snake_case' not 'camelCase'")
            || l == "ray_node_mem_total non-counter metrics should not have \"_total\" suffix"
            || l == "ray_node_cpu_count non-histogram and non-summary metrics should not have \"_count\" suffix"
    })
}

fn promtool_check(text: &str) -> (Option<i32>, String) {
    let mut child = must(
        Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn(),
        "promtool runs",
    );
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("a piped stdin");
        must(stdin.write_all(text.as_bytes()), "promtool reads the text");
    }
    let out = must(child.wait_with_output(), "promtool ends");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The discovery file's target groups: (component, targets).
fn discovered(m: &common::Machines) -> Vec<(String, Vec<String>)> {
    let path = m.temps[0].join("prom_metrics_service_discovery.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    let groups: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    groups
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let component = g["labels"]["prism_component"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let targets = g["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            (component, targets)
        })
        .collect()
}

/// A Prometheus server on host 0, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn prometheus_scrapes_every_node_through_the_discovery_file() {
    if std::env::var_os(DRIVER).is_some() {
        return drive();
    }
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `prometheus` on the PATH (.ci/run installs Debian's)");
        return;
    }
    let Some((m, head)) = nodes_up("metrics", 2, &[]) else {
        return;
    };
    let token = m.token().trim().to_string();
    must_eventually(
        "the head lists both nodes' endpoints and its own",
        Duration::from_secs(10),
        || {
            let groups = discovered(&m);
            groups.iter().any(|(c, t)| c == "node" && t.len() == 2)
                && groups.iter().any(|(c, t)| c == "head" && t.len() == 1)
        },
    );
    let groups = discovered(&m);
    let nodes = groups
        .iter()
        .find(|(c, _)| c == "node")
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    for ip in [m.ip(0), m.ip(1)] {
        assert!(
            nodes.iter().any(|t| t.starts_with(&format!("{ip}:"))),
            "{nodes:?}"
        );
    }

    let said = m.run_driver(
        1,
        "prometheus_scrapes_every_node_through_the_discovery_file",
        &head,
        &[(DRIVER, "1")],
        Duration::from_secs(120),
    );
    assert!(
        said.contains(&format!("SUM {}", (0..ADDS).sum::<i64>() + ADDS)),
        "{said}"
    );

    // The health probes answer without the token: each node's, and the
    // control store's on the head's dashboard.
    for at in &nodes {
        let (status, body) = get(&m, at, "/api/local_raylet_healthz", None);
        assert_eq!((status, body.as_str()), (200, "success"), "{at}");
    }
    for (_, targets) in groups.iter().filter(|(c, _)| c == "head") {
        for at in targets {
            let (status, body) = get(&m, at, "/api/gcs_healthz", None);
            assert_eq!((status, body.as_str()), (200, "success"), "{at}");
        }
    }

    // Every endpoint: the token is asked for, the text parses.
    let mut endpoints = nodes.clone();
    endpoints.extend(
        groups
            .iter()
            .filter(|(c, _)| c == "head")
            .flat_map(|(_, t)| t.clone()),
    );
    for at in &endpoints {
        let (status, body) = get(&m, at, "/metrics", None);
        assert_eq!(status, 401, "{at} without the token: {body}");
        let (status, body) = get(&m, at, "/metrics", Some(&token));
        assert_eq!(status, 200, "{at}: {body}");
        let (code, findings) = promtool_check(&body);
        assert!(
            code == Some(0) || (code == Some(3) && only_rays_names(&findings)),
            "promtool check metrics on {at}: exit {code:?}\n{findings}\n{body}"
        );
    }
    // The driver's node counted its tasks (reported when it shut down).
    let (_, text_1) = get(&m, &nodes[1], "/metrics", Some(&token));
    let (_, text_0) = get(&m, &nodes[0], "/metrics", Some(&token));
    let host1 = if nodes[1].starts_with(&format!("{}:", m.ip(1))) {
        text_1
    } else {
        text_0
    };
    assert!(
        host1.lines().any(|l| l.starts_with("ray_tasks{")
            && l.contains("add_for_metrics")
            && l.contains("State=\"FINISHED\"")
            && l.ends_with(&format!(" {ADDS}"))),
        "{host1}"
    );
    assert!(
        host1.lines().any(|l| l.starts_with("ray_tasks{")
            && l.contains("fail_for_metrics")
            && l.contains("State=\"FAILED\"")
            && l.ends_with(" 1")),
        "{host1}"
    );

    // A real Prometheus, on host 0, finds the nodes through the file.
    let dir = std::env::temp_dir().join(format!("prism-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    must(std::fs::create_dir_all(&dir), "a folder for Prometheus");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
         scrape_configs:\n  - job_name: prism\n    authorization:\n      type: Bearer\n      \
         credentials_file: {}\n    file_sd_configs:\n      - files: ['{}']\n        \
         refresh_interval: 1s\n",
        m.temps[0].join("token").display(),
        m.temps[0]
            .join("prom_metrics_service_discovery.json")
            .display()
    );
    must(
        std::fs::write(dir.join("prometheus.yml"), config),
        "its config",
    );
    let log = must(std::fs::File::create(dir.join("log")), "its log");
    let mut command = m.net.command(0, "prometheus");
    command
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg("--web.listen-address=127.0.0.1:19090")
        .stdout(Stdio::null())
        .stderr(must(log.try_clone(), "its log"));
    let prometheus = Prometheus {
        child: must(command.spawn(), "prometheus starts"),
        dir: dir.clone(),
    };
    let query = |q: &str| -> String {
        let path = format!(
            "/api/v1/query?query={}",
            q.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        );
        get(&m, "127.0.0.1:19090", &path, None).1
    };
    let finished = "sum(ray_tasks{State=\"FINISHED\",Name=~\".*add_for_metrics\"})";
    let up = "count(up{job=\"prism\"} == 1)";
    let answered = prism_tests::wait_until(Duration::from_secs(60), || {
        query(finished).contains(&format!("\"{ADDS}\"]")) && query(up).contains("\"3\"]")
    });
    assert!(
        answered,
        "Prometheus answers the task count and sees 3 targets up: {} / {}\nits log:\n{}",
        query(finished),
        query(up),
        std::fs::read_to_string(dir.join("log")).unwrap_or_default()
    );
    let failed = query("sum(ray_tasks{State=\"FAILED\"})");
    assert!(failed.contains("\"1\"]"), "{failed}");

    // The Grafana dashboard's every query answers something.
    let dashboard: serde_json::Value = must(
        serde_json::from_str(include_str!("../../docs/grafana/prism-dashboard.json")),
        "the Grafana dashboard is JSON",
    );
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(|e| e.replace("$session", ".*")))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    // GPU panels answer nothing on these GPU-less hosts: they must parse
    // (a success), as tests/gpu_metrics.rs checks the series they read.
    let gpu = |e: &String| e.contains("ray_node_gpus") || e.contains("ray_node_gram");
    let empty = |e: &String| {
        let answer = query(e);
        !answer.contains("\"status\":\"success\"") || (answer.contains("\"result\":[]") && !gpu(e))
    };
    prism_tests::wait_until(Duration::from_secs(30), || !exprs.iter().any(empty));
    let unanswered: Vec<(&String, String)> = exprs
        .iter()
        .filter(|e| empty(e))
        .map(|e| (e, query(e)))
        .collect();
    assert!(
        unanswered.is_empty(),
        "Grafana panels whose query answers nothing: {unanswered:#?}"
    );
    drop(prometheus);
}
