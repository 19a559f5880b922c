//! Objects between nodes: a 100 MB object pulled once into each node that
//! reads it (concurrent gets sharing one pull), freed everywhere with its
//! object, and lost with its node when its task may not run again; a pull
//! whose stream breaks tried again (with `--features failpoints`); and
//! objects lost with their node made again from their lineage (chains,
//! multi-result tasks, results owned by an actor on the dead node).
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    actor_on, affinity, drive_on_head, end_my_node, join_and_find_b_c, on, three_nodes, DRIVER,
    FAST_DEATH,
};
use prism_tests::must;
use std::time::{Duration, Instant};

// Used only by the fail-point test.
#[cfg(feature = "failpoints")]
use common::{text, Machines};
#[cfg(feature = "failpoints")]
use prism_tests::must_eventually;

/// Options that prefer `node` and run elsewhere when it is gone.
fn prefer(node: &prism::NodeInfo) -> prism::TaskOptions {
    prism::TaskOptions::new().scheduling_strategy(affinity(node, true))
}

/// `bytes` bytes made where it runs.
#[prism::remote]
fn fill(bytes: usize) -> Vec<u8> {
    (0..bytes).map(|i| (i % 251) as u8).collect()
}

/// Two blocks of `bytes` bytes made where it runs, each its own object
/// (the second shifted by one).
#[prism::remote(num_returns = 2)]
fn fill_pair(bytes: usize) -> (Vec<u8>, Vec<u8>) {
    let block: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let shifted = block.iter().map(|b| b + 1).collect();
    (block, shifted)
}

/// A small number (carried inline, not stored).
#[prism::remote]
fn size_of_block(size: usize) -> usize {
    size
}

/// Each byte of `data` plus one.
#[prism::remote]
fn shift(data: Vec<u8>) -> Vec<u8> {
    data.iter().map(|b| b.wrapping_add(1)).collect()
}

/// The sum of `data`, and the bytes this node pulled from others so far.
#[prism::remote]
fn checksum(data: Vec<u8>) -> (u64, u64) {
    let sum = data.iter().map(|&b| b as u64).sum();
    let pulled = prism::object_store_stats()
        .map(|s| s.pulled_bytes_total)
        .unwrap_or(0);
    (sum, pulled)
}

/// `bytes` bytes of `fill`, after `ms` milliseconds.
#[prism::remote]
fn slow_fill(ms: u64, bytes: usize) -> Vec<u8> {
    std::thread::sleep(Duration::from_millis(ms));
    fill(bytes)
}

/// How many objects this node's store holds.
#[prism::remote]
fn objects_here() -> u64 {
    prism::object_store_stats()
        .map(|s| s.num_objects)
        .unwrap_or(u64::MAX)
}

