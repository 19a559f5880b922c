//! Prism's side of Ray's microbenchmark (`ray microbenchmark`), row for
//! row: each figure does what the Ray row of the same name does (same
//! value sizes, batch sizes and number of clients), plus the figures Ray's
//! suite lacks (cluster start and stop, first task, actor creation, a
//! 100 MB get in a worker, memory of an idle node). Prints one
//! `name value unit` line per figure.
//!
//! Run: `cargo run --release --example microbenchmark [-- --quick]`
//! (`--quick` runs each row briefly: a smoke run, not a measurement).
//! `PRISM_BENCH_ROWS=pattern` runs only rows whose name contains it.

use prism::{ActorOptions, ObjectRef, View};
use prism_examples::proc_stats::{children, pss_kib};
use std::time::{Duration, Instant};

/// The small value every task and call returns, as Ray's `b"ok"`.
fn ok() -> Vec<u8> {
    b"ok".to_vec()
}

#[prism::remote]
fn small_value() -> Vec<u8> {
    ok()
}

/// A row Ray's suite lacks: `n` small values streamed by one task
/// (Ray's `num_returns="streaming"` generator yielding `b"ok"`).
#[prism::remote(num_returns = "streaming")]
fn small_values_streamed(n: u32) -> impl Iterator<Item = Vec<u8>> {
    (0..n).map(|_| ok())
}

#[prism::remote]
fn do_put_small() -> u8 {
    for _ in 0..100 {
        prism::put(0u64).expect("put");
    }
    0
}

/// A zeroed `Vec<i64>` allocated as numpy allocates `np.zeros`: fresh
/// zero pages, with transparent huge pages requested for the range, so
/// reading it costs one fault per 2 MiB rather than per 4 KiB.
fn zeros_like_numpy(n: usize) -> Vec<i64> {
    if n == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<i64>(n).expect("a valid array size");
    // SAFETY: the layout has a non-zero size; calloc hands back fresh zeroed
    // (untouched) pages for sizes this large; the advice does not change
    // the contents; from_raw_parts gets the pointer, length and capacity of
    // that very allocation, made by the global allocator with i64 layout.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut i64;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // The advice needs page-aligned bounds; calloc's pointer is not.
        let start = (ptr as usize).next_multiple_of(4096);
        let end = (ptr as usize + layout.size()) & !4095;
        if end > start {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
        Vec::from_raw_parts(ptr, n, n)
    }
}

#[prism::remote]
fn do_put() -> u8 {
    for _ in 0..10 {
        // 10 Mi int64 zeros = 80 MiB, as Ray's np.zeros(10 * 1024 * 1024).
        prism::put(zeros_like_numpy(10 * 1024 * 1024)).expect("put");
    }
    0
}

#[prism::remote]
fn create_object_containing_ref() -> Vec<ObjectRef<u64>> {
    (0..10_000)
        .map(|_| prism::put(1u64).expect("put"))
        .collect()
}

