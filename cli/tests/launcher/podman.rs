//! The cluster launcher's `podman` provider with real podman: `prism up`
//! of a head container with an autoscaler beside it, worker containers
//! started for waiting work and removed once idle, and `prism down`
//! leaving no container, network or autoscaler behind. The image is
//! `deploy/image/build.sh`'s, built by the test (`.ci/run` installs podman,
//! buildah and busybox-static). Skipped, saying why, where they are
//! missing or the test does not run as root.

use super::common::{run_bounded, text, PRISM};
use prism_tests::must;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The test images' name; each build of `prism` has its own tag.
const IMAGE_NAME: &str = "localhost/prism-launch-test";

/// The test's image for this build of `prism`: tagged by the binary's size
/// and time, so that test processes of one build share one image and
/// never replace it under each other.
fn image() -> &'static str {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        if let Ok(meta) = std::fs::metadata(PRISM) {
            (meta.len(), meta.modified().ok()).hash(&mut h);
        }
        format!("{IMAGE_NAME}:{:016x}", h.finish())
    })
}

/// A folder for the test (its home folder and cluster file) and the
/// cluster's name; dropping it removes whatever a failed run left: the
/// autoscaler (by pid, then by name), the containers and the network.
struct PodmanCluster {
    dir: PathBuf,
    name: String,
    file: PathBuf,
}

fn containers_conf() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/image/containers.conf")
        .display()
        .to_string()
}

/// The test's image, built once for the tests of this binary.
static IMAGE_BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();

