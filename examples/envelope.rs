//! The driver of the head's scalability envelope (`bench/envelope/run.sh`
//! starts the cluster: a head and N nodes on this machine, and runs this
//! against it). Against a running cluster it measures, one section after
//! another:
//!
//! - actors: `--actors` actors spread over the nodes, created and each
//!   called once, then called `CALLS_PER_ACTOR` times each, then killed;
//! - placement groups: `--groups` groups of one bundle (0.1 CPU, SPREAD)
//!   created, waited for, and removed;
//! - tasks: for each count in `--tasks`, that many no-op tasks submitted
//!   at once with `SPREAD` (each one a scheduling decision over the
//!   nodes), then waited for.
//!
//! For each section it prints the time, the rate, how many nodes the work
//! landed on, and what the head's processes (`--head-pids`: the control
//! store's and the head raylet's) spent in CPU and hold in memory,
//! read from `/proc`. Every figure is one line `ROW <name> <value> <unit>`.
//!
//! ```text
//! PRISM_ADDRESS=HEAD:PORT PRISM_TEMP_DIR=<the head's temp dir> \
//!   envelope --actors 2000 --groups 1000 --tasks 10000,100000 --head-pids 12,34
//! ```

use prism::{ActorOptions, Bundle, PlacementStrategy, SchedulingStrategy, TaskOptions};
use prism_examples::proc_stats::{field_kib, pss_kib};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Calls each actor gets after its first, for the call rate.
const CALLS_PER_ACTOR: usize = 10;
/// How long one section may wait for its work before it gives up.
const SECTION_LIMIT: Duration = Duration::from_secs(300);

/// A hash of this process's node id (ids differ in their first digits):
/// enough to count the distinct nodes that ran something.
fn node_tag() -> u32 {
    let id = prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default();
    // FNV-1a.
    id.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[prism::remote]
fn noop() -> u32 {
    node_tag()
}

#[prism::actor]
struct Member;

#[prism::actor]
impl Member {
    fn new() -> Self {
        Member
    }

    fn ping(&self) -> u32 {
        node_tag()
    }
}

/// The head's processes, as `/proc` shows them.
struct Head {
    pids: Vec<u32>,
}

impl Head {
    /// CPU seconds (user and system) the head's processes spent so far.
    fn cpu_s(&self) -> f64 {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.pids
            .iter()
            .map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // Fields after the command's closing parenthesis: state is
                // the first, utime the 12th, stime the 13th.
                let after = stat.rsplit(')').next().unwrap_or("");
                let f: Vec<&str> = after.split_whitespace().collect();
                let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                (get(11) + get(12)) / ticks
            })
            .sum()
    }

    fn mib(&self, read: impl Fn(u32) -> u64) -> f64 {
        self.pids.iter().map(|&p| read(p)).sum::<u64>() as f64 / 1024.0
    }

    /// Prints the head's CPU spent since `since` (seconds, over `span`),
    /// and its memory now and at its peak.
    fn report(&self, section: &str, since: f64, span: Duration) {
        let cpu = self.cpu_s() - since;
        row(&format!("{section}_head_cpu"), cpu, "cpu_s");
        row(
            &format!("{section}_head_cpu_share"),
            cpu / span.as_secs_f64().max(1e-9),
            "cores",
        );
        row(
            &format!("{section}_head_rss"),
            self.mib(|p| field_kib(p, "status", "VmRSS:")),
            "MiB",
        );
        row(&format!("{section}_head_pss"), self.mib(pss_kib), "MiB");
        row(
            &format!("{section}_head_peak_rss"),
            self.mib(|p| field_kib(p, "status", "VmHWM:")),
            "MiB",
        );
    }
}

fn row(name: &str, value: f64, unit: &str) {
    println!("ROW {name} {value:.3} {unit}");
}

/// The rows of a section that made `count` things in `took`: how many,
/// the time, and the rate in `unit`.
fn made_rows(section: &str, made: &str, count: usize, took: Duration, unit: &str) {
    row(&format!("{section}_{made}"), count as f64, section);
    row(&format!("{section}_create_time"), took.as_secs_f64(), "s");
    row(
        &format!("{section}_create_rate"),
        count as f64 / took.as_secs_f64(),
        unit,
    );
}

/// The machine's memory in use (total less available), in MiB: what
/// worker processes of every node together cost shows in its change.
fn machine_used_mib() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("MemTotal:") - field("MemAvailable:")) / 1024.0
}

fn distinct(tags: &[u32]) -> f64 {
    tags.iter().collect::<HashSet<_>>().len() as f64
}