/// Sums in eight independent lanes, so the compiler can vectorise it (as
/// numpy's sum is): the row should measure handing the data over, not a
/// scalar loop.
#[prism::remote]
fn sum_view(values: View<f32>) -> f64 {
    let mut lanes = [0f32; 8];
    let chunks = values.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().map(|l| *l as f64).sum::<f64>() + tail as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Ray's `Actor` (num_cpus=0).
#[prism::actor(num_cpus = 0)]
struct Actor;

#[prism::actor]
impl Actor {
    fn new() -> Self {
        Actor
    }

    fn small_value(&self) -> Vec<u8> {
        ok()
    }

    fn small_value_arg(&self, _x: u64) -> Vec<u8> {
        ok()
    }

    fn small_value_batch(&self, n: u32) -> u8 {
        let refs: Vec<_> = (0..n)
            .map(|_| small_value::remote().expect("submit"))
            .collect();
        prism::get_many(&refs).expect("get");
        0
    }
}

/// Ray's `AsyncActor`: async methods; Ray runs up to 1000 at once.
#[prism::actor(max_concurrency = 1000)]
struct AsyncActor;

#[prism::actor]
impl AsyncActor {
    fn new() -> Self {
        AsyncActor
    }

    async fn small_value(&self) -> Vec<u8> {
        ok()
    }

    async fn small_value_with_arg(&self, _x: u64) -> Vec<u8> {
        ok()
    }
}

/// Ray's `Client`, for async actors.
#[prism::actor(num_cpus = 0)]
struct AsyncClient {
    servers: Vec<prism::ActorHandle<AsyncActor>>,
}

#[prism::actor]
impl AsyncClient {
    fn new(servers: Vec<prism::ActorHandle<AsyncActor>>) -> Self {
        AsyncClient { servers }
    }

    fn small_value_batch(&self, n: u32) -> u8 {
        let mut refs = Vec::new();
        for s in &self.servers {
            refs.extend((0..n).map(|_| s.small_value().expect("call")));
        }
        prism::get_many(&refs).expect("get");
        0
    }
}

#[prism::remote]
fn async_actor_work(actors: Vec<prism::ActorHandle<AsyncActor>>, n: u32) -> u8 {
    let refs: Vec<_> = (0..n as usize)
        .map(|i| actors[i % actors.len()].small_value().expect("call"))
        .collect();
    prism::get_many(&refs).expect("get");
    0
}

/// Ray's `Client` (num_cpus=0): calls a list of server actors.
#[prism::actor(num_cpus = 0)]
struct Client {
    servers: Vec<prism::ActorHandle<Actor>>,
}

#[prism::actor]
impl Client {
    fn new(servers: Vec<prism::ActorHandle<Actor>>) -> Self {
        Client { servers }
    }

    fn small_value_batch(&self, n: u32) -> u8 {
        let mut refs = Vec::new();
        for s in &self.servers {
            refs.extend((0..n).map(|_| s.small_value().expect("call")));
        }
        prism::get_many(&refs).expect("get");
        0
    }

    fn small_value_batch_arg(&self, n: u32) -> u8 {
        let x = prism::put(0u64).expect("put");
        let mut refs = Vec::new();
        for s in &self.servers {
            refs.extend((0..n).map(|_| s.small_value_arg(&x).expect("call")));
        }
        prism::get_many(&refs).expect("get");
        0
    }
}

#[prism::remote]
fn work(actors: Vec<prism::ActorHandle<Actor>>, n: u32) -> u8 {
    let refs: Vec<_> = (0..n as usize)
        .map(|i| actors[i % actors.len()].small_value().expect("call"))
        .collect();
    prism::get_many(&refs).expect("get");
    0
}

struct Bench {
    quick: bool,
    filter: Option<String>,
}

impl Bench {
    fn wants(&self, name: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|f| name.contains(f.as_str()))
    }

    /// Runs `f` repeatedly, like Ray's `timeit`: a warm-up, then trials of
    /// a fixed duration; prints the mean rate of `multiplier` operations
    /// per call of `f`.
    fn timeit(
        &self,
        name: &str,
        multiplier: f64,
        mut f: impl FnMut() -> prism::Result<()>,
    ) -> prism::Result<()> {
        if !self.wants(name) {
            return Ok(());
        }
        let (warmup, trial, trials) = if self.quick {
            (Duration::from_millis(20), Duration::from_millis(100), 1)
        } else {
            (Duration::from_millis(500), Duration::from_secs(2), 3)
        };
        let start = Instant::now();
        f()?;
        while start.elapsed() < warmup {
            f()?;
        }
        let mut rates = Vec::new();
        for _ in 0..trials {
            let start = Instant::now();
            let mut calls = 0u64;
            while calls == 0 || start.elapsed() < trial {
                f()?;
                calls += 1;
            }
            rates.push(calls as f64 * multiplier / start.elapsed().as_secs_f64());
        }
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let unit = if name.ends_with("gigabytes") {
            "GB_per_s"
        } else {
            "per_s"
        };
        println!("{name} {mean:.3} {unit}");
        Ok(())
    }
}

