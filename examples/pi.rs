//! Monte Carlo estimate of pi over many tasks, with the speed-up over
//! running the same work on one core in this process.
//!
//! Run: `cargo run --release --example pi [total_samples] [tasks]`

use std::time::Instant;

/// Counts how many of `samples` random points in the unit square fall in
/// the quarter circle. A small xorshift generator keeps the example free of
/// extra crates; `seed` makes each task draw different points.
#[prism::remote]
fn count_inside(samples: u64, seed: u64) -> u64 {
    count(samples, seed)
}

fn count(samples: u64, seed: u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut inside = 0;
    for _ in 0..samples {
        let (x, y) = (next(), next());
        if x * x + y * y <= 1.0 {
            inside += 1;
        }
    }
    inside
}

fn arg(i: usize, default: u64) -> Result<u64, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(s) => s
            .replace('_', "")
            .parse()
            .map_err(|_| format!("argument {i} must be a whole number, got {s:?}")),
    }
}

#[prism::main]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let total = arg(1, 400_000_000)?;
    let tasks = arg(2, 64)?.max(1);
    let per_task = total / tasks;
    prism::init(prism::Config::default())?;
    let (cluster_total, _) = prism::cluster_resources()?;
    println!(
        "estimating pi from {} samples in {tasks} tasks on {} CPUs",
        per_task * tasks,
        cluster_total.get("CPU")
    );

    // Warm the pool: the first task on each worker pays process start-up.
    prism::get_many(
        &(0..4)
            .map(|s| count_inside::remote(1, s))
            .collect::<prism::Result<Vec<_>>>()?,
    )?;

    let start = Instant::now();
    let refs = (0..tasks)
        .map(|seed| count_inside::remote(per_task, seed + 1))
        .collect::<prism::Result<Vec<_>>>()?;
    let inside: u64 = prism::get_many(&refs)?.into_iter().sum();
    let parallel = start.elapsed();
    let pi = 4.0 * inside as f64 / (per_task * tasks) as f64;

    // The same work on one core, in this process, for the speed-up.
    let serial_tasks = tasks.min(8);
    let start = Instant::now();
    let serial_inside: u64 = (0..serial_tasks)
        .map(|seed| count(per_task, seed + 1))
        .sum();
    let serial = start.elapsed().as_secs_f64() * tasks as f64 / serial_tasks as f64;
    let check = 4.0 * serial_inside as f64 / (per_task * serial_tasks) as f64;

    println!(
        "pi ~= {pi:.6} (error {:.2e})",
        (pi - std::f64::consts::PI).abs()
    );
    println!(
        "{tasks} tasks on the cluster: {:.3} s",
        parallel.as_secs_f64()
    );
    println!(
        "one core, same work (from {serial_tasks} tasks timed): {serial:.3} s (pi ~= {check:.4})"
    );
    println!(
        "speed-up over one core: {:.2}x",
        serial / parallel.as_secs_f64()
    );
    Ok(())
}
