//! The collectives through real processes.
//!
//! Each test starts this test binary again, once per rank, with
//! `PRISM_TEST_ROLE` set; in those children the `rank_process` test plays the
//! role and exits non-zero on any failed check. Every wait on a child is
//! bounded, and children still running when a test ends are killed.

use half::{bf16, f16};
use prism_train::collective::{
    segment_range, staged, CollectiveConfig, CollectiveError, DataType, Element, GroupOptions,
    ProcessGroup, ReduceOp, TcpRendezvous, TransportChoice,
};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- parent side

mod common;
use common::run_ranks;

fn must_all_succeed(results: &[(usize, Option<i32>, String)], what: &str) {
    for (rank, code, log) in results {
        assert_eq!(
            *code,
            Some(0),
            "{what}: rank {rank} must exit 0; its output:\n{log}"
        );
    }
}

fn run_matrix(transport: &str, worlds: std::ops::RangeInclusive<usize>) {
    for world in worlds {
        let ranks: Vec<usize> = (0..world).collect();
        let mut env = vec![("PRISM_COLLECTIVE_TRANSPORT", transport.to_string())];
        if transport == "mixed" {
            env = vec![
                ("PRISM_COLLECTIVE_TRANSPORT", "auto".to_string()),
                ("PRISM_TEST_FAKE_HOSTS", "1".to_string()),
            ];
        }
        let results = run_ranks("matrix", world, &ranks, &env, Duration::from_secs(300));
        must_all_succeed(&results, &format!("{transport} matrix, world {world}"));
    }
}

#[test]
fn every_operation_and_type_matches_an_f64_reference_across_two_fake_hosts() {
    run_matrix("mixed", 3..=5);
}

#[test]
fn every_operation_and_type_matches_an_f64_reference_over_tcp() {
    run_matrix("tcp", 1..=8);
}

#[test]
fn every_operation_and_type_matches_an_f64_reference_over_shared_memory() {
    run_matrix("shm", 2..=8);
}

/// The rings live in a `memfd`, not in `/dev/shm`: a group whose rings
/// are larger than `/dev/shm` (Docker's default is 64 MiB, a group of
/// eight needs more) joins and runs. The child runs in a private mount
/// namespace with a 1 MiB tmpfs on `/dev/shm`, which takes root.
#[test]
fn a_dev_shm_smaller_than_the_rings_does_not_stop_a_group() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small /dev/shm in a mount namespace needs root");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let mut child = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m prism-small-shm /dev/shm && exec \"$0\" --exact rank_process --nocapture --test-threads=1")
        .arg(&exe)
        .env("PRISM_TEST_ROLE", "small_shm")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare runs");
    let until = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("waitable").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the small-/dev/shm child did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("its output");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed:\n{log}");
    assert!(log.contains("RESULT ok"), "{log}");
}

#[test]
fn buffers_larger_than_the_caches_come_through_shared_memory_whole() {
    // Large receives are copied out of the rings around the cache; this
    // checks every element of such calls, at odd lengths and offsets.
    for world in 2..=3 {
        let ranks: Vec<usize> = (0..world).collect();
        let env = [("PRISM_COLLECTIVE_TRANSPORT", "shm".to_string())];
        let results = run_ranks("large", world, &ranks, &env, Duration::from_secs(300));
        must_all_succeed(&results, &format!("large buffers, world {world}"));
    }
}

fn failure_case(
    role: &str,
    transport: &str,
    world: usize,
    ranks: &[usize],
    expect_ok: &[usize],
) -> Vec<String> {
    let (transport, fake_hosts) = match transport {
        "mixed" => ("auto", "1"),
        other => (other, ""),
    };
    let mut env = vec![
        ("PRISM_COLLECTIVE_TRANSPORT", transport.to_string()),
        ("PRISM_COLLECTIVE_TIMEOUT_MS", "2000".to_string()),
        ("PRISM_TEST_JOIN_TIMEOUT_MS", "60000".to_string()),
    ];
    if !fake_hosts.is_empty() {
        env.push(("PRISM_TEST_FAKE_HOSTS", fake_hosts.to_string()));
    }
    let results = run_ranks(role, world, ranks, &env, Duration::from_secs(30));
    for (rank, code, log) in &results {
        if expect_ok.contains(rank) {
            assert_eq!(*code, Some(0), "{role} over {transport}: rank {rank} must see an error within the timeout; its output:\n{log}");
        }
    }
    results.into_iter().map(|(_, _, log)| log).collect()
}

