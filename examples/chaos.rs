//! The chaos run: a workload of tasks, a small DAG of tasks that take
//! other tasks' results by reference, objects of mixed sizes (inline, in
//! shared memory, and puts larger than the store's free room) and actor
//! calls on one node, while a second thread SIGKILLs a random worker
//! process (task workers and the actor's process alike) every 30 to
//! 150 ms, and the store (64 MiB) is kept past full so objects spill.
//! Every result is checked, every wait is bounded, and the run is bounded
//! in time.
//!
//! The faults are random but seeded: the seed is printed first, and
//! `--seed` replays it (the kills' timing still depends on the machine).
//! Prints the figures: faults injected, tasks and actor calls retried,
//! actor restarts, objects spilled and restored, results checked, and the
//! time from each kill to the next result (median and max). Exits
//! non-zero if any result is wrong or missing.
//!
//! Run: `cargo run --release --example chaos [-- --seconds N] [--seed S]`

use prism::{ActorOptions, TaskOptions};
use prism_examples::proc_stats::children;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BLOCK: usize = 4 << 20;
const LIMIT: Duration = Duration::from_secs(60);

#[prism::remote]
fn square(x: u64) -> u64 {
    x * x
}

/// A 4 MiB block whose bytes follow from `seed`.
#[prism::remote]
fn block(seed: u64) -> Vec<u8> {
    pattern(seed)
}

/// 32,768 numbers (256 KiB: stored in shared memory, not inline).
#[prism::remote]
fn numbers(seed: u64) -> Vec<u64> {
    numbers_of(seed)
}

fn numbers_of(seed: u64) -> Vec<u64> {
    (0..32_768u64)
        .map(|i| i.wrapping_mul(seed | 1) % 1_000_003)
        .collect()
}

/// Takes two task results by reference (the executor fetches them).
#[prism::remote]
fn dot(a: Vec<u64>, b: Vec<u64>) -> u64 {
    a.iter()
        .zip(&b)
        .fold(0u64, |s, (x, y)| s.wrapping_add(x.wrapping_mul(*y)))
}

fn dot_of(a: u64, b: u64) -> u64 {
    let (a, b) = (numbers_of(a), numbers_of(b));
    a.iter()
        .zip(&b)
        .fold(0u64, |s, (x, y)| s.wrapping_add(x.wrapping_mul(*y)))
}

/// Bytes of a put larger than the room a full store has left.
const LARGE: usize = 24 << 20;

fn pattern(seed: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (seed as usize).wrapping_mul(31).wrapping_add(i % 253) as u8)
        .collect()
}

#[prism::actor]
struct Echo;

#[prism::actor]
impl Echo {
    fn new() -> Self {
        Echo
    }

    fn echo(&self, x: u64) -> u64 {
        x
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }
}

/// xorshift64*: small, seeded, good enough to pick victims and delays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Args {
    seconds: u64,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        seconds: 30,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1,
    };
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let v = args.next().ok_or(format!("{name} needs a number"))?;
            v.parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(format!("{name}: {v:?} is not a positive number"))
        };
        match arg.as_str() {
            "--seconds" => out.seconds = number("--seconds")?,
            "--seed" => out.seed = number("--seed")?,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; expected --seconds N or --seed S"
                ))
            }
        }
    }
    Ok(out)
}

/// Kills a random worker every 30 to 150 ms until `stop`; returns when
/// each kill happened.
fn chaos(seed: u64, stop: Arc<AtomicBool>) -> Vec<Instant> {
    let mut rng = Rng(seed);
    let mut kills = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(30 + rng.below(120)));
        let workers = children();
        if workers.is_empty() {
            continue;
        }
        let victim = workers[rng.below(workers.len() as u64) as usize];
        // SAFETY: kill(2) touches no memory of this process.
        if unsafe { libc::kill(victim as i32, libc::SIGKILL) } == 0 {
            kills.push(Instant::now());
        }
    }
    kills
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    println!("seed {}", args.seed);
    let config = prism::Config::default()
        .num_cpus(2)
        .object_store_memory(64 << 20);
    prism::init(config).map_err(|e| e.to_string())?;
    let outcome = run(&args);
    prism::shutdown();
    outcome
}

