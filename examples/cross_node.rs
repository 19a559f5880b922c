//! Round trips and transfers between two nodes of a cluster, against the
//! same on one node and a plain TCP copy between the machines.
//!
//! Run it on the head of a two-node cluster whose nodes have one CPU each
//! (`bench/cluster/cross_node.sh` makes one in network namespaces):
//! a task holds the driver's node, so every later task runs on the other
//! node.
//!
//! ```text
//! PRISM_ADDRESS=HEAD:6380 cargo run --release --example cross_node
//! ```

use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[prism::remote]
fn noop() -> u32 {
    0
}

#[prism::remote]
fn hold(ms: u64) -> String {
    std::thread::sleep(Duration::from_millis(ms));
    node()
}

#[prism::remote]
fn where_am_i() -> String {
    node()
}

#[prism::remote]
fn make(bytes: usize) -> Vec<u8> {
    vec![1u8; bytes]
}

/// Connects to `address` and sends `bytes` zero bytes: the raw TCP copy
/// the transfers are compared with.
#[prism::remote]
fn send_raw(address: String, bytes: usize) -> Result<(), String> {
    let mut stream = std::net::TcpStream::connect(&address).map_err(|e| e.to_string())?;
    let block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len());
        stream.write_all(&block[..n]).map_err(|e| e.to_string())?;
        left -= n;
    }
    Ok(())
}

fn node() -> String {
    prism::runtime_context()
        .map(|c| c.node_id.to_string())
        .unwrap_or_default()
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn round_trips(n: usize) -> prism::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        prism::get(&noop::remote()?)?;
        out.push(t.elapsed());
    }
    Ok(out)
}

/// A task makes `size` bytes (on whichever node it runs); once they are
/// ready, the seconds for the driver to read them: in place
/// (`get_view`, which on another node includes pulling the copy into this
/// node's store), and as a `Vec` of its own (`get`, one more copy).
fn time_big(size: usize) -> prism::Result<(f64, f64)> {
    let made = make::remote(size)?;
    prism::wait(std::slice::from_ref(&made), 1, None)?;
    let t = Instant::now();
    let view = prism::get_view(&made)?;
    let in_place = t.elapsed().as_secs_f64();
    assert!(view.len() == size && view[size - 1] == 1);
    drop(view);
    let made = make::remote(size)?;
    prism::wait(std::slice::from_ref(&made), 1, None)?;
    let t = Instant::now();
    let data = prism::get(&made)?;
    let owned = t.elapsed().as_secs_f64();
    assert_eq!(data.len(), size);
    Ok((in_place, owned))
}

/// Prints one transfer's figures.
fn report(what: &str, size: usize, (in_place, owned): (f64, f64)) {
    let rate = |secs: f64| size as f64 / secs / 1e9;
    println!(
        "{what}: get_view {:.1} ms ({:.2} GB/s), get {:.1} ms ({:.2} GB/s)",
        in_place * 1e3,
        rate(in_place),
        owned * 1e3,
        rate(owned)
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    prism::init(prism::Config::default())?;
    let here = node();
    let nodes = prism::nodes()?;
    println!("{} nodes alive", nodes.iter().filter(|n| n.alive).count());
    let n = 2000;

    // On this node.
    round_trips(200)?;
    let local = median_us(round_trips(n)?);

    let size = 100_000_000;
    let big_here = time_big(size)?;

    // Hold this node's CPU: later tasks go to the other node.
    let held = hold::remote(600_000)?;
    std::thread::sleep(Duration::from_millis(300));
    let there = prism::get(&where_am_i::remote()?)?;
    if there == here {
        return Err("the task ran on the driver's node: start a second node with one CPU".into());
    }
    round_trips(200)?;
    let remote = median_us(round_trips(n)?);
    println!("sync task round trip, same node:    {local:.1} us (median of {n})");
    println!("sync task round trip, other node:   {remote:.1} us (median of {n})");

    let t = Instant::now();
    let refs: Vec<_> = (0..3000)
        .map(|_| noop::remote())
        .collect::<prism::Result<_>>()?;
    prism::get_many(&refs)?;
    let rate = 3000.0 / t.elapsed().as_secs_f64();
    println!("3000 tasks on the other node:       {rate:.0} tasks/s");

    report("100 MB made on the same node", size, big_here);
    for label in ["first", "again"] {
        report(
            &format!("100 MB made on the other node ({label})"),
            size,
            time_big(size)?,
        );
    }

    // A plain TCP copy of the same size from the other node to this one.
    let listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    let my_ip = nodes
        .iter()
        .find(|n| n.node_id == here)
        .map(|n| n.node_ip.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let address = format!("{my_ip}:{}", listener.local_addr()?.port());
    let sent = send_raw::remote(address, size)?;
    let (mut stream, _) = listener.accept()?;
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    while got < size {
        let k = stream.read(&mut buf)?;
        if k == 0 {
            break;
        }
        got += k;
    }
    let secs = t.elapsed().as_secs_f64();
    prism::get(&sent)?;
    println!(
        "100 MB raw TCP copy between the nodes: {:.1} ms, {:.2} GB/s",
        secs * 1e3,
        got as f64 / secs / 1e9
    );
    drop(held);
    prism::shutdown();
    Ok(())
}