/// `--name value` from the command line.
fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn actors(head: &Head, count: usize) -> prism::Result<()> {
    let spread = ActorOptions::new().scheduling_strategy(SchedulingStrategy::Spread);
    let used0 = machine_used_mib();
    let cpu0 = head.cpu_s();
    let start = Instant::now();
    let members = (0..count)
        .map(|_| Member::remote_with(spread.clone()))
        .collect::<prism::Result<Vec<_>>>()?;
    let firsts = members
        .iter()
        .map(|m| m.ping())
        .collect::<prism::Result<Vec<_>>>()?;
    let tags = prism::get_many_timeout(&firsts, SECTION_LIMIT)?;
    let created = start.elapsed();
    made_rows(
        "actors",
        "created_and_called",
        count,
        created,
        "actors_per_s",
    );
    row("actors_nodes_used", distinct(&tags), "nodes");
    row(
        "actors_machine_memory_per_actor",
        (machine_used_mib() - used0) / count as f64,
        "MiB",
    );

    let t = Instant::now();
    let calls = (0..CALLS_PER_ACTOR)
        .flat_map(|_| members.iter().map(|m| m.ping()))
        .collect::<prism::Result<Vec<_>>>()?;
    prism::get_many_timeout(&calls, SECTION_LIMIT)?;
    row(
        "actors_call_rate",
        calls.len() as f64 / t.elapsed().as_secs_f64(),
        "calls_per_s",
    );
    head.report("actors", cpu0, start.elapsed());

    let t = Instant::now();
    for m in &members {
        prism::kill(m)?;
    }
    row("actors_kill_time", t.elapsed().as_secs_f64(), "s");
    Ok(())
}

fn groups(head: &Head, count: usize) -> prism::Result<()> {
    let cpu0 = head.cpu_s();
    let start = Instant::now();
    let groups = (0..count)
        .map(|_| {
            prism::placement_group(vec![Bundle::new().num_cpus(0.1)], PlacementStrategy::Spread)
        })
        .collect::<prism::Result<Vec<_>>>()?;
    let deadline = Instant::now() + SECTION_LIMIT;
    for g in &groups {
        let left = deadline.saturating_duration_since(Instant::now());
        if !g.wait(left)? {
            return Err(prism::Error::invalid(
                "placement groups",
                format!("group {} not ready within {SECTION_LIMIT:?}", g.id()),
            ));
        }
    }
    let created = start.elapsed();
    made_rows("groups", "created", count, created, "groups_per_s");
    let mut nodes = HashSet::new();
    for g in &groups {
        nodes.extend(g.bundle_nodes()?);
    }
    row("groups_nodes_used", nodes.len() as f64, "nodes");
    let t = Instant::now();
    for g in &groups {
        prism::remove_placement_group(g)?;
    }
    let removed = t.elapsed();
    row("groups_remove_time", removed.as_secs_f64(), "s");
    row(
        "groups_remove_rate",
        count as f64 / removed.as_secs_f64(),
        "groups_per_s",
    );
    head.report("groups", cpu0, start.elapsed());
    Ok(())
}

fn tasks(head: &Head, count: usize) -> prism::Result<()> {
    let spread = TaskOptions::new().scheduling_strategy(SchedulingStrategy::Spread);
    let cpu0 = head.cpu_s();
    let start = Instant::now();
    let refs = (0..count)
        .map(|_| noop::remote_with(spread.clone()))
        .collect::<prism::Result<Vec<_>>>()?;
    let submitted = start.elapsed();
    let tags = prism::get_many_timeout(&refs, SECTION_LIMIT)?;
    let done = start.elapsed();
    let name = format!("tasks_{count}");
    row(&format!("{name}_submit_time"), submitted.as_secs_f64(), "s");
    row(&format!("{name}_total_time"), done.as_secs_f64(), "s");
    row(
        &format!("{name}_rate"),
        count as f64 / done.as_secs_f64(),
        "tasks_per_s",
    );
    row(&format!("{name}_nodes_used"), distinct(&tags), "nodes");
    row(
        &format!("{name}_driver_peak_rss"),
        field_kib(std::process::id(), "status", "VmHWM:") as f64 / 1024.0,
        "MiB",
    );
    head.report(&name, cpu0, done);
    Ok(())
}

#[prism::main]
fn main() -> prism::Result<()> {
    let count =
        |name: &str, default: usize| arg(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    let head = Head {
        pids: arg("--head-pids")
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.parse().ok())
            .collect(),
    };
    let t = Instant::now();
    prism::init(prism::Config::default())?;
    row("driver_init", t.elapsed().as_secs_f64() * 1e3, "ms");
    let alive = prism::nodes()?.into_iter().filter(|n| n.alive).count();
    row("nodes_alive", alive as f64, "nodes");

    let n_actors = count("--actors", 2000);
    if n_actors > 0 {
        actors(&head, n_actors)?;
    }
    let n_groups = count("--groups", 1000);
    if n_groups > 0 {
        groups(&head, n_groups)?;
    }
    for n in arg("--tasks")
        .unwrap_or_else(|| "10000".into())
        .split(',')
        .filter_map(|v| v.parse::<usize>().ok())
    {
        tasks(&head, n)?;
    }
    Ok(())
}
