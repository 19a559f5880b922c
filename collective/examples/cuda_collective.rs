//! CUDA collectives on one GPU shared by several processes: a correctness
//! check against an f64 reference, then all-reduce time/algbw/busbw per size
//! next to the device-to-device copy bandwidth (the ceiling).
//!
//! ```text
//! cargo run --release -p prism-collective --features cuda --example cuda_collective -- \
//!     [--worlds 2,4] [--max-bytes 268435456]
//! ```
//!
//! On a machine without a driver it says so and exits with status 2.

use half::bf16;
use prism_collective::cuda::{CudaCollectives, CudaElement, CudaPath};
use prism_collective::{ProcessGroup, ReduceOp};
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
    let host: Vec<T> = (0..len).map(|i| T::from_f64(value(rank, i))).collect();
    let mut dev = cuda.to_device(&host).map_err(|e| e.to_string())?;
    cuda.all_reduce(group, &mut dev, op)
        .map_err(|e| e.to_string())?;
    let back = dev.to_vec().map_err(|e| e.to_string())?;
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

/// Median of `f` over `iters` calls, in microseconds.
fn median_us(iters: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Where a small all-reduce's time goes: the host barrier alone, a small
/// device copy waited for (every rank at once, then rank 0 alone), and the
/// all-reduce itself.
fn diagnose(cuda: &mut CudaCollectives, group: &ProcessGroup) -> Result<(), String> {
    let e = |e: prism_collective::CollectiveError| e.to_string();
    let src = cuda.alloc_zeroed::<f32>(1024).map_err(e)?;
    let mut dst = cuda.alloc_zeroed::<f32>(1024).map_err(e)?;
    let barrier = median_us(200, || group.barrier().map_err(e))?;
    let copy_all = median_us(200, || dst.copy_from_device(&src).map_err(e))?;
    group.barrier().map_err(e)?;
    let copy_alone = if group.rank() == 0 {
        median_us(200, || dst.copy_from_device(&src).map_err(e))?
    } else {
        0.0
    };
    group.barrier().map_err(e)?;
    // Each call is timed to its result on the device: a stream-ordered
    // call returns once queued.
    let reduce = median_us(200, || {
        cuda.all_reduce(group, &mut dst, ReduceOp::Sum).map_err(e)?;
        cuda.synchronize().map_err(e)
    })?;
    println!(
        "# diagnose world {} rank {}: barrier {barrier:.1} us, 4 KiB copy+sync {copy_all:.1} us \
         (rank 0 alone {copy_alone:.1} us), 4 KiB all_reduce {reduce:.1} us",
        group.world_size(),
        group.rank()
    );
    Ok(())
}

fn run_rank(max_bytes: usize) -> Result<(), String> {
    let group = ProcessGroup::from_env().map_err(|e| e.to_string())?;
    let mut cuda = CudaCollectives::new(0).map_err(|e| e.to_string())?;
    if std::env::args().any(|a| a == "--diagnose") {
        cuda.path(&group).map_err(|e| e.to_string())?;
        return diagnose(&mut cuda, &group);
    }
    let path = cuda.path(&group).map_err(|e| e.to_string())?;
    let label = match path {
        CudaPath::SameGpu => "ipc",
        CudaPath::HostStaged { .. } => "staged",
    };
    if group.rank() == 0 {
        println!("# world {}: {path}", group.world_size());
    }
    for len in [1, 3, 1000, 3_000_001, 40_000_003] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            check::<f32>(&mut cuda, &group, len, op)?;
            check::<bf16>(&mut cuda, &group, len, op)?;
        }
        check::<i32>(&mut cuda, &group, len, ReduceOp::Sum)?;
        check::<f64>(&mut cuda, &group, len, ReduceOp::Min)?;
        check_broadcast(&mut cuda, &group, len, len % group.world_size())?;
    }
    if group.rank() == 0 {
        println!("# correctness ok at world {}", group.world_size());
    }
    let mut bytes = 4096;
    while bytes <= max_bytes {
        let mut dev = cuda
            .alloc_zeroed::<f32>(bytes / 4)
            .map_err(|e| e.to_string())?;
        cuda.all_reduce(&group, &mut dev, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        group.barrier().map_err(|e| e.to_string())?;
        let iters = if bytes <= 1 << 20 { 200 } else { 20 };
        let mut times = Vec::new();
        for _ in 0..iters {
            let t = Instant::now();
            cuda.all_reduce(&group, &mut dev, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            // To the result on the device, not to the call's return.
            cuda.synchronize().map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.total_cmp(b));
        if group.rank() == 0 {
            let secs = times[times.len() / 2];
            let n = group.world_size() as f64;
            let algbw = bytes as f64 / secs / 1e9;
            println!(
                "prism-cuda {label}  {}  {bytes:>10}  {:>10.1}  {algbw:>8.3}  {:>8.3}",
                group.world_size(),
                secs * 1e6,
                algbw * 2.0 * (n - 1.0) / n
            );
        }
        bytes *= 4;
    }
    Ok(())
}

fn check_broadcast(
    cuda: &mut CudaCollectives,
    group: &ProcessGroup,
    len: usize,
    root: usize,
) -> Result<(), String> {
    let host: Vec<f32> = (0..len).map(|i| value(group.rank(), i) as f32).collect();
    let mut dev = cuda.to_device(&host).map_err(|e| e.to_string())?;
    cuda.broadcast(group, &mut dev, root)
        .map_err(|e| e.to_string())?;
    let back = dev.to_vec().map_err(|e| e.to_string())?;
    for (i, got) in back.iter().enumerate() {
        if *got != value(root, i) as f32 {
            return Err(format!(
                "broadcast from {root} len {len} [{i}]: got {got}, expected {}",
                value(root, i)
            ));
        }
    }
    Ok(())
}

fn d2d_gbps(cuda: &CudaCollectives, bytes: usize) -> Result<f64, String> {
    let src = cuda.alloc_zeroed::<u8>(bytes).map_err(|e| e.to_string())?;
    let mut dst = cuda.alloc_zeroed::<u8>(bytes).map_err(|e| e.to_string())?;
    dst.copy_from_device(&src).map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..10 {
        dst.copy_from_device(&src).map_err(|e| e.to_string())?;
    }
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
    println!(
        "# GPU 0: {}, driver CUDA {:?}, NVRTC {:?}",
        cuda.device_name(),
        cuda.driver_version().unwrap_or((0, 0)),
        cuda.compiler_version().unwrap_or((0, 0))
    );
    match d2d_gbps(&cuda, max_bytes) {
        Ok(g) => println!("# device-to-device copy {max_bytes} bytes: {g:.1} GB/s"),
        Err(e) => eprintln!("cuda_collective: d2d copy failed: {e}"),
    }
    drop(cuda);
    println!("# impl  path  world  bytes  time_us  algbw_GBps  busbw_GBps");
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
