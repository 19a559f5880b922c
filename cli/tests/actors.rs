//! Actors across nodes: placed on another node by affinity and by SPREAD,
//! named cluster-wide (found and raced for from other nodes), killed on
//! their node; and when their node dies, their callers told so naming it,
//! a restartable one created again elsewhere (found by name and called
//! from another node), and ones that ended or spent their restarts left
//! dead.
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    actor_on, affinity, drive_on_head, end_my_node, join_and_find_b_c, on, three_nodes, Where,
    DRIVER, FAST_DEATH,
};
use prism_tests::must;
use std::time::Duration;

/// Asks `w` for its node, crashes it, and asks again once it restarted.
#[prism::remote]
fn crash_between(w: prism::ActorHandle<Where>) -> (String, String) {
    let node = |w: &prism::ActorHandle<Where>| {
        w.node()
            .and_then(|n| prism::get(&n))
            .unwrap_or_else(|e| format!("failed: {e}"))
    };
    let before = node(&w);
    let _ = w.crash().and_then(|r| prism::get(&r));
    (before, node(&w))
}

/// Finds the actor named `name` from wherever it runs, and asks its node.
#[prism::remote]
fn find_named(name: String) -> String {
    match prism::get_actor::<Where>(&name).and_then(|w| prism::get(&w.node()?)) {
        Ok(node) => node,
        Err(e) => format!("not found: {e}"),
    }
}

/// Tries to create an actor named `name` from wherever it runs.
#[prism::remote]
fn take_name(name: String) -> String {
    match Where::remote_with(prism::ActorOptions::new().name(name)) {
        Ok(_) => "created".into(),
        Err(e) => e.to_string(),
    }
}

/// Asks `w` for its node after `ms` milliseconds.
#[prism::remote]
fn node_later(w: prism::ActorHandle<Where>, ms: u64) -> String {
    std::thread::sleep(Duration::from_millis(ms));
    match w.node().and_then(|n| prism::get(&n)) {
        Ok(node) => node,
        Err(e) => format!("failed: {e}"),
    }
}