/// Builds the image with this build's prism (whose libraries the drivers
/// share), unless a test process of the same build did: test processes
/// (nextest runs each test in its own) take turns through a lock file,
/// and the first builds. Before, two processes built one tag at once, and
/// one removed the image the other's container was being made from.
fn build_image() -> Result<(), String> {
    let lock_path = std::env::temp_dir().join("prism-launch-test-image.lock");
    let lock =
        std::fs::File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let deadline = Instant::now() + Duration::from_secs(400);
    while let Err(e) = lock.try_lock() {
        if Instant::now() > deadline {
            return Err(format!(
                "another test process held {} for 400 s: {e}",
                lock_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if podman(&["image", "exists", image()]).status.success() {
        return Ok(());
    }
    let mut build = Command::new("bash");
    build
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/build.sh"))
        .args(["--prism", PRISM, "--tag", image()]);
    let built = run_bounded(
        build,
        &[("CONTAINERS_CONF", containers_conf().as_str())],
        Duration::from_secs(300),
    );
    if !built.status.success() {
        return Err(text(&built));
    }
    // Earlier builds' images go (a container still using one keeps it).
    let listed = podman(&["images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_NAME]);
    for old in String::from_utf8_lossy(&listed.stdout).lines() {
        if old.trim() != image() && old.starts_with(IMAGE_NAME) {
            let _ = podman(&["rmi", old.trim()]);
        }
    }
    Ok(())
}

fn podman(args: &[&str]) -> std::process::Output {
    let mut c = Command::new("podman");
    c.args(args);
    run_bounded(
        c,
        &[("CONTAINERS_CONF", containers_conf().as_str())],
        Duration::from_secs(120),
    )
}

impl PodmanCluster {
    fn new(tag: &str, subnet: &str, body: &str) -> Option<PodmanCluster> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        if !root {
            eprintln!("skipped: podman's networks with fixed addresses need root");
            return None;
        }
        for tool in ["podman", "buildah", "strip"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !found {
                eprintln!("skipped: no {tool} (.ci/run installs podman, buildah, busybox-static)");
                return None;
            }
        }
        if !Path::new("/bin/busybox").exists() {
            eprintln!("skipped: no /bin/busybox (.ci/run installs busybox-static)");
            return None;
        }
        let name = format!("{tag}{}", std::process::id());
        let dir = PathBuf::from(format!("/var/tmp/prism-launch-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        must(
            std::fs::create_dir_all(dir.join("home")),
            "the test's folder",
        );
        let file = dir.join("cluster.yaml");
        must(
            std::fs::write(
                &file,
                format!(
                    "cluster_name: {name}\n\
                     provider: {{type: podman, image: \"{}\", subnet: {subnet}}}\n{body}",
                    image()
                ),
            ),
            "the cluster file",
        );
        let cluster = PodmanCluster { dir, name, file };
        let built = IMAGE_BUILT.get_or_init(build_image);
        assert!(built.is_ok(), "the image: {built:?}");
        Some(cluster)
    }

    /// `prism <args>` with the test's home folder.
    fn prism(&self, args: &[&str], limit: Duration) -> std::process::Output {
        let mut c = Command::new(PRISM);
        c.args(args);
        let home = self.dir.join("home").display().to_string();
        run_bounded(
            c,
            &[
                ("HOME", home.as_str()),
                ("CONTAINERS_CONF", containers_conf().as_str()),
            ],
            limit,
        )
    }

    /// `prism submit` of this test binary's ignored test `driver` (at
    /// `binary`), as the driver of the cluster.
    fn submit(&self, binary: &str, driver: &str, limit: Duration) -> std::process::Output {
        let file = self.file_arg();
        self.prism(
            &[
                "submit",
                &file,
                binary,
                "--ignored",
                "--exact",
                driver,
                "--nocapture",
            ],
            limit,
        )
    }

    fn file_arg(&self) -> String {
        self.file.display().to_string()
    }

    fn status(&self) -> String {
        text(&self.prism(
            &["exec", &self.file_arg(), "--", "prism", "status"],
            Duration::from_secs(60),
        ))
    }

    /// The cluster's containers, by name.
    fn containers(&self) -> Vec<String> {
        let filter = format!("label=prism-cluster={}", self.name);
        let out = podman(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn network_exists(&self) -> bool {
        podman(&["network", "exists", &format!("prism-{}", self.name)])
            .status
            .success()
    }

    fn local_dir(&self) -> PathBuf {
        self.dir.join("home/.prism/clusters").join(&self.name)
    }

    /// The autoscalers of this cluster running here.
    fn autoscalers(&self) -> Vec<u32> {
        let file = self.file_arg();
        let mut found = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return found;
        };
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.get(1).map(String::as_str) == Some("autoscaler") && args.contains(&file) {
                found.push(pid);
            }
        }
        // A command the autoscaler starts shows its command line between
        // fork and exec: a match whose parent matched is not another one.
        let parent = |pid: u32| -> Option<u32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 1..];
            after_name.split_whitespace().nth(1)?.parse().ok()
        };
        let matched = found.clone();
        found.retain(|pid| parent(*pid).is_none_or(|p| !matched.contains(&p)));
        found
    }
}

impl Drop for PodmanCluster {
    fn drop(&mut self) {
        for pid in self.autoscalers() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let containers = self.containers();
        if !containers.is_empty() {
            let mut args = vec!["rm", "--force", "-t", "0"];
            args.extend(containers.iter().map(String::as_str));
            podman(&args);
        }
        podman(&["network", "rm", "-f", &format!("prism-{}", self.name)]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_podman_provider_scales_containers_with_demand() {
    let Some(cluster) = PodmanCluster::new(
        "podscale",
        "10.89.231.0/24",
        // 12 s: a new worker's first task waits for the driver's program
        // (a debug test binary of about 340 MB) to reach it, during which
        // the node shows no work; under heavy load that took over 6 s.
        "max_workers: 2\nidle_timeout_minutes: 0.2\n\
         available_node_types:\n  head: {resources: {CPU: 1}}\n  \
         worker: {resources: {CPU: 1, accel: 1}, min_workers: 0, max_workers: 2}\n\
         head_node_type: head\n",
    ) else {
        return;
    };
    let file = cluster.file_arg();
    let up = cluster.prism(&["up", &file], Duration::from_secs(240));
    let said = text(&up);
    assert!(up.status.success(), "prism up: {said}");
    assert!(said.contains("10.89.231.2: container made"), "{said}");
    assert!(said.contains("autoscaler started"), "{said}");
    assert!(!said.contains("worker started"), "min_workers 0: {said}");
    assert_eq!(cluster.autoscalers().len(), 1, "one autoscaler runs here");
    let head = format!("prism-{}-10-89-231-2", cluster.name);
    assert_eq!(cluster.containers(), vec![head.clone()], "only the head");
    assert!(cluster.status().contains("Nodes: 1 alive"));

    // A second `prism up` changes nothing.
    let again = cluster.prism(&["up", &file], Duration::from_secs(120));
    assert!(
        text(&again).contains("nothing to change"),
        "{}",
        text(&again)
    );
    assert_eq!(cluster.autoscalers().len(), 1, "still one autoscaler");

    // An edited cluster file starts the autoscaler again with it; the
    // next `prism up` has nothing to change again.
    let body = must(std::fs::read_to_string(&file), "the cluster file");
    must(
        std::fs::write(
            &file,
            body.replace("idle_timeout_minutes: 0.2", "idle_timeout_minutes: 0.21"),
        ),
        "the cluster file is edited",
    );
    let edited = cluster.prism(&["up", &file], Duration::from_secs(120));
    let said = text(&edited);
    assert!(
        said.contains("autoscaler restarted (the cluster file changed)")
            && !said.contains("nothing to change"),
        "{said}"
    );
    assert_eq!(
        cluster.autoscalers().len(),
        1,
        "one autoscaler, the new one"
    );
    let again = cluster.prism(&["up", &file], Duration::from_secs(120));
    assert!(
        text(&again).contains("nothing to change"),
        "{}",
        text(&again)
    );

    let driver = must(std::env::current_exe(), "the test binary")
        .display()
        .to_string();
    let log =
        || std::fs::read_to_string(cluster.local_dir().join("autoscaler.log")).unwrap_or_default();

    // Demand no node type can meet is reported, and launches nothing.
    let gpu = {
        let mut c = Command::new(PRISM);
        c.args([
            "submit",
            &file,
            &driver,
            "--ignored",
            "--exact",
            "launcher_gpu_driver",
            "--nocapture",
        ]);
        let home = cluster.dir.join("home").display().to_string();
        std::thread::spawn(move || {
            run_bounded(
                c,
                &[
                    ("HOME", home.as_str()),
                    ("CONTAINERS_CONF", containers_conf().as_str()),
                ],
                Duration::from_secs(120),
            )
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reported = false;
    while Instant::now() < deadline && !gpu.is_finished() {
        let seen = cluster.status();
        if seen.contains("infeasible: 1 waiting for {CPU: 1, GPU: 1}: no node type has it") {
            assert_eq!(cluster.containers().len(), 1, "nothing is launched: {seen}");
            reported = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let gpu = must(gpu.join().map_err(|_| "panicked"), "the GPU driver ends");
    assert!(
        reported,
        "the infeasible demand must be reported: {}\n--- the driver:\n{}\n--- log:\n{}",
        cluster.status(),
        text(&gpu),
        log()
    );

    // A task only workers hold starts a worker container from none; three
    // one-CPU tasks on a one-CPU head start the second.
    let run = cluster.submit(&driver, "launcher_scaling_driver", Duration::from_secs(180));
    let ran = text(&run);
    assert!(run.status.success(), "the driver: {ran}\n{}", log());
    let w1 = format!("prism-{}-10-89-231-3", cluster.name);
    let w2 = format!("prism-{}-10-89-231-4", cluster.name);
    assert!(
        ran.contains(&format!("ACCEL RAN ON {w1}")) || ran.contains(&format!("ACCEL RAN ON {w2}")),
        "a worker container ran the accel task: {ran}\n{}",
        log()
    );
    for line in ran.lines().filter(|l| l.contains("RAN ON")) {
        eprintln!("{line}");
    }
    let launched = log();
    eprintln!("the autoscaler's log:\n{launched}");
    assert!(
        launched.contains("launching worker on 10.89.231.3")
            && launched.contains("launching worker on 10.89.231.4"),
        "one worker, then a second: {launched}"
    );
    assert!(
        ran.contains(&format!("RAN ON {head},{w1},{w2}")),
        "the busy tasks ran on the head and both workers: {ran}"
    );

    // Idle for 12 s, the workers' containers are removed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = cluster.containers();
        if left == vec![head.clone()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle workers' containers must go: {left:?}\n{}",
            cluster.status()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(cluster.status().contains("Nodes: 1 alive"));
    // How long after the work ended each worker was stopped (printed for
    // docs/launcher.md; the timeout is 6 s).
    let finished = ran
        .split("finished at ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|ms| ms.parse::<u64>().ok());
    if let Some(finished) = finished {
        for line in log().lines().filter(|l| l.contains(" stopping ")) {
            let at = line.split(' ').next().unwrap_or_default();
            let parts: Vec<f64> = at.split(':').filter_map(|p| p.parse().ok()).collect();
            if let [h, m, sec] = parts[..] {
                let day_ms = ((h * 3600.0 + m * 60.0 + sec) * 1000.0) as u64;
                let delay = day_ms as f64 - (finished % 86_400_000) as f64;
                eprintln!(
                    "IDLE STOP {:.2} s after the work ended (timeout 12.6 s): {line}",
                    delay / 1000.0
                );
            }
        }
    }

    // An actor no live node holds waits for a worker, as tasks do.
    let actor = cluster.submit(&driver, "launcher_actor_driver", Duration::from_secs(120));
    let said = text(&actor);
    assert!(
        actor.status.success(),
        "the actor's driver: {said}\n{}",
        log()
    );
    assert!(
        said.contains(&format!("ACTOR RAN ON {w1}"))
            || said.contains(&format!("ACTOR RAN ON {w2}")),
        "the actor ran on a worker container started for it: {said}\n{}",
        log()
    );
    for line in said.lines().filter(|l| l.contains("ACTOR RAN ON")) {
        eprintln!("{line}");
    }

    // A STRICT_SPREAD group of three bundles waits for two workers (one
    // could hold two of its bundles, but each needs a node of its own),
    // once the actor's worker has gone idle and been removed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.containers() != vec![head.clone()] {
        assert!(
            Instant::now() < deadline,
            "the actor's worker must go idle and be removed: {:?}",
            cluster.containers()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let group = cluster.submit(&driver, "launcher_group_driver", Duration::from_secs(120));
    let said = text(&group);
    assert!(
        group.status.success(),
        "the group's driver: {said}\n{}",
        log()
    );
    let placed = said
        .lines()
        .find(|l| l.contains("GROUP PLACED ON"))
        .unwrap_or_default();
    assert!(
        placed.contains(&w1) && placed.contains(&w2),
        "the group's bundles went to the head and both workers started for it: \
         {said}\n{}",
        log()
    );
    for line in said.lines().filter(|l| l.contains("GROUP PLACED ON")) {
        eprintln!("{line}");
    }

    let down = cluster.prism(&["down", &file], Duration::from_secs(120));
    assert!(down.status.success(), "prism down: {}", text(&down));
    assert_eq!(
        cluster.containers(),
        Vec::<String>::new(),
        "no container left"
    );
    assert!(
        !cluster.network_exists(),
        "the cluster's network is removed"
    );
    assert!(
        cluster.autoscalers().is_empty(),
        "the autoscaler is stopped"
    );
}

#[test]
fn the_podman_provider_names_a_missing_image() {
    let Some(cluster) = PodmanCluster::new(
        "podimage",
        "10.89.232.0/24",
        "max_workers: 1\navailable_node_types:\n  head: {}\n  worker: {min_workers: 1}\n",
    ) else {
        return;
    };
    let text_of = std::fs::read_to_string(&cluster.file).unwrap_or_default();
    must(
        std::fs::write(
            &cluster.file,
            text_of.replace(image(), "localhost/prism-no-such-image:dev"),
        ),
        "the cluster file",
    );
    let up = cluster.prism(&["up", &cluster.file_arg()], Duration::from_secs(120));
    let said = text(&up);
    assert!(!up.status.success(), "{said}");
    assert!(
        said.contains("localhost/prism-no-such-image:dev is not on this machine")
            && said.contains("deploy/image/build.sh"),
        "{said}"
    );
    assert!(cluster.containers().is_empty(), "nothing is left: {said}");
}
