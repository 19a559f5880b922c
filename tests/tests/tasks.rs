//! Remote functions through a real cluster: values, refs, many tasks,
//! wait, errors, resources, logs.

mod common;

use common::{cluster, must_eventually};
use prism::{Error, FailureKind, ObjectRef, TaskOptions};
use std::time::Duration;

#[prism::remote]
fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[prism::remote]
async fn add_async(a: i64, b: i64) -> i64 {
    tokio::task::yield_now().await;
    a + b
}

#[prism::remote]
fn sum_all(values: Vec<i64>) -> i64 {
    values.iter().sum()
}

#[prism::remote]
fn reverse(values: Vec<f64>) -> Vec<f64> {
    values.into_iter().rev().collect()
}

#[prism::remote]
fn sleep_then(ms: u64, value: i64) -> i64 {
    std::thread::sleep(Duration::from_millis(ms));
    value
}

#[prism::remote]
fn panics(message: String) -> i64 {
    panic!("{message}");
}

#[derive(Debug)]
struct NotFound(String);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no such key: {}", self.0)
    }
}

#[prism::remote]
fn lookup(key: String) -> Result<i64, NotFound> {
    if key == "answer" {
        Ok(42)
    } else {
        Err(NotFound(key))
    }
}

#[prism::remote]
fn exits_midway() -> i64 {
    std::process::exit(3);
}

#[prism::remote(num_gpus = 1)]
fn visible_gpus() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
}

#[prism::remote(num_gpus = 0.5)]
fn half_gpu() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
}

#[prism::remote(resource("special", 1.0), name = "tests.uses_special")]
fn uses_special() -> String {
    "ran".to_string()
}

#[prism::remote]
fn prints(marker: String) -> i64 {
    println!("{marker}");
    1
}

#[prism::remote]
fn submits_nested(n: i64) -> i64 {
    // A task may itself submit tasks and own their results.
    let r = add::remote(n, n).expect("a worker can submit tasks");
    prism::get(&r).expect("and get their results")
}

#[test]
fn tasks_take_values_and_refs_and_return_values() {
    cluster();
    let three = add::remote(1, 2).unwrap();
    assert_eq!(prism::get(&three).unwrap(), 3);
    let seven = add::remote(&three, 4).unwrap();
    assert_eq!(prism::get(&seven).unwrap(), 7);
    let put = prism::put(10i64).unwrap();
    assert_eq!(
        prism::get(&add::remote(&put, three.clone()).unwrap()).unwrap(),
        13
    );
    assert_eq!(prism::get(&add_async::remote(20, 22).unwrap()).unwrap(), 42);
    assert_eq!(
        prism::get(&submits_nested::remote(21).unwrap()).unwrap(),
        42
    );
}

#[test]
fn a_chain_of_refs_resolves_in_order() {
    cluster();
    let mut r = add::remote(0, 1).unwrap();
    for _ in 0..99 {
        r = add::remote(&r, 1).unwrap();
    }
    assert_eq!(prism::get(&r).unwrap(), 100);
}

#[test]
fn ten_thousand_concurrent_tasks_all_complete() {
    cluster();
    let refs: Vec<ObjectRef<i64>> = (0..10_000).map(|i| add::remote(i, 1).unwrap()).collect();
    let values = prism::get_many(&refs).unwrap();
    assert_eq!(values.len(), 10_000);
    assert!(values.iter().enumerate().all(|(i, v)| *v == i as i64 + 1));
}

#[test]
fn a_hundred_thousand_element_array_round_trips() {
    cluster();
    let values: Vec<f64> = (0..100_000).map(|i| i as f64 * 1.5).collect();
    let back = prism::get(&reverse::remote(values.clone()).unwrap()).unwrap();
    let expected: Vec<f64> = values.into_iter().rev().collect();
    assert_eq!(back, expected);
    let ints: Vec<i64> = (0..100_000).collect();
    assert_eq!(
        prism::get(&sum_all::remote(ints).unwrap()).unwrap(),
        4_999_950_000
    );
}

#[test]
fn wait_keeps_input_order_in_both_lists() {
    cluster();
    // Zero-CPU tasks each get a worker, so the sleepers block no one.
    let no_cpu = TaskOptions::new().num_cpus(0.0);
    let refs: Vec<ObjectRef<i64>> = [5000u64, 0, 5000, 0, 0]
        .iter()
        .enumerate()
        .map(|(i, ms)| sleep_then::remote_with(no_cpu.clone(), *ms, i as i64).unwrap())
        .collect();
    let (ready, pending) = prism::wait(&refs, 3, Some(Duration::from_secs(20))).unwrap();
    let ready_values: Vec<i64> = ready.iter().map(|r| prism::get(r).unwrap()).collect();
    assert_eq!(
        ready_values,
        vec![1, 3, 4],
        "ready refs must keep input order"
    );
    assert_eq!(pending, vec![refs[0].clone(), refs[2].clone()]);
    let (all, none) = prism::wait(&refs, 5, None).unwrap();
    assert_eq!(all, refs);
    assert!(none.is_empty());
    let (one, rest) = prism::wait(&refs, 1, None).unwrap();
    assert_eq!(
        one,
        vec![refs[0].clone()],
        "at most num_returns refs are ready, the first in order"
    );
    assert_eq!(rest, refs[1..].to_vec());
}