/// The actor driver's part, run on the head by the test below.
fn place_actors() {
    let (b, c) = join_and_find_b_c();
    let (b, c) = (&b, &c);
    let node_of = |w: &prism::ActorHandle<Where>| {
        must(prism::get(&must(w.node(), "called")), "the actor answers")
    };
    // Placed on B by node affinity, with a name.
    let on_b = must(
        Where::remote_with(actor_on(b).name("where-b")),
        "the actor is created",
    );
    println!("PLACED on B: {}", node_of(&on_b) == b.node_id);
    // SPREAD: one actor per node.
    let spread = prism::ActorOptions::new().scheduling_strategy(prism::SchedulingStrategy::Spread);
    let spread_actors: Vec<_> = (0..3)
        .map(|_| must(Where::remote_with(spread.clone()), "created"))
        .collect();
    let nodes: std::collections::BTreeSet<String> = spread_actors.iter().map(node_of).collect();
    println!("SPREAD actors over {} nodes", nodes.len());
    // Its name is found, and taken, from another node.
    let found = must(
        prism::get(&must(
            find_named::remote_with(on(c), "where-b".to_string()),
            "submitted",
        )),
        "the lookup runs",
    );
    println!("FOUND from C: {}", found == b.node_id);
    let duplicate = must(
        prism::get(&must(
            take_name::remote_with(on(c), "where-b".to_string()),
            "submitted",
        )),
        "the creation runs",
    );
    println!("DUPLICATE from C: {duplicate}");
    // Two creations of one name at once, from two nodes: one wins.
    let racers: Vec<_> = [b, c]
        .into_iter()
        .map(|n| {
            must(
                take_name::remote_with(on(n), "raced".to_string()),
                "submitted",
            )
        })
        .collect();
    let won = racers
        .iter()
        .filter(|r| must(prism::get(*r), "a racer finishes") == "created")
        .count();
    println!("RACE won by {won}");
    // Killed from here, on its node.
    must(prism::kill(&on_b), "the actor is killed");
    let after = prism::get(&must(on_b.node(), "called"));
    println!("KILLED on B: {}", after.is_err());
    // An actor whose node dies: its callers' error names the node.
    let on_c = must(Where::remote_with(actor_on(c)), "created");
    node_of(&on_c);
    // One that may restart, named, placed on C by a soft affinity: when C
    // dies, its owner (this driver) creates it again on another node.
    let moving = prism::ActorOptions::new()
        .scheduling_strategy(affinity(c, true))
        .max_restarts(1)
        .name("moving");
    let moved = must(Where::remote_with(moving.clone()), "created");
    println!("MOVING starts on C: {}", node_of(&moved) == c.node_id);
    // One just like it that ended itself before C dies: its node tells
    // its owner, which must not bring it back.
    // One with a single restart, spent on C by a crash that a task on B
    // causes (its owner never looks): C's node tells the owner, which
    // must not create it again when C dies.
    let once = must(Where::remote_with(moving.clone().name("once")), "created");
    let (before, after) = must(
        prism::get(&must(crash_between::remote_with(on(b), once.clone()), "s")),
        "the task on B runs",
    );
    println!(
        "ONCE restarted on C: {}",
        before == c.node_id && after == c.node_id
    );
    let left = must(Where::remote_with(moving.name("gone")), "created");
    node_of(&left);
    must(prism::get(&must(left.leave(), "called")), "it leaves");
    // Its name, looked up from B, says that it died, where and when.
    let gone = must(
        prism::get(&must(
            find_named::remote_with(on(b), "gone".to_string()),
            "submitted",
        )),
        "answered",
    );
    println!(
        "GONE by name says it died on C: {} ({gone})",
        gone.contains("died at") && gone.contains(&format!("on node {}", c.node_id))
    );
    // A caller on B that is not its owner calls it while C dies.
    let later = must(
        node_later::remote_with(on(b), moved.clone(), 1000),
        "submitted",
    );
    let _ = must(end_my_node::remote_with(on(c)), "submitted");
    std::thread::sleep(Duration::from_millis(500));
    match prism::get(&must(on_c.node(), "called")) {
        Ok(_) => println!("NODE DIED: the actor still answered"),
        Err(e) => println!(
            "NODE DIED names its node: {} ({e})",
            e.to_string().contains(&c.node_id)
        ),
    }
    match prism::get(&must(moved.node(), "called")) {
        Ok(now) => {
            println!("MOVED off C: {}", now != c.node_id && !now.is_empty());
            let found = prism::get(&must(
                find_named::remote_with(on(b), "moving".to_string()),
                "submitted",
            ));
            println!(
                "MOVED found by name: {} ({found:?})",
                found.as_deref() == Ok(now.as_str())
            );
            let from_b = prism::get(&later);
            println!(
                "MOVED called from B: {} ({from_b:?})",
                from_b.as_deref() == Ok(now.as_str())
            );
        }
        Err(e) => println!("MOVED failed: {e}"),
    }
    match prism::get(&must(once.node(), "called")) {
        Ok(node) => println!("ONCE came back on {node}"),
        Err(e) => println!("ONCE stays dead: true ({e})"),
    }
    // Its name says that its node died, and which.
    let once_by_name = must(
        prism::get(&must(
            find_named::remote_with(on(b), "once".to_string()),
            "submitted",
        )),
        "answered",
    );
    println!(
        "ONCE by name says its node died: {} ({once_by_name})",
        once_by_name.contains("its node died") && once_by_name.contains(&c.node_id)
    );
    match prism::get(&must(left.node(), "called")) {
        Ok(node) => println!("LEFT came back on {node}"),
        Err(e) => println!("LEFT stays gone: true ({e})"),
    }
    drop(spread_actors);
    prism::shutdown();
}

#[test]
fn actors_are_placed_on_other_nodes_named_cluster_wide_and_die_with_their_node() {
    if std::env::var_os(DRIVER).is_some() {
        return place_actors();
    }
    let Some((m, head)) = three_nodes("actors", FAST_DEATH) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "actors_are_placed_on_other_nodes_named_cluster_wide_and_die_with_their_node",
    );
    assert!(said.contains("PLACED on B: true"), "{said}");
    assert!(said.contains("SPREAD actors over 3 nodes"), "{said}");
    assert!(said.contains("FOUND from C: true"), "{said}");
    assert!(
        said.contains("DUPLICATE from C: ") && said.contains("already exists"),
        "{said}"
    );
    assert!(said.contains("RACE won by 1"), "{said}");
    assert!(said.contains("KILLED on B: true"), "{said}");
    assert!(said.contains("NODE DIED names its node: true"), "{said}");
    assert!(said.contains("MOVING starts on C: true"), "{said}");
    assert!(said.contains("MOVED off C: true"), "{said}");
    assert!(said.contains("MOVED found by name: true"), "{said}");
    assert!(said.contains("MOVED called from B: true"), "{said}");
    assert!(said.contains("LEFT stays gone: true"), "{said}");
    assert!(said.contains("ONCE restarted on C: true"), "{said}");
    assert!(said.contains("ONCE stays dead: true"), "{said}");
    assert!(
        said.contains("GONE by name says it died on C: true"),
        "{said}"
    );
    assert!(
        said.contains("ONCE by name says its node died: true"),
        "{said}"
    );
}