/// The pulling driver's part, run on the head by the test below.
fn pull() {
    const SIZE: usize = 100_000_000;
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Made and stored on B; owned by this driver on A.
    let made = must(fill::remote_with(on(b), SIZE), "submitted");
    // Three readers on C: the first pulls a copy into C's store, the
    // others read that copy.
    let reads: Vec<_> = (0..3)
        .map(|_| must(checksum::remote_with(on(c), &made), "submitted"))
        .collect();
    let mut whole = true;
    let mut pulled_on_c = 0;
    for r in &reads {
        let (sum, pulled) = must(prism::get(r), "a reader on C finishes");
        whole &= sum == expected;
        pulled_on_c = pulled_on_c.max(pulled);
    }
    let once = |pulled: u64| pulled >= SIZE as u64 && pulled < 2 * SIZE as u64;
    println!("C read whole: {whole}, pulled once: {}", once(pulled_on_c));
    // Two gets at once on this node share one pull.
    let getters: Vec<_> = (0..2)
        .map(|_| {
            let made = made.clone();
            std::thread::spawn(move || {
                prism::get(&made)
                    .map(|d| d.len() == SIZE && d[SIZE - 1] == ((SIZE - 1) % 251) as u8)
            })
        })
        .collect();
    let both = getters
        .into_iter()
        .all(|g| matches!(g.join(), Ok(Ok(true))));
    let pulled_here = must(prism::object_store_stats(), "this node's store").pulled_bytes_total;
    println!(
        "A read whole twice: {both}, pulled once: {}",
        once(pulled_here)
    );
    // Freed with the object: its primary on B and the copies on A and C.
    drop((made, reads));
    let counts = || -> Vec<u64> {
        let here = must(prism::object_store_stats(), "this store").num_objects;
        let mut all = vec![here];
        for node in [b, c] {
            let asked = must(objects_here::remote_with(on(node)), "submitted");
            all.push(must(prism::get(&asked), "the count arrives"));
        }
        all
    };
    let started = Instant::now();
    let mut last = counts();
    while last.iter().any(|&n| n > 0) && started.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        last = counts();
    }
    println!("FREED everywhere: {last:?}");
    // An actor on B owns a result stored on C and a copy of it pulled to
    // B: both go when the actor exits, though both nodes live on.
    let count_on = |node: &prism::NodeInfo| -> u64 {
        must(
            prism::get(&must(objects_here::remote_with(on(node)), "s")),
            "counted",
        )
    };
    let until = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !what() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        what()
    };
    let (b0, c0) = (count_on(b), count_on(c));
    let keeper = must(Keeper::remote_with(actor_on(b)), "created");
    let read = must(
        prism::get(&must(keeper.keep_and_read_on(c.node_id.clone()), "called")),
        "the keeper keeps and reads its result",
    );
    println!(
        "OWNED result on C, copy on B: {}",
        read == 1 << 20 && count_on(b) == b0 + 1 && count_on(c) == c0 + 1
    );
    must(prism::kill(&keeper), "the keeper is killed");
    println!(
        "FREED when its owner exited: {}",
        until(&|| count_on(b) == b0 && count_on(c) == c0)
    );
    // A result sealed after its owner exited is freed at once.
    let keeper = must(Keeper::remote_with(actor_on(b)), "created");
    must(
        prism::get(&must(
            keeper.start_slow_on(c.node_id.clone(), 1500),
            "called",
        )),
        "the keeper starts its slow task",
    );
    must(prism::kill(&keeper), "the keeper is killed");
    std::thread::sleep(Duration::from_millis(2500));
    println!(
        "FREED when sealed after its owner exited: {}",
        until(&|| count_on(c) == c0)
    );
    // An object whose node dies, and whose task may not run again
    // (max_retries 0), is lost, and the error names the node.
    let doomed = must(fill::remote_with(on(b).max_retries(0), SIZE), "submitted");
    must(
        prism::wait(std::slice::from_ref(&doomed), 1, None),
        "the object is made",
    );
    let _ = must(end_my_node::remote_with(on(b)), "submitted");
    std::thread::sleep(Duration::from_millis(500));
    match prism::get(&doomed) {
        Ok(_) => println!("LOST: no, it was read"),
        Err(e) => println!(
            "LOST naming its node: {} ({e})",
            e.to_string().contains(&b.node_id)
        ),
    }
    prism::shutdown();
}

/// The driver's part of the test below: an object on B whose first chunk
/// B fails to serve is still read whole on A.
#[cfg(feature = "failpoints")]
fn pull_through_a_broken_stream() {
    const SIZE: usize = 20_000_000;
    let (b, _) = join_and_find_b_c();
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Not rebuilt from its lineage: only the retried pull can read it.
    let made = must(fill::remote_with(on(&b).max_retries(0), SIZE), "submitted");
    let read = prism::get(&made).map(|d| d.iter().map(|&x| x as u64).sum::<u64>());
    println!(
        "READ whole: {} ({read:?})",
        matches!(read, Ok(sum) if sum == expected)
    );
    let pulled = must(prism::object_store_stats(), "this store").pulled_bytes_total;
    println!(
        "PULLED once: {}",
        pulled >= SIZE as u64 && pulled < 2 * SIZE as u64
    );
    prism::shutdown();
}