#[test]
fn wait_rejects_more_returns_than_refs_and_duplicates() {
    cluster();
    let r = add::remote(1, 1).unwrap();
    let err = prism::wait(std::slice::from_ref(&r), 2, None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = prism::wait(&[r.clone(), r], 1, None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

#[test]
fn get_with_a_timeout_gives_a_timeout_error() {
    cluster();
    let slow = sleep_then::remote(3000, 1).unwrap();
    let err = prism::get_timeout(&slow, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, Error::GetTimeout { .. }), "{err}");
    let refs = vec![add::remote(1, 1).unwrap(), slow];
    let err = prism::get_many_timeout(&refs, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, Error::GetTimeout { total: 2, .. }), "{err}");
}

#[test]
fn a_panic_reaches_the_caller_with_message_function_and_worker() {
    cluster();
    let err = prism::get(&panics::remote("boom at step 7".to_string()).unwrap()).unwrap_err();
    match err {
        Error::TaskFailed {
            function,
            message,
            kind,
            pid,
            ..
        } => {
            assert!(function.ends_with("::panics"), "{function}");
            assert_eq!(message, "boom at step 7");
            assert_eq!(kind, FailureKind::Panic);
            assert_ne!(pid, std::process::id(), "it must have run in a worker");
        }
        other => panic!("expected TaskFailed, got {other}"),
    }
    // The worker survives a panic.
    assert_eq!(prism::get(&add::remote(2, 2).unwrap()).unwrap(), 4);
}

#[test]
fn available_resources_are_at_most_the_totals() {
    cluster();
    let (total, _) = prism::cluster_resources().unwrap();
    let total = total.to_f64_map();
    let free = prism::available_resources().unwrap().to_f64_map();
    assert!(total["CPU"] >= 1.0, "{total:?}");
    for (name, amount) in &free {
        assert!(
            *amount <= total.get(name).copied().unwrap_or(0.0),
            "{name}: {free:?} against {total:?}"
        );
    }
}

#[test]
fn a_borrowed_value_or_a_slice_passes_for_an_owned_parameter() {
    cluster();
    let values = vec![1i64, 2, 3];
    let reversed = vec![1.5f64, 2.5];
    assert_eq!(prism::get(&sum_all::remote(&values).unwrap()).unwrap(), 6);
    assert_eq!(
        prism::get(&sum_all::remote(&values[1..]).unwrap()).unwrap(),
        5
    );
    // A flat buffer sent from a borrow arrives as the owned one would.
    let back = prism::get(&reverse::remote(&reversed).unwrap()).unwrap();
    assert_eq!(back, vec![2.5, 1.5]);
    assert_eq!(values, vec![1, 2, 3], "still the caller's");
}

#[test]
fn a_str_or_a_borrowed_string_passes_for_a_string_parameter() {
    cluster();
    let key = String::from("answer");
    let by_str = lookup::remote("answer").unwrap();
    let by_borrow = lookup::remote(&key).unwrap();
    assert_eq!(prism::get(&by_str).unwrap(), 42);
    assert_eq!(prism::get(&by_borrow).unwrap(), 42);
    // The value is sent as a `String` would be: an `Err` names it back.
    let err = prism::get(&lookup::remote("question").unwrap()).unwrap_err();
    assert!(err.to_string().contains("no such key: question"), "{err}");
}

#[test]
fn an_err_return_is_a_typed_failure_with_its_display() {
    cluster();
    assert_eq!(
        prism::get(&lookup::remote("answer".to_string()).unwrap()).unwrap(),
        42
    );
    let err = prism::get(&lookup::remote("question".to_string()).unwrap()).unwrap_err();
    assert!(
        matches!(&err, Error::TaskFailed { kind: FailureKind::Error, message, .. } if message == "no such key: question"),
        "{err}"
    );
}

#[test]
fn a_failed_dependency_fails_the_dependent_task() {
    cluster();
    let bad = panics::remote("upstream".to_string()).unwrap();
    let err = prism::get(&add::remote(&bad, 1).unwrap()).unwrap_err();
    assert!(
        matches!(&err, Error::TaskFailed { message, .. } if message == "upstream"),
        "{err}"
    );
}

#[test]
fn an_unknown_function_name_is_a_clear_error() {
    cluster();
    let r: ObjectRef<i64> =
        prism::__private::submit_task("no::such::function", TaskOptions::new(), vec![]).unwrap();
    let err = prism::get(&r).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownFunction { name, .. } if name == "no::such::function"),
        "{err}"
    );
}

