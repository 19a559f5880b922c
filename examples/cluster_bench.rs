//! The multi-node rows of the comparison with Ray: round trips to tasks
//! and actors on another node, a SPREAD burst over every node, and 100 MB
//! objects made on one node and read on another.
//!
//! Run it on the head of a cluster of three nodes with one CPU each
//! (`bench/cluster/vs_ray.sh` makes one in network namespaces and runs
//! Ray's side, `bench/cluster/ray_side.py`, in the same run). Each figure
//! is printed as `ROW <name> <value> <unit>`.
//!
//! ```text
//! PRISM_ADDRESS=HEAD:6380 cargo run --release --example cluster_bench
//! ```

use std::time::{Duration, Instant};

const ROUND_TRIPS: usize = 1000;
const SPREAD_TASKS: usize = 3000;
const BIG: usize = 100_000_000;

#[prism::remote]
fn noop() -> u32 {
    0
}

#[prism::remote]
fn make(bytes: usize) -> Vec<u8> {
    vec![1u8; bytes]
}

/// Reads a buffer in place (on another node, after pulling it here).
#[prism::remote]
fn consume(data: prism::View<u8>) -> usize {
    data.len()
}

#[prism::actor]
struct Echo {}

#[prism::actor]
impl Echo {
    fn new() -> Self {
        Echo {}
    }

    fn ping(&self) -> u32 {
        0
    }
}

fn median_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e3
}

fn affinity(node: &prism::NodeInfo) -> prism::Result<prism::SchedulingStrategy> {
    let node_id = prism::NodeId::parse(&node.node_id)
        .ok_or_else(|| prism::Error::invalid("node_id", "not a node id"))?;
    Ok(prism::SchedulingStrategy::NodeAffinity {
        node_id,
        soft: false,
    })
}

fn row(name: &str, value: f64, unit: &str) {
    println!("ROW {name} {value:.3} {unit}");
}

/// Median round trip of a task pinned to `node`.
fn task_round_trip(node: &prism::NodeInfo) -> prism::Result<f64> {
    let on = prism::TaskOptions::new().scheduling_strategy(affinity(node)?);
    for _ in 0..100 {
        prism::get(&noop::remote_with(on.clone())?)?;
    }
    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        prism::get(&noop::remote_with(on.clone())?)?;
        samples.push(t.elapsed());
    }
    Ok(median_ms(samples))
}

/// A 100 MB buffer made on `node`, ready.
fn made_on(node: &prism::NodeInfo) -> prism::Result<prism::ObjectRef<Vec<u8>>> {
    let on = prism::TaskOptions::new().scheduling_strategy(affinity(node)?);
    let made = make::remote_with(on, BIG)?;
    prism::wait(std::slice::from_ref(&made), 1, None)?;
    Ok(made)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    prism::init(prism::Config::default())?;
    row("driver init", started.elapsed().as_secs_f64() * 1e3, "ms");
    let here = prism::runtime_context()?.node_id.to_string();
    let nodes: Vec<_> = prism::nodes()?.into_iter().filter(|n| n.alive).collect();
    let head = nodes.iter().find(|n| n.node_id == here).ok_or("no head")?;
    let others: Vec<_> = nodes.iter().filter(|n| n.node_id != here).collect();
    if others.len() < 2 {
        return Err("start two more nodes: the benchmark needs three".into());
    }
    let (b, c) = (others[0], others[1]);

    row("task round trip, same node", task_round_trip(head)?, "ms");
    row("task round trip, other node", task_round_trip(b)?, "ms");

    let spread = prism::TaskOptions::new().scheduling_strategy(prism::SchedulingStrategy::Spread);
    let burst = |n: usize| -> prism::Result<f64> {
        let t = Instant::now();
        let refs = (0..n)
            .map(|_| noop::remote_with(spread.clone()))
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs)?;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    };
    burst(300)?;
    row("SPREAD tasks over 3 nodes", burst(SPREAD_TASKS)?, "tasks/s");

    // A 100 MB object made on B and used by a task on C: the first task
    // pulls it into C's store, the second reads C's copy.
    let on_c = prism::TaskOptions::new().scheduling_strategy(affinity(c)?);
    let made = made_on(b)?;
    for label in ["first", "again"] {
        let t = Instant::now();
        let len = prism::get(&consume::remote_with(on_c.clone(), &made)?)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(len, BIG);
        row(
            &format!("100 MB made on B used by a task on C ({label})"),
            ms,
            "ms",
        );
    }
    drop(made);

    // The driver reads a 100 MB object made on another node.
    let mut samples = Vec::new();
    for _ in 0..3 {
        let made = made_on(b)?;
        let t = Instant::now();
        let view = prism::get_view(&made)?;
        samples.push(t.elapsed());
        assert_eq!(view.len(), BIG);
    }
    row(
        "driver get of 100 MB from another node",
        median_ms(samples),
        "ms",
    );

    // A synchronous actor call to an actor on another node.
    let echo = Echo::remote_with(prism::ActorOptions::new().scheduling_strategy(affinity(b)?))?;
    for _ in 0..100 {
        prism::get(&echo.ping()?)?;
    }
    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        prism::get(&echo.ping()?)?;
        samples.push(t.elapsed());
    }
    row("sync actor call, other node", median_ms(samples), "ms");
    drop(echo);

    let t = Instant::now();
    prism::shutdown();
    row("driver shutdown", t.elapsed().as_secs_f64() * 1e3, "ms");
    Ok(())
}
