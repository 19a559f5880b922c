//! How Prism's costs grow with load: tasks per second with 1 to 10,000
//! tasks in flight, actor calls per second with 1, 4 and 16 calling
//! processes, tasks and n:n actor calls per second with 1 to 16 clients,
//! put and get throughput from 1 KiB to 1 GiB, memory per idle
//! worker and per 1,000 pending tasks. Prints one `name value unit` line per
//! figure.
//!
//! Run: `cargo run --release --example scaling [-- --quick]`
//! (`PRISM_BENCH_ROWS=pattern` runs only the sections with a figure whose
//! name contains it, as the microbenchmark does).

use prism::{ActorOptions, TaskOptions};
use prism_examples::proc_stats::{children, field_kib, pss_kib};
use std::time::{Duration, Instant};

#[prism::remote]
fn noop() -> u8 {
    0
}

#[prism::actor]
struct Sink;

#[prism::actor]
impl Sink {
    fn new() -> Self {
        Sink
    }

    fn ping(&self) -> u8 {
        0
    }
}

/// A calling process: makes `n` calls to the sink, then waits for them.
#[prism::remote(num_cpus = 0)]
fn call_sink(sink: prism::ActorHandle<Sink>, n: u32) -> u32 {
    let refs: Vec<_> = (0..n).map(|_| sink.ping().expect("call")).collect();
    prism::get_many(&refs).expect("get");
    n
}

/// A submitting client: runs `n` tasks and waits for them.
#[prism::remote(num_cpus = 0)]
fn submit_tasks(n: u32) -> u32 {
    let refs: Vec<_> = (0..n).map(|_| noop::remote().expect("submit")).collect();
    prism::get_many(&refs).expect("get");
    n
}

/// Holds a resource for its lifetime, so tasks that need it stay pending.
#[prism::actor]
struct Gate;

#[prism::actor]
impl Gate {
    fn new() -> Self {
        Gate
    }

    fn ready(&self) -> bool {
        true
    }
}

/// Repeats `round` (which does `ops` operations) for at least `span`.
fn rate(
    span: Duration,
    ops: f64,
    mut round: impl FnMut() -> prism::Result<()>,
) -> prism::Result<f64> {
    round()?; // warm-up
    let start = Instant::now();
    let mut rounds = 0u32;
    while rounds == 0 || start.elapsed() < span {
        round()?;
        rounds += 1;
    }
    Ok(ops * rounds as f64 / start.elapsed().as_secs_f64())
}

