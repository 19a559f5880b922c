//! Jobs through the head's dashboard: `prism job`, the Rust client, raw
//! HTTP and Ray's own `ray job` CLI and SDK against a real head started by
//! `prism start --head` (on loopback, ports picked free, a temp folder of
//! its own), with real entrypoint processes, a Prism driver among them.

mod common;

use common::head::{http, Head};
use common::{run_bounded, text, PRISM};
use prism_jobs::{JobRequest, JobStatus, JobSubmissionClient};
use prism_tests::{must, must_eventually};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Set in this binary when a job runs it as a Prism driver.
const JOB_DRIVER: &str = "PRISM_JOBS_TEST_DRIVER";

/// What the jobs tests ask of a head.
trait JobsHead {
    fn client(&self) -> JobSubmissionClient;
    fn job(&self, args: &[&str]) -> Output;
}

impl JobsHead for Head {
    fn client(&self) -> JobSubmissionClient {
        must(
            JobSubmissionClient::new(&self.url(), Some(self.token.clone())),
            "a client of the head",
        )
    }

    /// `prism job <args>` on this machine (it finds the head and token by
    /// itself).
    fn job(&self, args: &[&str]) -> Output {
        let mut command = Command::new(PRISM);
        command
            .args(["job", "--temp-dir"])
            .arg(&self.temp)
            .args(args);
        run_bounded(command, &[], Duration::from_secs(60))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    must(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        "a runtime",
    )
}

/// Whether a process of group `pgid` runs (zombies left for the init
/// process to reap do not count).
fn group_runs(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

/// The driver a job runs: this test binary, joining the cluster named by
/// `PRISM_ADDRESS`, running a task there.
#[prism::remote]
fn greeting_in_worker() -> String {
    std::env::var("GREETING").unwrap_or_else(|_| "no greeting".into())
}

#[test]
fn job_driver() {
    if std::env::var_os(JOB_DRIVER).is_none() {
        return;
    }
    must(
        prism::init(prism::Config::default()),
        "the job's driver joins the cluster",
    );
    let (total, _) = must(prism::cluster_resources(), "the cluster's resources");
    let from_worker = must(
        prism::get(&must(greeting_in_worker::remote(), "a task is submitted")),
        "the task's result",
    );
    println!(
        "DRIVER joined a cluster of {} CPU; driver sees {:?}; a worker sees {from_worker:?}",
        total.get("CPU").as_f64(),
        std::env::var("GREETING").unwrap_or_default()
    );
    prism::shutdown();
}

#[test]
fn jobs_run_on_the_head_and_prism_job_follows_them() {
    let head = Head::start("jobs-cli");

    let out = head.job(&["submit", "--", "echo hello from a job"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("hello from a job"), "{}", text(&out));

    let out = head.job(&["submit", "--", "echo about to fail; exit 3"]);
    assert!(
        !out.status.success(),
        "a failed job fails the command: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("about to fail") && text(&out).contains("exit code 3"),
        "{}",
        text(&out)
    );

    let out = head.job(&["submit", "--", "/no/such/program"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("FAILED") && text(&out).contains("not found"),
        "{}",
        text(&out)
    );

    // working_dir and env_vars: a folder with an executable script.
    let folder = head.temp.join("project");
    must(
        std::fs::create_dir_all(folder.join("data")),
        "a project folder",
    );
    must(
        std::fs::write(
            folder.join("run.sh"),
            "#!/bin/sh\necho \"$GREETING from $(cat data/word)\"\n",
        ),
        "a script",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        must(
            std::fs::set_permissions(
                folder.join("run.sh"),
                std::fs::Permissions::from_mode(0o755),
            ),
            "the script is executable",
        );
    }
    must(
        std::fs::write(folder.join("data/word"), "the package"),
        "a data file",
    );
    let folder_arg = folder.display().to_string();
    let out = head.job(&[
        "submit",
        "--working-dir",
        &folder_arg,
        "--runtime-env-json",
        r#"{"env_vars": {"GREETING": "hej"}}"#,
        "--metadata-json",
        r#"{"owner": "tests"}"#,
        "--",
        "./run.sh",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("hej from the package"),
        "{}",
        text(&out)
    );

    // A Prism program as the job's driver, joining the cluster.
    let exe = must(std::env::current_exe(), "this test's binary")
        .display()
        .to_string();
    let entry = format!("{exe} --exact job_driver --nocapture");
    let env = format!(r#"{{"env_vars": {{"{JOB_DRIVER}": "1", "GREETING": "hello workers"}}}}"#);
    let out = head.job(&["submit", "--runtime-env-json", &env, "--", &entry]);
    assert!(
        out.status.success(),
        "the driver job succeeds: {}",
        text(&out)
    );
    assert!(
        text(&out).contains(
            "DRIVER joined a cluster of 1 CPU; driver sees \"hello workers\"; a worker sees \"hello workers\""
        ),
        "{}",
        text(&out)
    );

    // Stop: a job that ignores SIGTERM is killed after the grace.
    let out = head.job(&[
        "submit",
        "--no-wait",
        "--submission-id",
        "stubborn",
        "--",
        "trap '' TERM; echo waiting; sleep 60",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let client = head.client();
    let rt = runtime();
    must_eventually("the stubborn job runs", Duration::from_secs(10), || {
        rt.block_on(client.logs("stubborn"))
            .unwrap_or_default()
            .contains("waiting")
    });
    let out = head.job(&["delete", "stubborn"]);
    assert!(
        !out.status.success() && text(&out).contains("stop it first"),
        "{}",
        text(&out)
    );
    let started = Instant::now();
    let out = head.job(&["stop", "stubborn"]);
    assert!(
        out.status.success() && text(&out).contains("STOPPED"),
        "{}",
        text(&out)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the grace was given"
    );
    let details = must(rt.block_on(client.get("stubborn")), "the stopped job");
    let pid: i32 = details
        .driver_info
        .expect("it ran")
        .pid
        .parse()
        .expect("a pid");
    assert!(!group_runs(pid), "no process of the stopped job is left");
    let out = head.job(&["stop", "stubborn"]);
    assert!(
        out.status.success() && text(&out).contains("already ended"),
        "{}",
        text(&out)
    );
    let out = head.job(&["delete", "stubborn"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = head.job(&["status", "stubborn"]);
    assert!(
        !out.status.success() && text(&out).contains("404"),
        "{}",
        text(&out)
    );

    // A driver started by hand is listed too, as Ray lists drivers; the
    // submitted driver's job carries its driver's job id.
    let mut by_hand = Command::new(must(std::env::current_exe(), "this test's binary"));
    by_hand.args(["--exact", "job_driver", "--nocapture"]);
    let temp = head.temp.display().to_string();
    let out = run_bounded(
        by_hand,
        &[
            (JOB_DRIVER, "1"),
            ("PRISM_ADDRESS", head.address.as_str()),
            ("PRISM_TEMP_DIR", temp.as_str()),
        ],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out));
    let mut drivers = Vec::new();
    must_eventually(
        "the driver is listed as ended",
        Duration::from_secs(10),
        || {
            drivers = rt
                .block_on(client.list())
                .unwrap_or_default()
                .into_iter()
                .filter(|j| j.job_type == prism_jobs::JobType::Driver)
                .collect();
            drivers.len() == 1 && drivers[0].status == JobStatus::Succeeded
        },
    );
    assert!(
        drivers[0].entrypoint.contains("job_driver"),
        "{:?}",
        drivers[0]
    );
    let driver_id = drivers[0].job_id.clone().expect("a driver has a job id");
    let out = head.job(&["logs", &driver_id]);
    assert!(
        !out.status.success() && text(&out).contains("driver started by hand"),
        "{}",
        text(&out)
    );
    let list = must(rt.block_on(client.list()), "the job list");
    let submitted_driver = list
        .iter()
        .find(|j| {
            j.entrypoint.contains("job_driver") && j.job_type == prism_jobs::JobType::Submission
        })
        .expect("the driver job");
    assert_ne!(
        submitted_driver.job_id, submitted_driver.submission_id,
        "it has its driver's job id"
    );
    let list: Vec<_> = list
        .into_iter()
        .filter(|j| j.job_type == prism_jobs::JobType::Submission)
        .collect();
    assert_eq!(list.len(), 5, "{list:?}");
    assert!(list
        .iter()
        .any(|j| j.metadata.as_ref().is_some_and(|m| m["owner"] == "tests")));
    let statuses: Vec<JobStatus> = list.iter().map(|j| j.status).collect();
    assert_eq!(
        statuses,
        [
            JobStatus::Succeeded,
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Failed,
            JobStatus::Succeeded
        ],
        "newest first"
    );
}

#[test]
fn the_job_table_outlives_the_control_store() {
    let head = Head::start("jobs-restart");
    let client = head.client();
    let rt = runtime();
    let done = must(
        rt.block_on(client.submit(&JobRequest {
            entrypoint: "echo before the restart".into(),
            ..Default::default()
        })),
        "a job is submitted",
    );
    must(
        rt.block_on(client.wait(&done, Duration::from_secs(20))),
        "it ends",
    );
    let running = must(
        rt.block_on(client.submit(&JobRequest {
            entrypoint: "sleep 2; echo across the restart".into(),
            ..Default::default()
        })),
        "a long job is submitted",
    );
    must_eventually("the long job runs", Duration::from_secs(10), || {
        rt.block_on(client.get(&running))
            .is_ok_and(|d| d.status == JobStatus::Running)
    });
    // The control store (and the dashboard in its process) dies; the
    // head node starts it again.
    let killed = Command::new("pkill")
        .args([
            "-9",
            "-f",
            &format!("gcs-server .*--temp-dir {}", head.temp.display()),
        ])
        .status();
    assert!(
        must(killed, "pkill runs").success(),
        "the control store was found and killed"
    );
    must_eventually(
        "the dashboard serves again",
        Duration::from_secs(20),
        || rt.block_on(client.get(&done)).is_ok(),
    );
    let details = must(
        rt.block_on(client.get(&done)),
        "the finished job is still listed",
    );
    assert_eq!(details.status, JobStatus::Succeeded);
    assert_eq!(
        must(rt.block_on(client.logs(&done)), "its log"),
        "before the restart\n"
    );
    let status = must(
        rt.block_on(client.wait(&running, Duration::from_secs(20))),
        "the running job is found again",
    );
    assert_eq!(
        status,
        JobStatus::Succeeded,
        "{:?}",
        rt.block_on(client.get(&running))
    );
    assert!(must(rt.block_on(client.logs(&running)), "its log").contains("across the restart"));

    // The head stops: its running jobs stop with it.
    let waiting = must(
        rt.block_on(client.submit(&JobRequest {
            entrypoint: "sleep 60".into(),
            ..Default::default()
        })),
        "a job that would outlive the head",
    );
    must_eventually("it runs", Duration::from_secs(10), || {
        rt.block_on(client.get(&waiting))
            .is_ok_and(|d| d.driver_info.is_some())
    });
    let pid: i32 = must(rt.block_on(client.get(&waiting)), "its details")
        .driver_info
        .expect("it runs")
        .pid
        .parse()
        .expect("a pid");
    let mut stop = Command::new(PRISM);
    stop.args(["stop", "--temp-dir"]).arg(&head.temp);
    let out = run_bounded(stop, &[], Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    assert!(!group_runs(pid), "the head's jobs ended with it");
}

#[test]
fn entrypoint_resources_are_held_and_a_job_waits_for_them() {
    // The head has 1 CPU: two entrypoints asking for 1 CPU each take turns.
    let head = Head::start("jobs-resources");
    let client = head.client();
    let rt = runtime();
    let gate = head.temp.join("gate");
    let one_cpu = |entrypoint: String| JobRequest {
        entrypoint,
        entrypoint_num_cpus: Some(1.0),
        ..Default::default()
    };
    let first = must(
        rt.block_on(client.submit(&one_cpu(format!(
            "for i in $(seq 600); do [ -e {} ] && exit 0; sleep 0.05; done; exit 9",
            gate.display()
        )))),
        "a job holding the CPU",
    );
    must_eventually("the first job runs", Duration::from_secs(10), || {
        rt.block_on(client.get(&first))
            .is_ok_and(|d| d.status == JobStatus::Running)
    });
    let second = must(
        rt.block_on(client.submit(&one_cpu("echo second".into()))),
        "a job that waits",
    );
    must_eventually(
        "the second job says what it waits for",
        Duration::from_secs(10),
        || {
            rt.block_on(client.get(&second)).is_ok_and(|d| {
                d.status == JobStatus::Pending
                    && d.message.as_deref().is_some_and(|m| {
                        m.contains("waiting for resources")
                            && m.contains("1 CPU")
                            && m.contains(&first)
                    })
            })
        },
    );
    // An entrypoint that asks for nothing does not wait.
    let free = must(
        rt.block_on(client.submit(&JobRequest {
            entrypoint: "echo free".into(),
            ..Default::default()
        })),
        "a job asking for no CPU",
    );
    assert_eq!(
        must(
            rt.block_on(client.wait(&free, Duration::from_secs(20))),
            "it ends"
        ),
        JobStatus::Succeeded
    );
    // A waiting job can be stopped; it never starts.
    let third = must(
        rt.block_on(client.submit(&one_cpu("echo never".into()))),
        "a third job",
    );
    assert!(must(rt.block_on(client.stop(&third)), "stop answers"));
    assert_eq!(
        must(
            rt.block_on(client.wait(&third, Duration::from_secs(20))),
            "it ends"
        ),
        JobStatus::Stopped
    );
    assert_eq!(must(rt.block_on(client.logs(&third)), "its log"), "");
    assert_eq!(
        must(rt.block_on(client.get(&second)), "still waiting").status,
        JobStatus::Pending
    );
    // The first gives the CPU back; the second runs.
    must(std::fs::write(&gate, b""), "the gate opens");
    for id in [&first, &second] {
        let status = must(
            rt.block_on(client.wait(id, Duration::from_secs(20))),
            "the job ends",
        );
        assert_eq!(
            status,
            JobStatus::Succeeded,
            "{:?}",
            rt.block_on(client.get(id))
        );
    }
    assert_eq!(
        must(rt.block_on(client.logs(&second)), "its log"),
        "second\n"
    );

    // A working_dir package goes with the last job that names it.
    let folder = head.temp.join("package");
    must(std::fs::create_dir_all(&folder), "a folder");
    must(std::fs::write(folder.join("word"), "zipped"), "a file");
    let uri = must(
        rt.block_on(client.upload_working_dir(&folder)),
        "the folder is uploaded",
    );
    let name = uri.trim_start_matches("gcs://").to_string();
    let path = format!("/api/packages/gcs/{name}");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = must(
            rt.block_on(
                client.submit(&JobRequest {
                    entrypoint: "cat word".into(),
                    runtime_env: Some(
                        serde_json::json!({ "working_dir": uri })
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    ),
                    ..Default::default()
                }),
            ),
            "a job in the package",
        );
        must(
            rt.block_on(client.wait(&id, Duration::from_secs(20))),
            "it ends",
        );
        assert_eq!(must(rt.block_on(client.logs(&id)), "its log"), "zipped");
        ids.push(id);
    }
    let (status, _) = http(&head.dashboard, "GET", &path, Some(&head.token), b"");
    assert_eq!(status, 200, "the package is kept while jobs name it");
    must(rt.block_on(client.delete(&ids[0])), "one job is deleted");
    let (status, _) = http(&head.dashboard, "GET", &path, Some(&head.token), b"");
    assert_eq!(status, 200, "the other job still names the package");
    must(rt.block_on(client.delete(&ids[1])), "the last is deleted");
    let (status, body) = http(&head.dashboard, "GET", &path, Some(&head.token), b"");
    assert_eq!(status, 404, "the package went with its last job: {body}");
}

/// A request (method, path, token, body), the status it must get, and
/// what the answer must say.
type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a [u8], u16, &'a str);

#[test]
fn bad_requests_get_clear_answers_and_the_server_keeps_serving() {
    let head = Head::start("jobs-bad");
    let at = head.dashboard.as_str();
    let token = Some(head.token.as_str());
    let (status, body) = http(at, "GET", "/api/version", token, b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"version\":\"4\""), "{body}");

    let (status, body) = http(
        at,
        "POST",
        "/api/jobs/",
        token,
        br#"{"entrypoint": "echo kept", "submission_id": "kept"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"job_id":"kept","submission_id":"kept"}"#);

    let cases: &[Case] = &[
        (
            "POST",
            "/api/jobs/",
            token,
            b"{not json",
            400,
            "not valid JSON",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "colour": 1}"#,
            400,
            "unknown field",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "metadata": {"a": 1}}"#,
            400,
            "must be strings",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "runtime_env": {"conda": "env"}}"#,
            400,
            "supported keys are working_dir",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "runtime_env": {"working_dir": "gcs://_ray_pkg_00.zip"}}"#,
            400,
            "was not uploaded",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "submission_id": "kept"}"#,
            400,
            "exists already",
        ),
        (
            "POST",
            "/api/jobs/",
            token,
            br#"{"entrypoint": "x", "entrypoint_num_cpus": 64}"#,
            400,
            "has 1 in all",
        ),
        (
            "POST",
            "/api/jobs/",
            None,
            br#"{"entrypoint": "x"}"#,
            401,
            "cluster token",
        ),
        (
            "GET",
            "/api/jobs/",
            Some("wrong"),
            b"",
            401,
            "cluster token",
        ),
        ("GET", "/api/jobs/nope", token, b"", 404, "no job"),
        ("POST", "/api/jobs/nope/stop", token, b"", 404, "no job"),
        ("DELETE", "/api/jobs/nope", token, b"", 404, "no job"),
        ("GET", "/api/jobs/nope/logs", token, b"", 404, "no job"),
        (
            "PUT",
            "/api/packages/gcs/_ray_pkg_ab.zip",
            token,
            b"not a zip",
            400,
            "not a zip",
        ),
        (
            "PUT",
            "/api/packages/s3/_ray_pkg_ab.zip",
            token,
            b"",
            400,
            "protocol",
        ),
        (
            "GET",
            "/api/packages/gcs/_ray_pkg_ab.zip",
            token,
            b"",
            404,
            "no package",
        ),
    ];
    for (method, path, token, body, want, says) in cases {
        let (status, answer) = http(at, method, path, *token, body);
        assert_eq!(
            status,
            *want,
            "{method} {path} {}: {answer}",
            String::from_utf8_lossy(body)
        );
        assert!(
            answer.contains(says),
            "{method} {path}: {answer:?} should say {says:?}"
        );
    }
    let client = head.client();
    let rt = runtime();
    must(
        rt.block_on(client.wait("kept", Duration::from_secs(20))),
        "the kept job ends",
    );
    let (status, body) = http(at, "POST", "/api/jobs/kept/stop", token, b"");
    assert_eq!((status, body.as_str()), (200, r#"{"stopped":false}"#));

    // A flood of malformed requests, bounded in count and time.
    let started = Instant::now();
    for i in 0..1000 {
        let body = format!("{{\"entrypoint\": {i}");
        let (status, _) = http(at, "POST", "/api/jobs/", token, body.as_bytes());
        assert_eq!(status, 400);
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "1,000 requests took over 2 minutes"
        );
    }
    let list = must(rt.block_on(client.list()), "the server still serves");
    assert_eq!(
        list.len(),
        1,
        "every earlier job is still listed, and no bad one: {list:?}"
    );
    assert_eq!(list[0].submission_id.as_deref(), Some("kept"));
    let id = must(
        rt.block_on(client.submit(&JobRequest {
            entrypoint: "echo still here".into(),
            ..Default::default()
        })),
        "a new job after the flood",
    );
    assert_eq!(
        must(
            rt.block_on(client.wait(&id, Duration::from_secs(20))),
            "it ends"
        ),
        JobStatus::Succeeded
    );
}

/// Ray's CLI and SDK, from PyPI (bench/ray/setup.sh installs them).
fn ray_venv() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/ray/.venv/bin");
    if root.join("ray").exists() {
        Some(root)
    } else {
        eprintln!("skipped: Ray's client is not installed (run bench/ray/setup.sh; CI does)");
        None
    }
}

#[test]
fn rays_own_cli_and_sdk_drive_a_prism_head() {
    let Some(bin) = ray_venv() else {
        return;
    };
    let head = Head::start("jobs-ray");
    let ray_env: Vec<(&str, String)> = vec![
        ("RAY_ADDRESS", head.url()),
        ("RAY_AUTH_MODE", "token".into()),
        ("RAY_AUTH_TOKEN", head.token.clone()),
    ];
    let ray = |args: &[&str]| -> Output {
        let mut command = Command::new(bin.join("ray"));
        command.args(args);
        let env: Vec<(&str, &str)> = ray_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_bounded(command, &env, Duration::from_secs(120))
    };
    let folder = head.temp.join("ray-project");
    must(std::fs::create_dir_all(&folder), "a project folder");
    must(
        std::fs::write(
            folder.join("main.sh"),
            "echo \"$WHO ran $(basename \"$PWD\" | cut -c1-9)\"\n",
        ),
        "a script",
    );
    let folder_arg = folder.display().to_string();
    let out = ray(&[
        "job",
        "submit",
        "--submission-id",
        "from-ray",
        "--working-dir",
        &folder_arg,
        "--runtime-env-json",
        r#"{"env_vars": {"WHO": "ray's cli"}}"#,
        "--",
        "sh",
        "main.sh",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("ray's cli ran _ray_pkg_") && text(&out).contains("succeeded"),
        "{}",
        text(&out)
    );

    let out = ray(&["job", "submit", "--", "sh", "-c", "exit 4"]);
    assert!(
        !out.status.success(),
        "a failed job fails ray's command too: {}",
        text(&out)
    );
    assert!(text(&out).contains("exit code 4"), "{}", text(&out));

    let out = ray(&["job", "status", "from-ray"]);
    assert!(
        out.status.success() && text(&out).contains("succeeded"),
        "{}",
        text(&out)
    );
    let out = ray(&["job", "logs", "from-ray"]);
    assert!(
        out.status.success() && text(&out).contains("ray's cli ran"),
        "{}",
        text(&out)
    );
    let out = ray(&["job", "list"]);
    assert!(
        out.status.success() && text(&out).contains("from-ray"),
        "{}",
        text(&out)
    );
    let out = ray(&[
        "job",
        "submit",
        "--no-wait",
        "--submission-id",
        "long",
        "--",
        "sleep",
        "60",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ray(&["job", "stop", "long"]);
    assert!(
        out.status.success() && text(&out).to_lowercase().contains("stopped"),
        "{}",
        text(&out)
    );
    let out = ray(&["job", "delete", "long"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ray(&[
        "job",
        "submit",
        "--runtime-env-json",
        r#"{"pip": ["requests"]}"#,
        "--",
        "true",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("not supported by Prism"),
        "{}",
        text(&out)
    );

    // The SDK.
    let script = r#"
import os, sys, time
from ray.job_submission import JobSubmissionClient, JobStatus
client = JobSubmissionClient(os.environ["RAY_ADDRESS"])
job = client.submit_job(entrypoint="echo sdk says $X", runtime_env={"env_vars": {"X": "hi"}}, metadata={"by": "sdk"})
deadline = time.time() + 30
while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
    assert time.time() < deadline, "the job did not end"
    time.sleep(0.1)
info = client.get_job_info(job)
print("SDK", info.status, info.metadata, client.get_job_logs(job).strip(), len(client.list_jobs()))
"#;
    let mut python = Command::new(bin.join("python"));
    python.args(["-c", script]);
    let env: Vec<(&str, &str)> = ray_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run_bounded(python, &env, Duration::from_secs(120));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("SDK SUCCEEDED {'by': 'sdk'} sdk says hi 3"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_records_of_ended_drivers_are_kept_to_the_job_tables_limit() {
    let head = Head::start_env("jobs-kept", 1, &[("PRISM_JOB_MAX_KEPT", "2")]);
    let client = head.client();
    let rt = runtime();
    let temp = head.temp.display().to_string();
    for _ in 0..3 {
        let mut by_hand = Command::new(must(std::env::current_exe(), "this test's binary"));
        by_hand.args(["--exact", "job_driver", "--nocapture"]);
        let out = run_bounded(
            by_hand,
            &[
                (JOB_DRIVER, "1"),
                ("PRISM_ADDRESS", head.address.as_str()),
                ("PRISM_TEMP_DIR", temp.as_str()),
            ],
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    // Each driver's record says it ended once its connection closed (in the
    // background): then the oldest goes, and two are listed.
    let mut drivers = Vec::new();
    must_eventually(
        "two ended drivers are listed",
        Duration::from_secs(15),
        || {
            drivers = rt
                .block_on(client.list())
                .unwrap_or_default()
                .into_iter()
                .filter(|j| j.job_type == prism_jobs::JobType::Driver)
                .collect();
            drivers.len() == 2 && drivers.iter().all(|d| d.status == JobStatus::Succeeded)
        },
    );
}