#[test]
fn a_peer_that_dies_mid_job_gives_every_other_rank_an_error_within_the_timeout() {
    failure_case("dies", "tcp", 3, &[0, 1, 2], &[0, 1]);
    failure_case("dies", "shm", 3, &[0, 1, 2], &[0, 1]);
    failure_case("dies", "mixed", 4, &[0, 1, 2, 3], &[0, 1, 3]);
}

#[test]
fn a_peer_that_stops_calling_gives_the_others_a_timeout_not_a_hang() {
    failure_case("stalls", "tcp", 3, &[0, 1, 2], &[0, 1]);
    failure_case("stalls", "shm", 3, &[0, 1, 2], &[0, 1]);
    failure_case("stalls", "mixed", 4, &[0, 1, 2, 3], &[0, 1, 3]);
}

#[test]
fn a_peer_that_never_joins_fails_the_rendezvous_within_the_timeout() {
    failure_case("never_joins", "auto", 3, &[0, 1], &[0, 1]);
}

#[test]
fn ranks_that_call_different_collectives_get_a_mismatch_error() {
    for transport in ["tcp", "shm"] {
        let logs = failure_case("mismatch", transport, 2, &[0, 1], &[0, 1]);
        // The first rank to read the other's header names both calls; the
        // other may see that rank abort first.
        assert!(
            logs.iter().any(|log| log.contains("MISMATCH")),
            "over {transport}, some rank must report the mismatch; outputs:\n{logs:#?}"
        );
    }
}

// ----------------------------------------------------------------- rank side

#[test]
fn rank_process() {
    let Ok(role) = std::env::var("PRISM_TEST_ROLE") else {
        return; // Only meaningful in a child started by the tests above.
    };
    match role.as_str() {
        "matrix" => role_matrix(),
        "large" => role_large(),
        "dies" => role_dies(),
        "stalls" => role_stalls(),
        "never_joins" => role_never_joins(),
        "mismatch" => role_mismatch(),
        "small_shm" => role_small_shm(),
        other => panic!("unknown role {other}"),
    }
}

fn env_usize(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the parent sets {name}"))
}

fn must_join(config: CollectiveConfig, port_var: &str, name: &str) -> ProcessGroup {
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    let port = env_usize(port_var);
    let options = GroupOptions::new(rank, world, format!("127.0.0.1:{port}"))
        .group_name(name)
        .config(config);
    ProcessGroup::join(options).unwrap_or_else(|e| panic!("rank {rank} must join {name}: {e}"))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn is_int(dt: DataType) -> bool {
    matches!(dt, DataType::I32 | DataType::I64 | DataType::U8)
}

/// The value rank `rank` contributes at index `i` of case `case`: never zero,
/// in a range where the reduction `op` stays exact or well conditioned.
fn value<T: Element>(rank: usize, case: u64, i: usize, op: ReduceOp) -> T {
    let u = (splitmix(case.wrapping_mul(1_000_003) ^ ((rank as u64) << 40) ^ i as u64) >> 11)
        as f64
        / (1u64 << 53) as f64;
    let int = is_int(T::DATA_TYPE);
    let v = match (op, int) {
        (ReduceOp::Sum | ReduceOp::Mean, false) => 0.5 + u,
        (ReduceOp::Sum | ReduceOp::Mean, true) => 1.0 + (u * 4.0).floor(),
        (ReduceOp::Product, false) => 0.8 + 0.45 * u,
        (ReduceOp::Product, true) => 1.0 + (u * 3.0).floor(),
        (ReduceOp::Min | ReduceOp::Max, false) => {
            let x = -100.0 + 200.0 * u;
            if x.abs() < 0.01 {
                1.0
            } else {
                x
            }
        }
        (ReduceOp::Min | ReduceOp::Max, true) => 1.0 + (u * 120.0).floor(),
    };
    T::from_f64(v)
}

fn inputs<T: Element>(rank: usize, case: u64, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len).map(|i| value::<T>(rank, case, i, op)).collect()
}

