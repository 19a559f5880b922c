//! Collective benchmark: time, algorithm bandwidth and bus bandwidth.
//!
//! ```text
//! cargo run --release -p prism-collective --example collective_bench -- \
//!     [--op all_reduce|all_gather|reduce_scatter|broadcast] \
//!     [--worlds 2,4] [--min-bytes 4096] [--max-bytes 268435456] \
//!     [--transport auto|tcp|shm] [--pretend-hosts N] [--tls 1]
//! ```
//!
//! Starts itself once per rank on this host for each world size, runs the
//! collective (all-reduce by default; sums of f32) on buffers from
//! `--min-bytes` to `--max-bytes` (×4 per step), and prints per size the
//! median time of one call, algbw = bytes / time and busbw, as nccl-tests
//! define them: the size is the whole buffer (all-gather's output,
//! reduce-scatter's input, rounded down to a multiple of the world size),
//! and busbw = algbw × 2(n-1)/n for all-reduce, × (n-1)/n for all-gather
//! and reduce-scatter, × 1 for broadcast. Rank 0 times its calls, so a
//! broadcast comes from rank 1 (rank 0 with one rank): rank 0 is then the
//! last to receive, and its time covers the whole broadcast.
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

/// The collective a run times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "all_reduce" => Op::AllReduce,
            "all_gather" => Op::AllGather,
            "reduce_scatter" => Op::ReduceScatter,
            "broadcast" => Op::Broadcast,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
        }
    }

    /// busbw / algbw at world `n`, as nccl-tests define it.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

/// One rank's buffers for one size, and the call on them.
struct Bench {
    op: Op,
    rank: usize,
    n: usize,
    /// all-reduce, reduce-scatter and broadcast: the buffer;
    /// all-gather: this rank's part.
    buf: Vec<f32>,
    /// all-gather's output.
    out: Vec<f32>,
}

impl Bench {
    /// Buffers for a call over `bytes` (rounded down to whole elements,
    /// and for all-gather and reduce-scatter to a multiple of the world).
    fn new(op: Op, group: &ProcessGroup, bytes: usize) -> Bench {
        let (rank, n) = (group.rank(), group.world_size());
        let elems = (bytes / 4).max(1);
        let part = (elems / n).max(1);
        let mine = (rank + 1) as f32;
        let (buf, out) = match op {
            Op::AllReduce => (vec![1.0; elems], Vec::new()),
            Op::AllGather => (vec![mine; part], vec![0.0; part * n]),
            Op::ReduceScatter => (vec![1.0; part * n], Vec::new()),
            Op::Broadcast => (vec![mine; elems], Vec::new()),
        };
        Bench {
            op,
            rank,
            n,
            buf,
            out,
        }
    }

    /// A broadcast's root: rank 1, so that rank 0, which times the calls,
    /// is the last rank of the chain to receive.
    fn root(&self) -> usize {
        1 % self.n
    }

    /// The bytes the size counts (nccl-tests' convention).
    fn bytes(&self) -> usize {
        4 * match self.op {
            Op::AllGather => self.out.len(),
            _ => self.buf.len(),
        }
    }

    fn call(&mut self, group: &ProcessGroup) -> Result<(), String> {
        let root = self.root();
        let done = match self.op {
            Op::AllReduce => group.all_reduce(&mut self.buf, ReduceOp::Sum),
            Op::AllGather => group.all_gather(&self.buf, &mut self.out),
            Op::ReduceScatter => group
                .reduce_scatter(&mut self.buf, ReduceOp::Sum)
                .map(|_| ()),
            Op::Broadcast => group.broadcast(&mut self.buf, root),
        };
        done.map_err(|e| e.to_string())
    }

    /// Checks the first call's result at both ends of what this rank got.
    fn check(&self) -> Result<(), String> {
        let n = self.n;
        let part = self.buf.len() / n.max(1);
        let (got, expected): (Vec<f32>, Vec<f32>) = match self.op {
            Op::AllReduce => (
                vec![self.buf[0], self.buf[self.buf.len() - 1]],
                vec![n as f32; 2],
            ),
            Op::AllGather => (
                vec![self.out[0], self.out[self.out.len() - 1]],
                vec![1.0, n as f32],
            ),
            Op::ReduceScatter => (
                vec![
                    self.buf[self.rank * part],
                    self.buf[(self.rank + 1) * part - 1],
                ],
                vec![n as f32; 2],
            ),
            Op::Broadcast => (
                vec![self.buf[0], self.buf[self.buf.len() - 1]],
                vec![(self.root() + 1) as f32; 2],
            ),
        };
        if got != expected {
            return Err(format!(
                "wrong {} result at {} bytes: {got:?} instead of {expected:?}",
                self.op.name(),
                self.bytes()
            ));
        }
        Ok(())
    }
}

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
    op: Op,
    worlds: Vec<usize>,
    min_bytes: usize,
    max_bytes: usize,
    transport: String,
    pretend_hosts: usize,
    tls: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        op: Op::AllReduce,
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
            "--op" => {
                args.op = Op::parse(&value).ok_or_else(|| {
                    format!("--op {value}: expected all_reduce, all_gather, reduce_scatter or broadcast")
                })?;
            }
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
    for size in sizes(args.min_bytes, args.max_bytes) {
        let mut bench = Bench::new(args.op, &group, size);
        let bytes = bench.bytes();
        bench.call(&group)?;
        bench.check()?;
        bench.call(&group)?;
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
            bench.call(&group)?;
            times.push(t.elapsed().as_secs_f64());
            if group.rank() == 0 {
                let src = match args.op {
                    Op::AllGather => &bench.out,
                    _ => &bench.buf,
                };
                // SAFETY: viewing initialised f32s as bytes.
                let src = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, bytes) };
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
    println!("# op {}", args.op.name());
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
                    let busbw = algbw * args.op.bus_factor(world);
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