/// The physical floor of a synchronous call: a 64-byte round trip over a
/// Unix-socket pair between two threads, in microseconds (median of runs).
fn floor_unix_socket_round_trip_us(rounds: u32) -> f64 {
    use std::io::{Read, Write};
    let Ok((mut a, mut b)) = std::os::unix::net::UnixStream::pair() else {
        return f64::NAN;
    };
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [7u8; 64];
    let mut samples = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..rounds {
            if a.write_all(&buf).is_err() || a.read_exact(&mut buf).is_err() {
                return f64::NAN;
            }
        }
        samples.push(start.elapsed().as_secs_f64() * 1e6 / rounds as f64);
    }
    drop(a);
    let _ = echo.join();
    median(samples)
}

/// The physical floor of a large put: single-threaded memcpy of 256 MiB,
/// into pages already mapped and into fresh ones, in GB/s (10^9 bytes).
fn floor_memcpy_gigabytes() -> (f64, f64) {
    let len = 256 << 20;
    let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut fresh_rates = Vec::new();
    let mut warm_rates = Vec::new();
    for _ in 0..3 {
        let mut dst: Vec<u8> = Vec::with_capacity(len);
        let start = Instant::now();
        // SAFETY: dst has capacity for len bytes, all written by the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), len);
            dst.set_len(len);
        }
        fresh_rates.push(len as f64 / start.elapsed().as_secs_f64() / 1e9);
        let start = Instant::now();
        dst.copy_from_slice(&src);
        warm_rates.push(len as f64 / start.elapsed().as_secs_f64() / 1e9);
        std::hint::black_box(&dst);
    }
    (median(warm_rates), median(fresh_rates))
}