/// The reduction over all ranks of index `i`, computed in f64.
fn reference<T: Element>(world: usize, case: u64, i: usize, op: ReduceOp) -> f64 {
    let vals = (0..world).map(|r| value::<T>(r, case, i, op).to_f64());
    let r = match op {
        ReduceOp::Sum | ReduceOp::Mean => vals.sum::<f64>(),
        ReduceOp::Product => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    };
    if op == ReduceOp::Mean {
        if is_int(T::DATA_TYPE) {
            (r / world as f64).trunc()
        } else {
            r / world as f64
        }
    } else {
        r
    }
}

fn tolerance(dt: DataType) -> f64 {
    match dt {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-5,
        DataType::F16 => 1e-2,
        DataType::BF16 => 6e-2,
        _ => 0.0,
    }
}

fn must_match<T: Element>(what: &str, got: T, expected: f64) {
    let dt = T::DATA_TYPE;
    let ok = if is_int(dt) {
        got.to_f64() == T::from_f64(expected).to_f64()
    } else {
        (got.to_f64() - expected).abs() <= tolerance(dt) * expected.abs().max(1e-3)
    };
    assert!(ok, "{what}: got {got:?}, the f64 reference is {expected}");
}

struct Matrix {
    rank: usize,
    world: usize,
    case: u64,
}

impl Matrix {
    fn next_case(&mut self) -> u64 {
        self.case += 1;
        self.case
    }

    fn lengths(&self) -> Vec<usize> {
        let n = self.world;
        let mut v = vec![0, 1, n + 1, 2 * n + 3, 1031, 3001];
        if n > 1 {
            v.push(n - 1);
        }
        v
    }

    fn all_types(&mut self, groups: &[&ProcessGroup]) {
        self.one_type::<f32>(groups);
        self.one_type::<f64>(groups);
        self.one_type::<f16>(groups);
        self.one_type::<bf16>(groups);
        self.one_type::<i32>(groups);
        self.one_type::<i64>(groups);
        self.one_type::<u8>(groups);
    }

