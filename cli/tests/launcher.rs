//! The cluster launcher through real SSH: `prism up` of a head and two
//! workers on three test hosts, each a network namespace running Debian's
//! sshd with its own address, host name, `/tmp` and home folder (a
//! machine of its own as far as Prism can tell), driven from a fourth host
//! as a user's laptop. A driver submitted with `prism submit` runs tasks
//! across the three; `prism up` run again changes nothing; `prism down`
//! leaves no process but sshd and no session folder on any host. Keys are
//! made by the test. Skipped, saying why, where namespaces or OpenSSH are
//! missing (`.ci/run` installs OpenSSH).

mod common;
#[path = "launcher/podman.rs"]
mod podman;

use common::{run_bounded, text, PRISM};
use prism_tests::must;
use prism_tests::netns::Network;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
/// The host `prism up` runs on (the user's laptop); hosts 0-2 are the
/// cluster's machines.
const LAPTOP: usize = 3;

/// Test hosts running sshd; dropping it kills everything left in their
/// namespaces (by pid) and removes the keys' folder.
struct SshHosts {
    net: Network,
    dir: PathBuf,
    sshd: Vec<Child>,
}

impl SshHosts {
    fn new(tag: &str) -> Option<SshHosts> {
        if let Err(why) = Network::available() {
            eprintln!("skipped: {why}");
            return None;
        }
        for tool in [SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen"] {
            if !Path::new(tool).exists() {
                eprintln!("skipped: no {tool} (.ci/run installs Debian's openssh-server and openssh-client)");
                return None;
            }
        }
        let net = must(Network::create(tag, 4), "the test hosts must be made");
        // Outside /tmp, which each host replaces with its own.
        let dir = PathBuf::from(format!(
            "/var/tmp/prism-launch-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        must(
            std::fs::create_dir_all(dir.join("home")),
            "the test's folder",
        );
        let mut hosts = SshHosts {
            net,
            dir,
            sshd: Vec::new(),
        };
        let keygen = |path: &Path| {
            let out = must(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(path)
                    .output(),
                "ssh-keygen runs",
            );
            assert!(out.status.success(), "ssh-keygen: {}", text(&out));
        };
        keygen(&hosts.dir.join("id_user"));
        keygen(&hosts.dir.join("id_other"));
        must(
            std::fs::copy(
                hosts.dir.join("id_user.pub"),
                hosts.dir.join("authorized_keys"),
            ),
            "the authorized key",
        );
        let _ = std::fs::create_dir_all("/run/sshd");
        for i in 0..3 {
            let key = hosts.dir.join(format!("host_{i}"));
            keygen(&key);
            let ip = hosts.net.hosts()[i].ip.clone();
            let config = hosts.dir.join(format!("sshd_{i}.conf"));
            must(
                std::fs::write(
                    &config,
                    format!(
                        "ListenAddress {ip}\nPort 22\nHostKey {}\nPidFile {}/sshd_{i}.pid\n\
                         AuthorizedKeysFile {}/authorized_keys\nPermitRootLogin prohibit-password\n\
                         PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                         StrictModes no\n",
                        key.display(),
                        hosts.dir.display(),
                        hosts.dir.display()
                    ),
                ),
                "sshd's config",
            );
            // Its own /tmp, home folder and host name: Prism's session
            // folders and the launcher's files are the host's alone.
            let script = format!(
                "mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /root && hostname machine{i} \
                 && exec {SSHD} -D -e -f {}",
                config.display()
            );
            let mut c = hosts.net.command(i, "unshare");
            c.args(["--mount", "--uts", "sh", "-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            hosts.sshd.push(must(c.spawn(), "sshd starts"));
        }
        // Each sshd answers before the test goes on.
        for i in 0..3 {
            let ip = hosts.net.hosts()[i].ip.clone();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let out = hosts.ssh(&ip, "true");
                if out.status.success() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sshd on {ip} must answer: {}",
                    text(&out)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Some(hosts)
    }

    /// Runs `script` on the machine at `ip` over SSH, from the laptop.
    fn ssh(&self, ip: &str, script: &str) -> std::process::Output {
        let mut c = self.net.command(LAPTOP, "ssh");
        c.args([
            "-F",
            "none",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=3",
        ])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args(["-o", "LogLevel=ERROR", "-i"])
        .arg(self.dir.join("id_user"))
        .arg(format!("root@{ip}"))
        .arg(script);
        run_bounded(c, &[], Duration::from_secs(30))
    }

    /// `prism <args>` on the laptop, with its own home folder.
    fn prism(&self, args: &[&str], limit: Duration) -> std::process::Output {
        let mut c = self.net.command(LAPTOP, PRISM);
        c.args(args);
        let home = self.dir.join("home").display().to_string();
        run_bounded(c, &[("HOME", home.as_str())], limit)
    }

    fn cluster_file(&self, name: &str, workers: &[&str], key: &str) -> PathBuf {
        let path = self.dir.join(format!("{name}.yaml"));
        let ips = workers
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let n = workers.len();
        must(
            std::fs::write(
                &path,
                format!(
                    "# A head and {n} workers over SSH.\n\
                     cluster_name: {name}\n\
                     provider:\n  type: ssh\n  head_ip: {}\n  worker_ips: [{ips}]\n\
                     auth:\n  ssh_user: root\n  ssh_private_key: {key}\n\
                     available_node_types:\n  head:\n    resources: {{CPU: 1}}\n  \
                     worker:\n    resources: {{CPU: 1}}\n    min_workers: {n}\n    max_workers: {n}\n\
                     head_node_type: head\n\
                     setup_commands:\n  - echo set up on $(hostname) > ~/setup-ran\n",
                    self.net.hosts()[0].ip,
                ),
            ),
            "the cluster file",
        );
        path
    }

    /// The processes left in host `i`'s namespace, but its sshd's.
    fn others_in(&self, i: usize) -> Vec<String> {
        self.net
            .processes(i)
            .into_iter()
            .filter(|(_, comm)| comm != "sshd")
            .map(|(pid, comm)| format!("{pid} {comm}"))
            .collect()
    }

    /// What host `i` has at `path`, seen in its own mount namespace.
    fn ls(&self, i: usize, path: &str) -> String {
        let pid = self.sshd[i].id().to_string();
        let out = must(
            Command::new("nsenter")
                .args(["-t", &pid, "-m", "ls", "-A", path])
                .output(),
            "nsenter runs",
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for SshHosts {
    fn drop(&mut self) {
        // Whatever a failed test left running, by pid, in each namespace.
        self.net.kill_all();
        for c in &mut self.sshd {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Joins the cluster `prism submit` runs this binary's driver in (run as
/// a plain test, with no cluster named, a driver does nothing).
fn joined_as_driver() -> bool {
    if std::env::var_os("PRISM_ADDRESS").is_none() {
        return false;
    }
    must(
        prism::init(prism::Config::default()),
        "the driver joins the cluster",
    );
    true
}

/// The driver `prism submit` runs on the head: tasks spread over the
/// cluster, each saying its machine's host name.
#[test]
#[ignore = "the driver of prism_up_submit_and_down_over_ssh, run on its head"]
fn launcher_driver() {
    if !joined_as_driver() {
        return;
    }
    // One task pinned to each live node: each machine runs one, however
    // long its node takes to fetch this program from the driver.
    let nodes = must(prism::nodes(), "the cluster's nodes");
    let refs: Vec<_> = nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| must(host_name::remote_with(common::on(n)), "a task is submitted"))
        .collect();
    let hosts: std::collections::BTreeSet<String> = refs
        .iter()
        .map(|r| must(prism::get(r), "a task runs"))
        .collect();
    println!(
        "RAN ON {} (finished at {} ms since 1970)",
        hosts.into_iter().collect::<Vec<_>>().join(","),
        prism_protocol::clock::unix_ms()
    );
    prism::shutdown();
}

#[prism::remote]
fn host_name() -> String {
    std::thread::sleep(Duration::from_millis(300));
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn prism_up_submit_and_down_over_ssh() {
    let Some(hosts) = SshHosts::new("up") else {
        return;
    };
    let key = hosts.dir.join("id_user").display().to_string();
    let (w1, w2) = (
        hosts.net.hosts()[1].ip.clone(),
        hosts.net.hosts()[2].ip.clone(),
    );
    let file = hosts.cluster_file("lab", &[&w1, &w2], &key);
    let file_arg = file.display().to_string();

    let started = Instant::now();
    let up = hosts.prism(&["up", &file_arg], Duration::from_secs(240));
    let said = text(&up);
    assert!(
        up.status.success(),
        "prism up must bring the cluster up: {said}"
    );
    eprintln!(
        "prism up took {:.2} s:\n{said}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        said.contains("head started") && said.contains("worker started"),
        "{said}"
    );
    assert!(
        said.contains("prism copied"),
        "the binary travels by itself: {said}"
    );

    let status = hosts.prism(
        &["exec", &file_arg, "--", "prism", "status"],
        Duration::from_secs(60),
    );
    let seen = text(&status);
    assert!(
        status.status.success(),
        "prism exec runs on the head: {seen}"
    );
    assert!(seen.contains("Nodes: 3 alive, 0 dead"), "{seen}");
    for i in 0..3 {
        assert!(
            hosts.ls(i, "/root").contains("setup-ran"),
            "the setup commands ran on machine {i}"
        );
    }

    let again = Instant::now();
    let up2 = hosts.prism(&["up", &file_arg], Duration::from_secs(120));
    let said2 = text(&up2);
    assert!(up2.status.success(), "a second prism up succeeds: {said2}");
    eprintln!(
        "the second prism up took {:.2} s",
        again.elapsed().as_secs_f64()
    );
    assert!(said2.contains("nothing to change"), "{said2}");
    assert!(
        !said2.contains("started"),
        "nothing is started again: {said2}"
    );

    let ip = hosts.prism(&["get-head-ip", &file_arg], Duration::from_secs(10));
    assert_eq!(
        text(&ip).trim(),
        hosts.net.hosts()[0].ip,
        "get-head-ip names the head"
    );

    let driver = must(std::env::current_exe(), "the test binary");
    let driver = driver.display().to_string();
    let run = hosts.prism(
        &[
            "submit",
            &file_arg,
            &driver,
            "--ignored",
            "--exact",
            "launcher_driver",
            "--nocapture",
        ],
        Duration::from_secs(180),
    );
    let ran = text(&run);
    assert!(
        run.status.success(),
        "the submitted driver must succeed: {ran}"
    );
    assert!(
        ran.contains("RAN ON machine0,machine1,machine2"),
        "the driver's tasks ran on all three machines: {ran}"
    );

    let down = hosts.prism(&["down", &file_arg], Duration::from_secs(120));
    let said = text(&down);
    assert!(
        down.status.success(),
        "prism down must stop the cluster: {said}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..3 {
        loop {
            let left = hosts.others_in(i);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "machine {i} still runs {left:?} after prism down"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            hosts.ls(i, "/tmp"),
            "",
            "no session folder is left on machine {i}"
        );
        assert!(
            !hosts.ls(i, "/root/.prism/clusters").contains("lab"),
            "the cluster's folder is gone from machine {i}"
        );
    }
}

#[test]
fn prism_up_names_a_refused_key_and_an_unreachable_machine() {
    let Some(hosts) = SshHosts::new("ur") else {
        return;
    };
    let other = hosts.dir.join("id_other").display().to_string();
    let refused = hosts.cluster_file("refused", &[], &other);
    let out = hosts.prism(
        &["up", &refused.display().to_string()],
        Duration::from_secs(60),
    );
    let said = text(&out);
    assert!(
        !out.status.success(),
        "a refused key fails prism up: {said}"
    );
    assert!(
        said.contains("refused the login of root") && said.contains("ssh_private_key"),
        "the refusal is named with what to check: {said}"
    );

    let key = hosts.dir.join("id_user").display().to_string();
    // 10.77.0.9 is on the test network, and no host has it.
    let unreachable = hosts.cluster_file("unreachable", &["10.77.0.9"], &key);
    let out = hosts.prism(
        &["up", &unreachable.display().to_string()],
        Duration::from_secs(90),
    );
    let said = text(&out);
    assert!(
        !out.status.success(),
        "an unreachable worker fails prism up: {said}"
    );
    assert!(
        said.contains("cannot reach 10.77.0.9 over SSH") && said.contains("run `prism up` again"),
        "the unreachable machine is named: {said}"
    );
    // The head came up meanwhile; down stops it (the unreachable machine
    // is reported, and nothing is left on the head).
    let down = hosts.prism(
        &["down", &unreachable.display().to_string()],
        Duration::from_secs(90),
    );
    assert!(
        !down.status.success(),
        "down reports the machine it cannot reach"
    );
    assert!(
        hosts.others_in(0).is_empty() || {
            std::thread::sleep(Duration::from_secs(3));
            hosts.others_in(0).is_empty()
        },
        "the head's node is stopped: {:?}",
        hosts.others_in(0)
    );
}

/// The driver of the autoscaling test: a task needing `accel`, which only
/// the worker type has (no worker runs yet), then three tasks of one CPU
/// each, 20 s long, on a cluster whose head has one CPU.
#[test]
#[ignore = "the driver of the_autoscaler_adds_workers_for_demand_and_stops_them_idle, run on its head"]
fn launcher_scaling_driver() {
    if !joined_as_driver() {
        return;
    }
    let accel = prism::TaskOptions::new().resource("accel", 1.0);
    let asked = Instant::now();
    let asked_at = prism_protocol::clock::unix_ms();
    let first = must(
        host_and_start::remote_with(accel),
        "an accel task is submitted",
    );
    let (host, started_at) = must(prism::get(&first), "the accel task runs");
    println!(
        "ACCEL RAN ON {host}, {:.2} s after it was submitted (submitted at {asked_at} ms, \
         started at {started_at} ms, since 1970)",
        asked.elapsed().as_secs_f64()
    );
    let refs: Vec<_> = (0..3)
        .map(|_| must(busy_host::remote(), "a task is submitted"))
        .collect();
    let hosts: std::collections::BTreeSet<String> = refs
        .iter()
        .map(|r| must(prism::get(r), "a task runs"))
        .collect();
    println!(
        "RAN ON {} (finished at {} ms since 1970)",
        hosts.into_iter().collect::<Vec<_>>().join(","),
        prism_protocol::clock::unix_ms()
    );
    prism::shutdown();
}

/// Says the host name of the machine it runs on.
#[prism::actor]
pub struct Host {}

#[prism::actor]
impl Host {
    fn new() -> Self {
        Host {}
    }

    fn name(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default()
    }
}

/// The driver of the podman provider's test: an actor needing `accel`,
/// which no live node has, waits for a worker the autoscaler starts.
#[test]
#[ignore = "the driver of the_podman_provider_scales_containers_with_demand, run on its head"]
fn launcher_actor_driver() {
    if !joined_as_driver() {
        return;
    }
    let asked = Instant::now();
    let host = must(
        Host::remote_with(prism::ActorOptions::new().resource("accel", 1.0)),
        "the actor is created once a node holds it",
    );
    let name = must(prism::get(&must(host.name(), "asked")), "it answers");
    println!(
        "ACTOR RAN ON {name}, {:.2} s after it was asked for",
        asked.elapsed().as_secs_f64()
    );
    prism::shutdown();
}

/// The driver of the podman provider's test: a STRICT_SPREAD placement
/// group of three half-CPU bundles, which the head alone cannot hold,
/// waits for the two workers the autoscaler starts for it; a task in each
/// bundle says where it ran.
#[test]
#[ignore = "the driver of the_podman_provider_scales_containers_with_demand, run on its head"]
fn launcher_group_driver() {
    if !joined_as_driver() {
        return;
    }
    let asked = Instant::now();
    // Three bundles, each on a node of its own: the head holds one, and
    // two more nodes must come, though one worker could hold two bundles.
    let bundle = prism::Bundle::new().resource("CPU", 0.5);
    let group = must(
        prism::placement_group(vec![bundle; 3], prism::PlacementStrategy::StrictSpread),
        "the group is asked for",
    );
    must(
        group.wait(Duration::from_secs(60)).and_then(|placed| {
            placed
                .then_some(())
                .ok_or(prism::Error::invalid("group", "not placed within 60 s"))
        }),
        "the group is placed once a node holds it",
    );
    let placed = asked.elapsed().as_secs_f64();
    let mut hosts: Vec<String> = (0..3)
        .map(|i| {
            let options = prism::TaskOptions::new()
                .num_cpus(0.5)
                .placement_group(&group, Some(i));
            let (host, _) = must(
                prism::get(&must(
                    host_and_start::remote_with(options),
                    "a task in the group",
                )),
                "it runs",
            );
            host
        })
        .collect();
    hosts.sort();
    println!(
        "GROUP PLACED ON {}, {placed:.2} s after it was asked for",
        hosts.join(" ")
    );
    prism::shutdown();
}

/// The driver that asks for a GPU no node type has, for a while.
#[test]
#[ignore = "the driver of the_autoscaler_adds_workers_for_demand_and_stops_them_idle, run on its head"]
fn launcher_gpu_driver() {
    if !joined_as_driver() {
        return;
    }
    let gpu = prism::TaskOptions::new().num_gpus(1.0);
    let _waits = must(host_name::remote_with(gpu), "a GPU task is submitted");
    std::thread::sleep(Duration::from_secs(8));
    println!("ASKED FOR A GPU");
    prism::shutdown();
}

/// The task's machine and when it started (ms since 1970).
#[prism::remote]
fn host_and_start() -> (String, u64) {
    let at = prism_protocol::clock::unix_ms();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    (host, at)
}

#[prism::remote]
fn busy_host() -> String {
    // Long enough for a second worker to come up after the first (each
    // takes a few seconds here, most of it the binary's copy).
    std::thread::sleep(Duration::from_secs(20));
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn the_autoscaler_adds_workers_for_demand_and_stops_them_idle() {
    let Some(hosts) = SshHosts::new("as") else {
        return;
    };
    let key = hosts.dir.join("id_user").display().to_string();
    let (w1, w2) = (
        hosts.net.hosts()[1].ip.clone(),
        hosts.net.hosts()[2].ip.clone(),
    );
    let file = hosts.dir.join("scaling.yaml");
    must(
        std::fs::write(
            &file,
            format!(
                "cluster_name: scaling\nmax_workers: 2\nidle_timeout_minutes: 0.2\n\
                 provider: {{type: ssh, head_ip: {}, worker_ips: [{w1}, {w2}]}}\n\
                 auth: {{ssh_user: root, ssh_private_key: {key}}}\n\
                 available_node_types:\n  head: {{resources: {{CPU: 1}}}}\n  \
                 worker: {{resources: {{CPU: 1, accel: 1}}, min_workers: 0, max_workers: 2}}\n\
                 head_node_type: head\n",
                hosts.net.hosts()[0].ip
            ),
        ),
        "the cluster file",
    );
    let file_arg = file.display().to_string();
    let up = hosts.prism(&["up", &file_arg], Duration::from_secs(240));
    let said = text(&up);
    assert!(up.status.success(), "prism up: {said}");
    assert!(said.contains("autoscaler started"), "{said}");
    assert!(
        !said.contains("worker started"),
        "min_workers 0: no worker at first: {said}"
    );
    let status = || {
        let out = hosts.prism(
            &["exec", &file_arg, "--", "prism", "status"],
            Duration::from_secs(60),
        );
        text(&out)
    };
    assert!(
        status().contains("Nodes: 1 alive"),
        "only the head at first"
    );

    // Demand no node type can meet is reported at once, and launches
    // nothing.
    let driver = must(std::env::current_exe(), "the test binary")
        .display()
        .to_string();
    let gpu = {
        let (driver, file_arg) = (driver.clone(), file_arg.clone());
        let home = hosts.dir.join("home").display().to_string();
        let mut c = hosts.net.command(LAPTOP, PRISM);
        c.args([
            "submit",
            &file_arg,
            &driver,
            "--ignored",
            "--exact",
            "launcher_gpu_driver",
            "--nocapture",
        ]);
        std::thread::spawn(move || {
            run_bounded(c, &[("HOME", home.as_str())], Duration::from_secs(120))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reported = false;
    while Instant::now() < deadline && !gpu.is_finished() {
        let seen = status();
        if seen.contains("infeasible: 1 waiting for {CPU: 1, GPU: 1}: no node type has it") {
            assert!(
                seen.contains("Nodes: 1 alive"),
                "nothing is launched for it: {seen}"
            );
            reported = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let gpu = must(gpu.join().map_err(|_| "panicked"), "the GPU driver ends");
    assert!(
        reported,
        "the infeasible demand must be reported: {}\n--- the driver:\n{}",
        status(),
        text(&gpu)
    );
    assert!(text(&gpu).contains("ASKED FOR A GPU"), "{}", text(&gpu));

    // Three one-CPU tasks on a one-CPU head: two workers come up and run
    // two of them.
    let run = hosts.prism(
        &[
            "submit",
            &file_arg,
            &driver,
            "--ignored",
            "--exact",
            "launcher_scaling_driver",
            "--nocapture",
        ],
        Duration::from_secs(180),
    );
    let ran = text(&run);
    let log = || {
        text(&hosts.ssh(
            &hosts.net.hosts()[0].ip,
            "cat /tmp/prism/logs/autoscaler.log",
        ))
    };
    assert!(
        run.status.success(),
        "the driver must succeed: {ran}\n{}",
        log()
    );
    assert!(
        ran.contains("ACCEL RAN ON machine1") || ran.contains("ACCEL RAN ON machine2"),
        "a task only the worker type holds started a worker from none: {ran}\n{}",
        log()
    );
    for line in ran.lines().filter(|l| l.contains("ACCEL RAN ON")) {
        eprintln!("{line}");
    }
    eprintln!("the autoscaler's log:\n{}", log());
    // A second worker comes up for the third task. It runs there when the
    // second worker joins within the 20 s the first two tasks take (sent
    // on by the node it waited at); copying a 255 MB binary over SSH on a
    // loaded machine can take longer, so only a worker is asked for here
    // (the podman test, whose launches take a second, asks for both).
    let launched = log();
    assert!(
        launched.contains("launching worker on 10.77.0.2")
            && launched.contains("launching worker on 10.77.0.3"),
        "one worker, then a second: {launched}"
    );
    assert!(
        ran.contains("RAN ON machine0,machine1") || ran.contains("RAN ON machine0,machine2"),
        "the tasks ran on the head and the new workers: {ran}\n{launched}"
    );
    // Idle for 12 s, the workers are stopped. (Each look below goes over
    // SSH; on a loaded machine a look can take seconds, so the timeout
    // leaves room for several while the workers idle.)
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut saw_idle = false;
    loop {
        let seen = status();
        saw_idle |= seen.contains("idle for");
        if seen.contains("Nodes: 1 alive") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle workers must be stopped: {seen}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(saw_idle, "prism status showed the idle workers' time");
    for i in 1..3 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = hosts.others_in(i);
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "machine {i} still runs {left:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            hosts.ls(i, "/tmp"),
            "",
            "no session folder on stopped machine {i}"
        );
    }
    let down = hosts.prism(&["down", &file_arg], Duration::from_secs(120));
    assert!(down.status.success(), "prism down: {}", text(&down));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = hosts.others_in(0);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the head still runs {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