#[test]
fn a_worker_that_dies_mid_task_gives_an_error_not_a_hang() {
    cluster();
    let err =
        prism::get_timeout(&exits_midway::remote().unwrap(), Duration::from_secs(30)).unwrap_err();
    assert!(matches!(err, Error::WorkerDied { .. }), "{err}");
    // The pool recovers.
    assert_eq!(prism::get(&add::remote(3, 3).unwrap()).unwrap(), 6);
}

/// Needs a resource no node has.
#[prism::remote(resource("nowhere", 1.0))]
fn needs_nowhere() -> i64 {
    1
}

/// Asks for more CPUs than the test cluster has.
#[prism::remote(num_cpus = 64)]
fn needs_many_cpus() -> i64 {
    2
}

#[test]
fn call_options_override_the_attributes_field_by_field() {
    cluster();
    // Options that say nothing of resources keep the attribute's.
    let err = needs_nowhere::remote_with(TaskOptions::new().max_retries(0)).unwrap_err();
    assert!(
        matches!(err, Error::Infeasible { .. }) && err.to_string().contains("nowhere"),
        "the attribute's resource is kept: {err}"
    );
    // Options that set one replace the attribute's.
    let two = needs_many_cpus::remote_with(TaskOptions::new().num_cpus(1.0)).unwrap();
    assert_eq!(prism::get(&two).unwrap(), 2);
}

#[test]
fn an_infeasible_request_fails_at_once_naming_shape_and_total() {
    cluster();
    let err = add::remote_with(TaskOptions::new().num_cpus(64.0), 1, 1).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Infeasible { .. }), "{text}");
    assert!(
        text.contains("CPU: 64") && text.contains("CPU: 2"),
        "{text}"
    );
    let err = add::remote_with(TaskOptions::new().resource("unicorn", 1.0), 1, 1).unwrap_err();
    assert!(err.to_string().contains("unicorn"), "{err}");
}