    fn one_type<T: Element>(&mut self, groups: &[&ProcessGroup]) {
        let (rank, world) = (self.rank, self.world);
        let dt = T::DATA_TYPE;
        for len in self.lengths() {
            for (gi, g) in groups.iter().enumerate() {
                for op in [
                    ReduceOp::Sum,
                    ReduceOp::Mean,
                    ReduceOp::Min,
                    ReduceOp::Max,
                    ReduceOp::Product,
                ] {
                    let case = self.next_case();
                    let mut buf = inputs::<T>(rank, case, len, op);
                    g.all_reduce(&mut buf, op).unwrap_or_else(|e| {
                        panic!("all_reduce {dt} {op} len {len} group {gi}: {e}")
                    });
                    for (i, v) in buf.iter().enumerate() {
                        must_match(
                            &format!("all_reduce {dt} {op} len {len} group {gi} [{i}]"),
                            *v,
                            reference::<T>(world, case, i, op),
                        );
                    }
                }
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let case = self.next_case();
                    let mut buf = inputs::<T>(rank, case, len, op);
                    let mine = g
                        .reduce_scatter(&mut buf, op)
                        .unwrap_or_else(|e| panic!("reduce_scatter {dt} {op} len {len}: {e}"));
                    assert_eq!(mine, segment_range(len, world, rank));
                    for i in mine {
                        must_match(
                            &format!("reduce_scatter {dt} {op} len {len} [{i}]"),
                            buf[i],
                            reference::<T>(world, case, i, op),
                        );
                    }
                }
                let case = self.next_case();
                let mine = inputs::<T>(rank, case, len, ReduceOp::Min);
                let mut all = vec![T::from_f64(0.0); len * world];
                g.all_gather(&mine, &mut all)
                    .unwrap_or_else(|e| panic!("all_gather {dt} len {len}: {e}"));
                for r in 0..world {
                    assert_eq!(
                        all[r * len..(r + 1) * len],
                        inputs::<T>(r, case, len, ReduceOp::Min)[..],
                        "all_gather {dt} len {len}: rank {r}'s part"
                    );
                }
                let case = self.next_case();
                let root = (case as usize) % world;
                let mut buf = inputs::<T>(rank, case, len, ReduceOp::Max);
                g.broadcast(&mut buf, root)
                    .unwrap_or_else(|e| panic!("broadcast {dt} len {len} root {root}: {e}"));
                assert_eq!(
                    buf,
                    inputs::<T>(root, case, len, ReduceOp::Max),
                    "broadcast {dt} len {len} root {root}"
                );
            }
        }
        for len in [1, self.world + 1, 3001] {
            for g in groups {
                // The staged (device-memory) path on its CPU twin.
                for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
                    let case = self.next_case();
                    let mut dev = staged::HostBuffer::new(inputs::<T>(rank, case, len, op));
                    staged::all_reduce(g, &mut dev, op)
                        .unwrap_or_else(|e| panic!("staged all_reduce {dt} {op} len {len}: {e}"));
                    for (i, v) in dev.into_inner().iter().enumerate() {
                        must_match(
                            &format!("staged all_reduce {dt} {op} len {len} [{i}]"),
                            *v,
                            reference::<T>(world, case, i, op),
                        );
                    }
                }
                let case = self.next_case();
                let root = (case as usize) % world;
                let mut dev = staged::HostBuffer::new(inputs::<T>(rank, case, len, ReduceOp::Max));
                staged::broadcast(g, &mut dev, root)
                    .unwrap_or_else(|e| panic!("staged broadcast {dt} len {len}: {e}"));
                assert_eq!(
                    dev.into_inner(),
                    inputs::<T>(root, case, len, ReduceOp::Max),
                    "staged broadcast {dt} len {len} root {root}"
                );
                // all_to_all: block j of rank r goes to block r of rank j.
                let case = self.next_case();
                let mine = inputs::<T>(rank, case, len * world, ReduceOp::Min);
                let mut out = vec![T::from_f64(0.0); len * world];
                g.all_to_all(&mine, &mut out)
                    .unwrap_or_else(|e| panic!("all_to_all {dt} len {len}: {e}"));
                for j in 0..world {
                    let theirs = inputs::<T>(j, case, len * world, ReduceOp::Min);
                    assert_eq!(
                        out[j * len..(j + 1) * len],
                        theirs[rank * len..(rank + 1) * len],
                        "all_to_all {dt} len {len}: block from rank {j}"
                    );
                }
            }
        }
        // Non-blocking calls keep their order, also around a blocking one.
        let g = groups[0];
        let cases: Vec<u64> = (0..3).map(|_| self.next_case()).collect();
        let works: Vec<_> = cases
            .iter()
            .map(|c| g.all_reduce_async(inputs::<T>(rank, *c, 517, ReduceOp::Sum), ReduceOp::Sum))
            .collect();
        let gathered = g.all_gather_async(vec![T::from_f64(rank as f64 + 1.0)]);
        g.barrier().unwrap_or_else(|e| panic!("barrier {dt}: {e}"));
        for (work, case) in works.into_iter().zip(cases) {
            let buf = work
                .wait()
                .unwrap_or_else(|e| panic!("all_reduce_async {dt}: {e}"));
            for (i, v) in buf.iter().enumerate() {
                must_match(
                    &format!("all_reduce_async {dt} [{i}]"),
                    *v,
                    reference::<T>(world, case, i, ReduceOp::Sum),
                );
            }
        }
        let all = gathered
            .wait()
            .unwrap_or_else(|e| panic!("all_gather_async {dt}: {e}"));
        let expected: Vec<T> = (0..world).map(|r| T::from_f64(r as f64 + 1.0)).collect();
        assert_eq!(all, expected);
    }
}

