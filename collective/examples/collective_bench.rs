//! All-reduce benchmark: time, algorithm bandwidth and bus bandwidth.
//!
//! ```text
//! cargo run --release -p prism-collective --example collective_bench -- \
//!     [--worlds 2,4] [--min-bytes 4096] [--max-bytes 268435456] \
//!     [--transport auto|tcp|shm] [--pretend-hosts N] [--tls 1]
//! ```
//!
//! Starts itself once per rank on this host for each world size, all-reduces
//! (sum) f32 buffers from `--min-bytes` to `--max-bytes` (×4 per step), and
//! prints per size the median time of one call, algbw = bytes / time and
//! busbw = algbw × 2(n-1)/n (as nccl-tests define it).
//!
//! The ceiling for shared memory is a single-threaded memcpy between two
//! touched buffers. Rank 0 times one of the same size after every timed
//! call, while the other ranks wait at a barrier, so both figures come from
//! the same minutes of the same machine; each row ends with that memcpy's
//! median rate and busbw's share of it. (The source is hidden from the
//! optimiser: a copy from a buffer it knows to be one repeated byte becomes
//! a memset, which only writes and runs twice as fast.)
//!
//! `--pretend-hosts N` splits the ranks into N pretend hosts (consecutive
//! ranks together) through `PRISM_COLLECTIVE_HOST_ID`, so a group on one
//! machine mixes shared memory and TCP as it would across N hosts.
//!
//! `--tls 1` runs mutual TLS on the links between pretend hosts (a CA and
//! a certificate for 127.0.0.1 are made for the run), to compare with the
//! same run in plain TCP.
//!
//! Output rows are whitespace separated and start with `prism`, so a script
//! can join them with other implementations (see bench/collective/).

use prism_collective::{GroupOptions, GroupTls, ProcessGroup, ReduceOp};

/// Where the parent leaves the run's certificates for the ranks.
const TLS_DIR: &str = "PRISM_BENCH_TLS_DIR";

/// A CA and a certificate for 127.0.0.1 that it signed, in `dir`.
fn make_certificates(dir: &std::path::Path) -> Result<(), String> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| fail(&e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().map_err(|e| fail(&e))?;
    let ca = CertifiedIssuer::self_signed(params, ca_key).map_err(|e| fail(&e))?;
    let key = KeyPair::generate().map_err(|e| fail(&e))?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .and_then(|p| p.signed_by(&key, &ca))
        .map_err(|e| fail(&e))?;
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", cert.pem()),
        ("key.pem", key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), pem).map_err(|e| fail(&e))?;
    }
    Ok(())
}
use std::process::{Command, Stdio};
use std::time::Instant;

struct Args {
    worlds: Vec<usize>,
    min_bytes: usize,
    max_bytes: usize,
    transport: String,
    pretend_hosts: usize,
    tls: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        worlds: vec![2, 4],
        min_bytes: 4096,
        max_bytes: 256 << 20,
        transport: "auto".to_string(),
        pretend_hosts: 1,
        tls: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--worlds" => {
                args.worlds = value.split(',').map(number).collect::<Result<_, _>>()?;
            }
            "--min-bytes" => args.min_bytes = number(&value)?,
            "--max-bytes" => args.max_bytes = number(&value)?,
            "--transport" => args.transport = value,
            "--pretend-hosts" => args.pretend_hosts = number(&value)?.max(1),
            "--tls" => args.tls = number(&value)? != 0,
            _ => {
                return Err(format!(
                    "unknown flag {flag}; see the example's doc comment"
                ))
            }
        }
    }
    Ok(args)
}

fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(4);
    while s <= max {
        v.push(s);
        s *= 4;
    }
    v
}

