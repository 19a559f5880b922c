//! The chaos run over a cluster: a head and three nodes on test hosts in
//! network namespaces, a driver on the head running a workload that covers
//! the runtime, and this test injecting faults meanwhile: it SIGKILLs
//! workers and actor processes (the Trainer's workers among them), kills
//! whole nodes and starts them again, and cuts nodes off the network.
//! Every result is checked, every wait is bounded, and the figures are
//! printed.
//!
//! `PRISM_CHAOS_SECONDS` (default 15) sets the workload's length and
//! `PRISM_CHAOS_SEED` replays a run's choice of faults:
//!
//! ```text
//! PRISM_CHAOS_SECONDS=60 cargo test -p prism-cli --test chaos -- --nocapture
//! ```
//!
//! Needs root for the namespaces (CI runs as root); elsewhere it says it
//! was skipped and why.

mod common;

use common::{Machines, DRIVER, FAST_DEATH};
use prism_tests::{must, must_eventually};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

const TEST: &str = "a_cluster_under_chaos_gives_every_result_right";
/// Every `get` of the workload waits at most this long.
const LIMIT: Duration = Duration::from_secs(60);
/// A stored block (above the inline limit, so it lives in a node's store).
const BLOCK: usize = 1 << 20;
/// A put larger than the free room of the head's full 64 MiB store.
const LARGE: usize = 24 << 20;
const STORE: &str = "67108864";

fn seconds() -> u64 {
    std::env::var("PRISM_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s > 0)
        .unwrap_or(15)
}

/// Now, in nanoseconds since the epoch: comparable between the test and
/// its driver, both on this machine.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// xorshift64*: the faults' choices, replayable from the seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

#[prism::remote]
fn square(x: u64) -> u64 {
    x * x
}

/// 256 KiB of numbers from `seed` (stored, not inline).
#[prism::remote]
fn numbers(seed: u64) -> Vec<u64> {
    numbers_of(seed)
}

fn numbers_of(seed: u64) -> Vec<u64> {
    (0..32_768).map(|i| (seed + i) % 1_000).collect()
}

#[prism::remote]
fn dot(a: Vec<u64>, b: Vec<u64>) -> u64 {
    a.iter().zip(&b).map(|(x, y)| x * y).sum()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed as usize + i % 251) as u8).collect()
}

#[prism::remote]
fn block(seed: u64) -> Vec<u8> {
    pattern(seed, BLOCK)
}

/// Each byte plus one: a task that takes a stored block by reference.
#[prism::remote]
fn shift(data: Vec<u8>) -> Vec<u8> {
    data.iter().map(|b| b.wrapping_add(1)).collect()
}

/// An actor with state: a value per round, checkpointed after every call,
/// so a restarted process (on this node or another) resumes with it.
#[prism::actor(checkpoint)]
#[derive(serde::Serialize, serde::Deserialize)]
struct Ledger {
    values: BTreeMap<u64, u64>,
}

#[prism::actor]
impl Ledger {
    fn new() -> Self {
        Ledger {
            values: BTreeMap::new(),
        }
    }

    /// Idempotent, so a call retried after a crash changes nothing more.
    fn record(&mut self, round: u64, value: u64) {
        self.values.insert(round, value);
    }