fn role_matrix() {
    let base = CollectiveConfig::from_env().expect("the parent sets valid overrides");
    let transport = base.transport;
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    // With PRISM_TEST_FAKE_HOSTS the ranks pretend to live on two hosts
    // (interleaved for the first group, halves for the second), so each
    // group mixes shared memory and TCP.
    let fake_hosts = std::env::var_os("PRISM_TEST_FAKE_HOSTS").is_some();
    let host = |h: usize| fake_hosts.then(|| format!("fake-host-{h}"));
    let a_config = CollectiveConfig {
        host_id: host(rank % 2),
        ..base.clone()
    };
    let a = must_join(a_config, "MASTER_PORT", "matrix-a");
    // The second group forces the ring and the chain for every size and uses
    // tiny chunks, ring blocks, rings and socket buffers, so that flow
    // control, wrap-around, partial reads and the interleaving of ring steps
    // are exercised on small buffers.
    let b_config = CollectiveConfig {
        small_message_bytes: 0,
        chunk_bytes: 4096,
        ring_block_bytes: 1000,
        shm_ring_bytes: 4160,
        shm_side_ring_bytes: 640,
        tcp_socket_buffer_bytes: 16 * 1024,
        device_chunk_bytes: 4096,
        host_id: host(rank * 2 / world),
        ..base
    };
    let b = must_join(b_config, "PRISM_TEST_SECOND_PORT", "matrix-b");
    if world > 1 {
        // What each group must have chosen, from how many ranks share this
        // rank's (possibly fake) host.
        let expected = |same_host: usize| match transport {
            TransportChoice::Tcp => "tcp",
            _ if same_host == world => "shm",
            _ if same_host == 1 => "tcp",
            _ => "shm+tcp",
        };
        let a_same = if fake_hosts {
            (0..world).filter(|r| r % 2 == rank % 2).count()
        } else {
            world
        };
        let b_same = if fake_hosts {
            (0..world)
                .filter(|r| r * 2 / world == rank * 2 / world)
                .count()
        } else {
            world
        };
        assert_eq!(a.transport(), expected(a_same), "group a, rank {rank}");
        assert_eq!(b.transport(), expected(b_same), "group b, rank {rank}");
    }
    let mut m = Matrix {
        rank: a.rank(),
        world,
        case: 0,
    };
    m.all_types(&[&a, &b]);
    a.barrier().expect("final barrier");
    b.barrier().expect("final barrier");
    println!("RESULT ok rank {}", a.rank());
}

/// All-reduce and all-gather of buffers of tens of MB (segments of more than
/// 8 MiB, so each rank copies its received segments out of the ring with
/// non-temporal stores), with values whose sums are exact in f32.
fn role_large() {
    let config = CollectiveConfig::from_env().expect("the parent sets valid overrides");
    let group = must_join(config, "MASTER_PORT", "large");
    assert_eq!(group.transport(), "shm");
    let (rank, world) = (group.rank(), group.world_size());
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 1021) as f32;
    // 7M + 7 elements: every segment is over 8 MiB at world 2 and 3, and
    // segment boundaries fall off 16-byte alignment.
    let len = 7_000_007;
    for round in 0..2 {
        let mut buf: Vec<f32> = (0..len).map(|i| value(rank + round, i)).collect();
        group
            .all_reduce(&mut buf, ReduceOp::Sum)
            .expect("large all_reduce");
        for (i, got) in buf.iter().enumerate() {
            let expected: f32 = (0..world).map(|r| value(r + round, i)).sum();
            assert_eq!(*got, expected, "all_reduce round {round}, element {i}");
        }
    }
    let part = 2_500_003;
    let mine: Vec<f32> = (0..part).map(|i| value(rank, i)).collect();
    let mut all = vec![0f32; part * world];
    group.all_gather(&mine, &mut all).expect("large all_gather");
    for (i, got) in all.iter().enumerate() {
        assert_eq!(*got, value(i / part, i % part), "all_gather element {i}");
    }
    group.barrier().expect("final barrier");
    println!("RESULT ok rank {rank}");
}

