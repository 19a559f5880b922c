//! Measures what the core costs: cluster start, first task, task and actor
//! call rates, small puts and gets, large puts, zero-copy gets, and the
//! memory of an idle node. Prints one `name value unit` line per figure.
//!
//! Run: `cargo run --release --example microbenchmark [--quick]`

use std::time::{Duration, Instant};

#[prism::remote]
fn noop() -> u8 {
    0
}

#[prism::actor]
struct Echo;

#[prism::actor]
impl Echo {
    fn new() -> Self {
        Echo
    }

    fn ping(&self) -> u8 {
        0
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("{name} {value:.3} {unit}");
}

fn rate(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

/// Proportional set size of this process and its children, in MiB.
fn pss_mib_of_tree() -> f64 {
    let me = std::process::id();
    let mut total_kib = 0u64;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid: u32 = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if pid != me && ppid != me {
            continue;
        }
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        total_kib += rollup
            .lines()
            .find(|l| l.starts_with("Pss:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total_kib as f64 / 1024.0
}

fn count_children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    stat.rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().nth(1))
                        == Some(me.as_str())
                })
                .count()
        })
        .unwrap_or(0)
}

#[prism::main]
fn main() -> prism::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };

    let start = Instant::now();
    prism::init(prism::Config::default())?;
    report("cluster_start", start.elapsed().as_secs_f64() * 1e3, "ms");

    let start = Instant::now();
    prism::get(&noop::remote()?)?;
    report(
        "first_task_latency",
        start.elapsed().as_secs_f64() * 1e3,
        "ms",
    );

    let start = Instant::now();
    let echo = Echo::remote()?;
    prism::get(&echo.ping()?)?;
    report(
        "actor_creation_plus_first_call",
        start.elapsed().as_secs_f64() * 1e3,
        "ms",
    );

    let n = 5000 / scale;
    let start = Instant::now();
    for _ in 0..n {
        prism::get(&noop::remote()?)?;
    }
    report(
        "single_client_tasks_sync",
        rate(n, start.elapsed()),
        "per_s",
    );

    let start = Instant::now();
    let refs = (0..n)
        .map(|_| noop::remote())
        .collect::<prism::Result<Vec<_>>>()?;
    prism::get_many(&refs)?;
    report(
        "single_client_tasks_async",
        rate(n, start.elapsed()),
        "per_s",
    );

    let start = Instant::now();
    for _ in 0..n {
        prism::get(&echo.ping()?)?;
    }
    report("1_1_actor_calls_sync", rate(n, start.elapsed()), "per_s");

    let start = Instant::now();
    let refs = (0..n)
        .map(|_| echo.ping())
        .collect::<prism::Result<Vec<_>>>()?;
    prism::get_many(&refs)?;
    report("1_1_actor_calls_async", rate(n, start.elapsed()), "per_s");

    let m = 20_000 / scale;
    let start = Instant::now();
    let small = (0..m)
        .map(|i| prism::put(i as u64))
        .collect::<prism::Result<Vec<_>>>()?;
    report("single_client_put_calls", rate(m, start.elapsed()), "per_s");

    let start = Instant::now();
    for r in &small {
        prism::get(r)?;
    }
    report("single_client_get_calls", rate(m, start.elapsed()), "per_s");
    drop(small);

    let mb100: Vec<u8> = (0..100_000_000u32).map(|i| i as u8).collect();
    let rounds = if quick { 2 } else { 10 };
    let mut first = 0.0;
    let mut best = Duration::MAX;
    for i in 0..rounds {
        let value = mb100.clone();
        let start = Instant::now();
        let r = prism::put(value)?;
        let took = start.elapsed();
        if i == 0 {
            first = 0.1 / took.as_secs_f64();
        } else {
            best = best.min(took);
        }
        drop(r);
        // Give the store the delete before the next put.
        std::thread::sleep(Duration::from_millis(20));
    }
    report("put_100mb_first_gigabytes", first, "GB_per_s");
    report(
        "put_100mb_reused_pages_gigabytes",
        0.1 / best.as_secs_f64(),
        "GB_per_s",
    );

    let big = prism::put(mb100)?;
    // Let the put's buffer be freed first (it is unmapped in the background).
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let view = prism::get_view(&big)?;
    report(
        "get_100mb_view_latency",
        start.elapsed().as_secs_f64() * 1e3,
        "ms",
    );
    drop(view);
    drop(big);

    std::thread::sleep(Duration::from_millis(200));
    report(
        "idle_node_processes",
        (1 + count_children()) as f64,
        "processes",
    );
    report("idle_node_pss", pss_mib_of_tree(), "MiB");
    Ok(())
}