    fn value(&self, round: u64) -> Option<u64> {
        self.values.get(&round).copied()
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LoopConfig {
    epochs: u32,
}

#[derive(serde::Serialize)]
struct LoopMetrics {
    epoch: u32,
    total: f64,
}

/// Adds every rank's rank + 1 into a running total each epoch (3 per epoch
/// with 2 workers), checkpointing the total; a restarted run resumes from
/// the latest checkpoint.
fn training_loop(config: LoopConfig) -> Result<(), prism_train::TrainError> {
    let failed = |e: std::io::Error| prism_train::TrainError::Metrics(e.to_string());
    let ctx = prism_train::get_context()?;
    let group = prism_train::get_process_group()?;
    let (mut start, mut total) = (0, 0.0);
    if let Some(c) = prism_train::get_checkpoint()? {
        let saved = std::fs::read_to_string(c.path().join("state")).map_err(failed)?;
        let (epoch, sum) = saved.split_once(' ').unwrap_or(("0", "0"));
        start = epoch.parse::<u32>().unwrap_or(0) + 1;
        total = sum.parse().unwrap_or(0.0);
    }
    for epoch in start..config.epochs {
        let mut x = [ctx.world_rank() as f64 + 1.0];
        group.all_reduce(&mut x, prism_train::collective::ReduceOp::Sum)?;
        total += x[0];
        std::thread::sleep(Duration::from_millis(50));
        let dir = std::env::temp_dir().join(format!(
            "prism-chaos-ckpt-{}-{epoch}-{}",
            std::process::id(),
            ctx.world_rank()
        ));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        std::fs::write(dir.join("state"), format!("{epoch} {total}")).map_err(failed)?;
        prism_train::report(
            LoopMetrics { epoch, total },
            Some(prism_train::Checkpoint::from_directory(&dir)),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

const EPOCHS: u32 = 40;

/// Runs the Trainer with its two workers on the head (the `trainer`
/// resource only the head offers), whose workers the faults kill; says
/// whether its final total is right.
fn train(storage: PathBuf) -> Result<String, String> {
    let result = prism_train::Trainer::new(training_loop, LoopConfig { epochs: EPOCHS })
        .scaling_config(prism_train::ScalingConfig::new(2).resources_per_worker("trainer", 1.0))
        .run_config(
            prism_train::RunConfig::new("chaos")
                .storage_path(storage)
                .failure_config(prism_train::FailureConfig::new(1_000)),
        )
        .fit()
        .into_result()
        .map_err(|e| e.to_string())?;
    let metrics = result.metrics.ok_or("no metrics")?;
    let total = metrics["total"].as_f64().unwrap_or(-1.0);
    let expected = 3.0 * f64::from(EPOCHS);
    if total != expected {
        return Err(format!("the total is {total}, not {expected}"));
    }
    Ok(format!("{EPOCHS} epochs, total {total}"))
}

/// The driver's part, run on the head by the test below.
fn workload() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let outcome = run_workload(seconds());
    match &outcome {
        Ok(()) => println!("RESULT every result was right"),
        Err(e) => println!("RESULT FAILED: {e}"),
    }
    prism::shutdown();
}

/// A bounded `get`, noting when the value arrived.
fn got<T: serde::de::DeserializeOwned + Send + 'static>(
    r: &prism::ObjectRef<T>,
    arrivals: &mut Vec<u64>,
) -> Result<T, String> {
    let v = prism::get_timeout(r, LIMIT).map_err(|e| e.to_string())?;
    arrivals.push(now_ns());
    Ok(v)
}

fn run_workload(seconds: u64) -> Result<(), String> {
    let err = |e: prism::Error| e.to_string();
    // When each checked result arrived, for the test's recovery times.
    let mut arrivals = Vec::new();
    let spread = prism::TaskOptions::new()
        .max_retries(-1)
        .scheduling_strategy(prism::SchedulingStrategy::Spread);
    let ledger = Ledger::remote_with(
        prism::ActorOptions::new()
            .max_restarts(-1)
            .max_task_retries(-1)
            .checkpoint_every(1)
            .scheduling_strategy(prism::SchedulingStrategy::Spread),
    )
    .map_err(err)?;
    let storage = std::env::temp_dir().join(format!("prism-chaos-runs-{}", std::process::id()));
    let trainer = {
        let storage = storage.clone();
        std::thread::spawn(move || train(storage))
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut rounds, mut checked) = (0u64, 0u64);
    let mut pids = HashSet::new();
    let mut kept: VecDeque<(u64, prism::ObjectRef<Vec<u8>>)> = VecDeque::new();
    let mut larges: VecDeque<(u64, prism::ObjectRef<Vec<u8>>)> = VecDeque::new();
    while Instant::now() < deadline {
        let base = rounds * 1_000;
        let squares = (0..12)
            .map(|i| square::remote_with(spread.clone(), base + i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        // A DAG: two stored producers and a task taking both by reference.
        let left = numbers::remote_with(spread.clone(), base + 1).map_err(err)?;
        let right = numbers::remote_with(spread.clone(), base + 2).map_err(err)?;
        let joined = dot::remote_with(spread.clone(), &left, &right).map_err(err)?;
        drop((left, right));
        // A chain kept alive: its blocks live in the nodes' stores, and
        // those lost with a node are made again from their lineage.
        let first = block::remote_with(spread.clone(), base).map_err(err)?;
        let shifted = shift::remote_with(spread.clone(), &first).map_err(err)?;
        drop(first);
        kept.push_back((base, shifted));
        ledger.record(rounds, base + 7).map_err(err)?;
        let large = (rounds % 5 == 0)
            .then(|| prism::put(pattern(base, LARGE)))
            .transpose()
            .map_err(err)?;
        for (i, r) in squares.iter().enumerate() {
            let x = base + i as u64;
            let v = got(r, &mut arrivals)?;
            if v != x * x {
                return Err(format!("square({x}) gave {v}"));
            }
        }
        let want: u64 = numbers_of(base + 1)
            .iter()
            .zip(&numbers_of(base + 2))
            .map(|(a, b)| a * b)
            .sum();
        let v = got(&joined, &mut arrivals)?;
        if v != want {
            return Err(format!("dot of round {rounds} gave {v}, not {want}"));
        }
        let seen = got(&ledger.value(rounds).map_err(err)?, &mut arrivals)?;
        if seen != Some(base + 7) {
            return Err(format!("the ledger has {seen:?} for round {rounds}"));
        }
        if rounds > 0 {
            let earlier = rounds - 1;
            let seen = got(&ledger.value(earlier).map_err(err)?, &mut arrivals)?;
            if seen != Some(earlier * 1_000 + 7) {
                return Err(format!("the ledger lost round {earlier}: {seen:?}"));
            }
        }
        pids.insert(got(&ledger.pid().map_err(err)?, &mut arrivals)?);
        // The last three large puts stay alive: more than the head's
        // store holds, so older ones spill and are read back.
        if let Some(large) = large {
            larges.push_back((base, large));
        }
        while larges.len() > 3 {
            if let Some((seed, r)) = larges.pop_front() {
                let v = got(&r, &mut arrivals)?;
                if v != pattern(seed, LARGE) {
                    return Err(format!(
                        "the large put of round {} came back changed",
                        seed / 1_000
                    ));
                }
                checked += 1;
            }
        }
        checked += 15 + u64::from(rounds > 0);
        // The oldest kept chain is read back, wherever it is now.
        while kept.len() > 6 {
            if let Some((seed, r)) = kept.pop_front() {
                let v = got(&r, &mut arrivals)?;
                let want: Vec<u8> = pattern(seed, BLOCK)
                    .iter()
                    .map(|b| b.wrapping_add(1))
                    .collect();
                if v != want {
                    return Err(format!(
                        "the chain of round {} came back changed",
                        seed / 1_000
                    ));
                }
                checked += 1;
            }
        }
        rounds += 1;
    }
    if let Ok(path) = std::env::var("PRISM_CHAOS_ARRIVALS") {
        let lines: Vec<String> = arrivals.iter().map(u64::to_string).collect();
        std::fs::write(path, lines.join("\n")).map_err(|e| e.to_string())?;
    }
    let trained = trainer
        .join()
        .map_err(|_| "the Trainer's thread panicked".to_string())??;
    let _ = std::fs::remove_dir_all(&storage);
    let retries = prism::retry_stats();
    let store = prism::object_store_stats().map_err(err)?;
    println!("rounds {rounds}");
    println!("results_checked {checked}");
    println!("trainer {trained}");
    println!("tasks_retried {}", retries.task_retries);
    println!("actor_calls_retried {}", retries.actor_call_retries);
    println!("actor_processes_seen {}", pids.len());
    println!("objects_rebuilt {}", retries.objects_rebuilt);
    println!("head_objects_spilled {}", store.spilled_total);
    println!("head_objects_restored {}", store.restored_total);
    Ok(())
}

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_string();
                    after.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn sigkill(pid: u32) -> bool {
    // SAFETY: kill has no memory-safety preconditions; the pid is a
    // process of this test's cluster.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) == 0 }
}

/// The live node process of `host`, if any.
fn node_of(m: &Machines, host: usize) -> Option<u32> {
    prism_raylet::NodeRecord::list(&m.temps[host])
        .into_iter()
        .find(|r| r.is_running())
        .map(|r| r.pid)
}

/// Kills a node the way a machine dies: the node process and its workers.
fn kill_node(m: &Machines, host: usize) {
    if let Some(pid) = node_of(m, host) {
        let workers = children_of(pid);
        sigkill(pid);
        for w in workers {
            sigkill(w);
        }
    }
}

#[derive(Default, Debug)]
struct Faults {
    workers_killed: u64,
    nodes_killed: u64,
    nodes_cut_off: u64,
    nodes_started_again: u64,
}

/// The median and longest wait, in ms, from each fault to the next result
/// the driver got.
fn recovery(faults: &[u64], arrivals: &[u64]) -> (f64, f64) {
    let mut waits: Vec<u64> = faults
        .iter()
        .filter_map(|f| arrivals.iter().find(|a| *a > f).map(|a| a - f))
        .collect();
    waits.sort_unstable();
    let ms = |w: Option<&u64>| w.map(|w| *w as f64 / 1e6).unwrap_or(0.0);
    (ms(waits.get(waits.len() / 2)), ms(waits.last()))
}

const NODE_FLAGS: &[&str] = &["--object-store-memory", STORE];

#[test]
fn a_cluster_under_chaos_gives_every_result_right() {
    if std::env::var_os(DRIVER).is_some() {
        return workload();
    }
    let Some(m) = Machines::new("chaos", 4) else {
        return;
    };
    let seed = std::env::var("PRISM_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("seed {seed}");
    let head = m.start_head_with(
        FAST_DEATH,
        &[
            "--num-cpus",
            "3",
            "--resources",
            r#"{"trainer": 2}"#,
            "--object-store-memory",
            STORE,
        ],
    );
    for host in 1..4 {
        let out = m.join_with(host, &head, NODE_FLAGS);
        assert!(
            out.status.success(),
            "the node joins: {}",
            common::text(&out)
        );
    }
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 4 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));

    let exe = must(std::env::current_exe(), "this test's binary");
    let mut driver = m.net.command(0, exe);
    let log = std::env::temp_dir().join(format!("prism-chaos-driver-{}.log", std::process::id()));
    let arrivals =
        std::env::temp_dir().join(format!("prism-chaos-arrivals-{}", std::process::id()));
    let temp = m.temps[0].display().to_string();
    driver
        .args(["--exact", TEST, "--nocapture"])
        .env("PRISM_ADDRESS", &head)
        .env("PRISM_TEMP_DIR", &temp)
        .env(DRIVER, "1")
        .env("PRISM_CHAOS_ARRIVALS", &arrivals)
        .env("PRISM_CHAOS_SECONDS", seconds().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(must(
            std::fs::File::create(&log),
            "the driver's log file",
        )));
    let mut child = must(driver.spawn(), "the driver starts");
    let stdout = must(child.stdout.take().ok_or("none"), "the driver's output");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });

    // Faults until the driver is done (bounded).
    let mut rng = Rng(seed);
    let mut faults = Faults::default();
    let limit = Instant::now() + Duration::from_secs(seconds() + 120);
    // A node taken down, and when to start it again.
    let mut down: Option<(usize, Instant, bool)> = None;
    let (mut worker_faults, mut node_faults) = (Vec::new(), Vec::new());
    while must(child.try_wait(), "the driver's state").is_none() {
        if Instant::now() > limit {
            let _ = child.kill();
            panic!("the driver did not finish within {} s", seconds() + 120);
        }
        std::thread::sleep(Duration::from_millis(150 + rng.below(450)));
        if let Some((host, at, cut)) = down {
            if Instant::now() >= at {
                // Declared dead by now: it comes back as a new node.
                if cut {
                    kill_node(&m, host);
                    must(m.net.join(host), "the host's link comes back");
                }
                // A link just brought back may not route for a moment
                // (its neighbours' entries failed while it was down).
                let mut out = m.join_with(host, &head, NODE_FLAGS);
                for _ in 0..10 {
                    if out.status.success() || !common::text(&out).contains("No route to host") {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    out = m.join_with(host, &head, NODE_FLAGS);
                }
                assert!(
                    out.status.success(),
                    "seed {seed}: host {host} (cut off: {cut}) joins again: {}",
                    common::text(&out)
                );
                faults.nodes_started_again += 1;
                down = None;
            }
            continue;
        }
        match rng.below(20) {
            // A whole node (never the head): killed, or cut off.
            0 | 1 => {
                let host = 1 + rng.below(3) as usize;
                let cut = rng.below(2) == 0;
                if cut {
                    must(m.net.cut(host), "the host is cut off");
                    faults.nodes_cut_off += 1;
                } else {
                    kill_node(&m, host);
                    faults.nodes_killed += 1;
                }
                node_faults.push(now_ns());
                down = Some((host, Instant::now() + Duration::from_millis(2500), cut));
            }
            // A worker or actor process of any node, the head's included
            // (where the Trainer's workers run).
            _ => {
                let host = rng.below(4) as usize;
                let workers = node_of(&m, host).map(children_of).unwrap_or_default();
                if !workers.is_empty() {
                    let victim = workers[rng.below(workers.len() as u64) as usize];
                    if sigkill(victim) {
                        faults.workers_killed += 1;
                        worker_faults.push(now_ns());
                    }
                }
            }
        }
    }
    if let Some((host, _, true)) = down {
        let _ = m.net.join(host);
    }
    let said = must(reader.join().map_err(|_| "panicked"), "the driver's output").join("\n");
    println!("{said}");
    println!("faults (seed {seed}): {faults:?}");
    let arrived: Vec<u64> = std::fs::read_to_string(&arrivals)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    let _ = std::fs::remove_file(&arrivals);
    for (what, times) in [
        ("worker kill", &worker_faults),
        ("node fault", &node_faults),
    ] {
        let (median, max) = recovery(times, &arrived);
        println!("recovery after a {what}: median {median:.1} ms, longest {max:.1} ms");
    }
    if !said.contains("RESULT every result was right") {
        let errors = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = errors.lines().rev().take(60).collect();
        for line in tail.iter().rev() {
            println!("driver: {line}");
        }
    }
    let _ = std::fs::remove_file(&log);
    assert!(
        said.contains("RESULT every result was right"),
        "seed {seed}: {said}"
    );
}