/// Two threads form a shared-memory group with 4 MiB rings in a 1 MiB
/// `/dev/shm` and all-reduce 8 MiB, checking every element.
fn role_small_shm() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let rdv = TcpRendezvous::on_listener(listener).expect("a bound listener");
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let rdv = rdv.clone();
            std::thread::spawn(move || {
                let config = CollectiveConfig {
                    transport: TransportChoice::SharedMemory,
                    timeout_ms: 20_000,
                    ..CollectiveConfig::default()
                };
                let group = ProcessGroup::join_with(
                    GroupOptions::new(rank, 2, rdv.master()).config(config),
                    &rdv,
                )?;
                let mut buf: Vec<f32> = (0..2 << 20).map(|i| (i % 1000 + rank) as f32).collect();
                group.all_reduce(&mut buf, ReduceOp::Sum)?;
                Ok::<_, CollectiveError>(buf)
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let buf = match h.join().expect("a joining thread") {
            Ok(buf) => buf,
            Err(e) => panic!("rank {rank} with a 1 MiB /dev/shm: {e}"),
        };
        for (i, got) in buf.iter().enumerate() {
            assert_eq!(
                *got,
                (2 * (i % 1000) + 1) as f32,
                "rank {rank}, element {i}"
            );
        }
        println!("rank {rank}: {} elements summed", buf.len());
    }
    println!("RESULT ok");
}

fn timeout_config() -> CollectiveConfig {
    let mut config = CollectiveConfig::from_env().expect("the parent sets valid overrides");
    if std::env::var_os("PRISM_TEST_FAKE_HOSTS").is_some() {
        config.host_id = Some(format!("fake-host-{}", env_usize("RANK") % 2));
    }
    config
}

/// Joins with a generous timeout (process start-up on a loaded machine is
/// not what these tests measure), then bounds each call by the short one.
fn must_join_then_shorten(name: &str) -> ProcessGroup {
    let short = timeout_config().timeout();
    let long = CollectiveConfig {
        timeout_ms: env_usize("PRISM_TEST_JOIN_TIMEOUT_MS") as u64,
        ..timeout_config()
    };
    let g = must_join(long, "MASTER_PORT", name);
    g.set_timeout(short);
    g
}

fn must_fail_in_time<R: std::fmt::Debug>(
    what: &str,
    started: Instant,
    result: Result<R, CollectiveError>,
) -> CollectiveError {
    let elapsed = started.elapsed();
    // Slack for a loaded machine: the point is "not a hang".
    let limit = timeout_config().timeout() + Duration::from_millis(3000);
    let err = match result {
        Ok(v) => panic!("{what} must fail, got {v:?}"),
        Err(e) => e,
    };
    assert!(
        elapsed <= limit,
        "{what} must fail within the timeout, took {elapsed:?}: {err}"
    );
    println!("{what} failed in {elapsed:?} with: {err}");
    err
}

fn role_dies() {
    let g = must_join(
        CollectiveConfig {
            timeout_ms: env_usize("PRISM_TEST_JOIN_TIMEOUT_MS") as u64,
            ..timeout_config()
        },
        "MASTER_PORT",
        "dies",
    );
    let mut buf = vec![1.0f32; 1 << 20];
    g.all_reduce(&mut buf, ReduceOp::Sum)
        .expect("the first all_reduce, before anyone dies");
    g.set_timeout(timeout_config().timeout());
    assert_eq!(buf[0], g.world_size() as f32);
    if g.rank() == 2 {
        std::process::exit(3);
    }
    let started = Instant::now();
    let err = must_fail_in_time(
        "all_reduce after rank 2 died",
        started,
        g.all_reduce(&mut buf, ReduceOp::Sum),
    );
    assert!(
        matches!(
            err,
            CollectiveError::PeerDisconnected { .. }
                | CollectiveError::GroupAborted { .. }
                | CollectiveError::Timeout { .. }
        ),
        "unexpected error kind: {err:?}"
    );
    let again = g
        .barrier()
        .expect_err("a broken group must refuse further calls");
    assert!(
        matches!(again, CollectiveError::GroupBroken { .. }),
        "{again:?}"
    );
}

fn role_stalls() {
    let g = must_join_then_shorten("stalls");
    if g.rank() == 2 {
        // Long enough for the others to time out, short enough not to hold
        // up the test.
        std::thread::sleep(timeout_config().timeout() * 2 + Duration::from_secs(1));
        return;
    }
    let mut buf = vec![1.0f64; 100_000];
    let started = Instant::now();
    must_fail_in_time(
        "all_reduce with rank 2 asleep",
        started,
        g.all_reduce(&mut buf, ReduceOp::Sum),
    );
}