/// With the raylets' fail points built in (`--features failpoints`): node
/// B breaks the first bulk stream it serves, and the pull is tried again.
#[cfg(feature = "failpoints")]
#[test]
fn a_pull_whose_stream_breaks_is_tried_again() {
    const TEST: &str = "a_pull_whose_stream_breaks_is_tried_again";
    if std::env::var_os(DRIVER).is_some() {
        return pull_through_a_broken_stream();
    }
    let Some(m) = Machines::new("brokenpull", 3) else {
        return;
    };
    let head = m.start_head(&[]);
    let b = m.join_env(1, &head, &[], &[("FAILPOINTS", "chunk_transfer=1*return")]);
    assert!(b.status.success(), "B joins: {}", text(&b));
    let c = m.join(2, &head);
    assert!(c.status.success(), "C joins: {}", text(&c));
    must_eventually(
        "every node is in the head's view",
        Duration::from_secs(10),
        || m.status(0).contains("Nodes: 3 alive"),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let said = drive_on_head(&m, &head, TEST);
    assert!(said.contains("READ whole: true"), "{said}");
    assert!(said.contains("PULLED once: true"), "{said}");
}

#[test]
fn objects_are_pulled_between_nodes_once_and_freed_with_their_object() {
    if std::env::var_os(DRIVER).is_some() {
        return pull();
    }
    let Some((m, head)) = three_nodes("pull", &[]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "objects_are_pulled_between_nodes_once_and_freed_with_their_object",
    );
    assert!(
        said.contains("C read whole: true, pulled once: true"),
        "{said}"
    );
    assert!(
        said.contains("A read whole twice: true, pulled once: true"),
        "{said}"
    );
    assert!(said.contains("FREED everywhere: [0, 0, 0]"), "{said}");
    assert!(
        said.contains("OWNED result on C, copy on B: true"),
        "{said}"
    );
    assert!(said.contains("FREED when its owner exited: true"), "{said}");
    assert!(
        said.contains("FREED when sealed after its owner exited: true"),
        "{said}"
    );
    assert!(said.contains("LOST naming its node: true"), "{said}");
}

/// Holds the results of tasks it ran elsewhere: it owns them.
#[prism::actor]
struct Keeper {
    kept: Vec<prism::ObjectRef<Vec<u8>>>,
}

#[prism::actor]
impl Keeper {
    fn new() -> Self {
        Keeper { kept: Vec::new() }
    }

    /// Runs a task on node `node_id` that stores 1 MiB there, and keeps
    /// its result.
    fn keep_result_on(&mut self, node_id: String) -> Result<(), String> {
        let node_id = prism::NodeId::parse(&node_id).ok_or("bad node id")?;
        let there = prism::TaskOptions::new().scheduling_strategy(
            prism::SchedulingStrategy::NodeAffinity {
                node_id,
                soft: false,
            },
        );
        let r = fill::remote_with(there, 1 << 20).map_err(|e| e.to_string())?;
        prism::wait(std::slice::from_ref(&r), 1, None).map_err(|e| e.to_string())?;
        self.kept.push(r);
        Ok(())
    }

    /// As `keep_result_on`, then reads the result here: a copy is pulled
    /// into this node's store.
    fn keep_and_read_on(&mut self, node_id: String) -> Result<usize, String> {
        self.keep_result_on(node_id)?;
        let last = self.kept.last().ok_or("nothing kept")?;
        prism::get(last).map(|d| d.len()).map_err(|e| e.to_string())
    }

    /// Starts a task on node `node_id` that stores 1 MiB there after
    /// `ms` milliseconds, and keeps its result without waiting.
    fn start_slow_on(&mut self, node_id: String, ms: u64) -> Result<(), String> {
        let node_id = prism::NodeId::parse(&node_id).ok_or("bad node id")?;
        let there = prism::TaskOptions::new().scheduling_strategy(
            prism::SchedulingStrategy::NodeAffinity {
                node_id,
                soft: false,
            },
        );
        let r = slow_fill::remote_with(there, ms, 1 << 20).map_err(|e| e.to_string())?;
        self.kept.push(r);
        Ok(())
    }
}

/// The rebuilding driver's part, run on the head by the test below.
fn rebuild_lost() {
    const SIZE: usize = 20_000_000;
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum();
    // Two objects made and stored on B, owned by this driver.
    let first = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let second = must(fill::remote_with(prefer(b), SIZE), "submitted");
    must(
        prism::wait(&[first.clone(), second.clone()], 2, None),
        "both are made",
    );
    // Two chains on B, each a task taking the result of another by
    // reference. The first chain's base is dropped once its second task
    // ran (its value is freed, its lineage kept); the second's is kept.
    let base = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let shifted = must(shift::remote_with(prefer(b), &base), "submitted");
    let kept_base = must(fill::remote_with(prefer(b), SIZE), "submitted");
    let kept_shifted = must(shift::remote_with(prefer(b), &kept_base), "submitted");
    must(
        prism::wait(&[shifted.clone(), kept_shifted.clone()], 2, None),
        "both chains are made",
    );
    // A stored result whose task took a small ready object by reference
    // (passed on as a value).
    let size = must(size_of_block::remote(SIZE), "submitted");
    must(prism::get(&size), "the size is ready");
    let sized = must(fill::remote_with(prefer(b), &size), "submitted");
    must(prism::wait(std::slice::from_ref(&sized), 1, None), "made");
    // Two results of one task, both stored on B.
    let (pair_first, pair_second) = must(fill_pair::remote_with(prefer(b), SIZE), "submitted");
    must(
        prism::wait(&[pair_first.clone(), pair_second.clone()], 2, None),
        "the pair is made",
    );
    drop(base);
    // An actor on B owns a result stored on C: it goes when B dies.
    let on_c_now = || {
        must(
            prism::get(&must(objects_here::remote_with(on(c)), "s")),
            "counted",
        )
    };
    let before = on_c_now();
    let keeper = must(Keeper::remote_with(actor_on(b)), "created");
    must(
        prism::get(&must(keeper.keep_result_on(c.node_id.clone()), "called")),
        "the keeper runs its task and keeps the result",
    );
    println!("KEPT on C: {}", on_c_now() == before + 1);
    // B dies with all of them.
    let held = on_c_now();
    let _ = must(end_my_node::remote_with(on(b)), "submitted");
    std::thread::sleep(Duration::from_millis(2500));
    // Nothing else changed on C meanwhile: only the keeper's result went.
    let deadline = Instant::now() + Duration::from_secs(10);
    while on_c_now() >= held && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("FREED with its owner's node: {}", on_c_now() == held - 1);
    // This driver reads the first: its task runs again elsewhere.
    let data = must(prism::get(&first), "the lost object is made again");
    let sum: u64 = data.iter().map(|&b| b as u64).sum();
    println!(
        "OWNER read it whole: {}",
        data.len() == SIZE && sum == expected
    );
    // A task on C reads the second: its owner (this driver) makes it again.
    let read = must(checksum::remote_with(on(c), &second), "submitted");
    let (sum, _) = must(prism::get(&read), "the reader on C finishes");
    println!("BORROWER read it whole: {}", sum == expected);
    // Each chain's end is made again, and so is its base first (freed) or
    // when the task made again finds it lost (kept).
    let expected_shifted: u64 = (0..SIZE).map(|i| (i % 251) as u64 + 1).sum();
    for (name, end) in [("FREED", &shifted), ("KEPT", &kept_shifted)] {
        match prism::get(end) {
            Ok(data) => {
                let sum: u64 = data.iter().map(|&b| b as u64).sum();
                println!("CHAIN {name} base made again: {}", sum == expected_shifted);
            }
            Err(e) => println!("CHAIN {name} failed: {e}"),
        }
    }
    drop(kept_base);
    match prism::get(&sized) {
        Ok(data) => println!("SIZED made again: {}", data.len() == SIZE),
        Err(e) => println!("SIZED failed: {e}"),
    }
    // Reading the second result runs the task again, which makes the
    // first (lost with it) again too: one run for both, read here and on C
    // (one of which is not where it ran).
    let pair = prism::get(&pair_second).and_then(|second| {
        let on_c = prism::get(&checksum::remote_with(on(c), &pair_first)?)?.0;
        Ok((prism::get(&pair_first)?, second, on_c))
    });
    match pair {
        Ok((first, second, on_c)) => {
            let sum = |data: &[u8]| data.iter().map(|&b| b as u64).sum::<u64>();
            let whole = sum(&first) == expected && sum(&second) == expected_shifted;
            println!("PAIR made again: {}", whole && on_c == expected);
        }
        Err(e) => println!("PAIR failed: {e}"),
    }
    println!("REBUILT {}", prism::retry_stats().objects_rebuilt);
    prism::shutdown();
}

#[test]
fn objects_lost_with_their_node_are_made_again_from_their_lineage() {
    if std::env::var_os(DRIVER).is_some() {
        return rebuild_lost();
    }
    let Some((m, head)) = three_nodes("lineage", FAST_DEATH) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "objects_lost_with_their_node_are_made_again_from_their_lineage",
    );
    assert!(said.contains("OWNER read it whole: true"), "{said}");
    assert!(said.contains("BORROWER read it whole: true"), "{said}");
    assert!(said.contains("CHAIN FREED base made again: true"), "{said}");
    assert!(said.contains("CHAIN KEPT base made again: true"), "{said}");
    assert!(said.contains("KEPT on C: true"), "{said}");
    assert!(said.contains("FREED with its owner's node: true"), "{said}");
    assert!(said.contains("SIZED made again: true"), "{said}");
    assert!(said.contains("PAIR made again: true"), "{said}");
    assert!(said.contains("REBUILT 8"), "{said}");
}
