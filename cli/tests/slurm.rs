//! Prism inside a real Slurm allocation: Debian's `slurmctld`, one
//! `slurmd` per test host (each a network namespace with its own address,
//! host name and `/tmp`, in a UTS and a mount namespace), and a `munged`
//! of the test's own. A job submitted with `sbatch` runs
//! `examples/slurm/train.sbatch` as users would (its driver line replaced
//! by this test's driver, or by the linear regression example when
//! `PRISM_SLURM_TRAIN_EXAMPLE` names its binary, as `.ci/run` does): the
//! first node starts the head, the others join, `prism wait --slurm` waits
//! for all three, and the driver's tasks run on all three machines. Then
//! the job is COMPLETED, no Prism process is left on any machine, and the
//! folder holding the token is gone. Skipped, saying why, where namespaces
//! or Slurm are missing (`.ci/run` installs slurm-wlm and munge).

mod common;

use common::{run_bounded, text, PRISM};
use prism_tests::must;
use prism_tests::netns::Network;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOOLS: &[&str] = &[
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/sbin/munged",
    "/usr/sbin/mungekey",
    "/usr/bin/sbatch",
    "/usr/bin/sinfo",
    "/usr/bin/scontrol",
    "/usr/bin/nsenter",
    "/usr/bin/unshare",
];
/// The host of slurmctld and of `sbatch`; hosts 0-2 are compute nodes.
const CONTROLLER: usize = 3;