fn report(name: &str, value: f64, unit: &str) {
    println!("{name} {value:.3} {unit}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[prism::main]
fn main() -> prism::Result<()> {
    let b = Bench {
        quick: std::env::args().any(|a| a == "--quick"),
        filter: std::env::var("PRISM_BENCH_ROWS")
            .ok()
            .filter(|s| !s.is_empty()),
    };
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let n_cpu = (cpus / 2).max(1);

    let start = Instant::now();
    // Ray's placement-group row runs on a cluster with {"custom": 100}.
    prism::init(prism::Config::default().resource("custom", 100.0))?;
    report("cluster_start", ms(start.elapsed()), "ms");

    // Right after init, as Ray's side does: this includes waiting for the
    // first worker process to come up.
    let start = Instant::now();
    prism::get(&small_value::remote()?)?;
    report("first_task_latency", ms(start.elapsed()), "ms");

    // Let the prestarted workers settle before measuring an idle node.
    std::thread::sleep(Duration::from_millis(300));
    let children = children();
    let pss: u64 = pss_kib(std::process::id()) + children.iter().map(|p| pss_kib(*p)).sum::<u64>();
    report(
        "idle_node_processes",
        (1 + children.len()) as f64,
        "processes",
    );
    report("idle_node_pss", pss as f64 / 1024.0, "MiB");

    let start = Instant::now();
    let first = Actor::remote()?;
    prism::get(&first.small_value()?)?;
    report("actor_creation_plus_first_call", ms(start.elapsed()), "ms");
    drop(first);

    if b.wants("get_100mb_in_worker") {
        let data: Vec<f32> = (0..25_000_000u32).map(|i| (i % 7) as f32).collect();
        // The first put into a fresh store: its memory is new to the
        // machine (compare put_100mb_random_gigabytes, which lands on
        // memory this one used).
        let start = Instant::now();
        let big = prism::put_ref(&data)?;
        report("first_put_100mb_ms", ms(start.elapsed()), "ms");
        prism::get(&sum_view::remote(&big)?)?;
        let mut rounds = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            prism::get(&sum_view::remote(&big)?)?;
            rounds.push(ms(start.elapsed()));
        }
        report("get_100mb_in_worker_ms", median(rounds), "ms");
        drop(big);
        let random: Vec<f32> = {
            let mut state = 0x2545_F491_4F6C_DD1Du64;
            (0..25_000_000)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32
                })
                .collect()
        };
        let start = Instant::now();
        let r = prism::put_ref(&random)?;
        report(
            "put_100mb_random_gigabytes",
            0.1 / start.elapsed().as_secs_f64(),
            "GB_per_s",
        );
        drop(r);
    }

    let value = prism::put(0u64)?;
    b.timeit("single_client_get_calls", 1.0, || {
        prism::get(&value).map(|_| ())
    })?;
    b.timeit("single_client_put_calls", 1.0, || {
        prism::put(0u64).map(|_| ())
    })?;
    b.timeit("multi_client_put_calls", 1000.0, || {
        let refs = (0..10)
            .map(|_| do_put_small::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    if b.wants("single_client_put_gigabytes") {
        // 100 Mi int64 zeros = 800 MiB, put from a borrowed buffer each time.
        let arr = zeros_like_numpy(100 * 1024 * 1024);
        b.timeit("single_client_put_gigabytes", 8.0 * 0.1, || {
            prism::put_ref(&arr).map(|_| ())
        })?;
    }
    b.timeit("single_client_tasks_and_get_batch", 1.0, || {
        let refs = (0..1000)
            .map(|_| small_value::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    b.timeit("multi_client_put_gigabytes", 10.0 * 8.0 * 0.1, || {
        let refs = (0..10)
            .map(|_| do_put::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    if b.wants("single_client_get_object_containing_10k_refs") {
        let containing = create_object_containing_ref::remote()?;
        b.timeit("single_client_get_object_containing_10k_refs", 1.0, || {
            prism::get(&containing).map(|_| ())
        })?;
    }
    b.timeit("single_client_wait_1k_refs", 1.0, || {
        let mut not_ready = (0..1000)
            .map(|_| small_value::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        for _ in 0..1000 {
            let (_ready, rest) = prism::wait(&not_ready, 1, None)?;
            not_ready = rest;
        }
        Ok(())
    })?;
    b.timeit("single_client_tasks_sync", 1.0, || {
        prism::get(&small_value::remote()?).map(|_| ())
    })?;
    b.timeit("single_client_tasks_async", 1000.0, || {
        let refs = (0..1000)
            .map(|_| small_value::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    if b.wants("multi_client_tasks_async") {
        let (n, m) = (10_000u32, 4);
        let actors = (0..m)
            .map(|_| Actor::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        b.timeit("multi_client_tasks_async", (n * m) as f64, || {
            let refs = actors
                .iter()
                .map(|a| a.small_value_batch(n))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
    }
    let a = Actor::remote()?;
    b.timeit("1_1_actor_calls_sync", 1.0, || {
        prism::get(&a.small_value()?).map(|_| ())
    })?;
    b.timeit("1_1_actor_calls_async", 1000.0, || {
        let refs = (0..1000)
            .map(|_| a.small_value())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    let concurrent = Actor::remote_with(ActorOptions::new().max_concurrency(16))?;
    b.timeit("1_1_actor_calls_concurrent", 1000.0, || {
        let refs = (0..1000)
            .map(|_| concurrent.small_value())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    if b.wants("1_n_actor_calls_async") {
        let n = 5000u32;
        let servers = (0..n_cpu)
            .map(|_| Actor::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        let client = Client::remote(servers)?;
        b.timeit("1_n_actor_calls_async", (n as usize * n_cpu) as f64, || {
            prism::get(&client.small_value_batch(n)?).map(|_| ())
        })?;
    }
    if b.wants("n_n_actor_calls_async") {
        let (n, m) = (5000u32, 4);
        let actors = (0..n_cpu)
            .map(|_| Actor::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        b.timeit("n_n_actor_calls_async", (n * m) as f64, || {
            let refs = (0..m)
                .map(|_| work::remote(actors.clone(), n))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
    }
    if b.wants("n_n_actor_calls_with_arg_async") {
        let n = 1000u32;
        let clients = (0..n_cpu)
            .map(|_| Client::remote(vec![Actor::remote()?]))
            .collect::<prism::Result<Vec<_>>>()?;
        b.timeit(
            "n_n_actor_calls_with_arg_async",
            (n as usize * clients.len()) as f64,
            || {
                let refs = clients
                    .iter()
                    .map(|c| c.small_value_batch_arg(n))
                    .collect::<prism::Result<Vec<_>>>()?;
                prism::get_many(&refs).map(|_| ())
            },
        )?;
    }
    let async_actor = AsyncActor::remote()?;
    b.timeit("1_1_async_actor_calls_sync", 1.0, || {
        prism::get(&async_actor.small_value()?).map(|_| ())
    })?;
    b.timeit("1_1_async_actor_calls_async", 1000.0, || {
        let refs = (0..1000)
            .map(|_| async_actor.small_value())
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;

    b.timeit("1_1_async_actor_calls_with_args_async", 1000.0, || {
        let refs = (0..1000u64)
            .map(|i| async_actor.small_value_with_arg(i))
            .collect::<prism::Result<Vec<_>>>()?;
        prism::get_many(&refs).map(|_| ())
    })?;
    if b.wants("1_n_async_actor_calls_async") {
        let n = 5000u32;
        let servers = (0..n_cpu)
            .map(|_| AsyncActor::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        let client = AsyncClient::remote(servers)?;
        b.timeit(
            "1_n_async_actor_calls_async",
            (n as usize * n_cpu) as f64,
            || prism::get(&client.small_value_batch(n)?).map(|_| ()),
        )?;
    }
    if b.wants("n_n_async_actor_calls_async") {
        let (n, m) = (5000u32, 4);
        let actors = (0..n_cpu)
            .map(|_| AsyncActor::remote())
            .collect::<prism::Result<Vec<_>>>()?;
        b.timeit("n_n_async_actor_calls_async", (n * m) as f64, || {
            let refs = (0..m)
                .map(|_| async_actor_work::remote(actors.clone(), n))
                .collect::<prism::Result<Vec<_>>>()?;
            prism::get_many(&refs).map(|_| ())
        })?;
    }

    // Ray's row: 100 groups of one bundle {"custom": 0.001}, created,
    // waited for, removed.
    b.timeit("placement_group_create_removal", 100.0, || {
        let pgs = (0..100)
            .map(|_| {
                prism::placement_group(
                    vec![prism::Bundle::new().resource("custom", 0.001)],
                    prism::PlacementStrategy::Pack,
                )
            })
            .collect::<prism::Result<Vec<_>>>()?;
        for pg in &pgs {
            pg.wait(Duration::from_secs(30))?;
        }
        for pg in &pgs {
            prism::remove_placement_group(pg)?;
        }
        Ok(())
    })?;

    // Ray's side: bench/ray/extra_rows.py (the same 1,000 values, each
    // read as its reference arrives).
    b.timeit("single_client_streaming_values", 1000.0, || {
        for value in small_values_streamed::remote(1000)? {
            prism::get(&value?)?;
        }
        Ok(())
    })?;

    let start = Instant::now();
    prism::shutdown();
    report("cluster_shutdown", ms(start.elapsed()), "ms");

    if b.wants("floor") {
        let rounds = if b.quick { 2_000 } else { 50_000 };
        report(
            "floor_unix_socket_round_trip_us",
            floor_unix_socket_round_trip_us(rounds),
            "us",
        );
        let (warm, fresh) = floor_memcpy_gigabytes();
        report("floor_memcpy_gigabytes", warm, "GB_per_s");
        report("floor_memcpy_fresh_pages_gigabytes", fresh, "GB_per_s");
    }
    Ok(())
}
