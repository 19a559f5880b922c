//! The object store through a real cluster: zero-copy reads, reference
//! counting across processes, nested references.

mod common;

use common::{cluster, must_eventually};
use prism::{ObjectRef, View};
use std::time::Duration;

/// Private (anonymous) resident memory of this process, in KiB.
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Sums a buffer read in place and reports how much private memory grew.
#[prism::remote]
fn sum_in_place(values: View<f32>) -> (f64, bool, u64) {
    let before = rss_anon_kib();
    let total: f64 = values.iter().map(|v| *v as f64).sum();
    let grown = rss_anon_kib().saturating_sub(before);
    (total, values.is_zero_copy(), grown)
}

#[prism::remote]
fn sum_refs(refs: Vec<ObjectRef<i64>>) -> i64 {
    refs.iter()
        .map(|r| prism::get(r).expect("a nested ref resolves in the worker"))
        .sum()
}

#[prism::remote]
fn wrap(value: i64) -> Vec<ObjectRef<i64>> {
    vec![
        prism::put(value).expect("a worker can put"),
        prism::put(value + 1).expect("twice"),
    ]
}

#[prism::remote]
fn length(values: Vec<u8>) -> usize {
    values.len()
}

fn store_is_empty() -> bool {
    prism::object_store_stats()
        .map(|s| s.num_objects == 0 && s.used_bytes == 0)
        .unwrap_or(false)
}

/// The store and the driver's reference table are shared by every test in
/// this binary, and some tests count what they hold: they run one at a time.
static STORE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the rest of a test alone, starting from an empty store.
fn alone_with_an_empty_store() -> std::sync::MutexGuard<'static, ()> {
    let guard = STORE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    must_eventually(
        "the store starts empty",
        Duration::from_secs(10),
        store_is_empty,
    );
    guard
}

#[test]
fn a_worker_reads_a_100_mb_object_without_copying_it() {
    cluster();
    let _guard = STORE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let big = prism::put(vec![0.5f32; 25_000_000]).unwrap();
    let (total, zero_copy, grown_kib) = prism::get(&sum_in_place::remote(&big).unwrap()).unwrap();
    assert_eq!(total, 12_500_000.0);
    assert!(zero_copy, "a store object must be viewed in place");
    assert!(
        grown_kib < 10 * 1024,
        "reading 100 MB in place grew the worker's private memory by {grown_kib} KiB"
    );
    let view = prism::get_view(&big).unwrap();
    assert!(view.is_zero_copy());
    assert_eq!(view.len(), 25_000_000);
    assert_eq!(view[24_999_999], 0.5);
}

#[test]
fn store_usage_returns_to_zero_when_references_are_gone() {
    cluster();
    let _guard = alone_with_an_empty_store();
    let a = prism::put(vec![7u8; 4 << 20]).unwrap();
    let b = prism::put(vec![1.0f64; 1 << 20]).unwrap();
    let used = prism::object_store_stats().unwrap();
    assert_eq!(used.num_objects, 2);
    // An in-flight task and a view keep objects alive past their handles.
    let len = length::remote(&a).unwrap();
    let view = prism::get_view(&b).unwrap();
    drop(a);
    drop(b);
    assert_eq!(prism::get(&len).unwrap(), 4 << 20);
    assert_eq!(view.len(), 1 << 20);
    drop(view);
    must_eventually(
        "store usage returns to zero",
        Duration::from_secs(10),
        store_is_empty,
    );
}

#[test]
fn large_arguments_and_results_go_through_the_store_and_are_freed() {
    cluster();
    let _guard = alone_with_an_empty_store();
    let n = prism::get(&length::remote(vec![3u8; 1 << 20]).unwrap()).unwrap();
    assert_eq!(n, 1 << 20);
    must_eventually(
        "the argument's copy is freed",
        Duration::from_secs(10),
        store_is_empty,
    );
}

#[test]
fn refs_nested_in_values_stay_alive_and_resolve_anywhere() {
    cluster();
    let _guard = STORE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let inner: Vec<ObjectRef<i64>> = (0..10).map(|i| prism::put(i).unwrap()).collect();
    let outer = prism::put(inner.clone()).unwrap();
    drop(inner);
    let back = prism::get(&outer).unwrap();
    assert_eq!(prism::get_many(&back).unwrap(), (0..10).collect::<Vec<_>>());
    assert_eq!(prism::get(&sum_refs::remote(back).unwrap()).unwrap(), 45);
    let wrapped = prism::get(&wrap::remote(41).unwrap()).unwrap();
    assert_eq!(prism::get_many(&wrapped).unwrap(), vec![41, 42]);
}

#[test]
fn owned_objects_are_forgotten_when_dropped() {
    cluster();
    let _guard = STORE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = prism::runtime_context().unwrap().num_owned_objects;
    let refs: Vec<ObjectRef<i64>> = (0..100).map(|i| prism::put(i).unwrap()).collect();
    assert!(prism::runtime_context().unwrap().num_owned_objects >= before + 100);
    drop(refs);
    let after = prism::runtime_context().unwrap().num_owned_objects;
    assert!(
        after <= before + 5,
        "owned objects were not released: {before} -> {after}"
    );
}

#[test]
fn bytes_and_typed_buffers_round_trip() {
    cluster();
    let _guard = STORE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let b = bytes::Bytes::from(vec![9u8; 300_000]);
    assert_eq!(prism::get(&prism::put(b.clone()).unwrap()).unwrap(), b);
    let v: Vec<i32> = (0..200_000).collect();
    assert_eq!(prism::get(&prism::put(v.clone()).unwrap()).unwrap(), v);
    let small = prism::put(vec![1.5f64, 2.5]).unwrap();
    let view = prism::get_view(&small).unwrap();
    assert!(
        !view.is_zero_copy(),
        "small objects travel inline and are copied"
    );
    assert_eq!(&*view, &[1.5, 2.5]);
}