#[prism::main]
fn main() -> prism::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let span = if quick {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };
    let filter = std::env::var("PRISM_BENCH_ROWS")
        .ok()
        .filter(|s| !s.is_empty());
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    prism::init(prism::Config::default().resource("gate", 1.0))?;

    for in_flight in [1usize, 10, 100, 1000, 10_000] {
        if !wants(&format!("tasks_in_flight_{in_flight}")) {
            continue;
        }
        let r = rate(span, in_flight as f64, || {
            let refs = (0..in_flight)
                .map(|_| noop::remote())
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
        println!("tasks_in_flight_{in_flight} {r:.1} per_s");
    }

    let sink = Sink::remote_with(ActorOptions::new().max_concurrency(1))?;
    prism::get(&sink.ping()?)?;
    for callers in [1u32, 4, 16] {
        if !wants(&format!("actor_calls_{callers}_callers")) {
            continue;
        }
        let per_caller = 2000;
        let r = rate(span, (callers * per_caller) as f64, || {
            let refs = (0..callers)
                .map(|_| call_sink::remote(sink.clone(), per_caller))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
        println!("actor_calls_{callers}_callers {r:.1} per_s");
    }

    // Throughput against the number of clients: `clients` processes each
    // submit tasks (`clients_tasks_async_N`), or each call an actor of its
    // own (`clients_actor_calls_async_N`, Ray's n:n rows). On a machine with
    // C cores these should grow until N reaches about C.
    let per_client = 2000u32;
    for clients in [1u32, 2, 4, 8, 16] {
        if !wants(&format!("clients_tasks_async_{clients}")) {
            continue;
        }
        let r = rate(span, (clients * per_client) as f64, || {
            let refs = (0..clients)
                .map(|_| submit_tasks::remote(per_client))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
        println!("clients_tasks_async_{clients} {r:.1} per_s");
    }
    for clients in [1u32, 2, 4, 8, 16] {
        if !wants(&format!("clients_actor_calls_async_{clients}")) {
            continue;
        }
        let sinks = (0..clients)
            .map(|_| Sink::remote_with(ActorOptions::new().num_cpus(0.0)))
            .collect::<prism::Result<Vec<_>>>()?;
        for s in &sinks {
            prism::get(&s.ping()?)?;
        }
        let r = rate(span, (clients * per_client) as f64, || {
            let refs = sinks
                .iter()
                .map(|s| call_sink::remote(s.clone(), per_client))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
        println!("clients_actor_calls_async_{clients} {r:.1} per_s");
        for s in &sinks {
            prism::kill(s)?;
        }
    }

    for (label, bytes) in [
        ("1kib", 1usize << 10),
        ("64kib", 64 << 10),
        ("1mib", 1 << 20),
        ("64mib", 64 << 20),
        ("1gib", 1 << 30),
    ] {
        let figures = ["put", "get_copy", "get_view"].map(|f| format!("{f}_{label}"));
        if (quick && bytes > 64 << 20) || !figures.iter().any(|f| wants(f)) {
            continue;
        }
        let data: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        let span = if bytes >= 64 << 20 { span / 2 } else { span };
        let puts = rate(span, bytes as f64, || prism::put_ref(&data).map(drop))?;
        let r = prism::put_ref(&data)?;
        let gets = rate(span, bytes as f64, || prism::get(&r).map(drop))?;
        let views = rate(span, bytes as f64, || prism::get_view(&r).map(drop))?;
        println!("put_{label} {:.3} GB_per_s", puts / 1e9);
        println!("get_copy_{label} {:.3} GB_per_s", gets / 1e9);
        println!("get_view_{label} {:.3} GB_per_s", views / 1e9);
    }

    if !wants("memory_per_idle_worker") && !wants("memory_per_1000_pending_tasks") {
        return Ok(());
    }
    // Memory of idle workers: start 8 more (actors that hold no resources)
    // and compare the total PSS of the worker processes before and after.
    std::thread::sleep(Duration::from_millis(500));
    let before: u64 = children().iter().map(|p| pss_kib(*p)).sum();
    let n_before = children().len();
    let idle = (0..8)
        .map(|_| Sink::remote())
        .collect::<prism::Result<Vec<_>>>()?;
    for s in &idle {
        prism::get(&s.ping()?)?;
    }
    std::thread::sleep(Duration::from_millis(500));
    let after: u64 = children().iter().map(|p| pss_kib(*p)).sum();
    let added = children().len().saturating_sub(n_before).max(1);
    println!(
        "memory_per_idle_worker {:.2} MiB",
        (after.saturating_sub(before)) as f64 / added as f64 / 1024.0
    );

    // Memory per 1,000 pending tasks: tasks that need the gate, which an
    // actor holds, stay queued in this driver.
    let gate = Gate::remote_with(ActorOptions::new().resource("gate", 1.0))?;
    prism::get(&gate.ready()?)?;
    let me = std::process::id();
    let rss_before = field_kib(me, "status", "RssAnon:");
    let pending = 10_000;
    let waiting = (0..pending)
        .map(|_| noop::remote_with(TaskOptions::new().num_cpus(0.0).resource("gate", 1.0)))
        .collect::<prism::Result<Vec<_>>>()?;
    let rss_after = field_kib(me, "status", "RssAnon:");
    println!(
        "memory_per_1000_pending_tasks {:.3} MiB",
        rss_after.saturating_sub(rss_before) as f64 / (pending as f64 / 1000.0) / 1024.0
    );
    prism::kill(&gate)?;
    prism::get_many_timeout(&waiting, Duration::from_secs(120))?;
    Ok(())
}