fn iterations(bytes: usize) -> usize {
    match bytes {
        b if b <= 1 << 20 => 100,
        b if b <= 16 << 20 => 20,
        b if b <= 64 << 20 => 8,
        _ => 5,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One rank: all sizes; rank 0 prints `RESULT bytes seconds transport
/// memcpy_seconds`.
fn run_rank(args: &Args) -> Result<(), String> {
    let mut options = GroupOptions::from_env().map_err(|e| e.to_string())?;
    if let Ok(dir) = std::env::var(TLS_DIR) {
        let read = |name: &str| std::fs::read(format!("{dir}/{name}")).map_err(|e| e.to_string());
        let tls = GroupTls::from_pem(&read("cert.pem")?, &read("key.pem")?, &read("ca.pem")?)
            .map_err(|e| e.to_string())?;
        options = options.tls(tls);
    }
    let group = ProcessGroup::join(options).map_err(|e| e.to_string())?;
    let n = group.world_size();
    for bytes in sizes(args.min_bytes, args.max_bytes) {
        let mut buf = vec![1.0f32; bytes / 4];
        group
            .all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        if buf[0] != n as f32 || buf[buf.len() - 1] != n as f32 {
            return Err(format!(
                "wrong result at {bytes} bytes: {} instead of {n}",
                buf[0]
            ));
        }
        group
            .all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        // Rank 0's memcpy ceiling, timed between the calls.
        let mut copy = if group.rank() == 0 {
            std::hint::black_box(vec![2u8; bytes])
        } else {
            Vec::new()
        };
        group.barrier().map_err(|e| e.to_string())?;
        let mut times = Vec::new();
        let mut copies = Vec::new();
        for _ in 0..iterations(bytes) {
            let t = Instant::now();
            group
                .all_reduce(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            times.push(t.elapsed().as_secs_f64());
            if group.rank() == 0 {
                // SAFETY: viewing initialised f32s as bytes.
                let src =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 4) };
                copies.push(time_memcpy(src, &mut copy));
            }
            group.barrier().map_err(|e| e.to_string())?;
        }
        if group.rank() == 0 {
            println!(
                "RESULT {bytes} {:.9} {} {:.9}",
                median(times),
                group.transport(),
                median(copies)
            );
        }
    }
    group.barrier().map_err(|e| e.to_string())
}

/// Seconds for one single-threaded copy of `src` into `dst`.
fn time_memcpy(src: &[u8], dst: &mut [u8]) -> f64 {
    let t = Instant::now();
    dst.copy_from_slice(std::hint::black_box(src));
    std::hint::black_box(&mut *dst);
    t.elapsed().as_secs_f64()
}

/// A single-threaded memcpy of `bytes` in GB/s, median of 5, for the
/// header line.
fn memcpy_gbps(bytes: usize) -> f64 {
    let src = std::hint::black_box(vec![1u8; bytes]);
    let mut dst = std::hint::black_box(vec![2u8; bytes]);
    let times = (0..5).map(|_| time_memcpy(&src, &mut dst)).collect();
    bytes as f64 / median(times) / 1e9
}

/// One row of a world's results.
struct Row {
    bytes: usize,
    secs: f64,
    transport: String,
    memcpy_secs: f64,
}

fn run_world(args: &Args, world: usize) -> Result<Vec<Row>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut children = Vec::new();
    for rank in 0..world {
        let mut command = Command::new(&exe);
        command
            .args(std::env::args().skip(1))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("PRISM_COLLECTIVE_TRANSPORT", &args.transport)
            .stdout(if rank == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        if args.pretend_hosts > 1 {
            let host = rank * args.pretend_hosts / world;
            command.env("PRISM_COLLECTIVE_HOST_ID", format!("pretend-host-{host}"));
        }
        let child = command.spawn().map_err(|e| e.to_string())?;
        children.push(child);
    }
    let mut rows = Vec::new();
    let mut failed = None;
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            eprintln!(
                "collective_bench: rank {rank} of world {world} failed: {}",
                out.status
            );
            failed = Some(format!("world {world} failed"));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if let ["RESULT", bytes, secs, transport, memcpy] = f.as_slice() {
                let bad = || format!("bad RESULT line: {line}");
                rows.push(Row {
                    bytes: bytes.parse().map_err(|_| bad())?,
                    secs: secs.parse().map_err(|_| bad())?,
                    transport: transport.to_string(),
                    memcpy_secs: memcpy.parse().map_err(|_| bad())?,
                });
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("collective_bench: {e}");
            std::process::exit(2);
        }
    };
    if std::env::var_os("RANK").is_some() {
        if let Err(e) = run_rank(&args) {
            eprintln!("collective_bench rank: {e}");
            std::process::exit(1);
        }
        return;
    }
    let ceiling = memcpy_gbps(args.max_bytes.max(1 << 20));
    println!(
        "# memcpy {} bytes single-threaded: {ceiling:.2} GB/s",
        args.max_bytes
    );
    let certs = std::env::temp_dir().join(format!("prism-bench-tls-{}", std::process::id()));
    if args.tls {
        if let Err(e) = make_certificates(&certs) {
            eprintln!("collective_bench: making the run's certificates: {e}");
            std::process::exit(1);
        }
        std::env::set_var(TLS_DIR, &certs);
        println!("# TLS on the links between pretend hosts");
    }
    println!(
        "# impl  transport  world  bytes  time_us  algbw_GBps  busbw_GBps  memcpy_GBps  busbw/memcpy"
    );
    let started = Instant::now();
    for &world in &args.worlds {
        match run_world(&args, world) {
            Ok(rows) => {
                for Row {
                    bytes,
                    secs,
                    transport,
                    memcpy_secs,
                } in rows
                {
                    let algbw = bytes as f64 / secs / 1e9;
                    let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
                    let memcpy = bytes as f64 / memcpy_secs / 1e9;
                    println!(
                        "prism  {transport:<4}  {world}  {bytes:>10}  {:>10.1}  {algbw:>8.3}  {busbw:>8.3}  {memcpy:>8.3}  {:>5.1}%",
                        secs * 1e6,
                        100.0 * busbw / memcpy
                    );
                }
            }
            Err(e) => {
                eprintln!("collective_bench: {e}");
                std::process::exit(1);
            }
        }
    }
    println!("# done in {:.1} s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&certs);
}
