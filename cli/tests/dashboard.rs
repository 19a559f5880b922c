//! The dashboard in a real browser: Debian's `chromium`, headless
//! (installed by `.ci/run`), opens each view of a head's dashboard (a
//! head started by `prism start --head` on loopback, with a running job,
//! a finished driver's actors and tasks, one of them failed), logged in
//! through `/?token=`. The test reads what each view shows from the DOM
//! the browser ends with, requires the page's error list and the
//! browser's console to be free of errors, and keeps a screenshot of each
//! view in `<target>/tmp/dashboard-screenshots/`. Skipped, saying so,
//! where no `chromium` is installed.

mod common;

use common::head::Head;
use common::{run_bounded, text, PRISM};
use prism::ActorOptions;
use prism_tests::must;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const DASH_DRIVER: &str = "PRISM_DASHBOARD_TEST_DRIVER";

#[prism::remote]
fn dashboard_square(x: i64) -> i64 {
    x * x
}

#[prism::remote]
fn dashboard_explode() -> i64 {
    panic!("dashboard task failed on purpose")
}

#[prism::actor]
struct DashKeeper {
    n: u64,
}

#[prism::actor]
impl DashKeeper {
    fn new() -> Self {
        DashKeeper { n: 0 }
    }

    fn bump(&mut self) -> u64 {
        self.n += 1;
        self.n
    }
}

#[test]
fn dashboard_driver() {
    if std::env::var_os(DASH_DRIVER).is_none() {
        return;
    }
    must(prism::init(prism::Config::default()), "the driver joins");
    let keeper = must(
        DashKeeper::remote_with(ActorOptions::new().name("dash-keeper")),
        "an actor",
    );
    must(prism::get(&must(keeper.bump(), "a call")), "it answers");
    for i in 0..12 {
        must(
            prism::get(&must(dashboard_square::remote(i), "a task")),
            "a square",
        );
    }
    assert!(prism::get(&must(dashboard_explode::remote(), "a task")).is_err());
    prism::shutdown();
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs headless Chromium on `url` with a fresh profile: what it printed
/// (the DOM with `--dump-dom`) and its log.
fn browse(browser: &str, profile: &Path, url: &str, extra: &[&str]) -> (String, String) {
    let mut command = Command::new(browser);
    command
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url);
    let out = run_bounded(command, &[], Duration::from_secs(60));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text of the element with this id in a dumped DOM.
fn inner<'a>(dom: &'a str, id: &str) -> &'a str {
    let Some(start) = dom.find(&format!("id=\"{id}\"")) else {
        return "";
    };
    let rest = &dom[start..];
    let Some(open) = rest.find('>') else {
        return "";
    };
    let rest = &rest[open + 1..];
    &rest[..rest.find("</").unwrap_or(rest.len())]
}

#[test]
fn every_view_of_the_dashboard_shows_the_cluster_in_a_real_browser() {
    if std::env::var_os(DASH_DRIVER).is_some() {
        return;
    }
    let Some(browser) = chromium() else {
        eprintln!("skipped: no chromium installed (.ci/run installs Debian's)");
        return;
    };
    let head = Head::start_with("dashboard", 4);
    let temp = head.temp.display().to_string();
    let exe = must(std::env::current_exe(), "this test's binary");
    let mut driver = Command::new(exe);
    driver.args(["--exact", "dashboard_driver", "--nocapture"]);
    let out = run_bounded(
        driver,
        &[
            (DASH_DRIVER, "1"),
            ("PRISM_ADDRESS", &head.address),
            ("PRISM_TEMP_DIR", &temp),
        ],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "the driver runs: {}", text(&out));
    let mut submit = Command::new(PRISM);
    submit.args([
        "job",
        "--temp-dir",
        &temp,
        "submit",
        "--no-wait",
        "--submission-id",
        "dashboard-sleeper",
        "--",
        "sleep 120",
    ]);
    let out = run_bounded(submit, &[], Duration::from_secs(60));
    assert!(out.status.success(), "a job runs: {}", text(&out));
    // A few of the head's samples for the charts.
    std::thread::sleep(Duration::from_secs(5));

    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    must(
        std::fs::create_dir_all(&shots),
        "a folder for the screenshots",
    );
    let profile = head.temp.join("browser-profile");
    let login = format!("{}/?token={}", head.url(), head.token);
    let views: [(&str, &[&str]); 7] = [
        (
            "overview",
            &[
                "Nodes alive",
                "Failed tasks",
                "CPU",
                "dashboard task failed on purpose",
            ],
        ),
        ("nodes", &["127.0.0.1", "ALIVE", "node-"]),
        (
            "jobs",
            &["dashboard-sleeper", "RUNNING", "sleep 120", "DRIVER"],
        ),
        ("actors", &["DashKeeper", "dash-keeper", "DEAD"]),
        (
            "tasks",
            &[
                "dashboard_square",
                "dashboard_explode",
                "FAILED",
                "data-task=",
                "prism-timeline.json",
            ],
        ),
        ("placement-groups", &["placement_group_id", "group"]),
        (
            "metrics",
            &[
                "data-series=\"CPU used\"",
                "data-series=\"nodes alive\"",
                "polyline",
            ],
        ),
    ];
    for (view, wanted) in views {
        let url = format!("{login}#{view}");
        let (dom, log) = browse(browser, &profile, &url, &["--dump-dom"]);
        assert!(
            dom.contains(&format!("data-loaded=\"{view}\"")),
            "the {view} view loaded:\n{dom}\n{log}"
        );
        assert_eq!(inner(&dom, "errors"), "", "the page's errors on {view}");
        for part in wanted {
            assert!(dom.contains(part), "the {view} view shows {part:?}:\n{dom}");
        }
        for line in log.lines() {
            let console_error =
                line.contains(":CONSOLE") && (line.contains("Error") || line.contains("Uncaught"));
            assert!(!console_error, "the browser's console on {view}: {line}");
        }
        let shot = shots.join(format!("{view}.png"));
        let _ = std::fs::remove_file(&shot);
        browse(
            browser,
            &profile,
            &url,
            &[
                &format!("--screenshot={}", shot.display()),
                "--window-size=1280,1000",
                "--hide-scrollbars",
            ],
        );
        let png = must(std::fs::read(&shot), "a screenshot of the view");
        assert!(png.starts_with(b"\x89PNG"), "{} is a PNG", shot.display());
    }
    // Without the token: the page says how to get in, and no data.
    let fresh = head.temp.join("browser-profile-stranger");
    let (dom, _) = browse(
        browser,
        &fresh,
        &format!("{}/#actors", head.url()),
        &["--dump-dom"],
    );
    assert!(dom.contains("needs the cluster token"), "{dom}");
    assert!(!dom.contains("DashKeeper"), "{dom}");
}