#[test]
fn zero_or_negative_resources_are_rejected() {
    cluster();
    let err = add::remote_with(TaskOptions::new().num_cpus(-1.0), 1, 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = add::remote_with(TaskOptions::new().resource("special", 0.0), 1, 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

#[test]
fn gpu_tasks_see_their_devices_and_fractions_share_one() {
    cluster();
    let whole = prism::get(&visible_gpus::remote().unwrap()).unwrap();
    assert!(
        whole == "0" || whole == "1",
        "CUDA_VISIBLE_DEVICES was {whole:?}"
    );
    let halves: Vec<String> = (0..4)
        .map(|_| half_gpu::remote().unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|r| prism::get(r).unwrap())
        .collect();
    assert!(halves.iter().all(|h| h == "0" || h == "1"), "{halves:?}");
}

#[test]
fn custom_resources_schedule_and_the_name_option_registers() {
    cluster();
    assert_eq!(prism::get(&uses_special::remote().unwrap()).unwrap(), "ran");
    assert_eq!(uses_special::NAME, "tests.uses_special");
}

#[test]
fn scheduling_strategies_on_a_single_node_cluster() {
    cluster();
    let here = prism::runtime_context().unwrap().node_id;
    let spread = prism::TaskOptions::new().scheduling_strategy(prism::SchedulingStrategy::Spread);
    assert_eq!(
        prism::get(&add::remote_with(spread, 1, 2).unwrap()).unwrap(),
        3
    );
    let pinned = |node_id, soft| {
        prism::TaskOptions::new()
            .scheduling_strategy(prism::SchedulingStrategy::NodeAffinity { node_id, soft })
    };
    assert_eq!(
        prism::get(&add::remote_with(pinned(here, false), 2, 2).unwrap()).unwrap(),
        4
    );
    let elsewhere = prism::NodeId::new();
    assert_eq!(
        prism::get(&add::remote_with(pinned(elsewhere, true), 3, 3).unwrap()).unwrap(),
        6,
        "a soft affinity to a node that is not there runs the task anyway"
    );
    let err = prism::get(&add::remote_with(pinned(elsewhere, false), 4, 4).unwrap()).unwrap_err();
    assert!(err.to_string().contains("not a live node"), "{err}");
    assert!(err.to_string().contains(&elsewhere.to_string()), "{err}");
}

#[test]
fn objectrefs_can_be_awaited_from_async_code() {
    cluster();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let v = rt.block_on(async {
        let r = add::remote(5, 6).unwrap();
        let a = (&r).await.unwrap();
        let b = add::remote(&r, 1).unwrap().await.unwrap();
        a + b
    });
    assert_eq!(v, 23);
}

#[test]
fn worker_output_is_captured_in_the_session_logs() {
    cluster();
    let marker = format!("marker-{}", std::process::id());
    assert_eq!(
        prism::get(&prints::remote(marker.clone()).unwrap()).unwrap(),
        1
    );
    let logs = prism::runtime_context().unwrap().session_dir.join("logs");
    must_eventually(
        "the marker reaches a worker .out file",
        Duration::from_secs(10),
        || {
            std::fs::read_dir(&logs).unwrap().flatten().any(|e| {
                e.file_name().to_string_lossy().ends_with(".out")
                    && std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .contains(&marker)
            })
        },
    );
    assert!(std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("driver-")));
}

#[prism::remote]
fn fan_out(depth: u32) -> u64 {
    if depth == 0 {
        return 1;
    }
    let children: Vec<ObjectRef<u64>> = (0..2)
        .map(|_| fan_out::remote(depth - 1).expect("submit a child"))
        .collect();
    prism::get_many(&children)
        .expect("children finish")
        .into_iter()
        .sum()
}

#[test]
fn nested_gets_do_not_deadlock_a_full_node() {
    cluster();
    // 2 + 4 + 8 tasks each block in get while holding one of the node's two
    // CPUs; blocked workers lend their CPUs back so the leaves can run.
    let leaves = prism::get_timeout(&fan_out::remote(3).unwrap(), Duration::from_secs(60)).unwrap();
    assert_eq!(leaves, 8);
    let refs: Vec<_> = (0..4).map(|_| fan_out::remote(2).unwrap()).collect();
    assert_eq!(
        prism::get_many_timeout(&refs, Duration::from_secs(60)).unwrap(),
        vec![4; 4]
    );
}

/// Dies on its first attempt (the marker file does not exist yet), then
/// returns 7.
#[prism::remote]
fn dies_once(marker: String) -> i64 {
    let marker = std::path::Path::new(&marker);
    if !marker.exists() {
        let _ = std::fs::write(marker, b"");
        std::process::exit(3);
    }
    7
}

/// Fails on its first attempt, then returns 8.
#[prism::remote]
fn fails_once(marker: String) -> Result<i64, String> {
    let marker = std::path::Path::new(&marker);
    if !marker.exists() {
        let _ = std::fs::write(marker, b"");
        return Err("not yet".into());
    }
    Ok(8)
}

/// `fails_once` with its retries on the attribute.
#[prism::remote(max_retries = 1, retry_exceptions = true)]
fn fails_once_retried(marker: String) -> Result<i64, String> {
    fails_once(marker)
}

/// `dies_once` that may not be retried, from its attribute.
#[prism::remote(max_retries = 0)]
fn dies_once_unretried(marker: String) -> i64 {
    dies_once(marker)
}

fn marker(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("prism-retry-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path.display().to_string()
}

#[test]
fn a_task_whose_worker_dies_is_retried_and_the_caller_sees_only_the_result() {
    cluster();
    let m = marker("dies");
    let value = prism::get_timeout(
        &dies_once::remote(m.clone()).unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(value.unwrap(), 7, "the second attempt answers");
    let _ = std::fs::remove_file(&m);
    // With retries off, the worker's death is the answer.
    let m = marker("dies-no-retry");
    let once = TaskOptions::new().max_retries(0);
    let err = prism::get_timeout(
        &dies_once::remote_with(once, m.clone()).unwrap(),
        Duration::from_secs(30),
    )
    .unwrap_err();
    assert!(matches!(err, Error::WorkerDied { .. }), "{err}");
    let _ = std::fs::remove_file(&m);
}

#[test]
fn a_final_error_says_how_many_attempts_were_made_and_why() {
    cluster();
    let twice = TaskOptions::new().max_retries(1);
    let err = prism::get_timeout(
        &exits_midway::remote_with(twice).unwrap(),
        Duration::from_secs(30),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::WorkerDied { .. }), "{text}");
    assert!(
        text.contains("attempt 2 of 2") && text.contains("attempt 1:"),
        "{text}"
    );
}

#[test]
fn retries_set_on_the_attribute_apply_and_call_options_override_them() {
    cluster();
    let m = marker("attr-fails");
    assert_eq!(
        prism::get(&fails_once_retried::remote(m.clone()).unwrap()).unwrap(),
        8,
        "retry_exceptions = true on the attribute"
    );
    let _ = std::fs::remove_file(&m);
    let off = TaskOptions::new().max_retries(0);
    let err = prism::get(&fails_once_retried::remote_with(off, m.clone()).unwrap()).unwrap_err();
    assert!(matches!(err, Error::TaskFailed { .. }), "{err}");
    let _ = std::fs::remove_file(&m);
    let m = marker("attr-dies");
    let err = prism::get_timeout(
        &dies_once_unretried::remote(m.clone()).unwrap(),
        Duration::from_secs(30),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::WorkerDied { .. }),
        "max_retries = 0: {err}"
    );
    let _ = std::fs::remove_file(&m);
    // Whole numbers pass where amounts are asked for, as in Ray.
    let whole = TaskOptions::new().num_cpus(1).num_gpus(0).max_retries(0);
    assert_eq!(
        prism::get(&add::remote_with(whole, 1, 2).unwrap()).unwrap(),
        3
    );
}

#[test]
fn application_errors_are_retried_only_when_asked() {
    cluster();
    let m = marker("fails");
    let err = prism::get(&fails_once::remote(m.clone()).unwrap()).unwrap_err();
    assert!(
        matches!(err, Error::TaskFailed { .. }),
        "not retried by default: {err}"
    );
    let _ = std::fs::remove_file(&m);
    let retried = TaskOptions::new().retry_exceptions(true);
    assert_eq!(
        prism::get(&fails_once::remote_with(retried, m.clone()).unwrap()).unwrap(),
        8
    );
    let _ = std::fs::remove_file(&m);
    let err = fails_once::remote_with(TaskOptions::new().max_retries(-2), m).unwrap_err();
    assert!(err.to_string().contains("max_retries"), "{err}");
}

#[test]
fn application_errors_can_be_retried_only_when_they_match() {
    cluster();
    let m = marker("fails-matching");
    // "not yet" is the first attempt's error: retried when asked for it.
    let matching = TaskOptions::new().retry_exceptions_matching(["not yet"]);
    assert_eq!(
        prism::get(&fails_once::remote_with(matching, m.clone()).unwrap()).unwrap(),
        8
    );
    let _ = std::fs::remove_file(&m);
    let other = TaskOptions::new().retry_exceptions_matching(["timeout"]);
    let err = prism::get(&fails_once::remote_with(other, m.clone()).unwrap()).unwrap_err();
    assert!(err.to_string().contains("not yet"), "{err}");
    let _ = std::fs::remove_file(&m);
    let empty = TaskOptions::new().retry_exceptions_matching([""]);
    let err = fails_once::remote_with(empty, m).unwrap_err();
    assert!(
        err.to_string().contains("retry_exceptions_matching"),
        "{err}"
    );
}

/// Writes file `i` in `dir`.
#[prism::remote]
fn mark(dir: String, i: u32) -> u32 {
    match std::fs::write(std::path::Path::new(&dir).join(i.to_string()), b"") {
        Ok(()) => i,
        Err(_) => u32::MAX,
    }
}

/// Waits (at most 30 s) until `n` files are in `dir`; returns how many
/// it saw.
#[prism::remote]
fn wait_for_marks(dir: String, n: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        if seen >= n || std::time::Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Short tasks first: the submitter then sends tasks of this shape to
/// its workers several at a time.
fn warm_up_pipelining() {
    let refs: Vec<_> = (0..500).map(|i| add::remote(i, 1).unwrap()).collect();
    assert_eq!(prism::get_many(&refs).unwrap().len(), 500);
}

#[test]
fn a_task_waiting_for_tasks_sent_after_it_does_not_hold_them_up() {
    cluster();
    let dir = std::env::temp_dir().join(format!("prism-marks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display().to_string();
    warm_up_pipelining();
    // The tasks after the waiter are sent in the same burst: some go to
    // its worker behind it, and come back to go elsewhere once it has run
    // long, or it would wait for them for ever.
    let before: Vec<_> = (0..200).map(|i| add::remote(i, 1).unwrap()).collect();
    let waiter = wait_for_marks::remote(d.clone(), 200).unwrap();
    let marks: Vec<_> = (0..200)
        .map(|i| mark::remote(d.clone(), i).unwrap())
        .collect();
    assert_eq!(
        prism::get_timeout(&waiter, Duration::from_secs(60)).unwrap(),
        200,
        "the waiter saw every task sent after it run"
    );
    let marked = prism::get_many_timeout(&marks, Duration::from_secs(60)).unwrap();
    assert_eq!(marked, (0..200).collect::<Vec<u32>>());
    assert_eq!(prism::get_many(&before).unwrap().len(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tasks_queued_on_a_worker_that_dies_are_sent_again() {
    cluster();
    warm_up_pipelining();
    let m = marker("dies-in-a-burst");
    let mut refs: Vec<_> = (0..300).map(|i| add::remote(i, 1).unwrap()).collect();
    let dies = dies_once::remote(m.clone()).unwrap();
    refs.extend((300..600).map(|i| add::remote(i, 1).unwrap()));
    assert_eq!(
        prism::get_timeout(&dies, Duration::from_secs(60)).unwrap(),
        7
    );
    let values = prism::get_many_timeout(&refs, Duration::from_secs(60)).unwrap();
    assert!(values.iter().enumerate().all(|(i, v)| *v == i as i64 + 1));
    let _ = std::fs::remove_file(&m);
}

#[test]
fn a_task_that_may_not_be_retried_is_never_lost_with_another_tasks_worker() {
    cluster();
    warm_up_pipelining();
    // Tasks without retries are never queued behind another task, nor
    // another behind them: a worker that exits takes only its own task.
    let once = TaskOptions::new().max_retries(0);
    let mut refs: Vec<_> = (0..200)
        .map(|i| add::remote_with(once.clone(), i, 1).unwrap())
        .collect();
    let exits: Vec<_> = (0..3)
        .map(|_| exits_midway::remote_with(once.clone()).unwrap())
        .collect();
    refs.extend((200..400).map(|i| add::remote_with(once.clone(), i, 1).unwrap()));
    let values = prism::get_many_timeout(&refs, Duration::from_secs(60)).unwrap();
    assert!(values.iter().enumerate().all(|(i, v)| *v == i as i64 + 1));
    for e in &exits {
        let err = prism::get_timeout(e, Duration::from_secs(30)).unwrap_err();
        assert!(matches!(err, Error::WorkerDied { .. }), "{err}");
    }
}

/// Bounds each wait for a result of a call with `num_returns`.
const WITHIN: Duration = Duration::from_secs(30);

/// Three values, each stored as its own object: a number, `n` bytes (in
/// the store when large) and a label.
#[prism::remote(num_returns = 3)]
fn split(n: usize) -> (usize, Vec<u8>, String) {
    (n, vec![7u8; n], format!("n={n}"))
}

#[prism::remote(num_returns = 2)]
fn div_mod(a: i64, b: i64) -> Result<(i64, i64), String> {
    if b == 0 {
        return Err(format!("{a} divided by zero"));
    }
    Ok((a / b, a % b))
}

#[prism::remote]
fn length(bytes: Vec<u8>) -> usize {
    bytes.len()
}

#[test]
fn a_task_with_num_returns_gives_one_ref_per_value() {
    cluster();
    let big = 3 << 20;
    let (count, bytes, label) = split::remote(big).unwrap();
    assert!(count.id() != bytes.id() && bytes.id() != label.id());
    // Each is read on its own, in any order.
    assert_eq!(
        prism::get_timeout(&label, WITHIN).unwrap(),
        format!("n={big}")
    );
    assert_eq!(prism::get_timeout(&count, WITHIN).unwrap(), big);
    // And passed on on its own: the large one by reference.
    let len = length::remote(&bytes).unwrap();
    assert_eq!(prism::get_timeout(&len, WITHIN).unwrap(), big);
    let got = prism::get_timeout(&bytes, WITHIN).unwrap();
    assert!(got.len() == big && got.iter().all(|b| *b == 7));

    // Small values travel in the answer.
    let (count, bytes, label) = split::remote(4).unwrap();
    assert_eq!(prism::get_timeout(&bytes, WITHIN).unwrap(), vec![7u8; 4]);
    assert_eq!(prism::get_timeout(&count, WITHIN).unwrap(), 4);
    assert_eq!(prism::get_timeout(&label, WITHIN).unwrap(), "n=4");

    // Dropping some refs leaves the others' values.
    let (count, bytes, label) = split::remote(big).unwrap();
    drop(count);
    drop(bytes);
    assert_eq!(
        prism::get_timeout(&label, WITHIN).unwrap(),
        format!("n={big}")
    );

    // `wait` and `get_many` take them like any refs.
    let (q, r) = div_mod::remote(17, 5).unwrap();
    let (ready, _) = prism::wait(&[q.clone(), r.clone()], 2, Some(WITHIN)).unwrap();
    assert_eq!(ready.len(), 2);
    assert_eq!(
        prism::get_many_timeout(&[q, r], WITHIN).unwrap(),
        vec![3, 2]
    );
}

#[test]
fn a_failed_task_with_num_returns_fails_every_ref() {
    cluster();
    let (q, r) = div_mod::remote(1, 0).unwrap();
    for outcome in [
        prism::get_timeout(&r, WITHIN),
        prism::get_timeout(&q, WITHIN),
    ] {
        match outcome {
            Err(Error::TaskFailed { message, kind, .. }) => {
                assert_eq!(kind, FailureKind::Error);
                assert!(message.contains("1 divided by zero"), "{message}");
            }
            other => panic!("expected TaskFailed, got {other:?}"),
        }
    }
}

/// Values `0..n`, every `big_every`-th one (from the first) with 300 KiB
/// of bytes (stored in the object store); after the first, waits (30 s at
/// most) for the file `gate`, if one is named.
#[prism::remote(num_returns = "streaming")]
fn numbered(n: u64, big_every: u64, gate: Option<String>) -> impl Iterator<Item = (u64, Vec<u8>)> {
    (0..n).map(move |i| {
        if i == 1 {
            if let Some(gate) = &gate {
                let start = std::time::Instant::now();
                while !std::path::Path::new(gate).exists() && start.elapsed() < WITHIN {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        let bytes = if big_every > 0 && i % big_every == 0 {
            vec![i as u8; 300 << 10]
        } else {
            Vec::new()
        };
        (i, bytes)
    })
}

/// `0..n`, failing at `fail_at`; fails before any value when `n` is 0.
#[prism::remote(num_returns = "streaming")]
fn until_failure(
    n: u64,
    fail_at: u64,
) -> Result<Box<dyn Iterator<Item = Result<u64, String>> + Send>, String> {
    if n == 0 {
        return Err("nothing to stream".into());
    }
    Ok(Box::new((0..n).map(move |i| {
        if i == fail_at {
            Err(format!("value {i} failed"))
        } else {
            Ok(i * 10)
        }
    })))
}

/// The labels of `0..n`, from a named type (`Vec<String>`).
#[prism::remote(num_returns = "streaming")]
fn labels(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("label {i}")).collect()
}

/// `0..n`; the first run's worker exits after sending `die_after`
/// values (the marker file `once` tells the runs apart).
#[prism::remote(num_returns = "streaming", max_retries = 2)]
fn dies_midway(n: u64, die_after: u64, once: String) -> impl Iterator<Item = u64> {
    let first_run = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&once)
        .is_ok();
    (0..n).inspect(move |&i| {
        if first_run && i == die_after {
            std::process::exit(3);
        }
    })
}

fn gate_file(test: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("prism-stream-{test}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn a_streaming_task_hands_out_each_value_as_it_is_made() {
    cluster();
    let gate = gate_file("gate");
    let mut stream = numbered::remote(6, 2, Some(gate.display().to_string())).unwrap();
    // The first value arrives while the task waits for the gate: it was
    // handed out before the task ended.
    let first = stream.next().expect("a first value").unwrap();
    let (i, bytes) = prism::get_timeout(&first, WITHIN).unwrap();
    assert_eq!((i, bytes.len()), (0, 300 << 10));
    assert!(
        prism::get_timeout(stream.completed(), Duration::from_millis(200)).is_err(),
        "the task still runs"
    );
    // Waiting for a value not made yet gives a timeout, and the stream
    // goes on from where it was.
    let early = stream.next_timeout(Duration::from_millis(100));
    assert!(
        matches!(early, Some(Err(Error::GetTimeout { .. }))),
        "{early:?}"
    );
    std::fs::write(&gate, "").unwrap();
    let rest: Vec<ObjectRef<(u64, Vec<u8>)>> =
        stream.by_ref().map(|r| r.expect("a value")).collect();
    assert_eq!(rest.len(), 5);
    for (k, r) in rest.iter().enumerate() {
        let (i, bytes) = prism::get_timeout(r, WITHIN).unwrap();
        let i_expected = k as u64 + 1;
        assert_eq!(i, i_expected);
        let big = i % 2 == 0;
        assert_eq!(bytes.len(), if big { 300 << 10 } else { 0 }, "value {i}");
        assert!(bytes.iter().all(|&b| b == i as u8));
    }
    assert!(stream.next().is_none(), "the end stays the end");
    assert_eq!(prism::get_timeout(stream.completed(), WITHIN).unwrap(), 6);
    // A value is an object like any: passed on by reference, it is read
    // by another task (the stored one from the store).
    let length_of = |r: &ObjectRef<(u64, Vec<u8>)>| {
        prism::get_timeout(
            &sum_all::remote(vec![prism::get(r).unwrap().1.len() as i64]).unwrap(),
            WITHIN,
        )
        .unwrap()
    };
    assert_eq!(length_of(&rest[1]), 300 << 10);
    let _ = std::fs::remove_file(&gate);

    // A named iterable type streams its items.
    let labels: Vec<String> = labels::remote(3)
        .unwrap()
        .map(|r| prism::get_timeout(&r.unwrap(), WITHIN).unwrap())
        .collect();
    assert_eq!(labels, ["label 0", "label 1", "label 2"]);
    // An empty stream ends at once, with a count of 0.
    let mut empty = labels::remote(0).unwrap();
    assert!(empty.next().is_none());
    assert_eq!(prism::get_timeout(empty.completed(), WITHIN).unwrap(), 0);
}

#[test]
fn a_streaming_task_that_fails_gives_its_values_then_the_error() {
    cluster();
    let mut stream = until_failure::remote(5, 3).unwrap();
    let mut values = Vec::new();
    let error = loop {
        match stream.next() {
            Some(Ok(r)) => values.push(prism::get_timeout(&r, WITHIN).unwrap()),
            Some(Err(e)) => break e,
            None => panic!("the stream must fail, after {values:?}"),
        }
    };
    assert_eq!(values, [0, 10, 20], "the values made before the failure");
    match &error {
        Error::TaskFailed { message, kind, .. } => {
            assert_eq!(*kind, FailureKind::Error);
            assert_eq!(message, "value 3 failed");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    assert!(stream.next().is_none(), "nothing after the error");
    // An `Err` before the first value: the error at once.
    let mut stream = until_failure::remote(0, 0).unwrap();
    match stream.next() {
        Some(Err(Error::TaskFailed { message, .. })) => assert_eq!(message, "nothing to stream"),
        other => panic!("expected the task's error, got {other:?}"),
    }
    assert!(stream.next().is_none());
}

#[test]
fn a_streaming_task_retried_after_its_worker_died_gives_each_value_once() {
    cluster();
    let once = gate_file("once");
    let values: Vec<u64> = dies_midway::remote(7, 3, once.display().to_string())
        .unwrap()
        .map(|r| prism::get_timeout(&r.expect("a value"), WITHIN).unwrap())
        .collect();
    assert!(once.exists(), "the first run ran");
    assert_eq!(values, (0..7).collect::<Vec<_>>());
    let _ = std::fs::remove_file(&once);
}

#[test]
fn a_streaming_tasks_values_are_read_async() {
    cluster();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let total = rt.block_on(async {
        let mut stream = numbered::remote(4, 0, None).unwrap();
        let mut total = 0;
        while let Some(r) = stream.next_async().await {
            total += r.unwrap().await.unwrap().0;
        }
        total
    });
    assert_eq!(total, 6);
}

/// `0..n`, each value noted as the file `dir/<i>` as it is made.
#[prism::remote(num_returns = "streaming")]
fn noted(n: u32, dir: String) -> impl Iterator<Item = u32> {
    (0..n).inspect(move |i| {
        let _ = std::fs::write(std::path::Path::new(&dir).join(i.to_string()), "");
    })
}

#[test]
fn a_streaming_task_with_backpressure_pauses_until_its_values_are_read() {
    cluster();
    let dir = gate_file("noted");
    std::fs::create_dir_all(&dir).unwrap();
    let made = || std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let paced = TaskOptions::new().generator_backpressure(2);
    let mut stream = noted::remote_with(paced, 50, dir.display().to_string()).unwrap();
    // Nothing read yet: 2 values wait unread, 2 more are on their way,
    // and the task stops in the send of the one after: 5 made.
    must_eventually("the task makes its first values", WITHIN, || made() >= 5);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(made(), 5, "the task pauses while its values wait unread");
    // Reading lets it go on, to the end.
    let values: Vec<u32> = stream
        .by_ref()
        .map(|r| prism::get_timeout(&r.unwrap(), WITHIN).unwrap())
        .collect();
    assert_eq!(values, (0..50).collect::<Vec<_>>());
    assert_eq!(made(), 50);
    let _ = std::fs::remove_dir_all(&dir);
    // A cancel ends a paused task: its held-back answers go.
    let dir = gate_file("noted-cancel");
    std::fs::create_dir_all(&dir).unwrap();
    let made = || std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let paced = TaskOptions::new().generator_backpressure(2);
    let stream = noted::remote_with(paced, 50, dir.display().to_string()).unwrap();
    must_eventually("the task makes its first values", WITHIN, || made() >= 5);
    stream.cancel(false).unwrap();
    match prism::get_timeout(stream.completed(), WITHIN) {
        Err(Error::TaskCancelled { .. }) => {}
        other => panic!("expected TaskCancelled, got {other:?}"),
    }
    assert!(made() < 50, "the task stopped early");
    let _ = std::fs::remove_dir_all(&dir);
    // No room for even one value is refused, naming the option.
    let refused = noted::remote_with(
        TaskOptions::new().generator_backpressure(0),
        1,
        String::new(),
    );
    match refused {
        Err(Error::InvalidArgument { .. }) => {
            let said = refused.unwrap_err().to_string();
            assert!(said.contains("generator_backpressure"), "{said}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