/// A Slurm cluster on test hosts; dropping it kills what is left in its
/// namespaces (by pid), its daemons, and removes its folder.
struct Slurm {
    net: Network,
    dir: PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    fn new(tag: &str) -> Option<Slurm> {
        if let Err(why) = Network::available() {
            eprintln!("skipped: {why}");
            return None;
        }
        for tool in TOOLS {
            if !Path::new(tool).exists() {
                eprintln!("skipped: no {tool} (.ci/run installs Debian's slurm-wlm and munge)");
                return None;
            }
        }
        let net = must(Network::create(tag, 4), "the test hosts must be made");
        for h in net.hosts() {
            // A default route: a head finds its address from its route out.
            let out = must(
                Command::new("ip")
                    .args(["-n", &h.ns, "route", "add", "default", "dev", "eth0"])
                    .output(),
                "ip route",
            );
            assert!(out.status.success(), "a default route: {}", text(&out));
        }
        // Outside /tmp, which each compute host replaces with its own; the
        // submit folder is shared by all, as home folders are on a cluster.
        let dir = PathBuf::from(format!("/var/tmp/prism-slurm-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "log", "work", "spool"] {
            must(std::fs::create_dir_all(dir.join(sub)), "the test's folders");
        }
        let mut slurm = Slurm {
            net,
            dir,
            daemons: Vec::new(),
        };
        let d = slurm.dir.display().to_string();
        let key = format!("{d}/munge.key");
        let out = must(
            Command::new("mungekey")
                .args(["--create", "--keyfile", &key])
                .output(),
            "mungekey runs",
        );
        assert!(out.status.success(), "mungekey: {}", text(&out));
        let munged = must(
            Command::new("munged")
                .args(["--foreground", "--force"])
                .arg(format!("--socket={d}/munge.sock"))
                .arg(format!("--key-file={key}"))
                .arg(format!("--pid-file={d}/munged.pid"))
                .arg(format!("--log-file={d}/log/munged.log"))
                .arg(format!("--seed-file={d}/munged.seed"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn(),
            "munged starts",
        );
        slurm.daemons.push(munged);
        let ip = |i: usize| slurm.net.hosts()[i].ip.clone();
        let mut conf = format!(
            "ClusterName=prismtest\nSlurmctldHost=controller({})\nSlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge.sock\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\nSchedulerType=sched/builtin\nReturnToService=2\n\
             MpiDefault=none\nKillWait=5\n",
            ip(CONTROLLER)
        );
        for i in 0..3 {
            conf.push_str(&format!(
                "NodeName=machine{i} NodeAddr={} CPUs=2 State=UNKNOWN\n",
                ip(i)
            ));
        }
        conf.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
        must(std::fs::write(slurm.conf(), conf), "slurm.conf");
        let conf = slurm.conf().display().to_string();
        // Its host name is the one slurm.conf gives the controller.
        let mut ctl = slurm.net.command(CONTROLLER, "unshare");
        let script = format!("hostname controller && exec /usr/sbin/slurmctld -D -f {conf}");
        ctl.args(["--uts", "sh", "-c", &script])
            .env("SLURM_CONF", &conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        slurm.daemons.push(must(ctl.spawn(), "slurmctld starts"));
        for i in 0..3 {
            must(
                std::fs::create_dir_all(slurm.dir.join(format!("spool/machine{i}"))),
                "a spool folder",
            );
            // nsenter rather than `ip netns exec`, which mounts a /sys of
            // its own without the cgroups slurmd reads.
            let script = format!(
                "mount -t tmpfs tmpfs /tmp && hostname machine{i} && \
                 exec /usr/sbin/slurmd -D -N machine{i} -f {conf}"
            );
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{}", slurm.net.hosts()[i].ns))
                .args(["unshare", "--mount", "--uts", "sh", "-c", &script])
                .env("SLURM_CONF", &conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            slurm.daemons.push(must(c.spawn(), "slurmd starts"));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = slurm.on_controller(&["sinfo", "-h", "-o", "%D %t"], &slurm.dir);
            let said = text(&out);
            if said.trim() == "3 idle" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the three slurmd must be idle: {said}\n{}",
                std::fs::read_to_string(slurm.dir.join("log/slurmctld.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        Some(slurm)
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// A Slurm command on the controller's host, in folder `cwd`.
    fn on_controller(&self, args: &[&str], cwd: &Path) -> std::process::Output {
        let mut c = self.net.command(CONTROLLER, args[0]);
        c.args(&args[1..]).current_dir(cwd);
        let conf = self.conf().display().to_string();
        let bin = Path::new(PRISM)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
        run_bounded(
            c,
            &[("SLURM_CONF", conf.as_str()), ("PATH", path.as_str())],
            Duration::from_secs(30),
        )
    }

    /// The processes left in compute host `i`'s namespace but Slurm's own.
    fn prism_left_on(&self, i: usize) -> Vec<String> {
        self.net
            .processes(i)
            .into_iter()
            .filter(|(_, comm)| !matches!(comm.as_str(), "slurmd" | "slurmstepd"))
            .map(|(pid, comm)| format!("{pid} {comm}"))
            .collect()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        self.net.kill_all();
        for c in &mut self.daemons {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The driver the batch script runs on the allocation's first node: one
/// task pinned to each node, each saying its machine's host name; and the
/// token's folder and file are the user's alone.
#[test]
#[ignore = "the driver of a_cluster_in_a_slurm_allocation_runs_a_driver_and_ends_with_it"]
fn slurm_driver() {
    let (Ok(submit), Ok(job)) = (
        std::env::var("SLURM_SUBMIT_DIR"),
        std::env::var("SLURM_JOB_ID"),
    ) else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let meet = PathBuf::from(submit).join(format!(".prism-slurm-{job}"));
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    println!("MODES {:o} {:o}", mode(&meet), mode(&meet.join("token")));
    must(
        prism::init(prism::Config::default()),
        "the driver joins the cluster",
    );
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
    let (total, _) = must(prism::cluster_resources(), "the cluster's resources");
    println!("CPUS {}", total.get("CPU").as_f64());
    println!("RAN ON {}", hosts.into_iter().collect::<Vec<_>>().join(","));
    prism::shutdown();
}

#[prism::remote]
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn a_cluster_in_a_slurm_allocation_runs_a_driver_and_ends_with_it() {
    let Some(slurm) = Slurm::new("sl") else {
        return;
    };
    let work = slurm.dir.join("work");
    let example = must(
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/slurm/train.sbatch"
        )),
        "the example batch script",
    );
    let driver_line = "./linear_regression --workers 3";
    assert!(example.contains(driver_line), "the example runs its driver");
    let (driver, expect) = match std::env::var("PRISM_SLURM_TRAIN_EXAMPLE") {
        Ok(bin) => (format!("{bin} --workers 3"), "final loss"),
        Err(_) => {
            let me = must(std::env::current_exe(), "the test binary");
            (
                format!(
                    "{} --ignored --exact slurm_driver --nocapture",
                    me.display()
                ),
                "RAN ON machine0,machine1,machine2",
            )
        }
    };
    must(
        std::fs::write(
            work.join("job.sbatch"),
            example.replace(driver_line, &driver),
        ),
        "the batch script",
    );
    let out = slurm.on_controller(&["sbatch", "--parsable", "job.sbatch"], &work);
    let said = text(&out);
    assert!(out.status.success(), "sbatch takes the job: {said}");
    let job = said
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(!job.is_empty(), "sbatch names the job: {said}");

    // squeue shows the job until it is done; then scontrol says how.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let q = slurm.on_controller(&["squeue", "-h", "-j", &job, "-o", "%T"], &work);
        let state = text(&q);
        if state.trim().is_empty() || state.contains("Invalid job id") {
            break;
        }
        assert!(Instant::now() < deadline, "the job must end: {state}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let output =
        std::fs::read_to_string(work.join(format!("prism-train-{job}.out"))).unwrap_or_default();
    let shown = slurm.on_controller(&["scontrol", "show", "job", &job], &work);
    let shown = text(&shown);
    assert!(
        shown.contains("JobState=COMPLETED"),
        "the job completes: {shown}\n--- its output:\n{output}"
    );
    assert!(
        output.contains(expect),
        "the driver ran across the allocation: {output}"
    );
    assert!(
        output.contains("joined the head"),
        "prism wait --slurm waited for every node: {output}"
    );
    if expect.starts_with("RAN ON") {
        assert!(
            output.contains("MODES 700 600"),
            "the token is the user's alone: {output}"
        );
        assert!(
            output.contains("CPUS 6"),
            "each node offers Slurm's 2 CPUs: {output}"
        );
    }
    assert!(
        !work.join(format!(".prism-slurm-{job}")).exists(),
        "the folder with the token goes with the job"
    );
    // The nodes stop with the allocation.
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..3 {
        loop {
            let left = slurm.prism_left_on(i);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "machine{i} still runs {left:?} after the job"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
