//! A node under pressure. A store that fills: objects spill to disk and are
//! read back intact; with spilling off, a clear error that recovers when
//! references are dropped, and a task whose second result does not fit
//! leaves no copy of its first; bad spill settings fail `init` by name. Memory
//! past its threshold: the memory monitor stops the newest task, which
//! fails (after its retries) saying why. Each test runs its own small
//! cluster in a child process (one cluster per process).

mod common;

use common::{in_own_process, must, must_eventually};
use prism::Error;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Runs test `name` in a child process of its own, with `env`.
fn in_child(name: &str, env: &[(&str, &str)]) -> bool {
    in_own_process(name, env, Duration::from_secs(120))
}

fn small_store() -> prism::Config {
    prism::Config::default()
        .num_cpus(1)
        .object_store_memory(8 << 20)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

#[prism::remote]
fn make_block(seed: u8, len: usize) -> Vec<u8> {
    pattern(seed, len)
}

/// Puts `len` bytes and reads them back, waiting (10 s at most) for the
/// store to have room, which it must have once `freed`.
fn put_once_there_is_room(len: usize, freed: &str) {
    let start = Instant::now();
    loop {
        match prism::put(vec![3u8; len]) {
            Ok(r) => {
                assert_eq!(prism::get(&r).unwrap().len(), len);
                return;
            }
            Err(Error::ObjectStoreFull { .. }) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the store must have room again once {freed}: {e}"),
        }
    }
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn objects_that_do_not_fit_are_spilled_to_disk_and_read_back_intact() {
    let name = "objects_that_do_not_fit_are_spilled_to_disk_and_read_back_intact";
    if !in_child(name, &[]) {
        return;
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("prism-spill-test-{}", std::process::id()));
    must(
        prism::init(small_store().object_spill_dir(&dir)),
        "a cluster with a small store starts",
    );
    // Five 3 MiB objects in an 8 MiB store: the older ones must spill.
    let len = 3 << 20;
    let mut refs: Vec<_> = (0..4u8)
        .map(|seed| {
            must(
                prism::put(pattern(seed, len)),
                "a put that does not fit spills others",
            )
        })
        .collect();
    refs.push(must(
        make_block::remote(4, len),
        "a task result goes to the store too",
    ));
    must(prism::get(&refs[4]), "the task ran");
    let stats = prism::object_store_stats().unwrap();
    assert!(
        stats.spilled_total >= 2,
        "older objects were spilled: {stats:?}"
    );
    assert!(files_in(&dir) >= 1, "spill files are in {}", dir.display());
    for (seed, r) in refs.iter().enumerate() {
        let value = must(prism::get(r), "a spilled object is read back");
        assert!(
            value == pattern(seed as u8, len),
            "object {seed} came back changed"
        );
    }
    let stats = prism::object_store_stats().unwrap();
    assert!(
        stats.restored_total >= 1,
        "spilled objects were restored: {stats:?}"
    );
    // Freed objects take their files with them.
    drop(refs);
    must_eventually(
        "spill files of freed objects are deleted",
        Duration::from_secs(10),
        || files_in(&dir) == 0,
    );
    prism::shutdown();
    assert!(!dir.exists(), "the spill directory goes at shutdown");
}

#[test]
fn with_spilling_off_a_full_store_says_what_was_asked_and_what_is_used() {
    let name = "with_spilling_off_a_full_store_says_what_was_asked_and_what_is_used";
    if !in_child(name, &[("PRISM_OBJECT_SPILLING", "false")]) {
        return;
    }
    prism::init(small_store()).unwrap();
    let first = prism::put(vec![1u8; 6 << 20]).unwrap();
    let err = prism::put(vec![2u8; 6 << 20]).unwrap_err();
    match &err {
        Error::ObjectStoreFull {
            requested,
            used,
            capacity,
            num_objects,
        } => {
            assert_eq!(*requested, (6 << 20) + 64);
            assert!(*used >= 6 << 20);
            assert_eq!(*capacity, 8 << 20);
            assert_eq!(*num_objects, 1);
        }
        other => panic!("expected ObjectStoreFull, got {other}"),
    }
    assert!(err.to_string().contains("asked for"), "{err}");
    drop(first);
    put_once_there_is_room(6 << 20, "the first object is freed");
    prism::shutdown();
}

#[prism::remote(num_returns = 2)]
fn two_blocks(len: usize) -> (Vec<u8>, Vec<u8>) {
    (pattern(1, len), pattern(2, len))
}

#[test]
fn a_task_whose_second_result_does_not_fit_leaves_nothing_in_the_store() {
    let name = "a_task_whose_second_result_does_not_fit_leaves_nothing_in_the_store";
    if !in_child(name, &[("PRISM_OBJECT_SPILLING", "false")]) {
        return;
    }
    prism::init(small_store()).unwrap();
    // Two 5 MiB results in an 8 MiB store: the second cannot be stored.
    let (first, second) = two_blocks::remote(5 << 20).unwrap();
    for result in [prism::get(&second), prism::get(&first)] {
        let e = result.unwrap_err();
        assert!(e.to_string().contains("asked for"), "{e}");
    }
    // The first result's copy went with the failed answer: the store has
    // room for 7 MiB again.
    put_once_there_is_room(7 << 20, "the first result's copy is deleted");
    prism::shutdown();
}

/// `count` blocks of `len` bytes, made one by one; with `read` named,
/// each after the file `read/<i - 1>` appeared (10 s at most), which the
/// caller writes once it read the block before.
#[prism::remote(num_returns = "streaming")]
fn blocks(count: u8, len: usize, read: Option<String>) -> impl Iterator<Item = Vec<u8>> {
    (0..count).map(move |seed| {
        if let (Some(read), Some(before)) = (&read, seed.checked_sub(1)) {
            let mark = Path::new(read).join(before.to_string());
            let start = Instant::now();
            while !mark.exists() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        pattern(seed, len)
    })
}

#[test]
fn a_stream_larger_than_the_store_flows_through_it_and_a_dropped_one_is_freed() {
    let name = "a_stream_larger_than_the_store_flows_through_it_and_a_dropped_one_is_freed";
    if !in_child(name, &[("PRISM_OBJECT_SPILLING", "false")]) {
        return;
    }
    prism::init(small_store()).unwrap();
    // 8 x 1.5 MiB through an 8 MiB store: each value is made once the
    // one before was read, and dropped as the next is made, so the store
    // holds three at most (one read, one made, one dropped on its way
    // out).
    let len = 3 << 19;
    let read = std::env::temp_dir().join(format!("prism-stream-read-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&read);
    std::fs::create_dir_all(&read).unwrap();
    let mut seen = 0u8;
    for r in blocks::remote(8, len, Some(read.display().to_string())).unwrap() {
        let r = r.unwrap();
        // Taking the next value waits for the task to have made it.
        assert_eq!(prism::get(&r).unwrap(), pattern(seen, len));
        drop(r);
        std::fs::write(read.join(seen.to_string()), "").unwrap();
        seen += 1;
    }
    assert_eq!(seen, 8);
    let _ = std::fs::remove_dir_all(&read);
    // Values never taken are freed with their generator: three 1.5 MiB
    // values made, then dropped unread, leave room for 7 MiB.
    let stream = blocks::remote(3, len, None).unwrap();
    assert_eq!(prism::get(stream.completed()).unwrap(), 3);
    drop(stream);
    put_once_there_is_room(7 << 20, "the stream's values are freed with it");
    prism::shutdown();
}

#[test]
fn bad_spill_settings_fail_init_naming_the_setting() {
    let name = "bad_spill_settings_fail_init_naming_the_setting";
    if !in_child(name, &[]) {
        return;
    }
    let mut config = small_store();
    config.object_spilling_threshold = 1.5;
    let err = prism::init(config).unwrap_err();
    assert!(
        err.to_string().contains("object_spilling_threshold"),
        "{err}"
    );
    let err =
        prism::init(small_store().object_spill_dir("/proc/prism-cannot-write-here")).unwrap_err();
    assert!(err.to_string().contains("object_spill_dir"), "{err}");
}

#[prism::remote]
fn linger(ms: u64) -> u32 {
    std::thread::sleep(Duration::from_millis(ms));
    std::process::id()
}

#[test]
fn past_the_memory_threshold_the_newest_task_is_stopped_and_its_error_says_why() {
    let name = "past_the_memory_threshold_the_newest_task_is_stopped_and_its_error_says_why";
    // Any machine is past a threshold of 0.01%: every task gets stopped.
    let env = [
        ("PRISM_MEMORY_USAGE_THRESHOLD", "0.0001"),
        ("PRISM_MEMORY_MONITOR_REFRESH_MS", "20"),
    ];
    if !in_child(name, &env) {
        return;
    }
    must(prism::init(small_store()), "a cluster starts");
    let once_retried = prism::TaskOptions::new().max_retries(1);
    let task = linger::remote_with(once_retried, 20_000).unwrap();
    let err = prism::get_timeout(&task, Duration::from_secs(60)).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::WorkerDied { reason, .. } if reason.contains("memory monitor")),
        "{text}"
    );
    assert!(text.contains("memory_usage_threshold = 0.0001"), "{text}");
    assert!(
        text.contains("attempt 1"),
        "it was retried once first: {text}"
    );
    // The driver and the raylet were not touched.
    let value = must(prism::put(vec![5u8; 1 << 20]), "the node still serves puts");
    assert_eq!(prism::get(&value).unwrap().len(), 1 << 20);
    prism::shutdown();
}

#[test]
fn an_object_whose_spill_file_is_gone_is_reported_lost_by_name() {
    let name = "an_object_whose_spill_file_is_gone_is_reported_lost_by_name";
    if !in_child(name, &[]) {
        return;
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("prism-lost-test-{}", std::process::id()));
    must(
        prism::init(small_store().object_spill_dir(&dir)),
        "a cluster with a small store starts",
    );
    let len = 3 << 20;
    let first = must(prism::put(pattern(1, len)), "put");
    let _second = must(prism::put(pattern(2, len)), "put");
    let third = must(prism::put(pattern(3, len)), "a put that spills the first");
    must_eventually(
        "the first object is spilled",
        Duration::from_secs(10),
        || files_in(&dir) >= 1,
    );
    // The disk loses the spill files.
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        std::fs::remove_file(entry.path()).unwrap();
    }
    for _ in 0..2 {
        let err = prism::get(&first).unwrap_err();
        assert!(
            matches!(&err, Error::ObjectLost { cause, .. } if cause.contains("spill file")),
            "{err}"
        );
    }
    assert!(
        prism::get(&third).unwrap() == pattern(3, len),
        "objects in memory are intact"
    );
    prism::shutdown();
}