/// Says where it runs and how often it was restarted.
#[prism::actor]
pub struct Keeper {}

#[prism::actor]
impl Keeper {
    fn new() -> Self {
        Keeper {}
    }

    fn whereabouts(&self) -> (String, u32) {
        prism::runtime_context()
            .map(|c| (c.node_id.to_string(), c.actor_restarts))
            .unwrap_or_default()
    }
}

/// The first driver: a detached actor on C (by soft affinity), called
/// once; then the driver leaves, and the actor lives on.
fn make_keeper() {
    let (_, c) = join_and_find_b_c();
    let keeper = must(
        Keeper::remote_with(
            prism::ActorOptions::new()
                .name("keeper")
                .detached()
                .max_restarts(1)
                .scheduling_strategy(affinity(&c, true)),
        ),
        "a detached actor on C",
    );
    let (node, restarts) = must(
        prism::get(&must(keeper.whereabouts(), "asked")),
        "it answers",
    );
    println!("KEEPER on C: {} restarts={restarts}", node == c.node_id);
    prism::shutdown();
}

/// The second driver, after C died: the head created the actor again on a
/// live node, counting the restart, and it is found by name.
fn find_keeper() {
    let (_, c) = join_and_find_b_c();
    let started = std::time::Instant::now();
    let mut last = String::new();
    let found = loop {
        let answer =
            prism::get_actor::<Keeper>("keeper").and_then(|k| prism::get(&k.whereabouts()?));
        match answer {
            Ok(found) => break Some(found),
            Err(e) if started.elapsed() < Duration::from_secs(40) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                last = e.to_string();
                break None;
            }
        }
    };
    match found {
        Some((node, restarts)) => println!(
            "KEEPER again off C: {} restarts={restarts}",
            node != c.node_id
        ),
        None => println!("KEEPER not found: {last}"),
    }
    // Killed for good, its record in the head's table goes with it.
    if let Ok(keeper) = prism::get_actor::<Keeper>("keeper") {
        let key = format!("prism/detached/{}", keeper.id());
        let recorded = prism::kv::get(&key).ok().flatten().is_some();
        must(prism::kill(&keeper), "the actor is killed");
        let started = std::time::Instant::now();
        while prism::kv::get(&key).ok().flatten().is_some()
            && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let gone = prism::kv::get(&key).ok().flatten().is_none();
        println!("KEEPER record before kill: {recorded}, after: gone={gone}");
    }
    prism::shutdown();
}

#[test]
fn a_detached_actor_whose_node_dies_is_created_again_by_the_head() {
    let test = "a_detached_actor_whose_node_dies_is_created_again_by_the_head";
    if std::env::var_os(DRIVER).is_some() {
        return match std::env::var("PRISM_CLI_TEST_PHASE").as_deref() {
            Ok("find") => find_keeper(),
            _ => make_keeper(),
        };
    }
    let Some((m, head)) = three_nodes("detached", FAST_DEATH) else {
        return;
    };
    let said = drive_on_head(&m, &head, test);
    assert!(said.contains("KEEPER on C: true restarts=0"), "{said}");
    // The driver left; its detached actor lives on C. C dies.
    prism_tests::kill(m.node_pid(2));
    let said = m.run_driver(
        0,
        test,
        &head,
        &[(DRIVER, "1"), ("PRISM_CLI_TEST_PHASE", "find")],
        Duration::from_secs(90),
    );
    assert!(
        said.contains("KEEPER again off C: true restarts=1"),
        "{said}"
    );
    assert!(
        said.contains("KEEPER record before kill: true, after: gone=true"),
        "{said}"
    );
}