fn role_never_joins() {
    let rank = env_usize("RANK");
    let port = env_usize("MASTER_PORT");
    let options = GroupOptions::new(rank, 3, format!("127.0.0.1:{port}")).config(timeout_config());
    let started = Instant::now();
    let err = must_fail_in_time(
        "joining without rank 2",
        started,
        ProcessGroup::join(options),
    );
    assert!(
        matches!(err, CollectiveError::RendezvousTimeout { .. }),
        "{err:?}"
    );
}

fn role_mismatch() {
    let g = must_join_then_shorten("mismatch");
    let mut buf = vec![1i32; 10 + g.rank()];
    let started = Instant::now();
    let err = must_fail_in_time(
        "all_reduce of different lengths",
        started,
        g.all_reduce(&mut buf, ReduceOp::Sum),
    );
    match err {
        CollectiveError::CallMismatch { .. } => println!("MISMATCH reported"),
        CollectiveError::PeerDisconnected { .. } | CollectiveError::GroupAborted { .. } => {}
        other => panic!("unexpected error kind: {other:?}"),
    }
}

/// Threads of one process form a group too; random lengths through tiny
/// rings and chunks shake out wrap-around and flow-control bugs quickly.
#[test]
fn random_lengths_through_tiny_rings_stay_correct_over_both_transports() {
    for transport in [TransportChoice::Tcp, TransportChoice::SharedMemory] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let rdv = TcpRendezvous::on_listener(listener).expect("a bound listener");
        let world = 3;
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let rdv = rdv.clone();
                std::thread::spawn(move || {
                    let config = CollectiveConfig {
                        small_message_bytes: 256,
                        chunk_bytes: 4096,
                        ring_block_bytes: 100,
                        shm_ring_bytes: 704,
                        shm_side_ring_bytes: 64,
                        tcp_socket_buffer_bytes: 64 * 1024,
                        transport,
                        timeout_ms: 60_000,
                        ..CollectiveConfig::default()
                    };
                    let g = ProcessGroup::join_with(
                        GroupOptions::new(rank, world, rdv.master()).config(config),
                        &rdv,
                    )
                    .unwrap_or_else(|e| panic!("rank {rank} must join: {e}"));
                    for case in 0..400u64 {
                        let len = (splitmix(case) % 5000) as usize;
                        let mut buf = inputs::<u8>(rank, case, len, ReduceOp::Sum);
                        g.all_reduce(&mut buf, ReduceOp::Sum)
                            .unwrap_or_else(|e| panic!("case {case} len {len}: {e}"));
                        for (i, v) in buf.iter().enumerate() {
                            must_match(
                                &format!("{transport:?} case {case} len {len} [{i}]"),
                                *v,
                                reference::<u8>(world, case, i, ReduceOp::Sum),
                            );
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[derive(Debug, Default)]
struct MemoryStore(std::sync::Mutex<std::collections::HashMap<String, String>>);

impl prism_train::collective::KvStore for MemoryStore {
    fn put(&self, key: &str, value: &str) -> prism_train::collective::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), value.to_string());
        Ok(())
    }
    fn get(&self, key: &str) -> prism_train::collective::Result<Option<String>> {
        Ok(self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned())
    }
}

/// The swap the Trainer will make: the same group, formed through a
/// key-value store instead of a master port.
#[test]
fn a_group_forms_through_a_key_value_store() {
    use prism_train::collective::KvRendezvous;
    let store = std::sync::Arc::new(KvRendezvous::new(
        MemoryStore::default(),
        "127.0.0.1".parse().expect("literal address"),
    ));
    let world = 3;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            std::thread::spawn(move || {
                let options = GroupOptions::new(rank, world, "unused:0")
                    .group_name("kv-test")
                    .timeout(Duration::from_secs(30));
                let g = ProcessGroup::join_with(options, &*store)
                    .unwrap_or_else(|e| panic!("rank {rank} must join through the store: {e}"));
                let mut buf = vec![rank as i64 + 1; 100];
                g.all_reduce(&mut buf, ReduceOp::Sum).expect("all_reduce");
                assert_eq!(buf, vec![6i64; 100]);
            })
        })
        .collect();
    for h in handles {
        if let Err(panic) = h.join() {
            std::panic::resume_unwind(panic);
        }
    }
}
