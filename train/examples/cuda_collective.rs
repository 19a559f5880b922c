//! CUDA collectives on one GPU shared by several processes: a correctness
//! check against an f64 reference, then all-reduce time/algbw/busbw per size
//! next to the device-to-device copy bandwidth (the ceiling).
//!
//! ```text
//! cargo run --release -p prism-train --features cuda --example cuda_collective -- \
//!     [--worlds 2,4] [--max-bytes 268435456]
//! ```
//!
//! On a machine without a driver it says so and exits with status 2.

use half::bf16;
use prism_train::collective::cuda::{CudaCollectives, CudaElement};
use prism_train::collective::{ProcessGroup, ReduceOp};
use std::process::Command;
use std::time::Instant;

fn value(rank: usize, i: usize) -> f64 {
    1.0 + ((rank * 7919 + i * 31) % 17) as f64 / 16.0
}

fn check<T: CudaElement>(
    cuda: &mut CudaCollectives,
    group: &ProcessGroup,
    len: usize,
    op: ReduceOp,
) -> Result<(), String> {
    let (rank, n) = (group.rank(), group.world_size());
    let stream = cuda.context().default_stream();
    let host: Vec<T> = (0..len).map(|i| T::from_f64(value(rank, i))).collect();
    let mut dev = stream.memcpy_stod(&host).map_err(|e| format!("{e:?}"))?;
    cuda.all_reduce(group, &mut dev, op)
        .map_err(|e| e.to_string())?;
    let back = stream.memcpy_dtov(&dev).map_err(|e| format!("{e:?}"))?;
    for (i, got) in back.iter().enumerate() {
        let vals = (0..n).map(|r| T::from_f64(value(r, i)).to_f64());
        let expected = match op {
            ReduceOp::Sum => vals.sum::<f64>(),
            ReduceOp::Mean => vals.sum::<f64>() / n as f64,
            ReduceOp::Max => vals.fold(f64::MIN, f64::max),
            ReduceOp::Min => vals.fold(f64::MAX, f64::min),
            ReduceOp::Product => vals.product(),
        };
        if (got.to_f64() - expected).abs() > 0.05 * expected.abs() {
            return Err(format!(
                "{:?} {op} len {len} [{i}]: got {got:?}, expected {expected}",
                T::DATA_TYPE
            ));
        }
    }
    Ok(())
}

fn run_rank(max_bytes: usize) -> Result<(), String> {
    let group = ProcessGroup::from_env().map_err(|e| e.to_string())?;
    let mut cuda = CudaCollectives::new(0).map_err(|e| e.to_string())?;
    for len in [1, 3, 1000, 3_000_001] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            check::<f32>(&mut cuda, &group, len, op)?;
            check::<bf16>(&mut cuda, &group, len, op)?;
        }
        check::<i32>(&mut cuda, &group, len, ReduceOp::Sum)?;
    }
    if group.rank() == 0 {
        println!("# correctness ok at world {}", group.world_size());
    }
    let stream = cuda.context().default_stream();
    let mut bytes = 4096;
    while bytes <= max_bytes {
        let mut dev = stream
            .alloc_zeros::<f32>(bytes / 4)
            .map_err(|e| format!("{e:?}"))?;
        cuda.all_reduce(&group, &mut dev, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        group.barrier().map_err(|e| e.to_string())?;
        let iters = if bytes <= 1 << 20 { 50 } else { 5 };
        let mut times = Vec::new();
        for _ in 0..iters {
            let t = Instant::now();
            cuda.all_reduce(&group, &mut dev, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.total_cmp(b));
        if group.rank() == 0 {
            let secs = times[times.len() / 2];
            let n = group.world_size() as f64;
            let algbw = bytes as f64 / secs / 1e9;
            println!(
                "prism-cuda  {}  {bytes:>10}  {:>10.1}  {algbw:>8.3}  {:>8.3}",
                group.world_size(),
                secs * 1e6,
                algbw * 2.0 * (n - 1.0) / n
            );
        }
        bytes *= 4;
    }
    Ok(())
}

fn d2d_gbps(cuda: &CudaCollectives, bytes: usize) -> Result<f64, String> {
    let stream = cuda.context().default_stream();
    let src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| format!("{e:?}"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| format!("{e:?}"))?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let t = Instant::now();
    for _ in 0..10 {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| format!("{e:?}"))?;
    }
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    Ok(10.0 * bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let max_bytes: usize = flag("--max-bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    if std::env::var_os("RANK").is_some() {
        if let Err(e) = run_rank(max_bytes) {
            eprintln!("cuda_collective rank: {e}");
            std::process::exit(1);
        }
        return;
    }
    let cuda = match CudaCollectives::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cuda_collective: {e}");
            std::process::exit(2);
        }
    };
    match d2d_gbps(&cuda, max_bytes) {
        Ok(g) => println!("# device-to-device copy {max_bytes} bytes: {g:.1} GB/s"),
        Err(e) => eprintln!("cuda_collective: d2d copy failed: {e}"),
    }
    drop(cuda);
    println!("# impl  world  bytes  time_us  algbw_GBps  busbw_GBps");
    let worlds = flag("--worlds").unwrap_or_else(|| "2,4".to_string());
    for world in worlds.split(',').filter_map(|w| w.parse::<usize>().ok()) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(29500);
        let exe = std::env::current_exe().expect("the example knows its own path");
        let mut children: Vec<_> = (0..world)
            .filter_map(|rank| {
                Command::new(&exe)
                    .args(&args[1..])
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .spawn()
                    .ok()
            })
            .collect();
        let ok = children
            .iter_mut()
            .all(|c| c.wait().map(|s| s.success()).unwrap_or(false));
        if !ok {
            eprintln!("cuda_collective: a rank of world {world} failed");
            std::process::exit(1);
        }
    }
}