fn run(args: &Args) -> Result<(), String> {
    let err = |e: prism::Error| e.to_string();
    let forever = TaskOptions::new().max_retries(-1);
    let echo = Echo::remote_with(ActorOptions::new().max_restarts(-1).max_task_retries(-1))
        .map_err(err)?;
    let mut actor_pids = HashSet::new();
    let stop = Arc::new(AtomicBool::new(false));
    let chaos_thread = {
        let (seed, stop) = (args.seed, stop.clone());
        std::thread::spawn(move || chaos(seed, stop))
    };
    let completions = Mutex::new(Vec::new());
    let done = |n: usize| completions.lock().unwrap().push((Instant::now(), n));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let (mut checked, mut rounds) = (0u64, 0u64);
    let (mut dag_checked, mut large_checked) = (0u64, 0u64);
    let mut kept = std::collections::VecDeque::new();
    let mut outcome = Ok(());
    while Instant::now() < deadline && outcome.is_ok() {
        let base = rounds * 1000;
        let squares: Vec<_> = (0..20)
            .map(|i| square::remote_with(forever.clone(), base + i))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let blocks: Vec<_> = (0..4)
            .map(|i| block::remote_with(forever.clone(), base + i).map(|r| (base + i, r)))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let echoes: Vec<_> = (0..10)
            .map(|i| echo.echo(base + i))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        // A DAG: two producers, and a task that takes both by reference.
        let (left, right) = (
            numbers::remote_with(forever.clone(), base + 1).map_err(err)?,
            numbers::remote_with(forever.clone(), base + 2).map_err(err)?,
        );
        let joined = dot::remote_with(forever.clone(), &left, &right).map_err(err)?;
        drop((left, right));
        // Every eighth round, a put larger than the free room of the full
        // store: it waits for spilling.
        let large = match rounds % 8 {
            0 => Some(prism::put(pattern(base + 7).repeat(LARGE / BLOCK)).map_err(err)?),
            _ => None,
        };
        outcome = (|| {
            for (i, r) in squares.iter().enumerate() {
                let v = prism::get_timeout(r, LIMIT).map_err(err)?;
                let x = base + i as u64;
                if v != x * x {
                    return Err(format!("square({x}) gave {v}"));
                }
                done(1);
            }
            for (i, r) in echoes.iter().enumerate() {
                let v = prism::get_timeout(r, LIMIT).map_err(err)?;
                if v != base + i as u64 {
                    return Err(format!("echo({}) gave {v}", base + i as u64));
                }
                done(1);
            }
            for (seed, r) in &blocks {
                let v = prism::get_timeout(r, LIMIT).map_err(err)?;
                if v != pattern(*seed) {
                    return Err(format!("block({seed}) came back changed"));
                }
                done(1);
            }
            let v = prism::get_timeout(&joined, LIMIT).map_err(err)?;
            if v != dot_of(base + 1, base + 2) {
                return Err(format!("dot({}, {}) gave {v}", base + 1, base + 2));
            }
            done(1);
            dag_checked += 1;
            if let Some(large) = &large {
                let v = prism::get_timeout(large, LIMIT).map_err(err)?;
                if v.len() != LARGE || v.chunks(BLOCK).any(|c| c != pattern(base + 7)) {
                    return Err(format!(
                        "the {LARGE}-byte put of round {rounds} came back changed"
                    ));
                }
                large_checked += 1;
            }
            let pid = prism::get_timeout(&echo.pid().map_err(err)?, LIMIT).map_err(err)?;
            actor_pids.insert(pid);
            Ok(())
        })();
        checked += 35 + u64::from(large.is_some());
        rounds += 1;
        // Keep the last 16 blocks alive: 64 MiB of results in a 64 MiB
        // store, so older ones spill and are read back below.
        kept.extend(blocks);
        while kept.len() > 16 {
            if let Some((seed, r)) = kept.pop_front() {
                if outcome.is_ok() && seed % 7 == 0 {
                    let v = prism::get_timeout(&r, LIMIT).map_err(err)?;
                    if v != pattern(seed) {
                        outcome = Err(format!("kept block({seed}) came back changed"));
                    }
                    checked += 1;
                }
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let kills = chaos_thread
        .join()
        .map_err(|_| "the chaos thread panicked".to_string())?;
    let completions = completions.into_inner().unwrap_or_default();
    let mut recovery: Vec<Duration> = kills
        .iter()
        .filter_map(|k| {
            completions
                .iter()
                .find(|(t, _)| t > k)
                .map(|(t, _)| t.duration_since(*k))
        })
        .collect();
    recovery.sort();
    let retries = prism::retry_stats();
    let store = prism::object_store_stats().map_err(err)?;
    let ms = |d: Option<&Duration>| d.map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0);
    println!("seconds {}", args.seconds);
    println!("rounds {rounds}");
    println!("results_checked {checked}");
    println!("dag_results_checked {dag_checked}");
    println!("large_puts_checked {large_checked}");
    println!("faults_injected {}", kills.len());
    println!("tasks_retried {}", retries.task_retries);
    println!("actor_calls_retried {}", retries.actor_call_retries);
    println!("actor_restarts_seen {}", actor_pids.len().saturating_sub(1));
    println!("objects_spilled {}", store.spilled_total);
    println!("objects_restored {}", store.restored_total);
    println!(
        "recovery_ms median {:.1} max {:.1}",
        ms(recovery.get(recovery.len() / 2)),
        ms(recovery.last())
    );
    match &outcome {
        Ok(()) => println!("result every result was right"),
        Err(e) => println!("result FAILED (seed {}): {e}", args.seed),
    }
    outcome
}