#[prism::actor]
struct Holder {
    held: Vec<ObjectRef<Vec<u8>>>,
}

#[prism::actor]
impl Holder {
    fn new() -> Self {
        Holder { held: Vec::new() }
    }

    fn hold(&mut self, refs: Vec<ObjectRef<Vec<u8>>>) -> usize {
        self.held.extend(refs);
        self.held.len()
    }
}

/// A 1 MiB vector of `byte`s (stored, not inline).
#[prism::remote]
fn filled(byte: u8) -> Vec<u8> {
    vec![byte; 1 << 20]
}

/// Owns one object at a time (and a task's result) and hands them out.
#[prism::actor]
struct Lender {
    object: Option<ObjectRef<Vec<u8>>>,
    result: Option<ObjectRef<Vec<u8>>>,
}

#[prism::actor]
impl Lender {
    fn new() -> Self {
        Lender {
            object: None,
            result: None,
        }
    }

    /// Runs a task that stores a vector of `byte`s: its result is owned
    /// by this actor (the task's caller), and kept.
    fn make_result(&mut self, byte: u8) -> Result<(), String> {
        let r = filled::remote(byte).map_err(|e| e.to_string())?;
        prism::wait(std::slice::from_ref(&r), 1, None).map_err(|e| e.to_string())?;
        self.result = Some(r);
        Ok(())
    }

    /// Puts a fresh object of `byte`s, owned by this actor.
    fn make(&mut self, byte: u8) -> Result<(), String> {
        self.object = Some(prism::put(vec![byte; 1 << 20]).map_err(|e| e.to_string())?);
        Ok(())
    }

    fn pid(&self) -> u32 {
        std::process::id()
    }

    /// Hands the object out; with `keep = false` lets go of its own handle,
    /// leaving the caller's borrow as the only thing holding it.
    fn lend(&mut self, keep: bool) -> Vec<ObjectRef<Vec<u8>>> {
        let out = self.object.iter().chain(&self.result).cloned().collect();
        if !keep {
            self.object = None;
        }
        out
    }
}

#[test]
fn an_object_lent_twice_to_one_process_outlives_the_first_borrows_end() {
    cluster();
    let _guard = alone_with_an_empty_store();
    let lender = Lender::remote().unwrap();
    for round in 0..30u8 {
        prism::get(&lender.make(round).unwrap()).unwrap();
        // The first borrow ends (its end-of-borrow is on its way to the
        // owner) while the second hand-out, from the owner's last handle,
        // is made: the object must live on for the second.
        let first = prism::get(&lender.lend(true).unwrap()).unwrap();
        drop(first);
        let second = prism::get(&lender.lend(false).unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let value = prism::get(&second[0]).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!((value.len(), value[0]), (1 << 20, round));
    }
    // And every borrow ended: nothing is left.
    must_eventually(
        "every lent object is freed once its borrows end",
        Duration::from_secs(10),
        store_is_empty,
    );
}

#[test]
fn a_borrower_that_dies_releases_what_it_borrowed() {
    cluster();
    let _guard = alone_with_an_empty_store();
    let holder = Holder::remote().unwrap();
    let big = prism::put(vec![5u8; 4 << 20]).unwrap();
    assert_eq!(
        prism::get(&holder.hold(vec![big.clone()]).unwrap()).unwrap(),
        1
    );
    drop(big);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        prism::object_store_stats().unwrap().num_objects,
        1,
        "the actor still borrows the object"
    );
    prism::kill(&holder).unwrap();
    must_eventually(
        "the object is freed once its only borrower is gone",
        Duration::from_secs(10),
        store_is_empty,
    );
}

#[test]
fn a_borrower_whose_owner_died_gets_owner_died_naming_the_object_and_owner() {
    // In a cluster of its own: it checks that the store ends up empty.
    let name = "a_borrower_whose_owner_died_gets_owner_died_naming_the_object_and_owner";
    if !common::in_own_process(name, &[], Duration::from_secs(120)) {
        return;
    }
    let c = cluster();
    let limit = Duration::from_secs(30);
    let lender = Lender::remote().unwrap();
    prism::get(&lender.make(9).unwrap()).unwrap();
    prism::get(&lender.make_result(8).unwrap()).unwrap();
    let borrowed = prism::get(&lender.lend(true).unwrap()).unwrap();
    assert_eq!(borrowed.len(), 2, "a put and a task's result");
    assert_eq!(
        prism::get(&borrowed[0]).unwrap()[0],
        9,
        "read while its owner lives"
    );
    let pid = prism::get(&lender.pid().unwrap()).unwrap();
    c.kill_worker(pid, limit);
    let err = prism::get_timeout(&borrowed[0], limit).unwrap_err();
    match &err {
        prism::Error::OwnerDied { object_id, .. } => assert_eq!(*object_id, borrowed[0].id()),
        other => panic!("expected OwnerDied, got {other}"),
    }
    assert!(
        err.to_string().contains(&borrowed[0].id().to_string()),
        "{err}"
    );
    let err = prism::get_timeout(&borrowed[1], limit).unwrap_err();
    assert!(matches!(err, prism::Error::OwnerDied { .. }), "{err}");
    // Neither copy had an owner left: the store freed both, the task's
    // result (owned by the dead actor, made by another worker) too.
    must_eventually("the dead owner's objects are freed", limit, store_is_empty);
}
