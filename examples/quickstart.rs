//! A tour of Prism: tasks, objects, actors and wait, with the time each
//! step took.
//!
//! Run: `cargo run --release --example quickstart`

use std::time::{Duration, Instant};

/// Adds two numbers in a worker process.
#[prism::remote]
fn add(a: i64, b: i64) -> i64 {
    a + b
}

/// Sums a buffer that the worker reads in place from shared memory.
#[prism::remote]
fn sum(values: prism::View<f32>) -> f64 {
    values.iter().map(|v| *v as f64).sum()
}

/// Sleeps without blocking the worker, then returns its argument.
#[prism::remote]
async fn slow_echo(ms: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    ms
}

/// A counter that lives in its own process.
#[prism::actor]
struct Counter {
    n: i64,
}

#[prism::actor]
impl Counter {
    fn new(start: i64) -> Self {
        Counter { n: start }
    }

    fn incr(&mut self, by: i64) -> i64 {
        self.n += by;
        self.n
    }

    fn get(&self) -> i64 {
        self.n
    }
}

fn step<T>(what: &str, f: impl FnOnce() -> prism::Result<T>) -> prism::Result<T> {
    let start = Instant::now();
    let r = f()?;
    println!("{what:<55} {:>9.3} ms", start.elapsed().as_secs_f64() * 1e3);
    Ok(r)
}

#[prism::main]
fn main() -> prism::Result<()> {
    step("start an embedded cluster (prism::init)", || {
        prism::init(prism::Config::default())
    })?;

    let r = step("first task: add::remote(1, 2) and get", || {
        let r = add::remote(1, 2)?;
        prism::get(&r)
    })?;
    assert_eq!(r, 3);

    let n = 1000;
    let total = step(&format!("{n} tasks submitted, then all gotten"), || {
        let refs = (0..n)
            .map(|i| add::remote(i, 1))
            .collect::<prism::Result<Vec<_>>>()?;
        Ok(prism::get_many(&refs)?.into_iter().sum::<i64>())
    })?;
    assert_eq!(total, (1..=n).sum::<i64>());

    let chained = step("a chain of 10 tasks, each taking the last's ref", || {
        let mut r = add::remote(0, 1)?;
        for _ in 0..9 {
            r = add::remote(&r, 1)?;
        }
        prism::get(&r)
    })?;
    assert_eq!(chained, 10);

    let big = step("put 100 MB (25M f32) into shared memory", || {
        prism::put(vec![1.0f32; 25_000_000])
    })?;
    let s = step("sum it in a worker, read in place", || {
        prism::get(&sum::remote(&big)?)
    })?;
    assert_eq!(s, 25_000_000.0);
    let view = step("view it here without a copy (get_view)", || {
        prism::get_view(&big)
    })?;
    println!(
        "  the view has {} elements, zero-copy: {}",
        view.len(),
        view.is_zero_copy()
    );
    drop(view);

    let c = step("create an actor and make its first call", || {
        let c = Counter::remote(0)?;
        prism::get(&c.incr(5)?)?;
        Ok(c)
    })?;
    let v = step("100 more calls to it, in order", || {
        let mut last = None;
        for _ in 0..100 {
            last = Some(c.incr(1)?);
        }
        match last {
            Some(r) => prism::get(&r),
            None => prism::get(&c.get()?),
        }
    })?;
    assert_eq!(v, 105);

    let (ready, pending) = step("wait for 2 of 4 tasks sleeping 0/0/1500/1500 ms", || {
        let refs = [0, 0, 1500, 1500]
            .into_iter()
            .map(slow_echo::remote)
            .collect::<prism::Result<Vec<_>>>()?;
        prism::wait(&refs, 2, Some(Duration::from_secs(1)))
    })?;
    println!("  ready: {}, still pending: {}", ready.len(), pending.len());

    let stats = prism::object_store_stats()?;
    println!(
        "object store: {} objects, {} bytes in use of {}",
        stats.num_objects, stats.used_bytes, stats.capacity_bytes
    );
    drop(big);
    step("shut down", || {
        prism::shutdown();
        Ok(())
    })?;
    Ok(())
}
