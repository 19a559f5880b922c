//! Placement groups across nodes: a STRICT_SPREAD group reserves one
//! bundle on each of three nodes (its tasks and actors run there, groups
//! made on other nodes are listed, an impossible group is refused,
//! removal frees the CPUs, and a group waiting for them is placed once
//! they are free); the bundles on a node that dies are placed
//! again on another node, with the actor in them; and a group whose home
//! node dies is taken up by the head, placed again, and removed when its
//! job ends (given back at once when its job died with the home; taken up
//! by a head started again when the head was its home).
//!
//! Real node processes on test hosts in network namespaces (10.77.0.x, one
//! per host), started through the `prism` command (the harness is in
//! `common/mod.rs`). Needs root for the namespaces (CI runs as root);
//! elsewhere each test says it was skipped and why.

mod common;

use common::{
    drive_in_background, drive_on_head, finished, fresh_marks, head_and_three, host_of, node_of,
    on, three_nodes, Tally, Where, DRIVER, MARKS,
};
use prism_tests::{must, must_become, must_eventually};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Makes a group of one CPU bundle from wherever it runs (its home is
/// that node) and returns its id.
#[prism::remote]
fn make_group() -> String {
    let bundle = prism::Bundle::new().num_cpus(1.0);
    match prism::placement_group(vec![bundle], prism::PlacementStrategy::Pack) {
        Ok(g) => g.id().to_string(),
        Err(e) => format!("failed: {e}"),
    }
}

/// The placement-group driver's part, run on the head by the test below.
fn place_groups() {
    use prism::{Bundle, PlacementStrategy};
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let one_cpu = || Bundle::new().num_cpus(1.0);
    let group = must(
        prism::placement_group(
            vec![one_cpu(), one_cpu(), one_cpu()],
            PlacementStrategy::StrictSpread,
        ),
        "the group is accepted",
    );
    must(group.ready(), "the group is created");
    let nodes = must(group.bundle_nodes(), "the bundles' nodes");
    let distinct: std::collections::BTreeSet<&String> = nodes.iter().collect();
    println!("STRICT_SPREAD over {} nodes", distinct.len());
    let mut on_their_nodes = nodes.len() == 3;
    for (i, node) in nodes.iter().enumerate() {
        let options = prism::TaskOptions::new().placement_group(&group, Some(i));
        let ran = must(
            prism::get(&must(node_of::remote_with(options), "submitted")),
            "a task in a bundle runs",
        );
        on_their_nodes &= &ran == node;
    }
    println!("BUNDLE tasks on their nodes: {on_their_nodes}");
    let actor = must(
        Where::remote_with(prism::ActorOptions::new().placement_group(&group, Some(2))),
        "an actor in a bundle starts",
    );
    let actor_node = must(
        prism::get(&must(actor.node(), "called")),
        "the actor answers",
    );
    println!(
        "BUNDLE actor on its node: {}",
        nodes.get(2) == Some(&actor_node)
    );
    // A group made by a task on another node (pending: every CPU is
    // reserved) is listed from here, next to this driver's.
    let options = prism::TaskOptions::new().placement_group(&group, Some(2));
    let other = must(
        prism::get(&must(make_group::remote_with(options), "submitted")),
        "the task runs",
    );
    let listed = must(prism::list_placement_groups(), "the groups are listed");
    let ids: Vec<String> = listed.iter().map(|(_, g, _)| g.id().to_string()).collect();
    println!(
        "LISTED both: {}",
        ids.contains(&group.id().to_string()) && ids.contains(&other)
    );
    for (_, g, _) in &listed {
        if g.id().to_string() == other {
            must(
                prism::remove_placement_group(g),
                "the other group is removed",
            );
        }
    }
    match prism::placement_group(vec![one_cpu(); 4], PlacementStrategy::StrictSpread) {
        Ok(_) => println!("FOUR bundles: accepted"),
        Err(e) => println!("FOUR bundles: {e}"),
    }
    drop(actor);
    must(
        prism::remove_placement_group(&group),
        "the group is removed",
    );
    let started = Instant::now();
    let mut free = 0.0;
    while started.elapsed() < Duration::from_secs(15) {
        let (_, available) = must(prism::cluster_resources(), "the cluster's resources");
        free = available.get("CPU").as_f64();
        if free >= 3.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("FREED CPUs: {free}");
    // A group that fits nowhere now waits, and is placed once what it
    // waits for is given back on the other nodes.
    let all = must(
        prism::placement_group(vec![one_cpu(); 3], PlacementStrategy::Spread),
        "the group of every CPU is accepted",
    );
    must(all.ready(), "the group of every CPU is created");
    let waiting = must(
        prism::placement_group(vec![one_cpu(); 2], PlacementStrategy::StrictSpread),
        "the waiting group is accepted",
    );
    let waits = !must(waiting.wait(Duration::from_millis(500)), "asked");
    must(
        prism::remove_placement_group(&all),
        "the group of every CPU is removed",
    );
    let placed = must(waiting.wait(Duration::from_secs(15)), "asked");
    println!("WAITING group waits: {waits}, placed once freed: {placed}");
    must(
        prism::remove_placement_group(&waiting),
        "the waiting group is removed",
    );
    prism::shutdown();
}

#[test]
fn a_strict_spread_group_reserves_one_bundle_on_each_of_three_nodes() {
    if std::env::var_os(DRIVER).is_some() {
        return place_groups();
    }
    let Some((m, head)) = three_nodes("groups", &[("PRISM_HEARTBEAT_PERIOD_MS", "200")]) else {
        return;
    };
    let said = drive_on_head(
        &m,
        &head,
        "a_strict_spread_group_reserves_one_bundle_on_each_of_three_nodes",
    );
    assert!(said.contains("STRICT_SPREAD over 3 nodes"), "{said}");
    assert!(said.contains("BUNDLE tasks on their nodes: true"), "{said}");
    assert!(said.contains("BUNDLE actor on its node: true"), "{said}");
    assert!(said.contains("LISTED both: true"), "{said}");
    assert!(
        said.contains("FOUR bundles: no node can ever satisfy"),
        "{said}"
    );
    assert!(said.contains("FREED CPUs: 3"), "{said}");
    assert!(
        said.contains("WAITING group waits: true, placed once freed: true"),
        "{said}"
    );
}

/// The driver's part: a STRICT_SPREAD group of two bundles over two of
/// three slot nodes, an actor in each; the node of bundle 0 is killed by
/// the test, and the bundle and its tasks go to the third.
fn move_group() {
    use prism::{Bundle, PlacementStrategy};
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = PathBuf::from(std::env::var(MARKS).unwrap_or_default());
    let slot = || Bundle::new().resource("slot", 1.0);
    let group = must(
        prism::placement_group(vec![slot(), slot()], PlacementStrategy::StrictSpread),
        "the group is asked for",
    );
    assert!(must(
        group.wait(Duration::from_secs(30)),
        "the group is placed"
    ));
    let before = must(group.bundle_nodes(), "the bundles' nodes");
    let moving = must(
        Where::remote_with(
            prism::ActorOptions::new()
                .placement_group(&group, Some(0))
                .max_restarts(1),
        ),
        "an actor in bundle 0",
    );
    let staying = must(
        Tally::remote_with(prism::ActorOptions::new().placement_group(&group, Some(1))),
        "an actor in bundle 1",
    );
    let first = must(prism::get(&must(moving.node(), "asked")), "it answers");
    must(prism::get(&must(staying.add(7), "asked")), "it answers");
    // Written whole, then renamed: the test never reads half a name.
    must(
        std::fs::write(marks.join("victim.part"), &before[0]),
        "the victim is named",
    );
    must(
        std::fs::rename(marks.join("victim.part"), marks.join("victim")),
        "the victim is named",
    );
    must_eventually("the test killed the node", Duration::from_secs(60), || {
        marks.join("killed").exists()
    });
    let after = must_become("bundle 0 moves", Duration::from_secs(30), || {
        group
            .bundle_nodes()
            .ok()
            .filter(|n| n.len() == 2 && n[0] != before[0])
    });
    let third = after[0] != before[1] && after[1] == before[1];
    // The actor of the moved bundle is created again by its owner, in its
    // bundle on the new node (its one restart).
    let now = prism::get(&must(moving.node(), "asked")).unwrap_or_else(|e| e.to_string());
    let kept = prism::get(&must(staying.add(1), "asked")).unwrap_or(0);
    let task = prism::get(&must(
        node_of::remote_with(
            prism::TaskOptions::new()
                .placement_group(&group, Some(0))
                .num_cpus(0.0),
        ),
        "a task in bundle 0",
    ))
    .unwrap_or_else(|e| e.to_string());
    println!(
        "MOVED first_on_victim={} to_third={third} actor_in_new_bundle={} kept={kept} task_on_new={} ({task}; actor: {now})",
        first == before[0],
        now == after[0],
        task == after[0]
    );
    prism::shutdown();
}

#[test]
fn a_placement_groups_bundles_on_a_dead_node_are_placed_again() {
    if std::env::var_os(DRIVER).is_some() {
        return move_group();
    }
    let Some((m, head)) = head_and_three("pgmove", "slot") else {
        return;
    };
    let marks = fresh_marks("pgmove");
    let waiter = drive_in_background(
        &m,
        "a_placement_groups_bundles_on_a_dead_node_are_placed_again",
        &head,
        &marks,
    );
    let victim = must_become("the driver names the node", Duration::from_secs(60), || {
        std::fs::read_to_string(marks.join("victim")).ok()
    });
    prism_tests::kill(m.node_pid(host_of(&m, &victim)));
    must(
        std::fs::write(marks.join("killed"), ""),
        "the driver is told",
    );
    let said = finished(waiter);
    assert!(
        said.contains(
            "MOVED first_on_victim=true to_third=true actor_in_new_bundle=true kept=8 task_on_new=true"
        ),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&marks);
}

/// The adoption driver's first part, on the third slot node: a task on
/// another slot node makes the group there (its home); the test kills that
/// node; the head takes the group up and it is whole again on the two live
/// slot nodes.
fn adopt_group() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = PathBuf::from(std::env::var(MARKS).unwrap_or_default());
    let nodes = must(prism::nodes(), "the nodes");
    let mine = must(prism::runtime_context(), "the driver's context")
        .node_id
        .to_string();
    let home = must(
        nodes
            .iter()
            .find(|n| n.alive && n.total.get("slot").as_f64() > 0.0 && n.node_id != mine)
            .ok_or("no other slot node"),
        "a slot node other than the driver's",
    );
    let made = must(
        prism::get(&must(
            make_named_group::remote_with(on(home).num_cpus(0.0), "adopted".to_string()),
            "submitted",
        )),
        "the task runs",
    );
    assert_eq!(made, "placed");
    must(
        std::fs::write(marks.join("victim.part"), &home.node_id),
        "the victim is named",
    );
    must(
        std::fs::rename(marks.join("victim.part"), marks.join("victim")),
        "the victim is named",
    );
    must_eventually("the test killed the node", Duration::from_secs(60), || {
        marks.join("killed").exists()
    });
    let (group, after) = must_become(
        "the group is whole again on live nodes",
        Duration::from_secs(60),
        || {
            let group = prism::get_placement_group("adopted").ok()?;
            let after = group.bundle_nodes().ok()?;
            let distinct: std::collections::BTreeSet<&String> = after.iter().collect();
            (after.len() == 2 && distinct.len() == 2 && !after.contains(&home.node_id))
                .then_some((group, after))
        },
    );
    let mut on_their_nodes = true;
    for (i, node) in after.iter().enumerate() {
        let options = prism::TaskOptions::new()
            .placement_group(&group, Some(i))
            .num_cpus(0.0);
        let ran = must(
            prism::get(&must(node_of::remote_with(options), "submitted")),
            "a task in a bundle runs",
        );
        on_their_nodes &= ran == *node;
    }
    let listed = must(prism::list_placement_groups(), "the groups are listed");
    println!(
        "ADOPTED tasks_on_their_nodes={on_their_nodes} listed={}",
        listed.iter().any(|(name, _, _)| name == "adopted")
    );
    prism::shutdown();
}

/// The adoption driver's second part, after the first one's job ended: the
/// head, which is no lessee of that job, saw it end and removed the group,
/// and the slots are free again.
fn adopted_group_ended() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let free = must_become(
        "the adopted group is removed with its job",
        Duration::from_secs(30),
        || {
            let listed = prism::list_placement_groups().ok()?;
            let free = free_slots_on_live_nodes()?;
            (listed.is_empty() && free >= 2.0).then_some(free)
        },
    );
    println!("ENDED slots_free={free}");
    prism::shutdown();
}

#[test]
fn a_placement_group_whose_home_dies_is_placed_again_by_the_head_and_ends_with_its_job() {
    if std::env::var_os(DRIVER).is_some() {
        return match std::env::var("PRISM_CLI_TEST_PHASE").as_deref() {
            Ok("ended") => adopted_group_ended(),
            _ => adopt_group(),
        };
    }
    let Some((m, head)) = head_and_three("pgadopt", "slot") else {
        return;
    };
    let marks = fresh_marks("pgadopt");
    let marks_text = marks.display().to_string();
    let test =
        "a_placement_group_whose_home_dies_is_placed_again_by_the_head_and_ends_with_its_job";
    // The driver on host 3, so that the head's raylet serves none of its
    // job and learns of its end from the driver's record alone.
    let said = std::thread::scope(|scope| {
        let driver = scope.spawn(|| {
            m.run_driver(
                3,
                test,
                &head,
                &[(DRIVER, "1"), (MARKS, marks_text.as_str())],
                Duration::from_secs(150),
            )
        });
        let victim = must_become("the driver names the node", Duration::from_secs(60), || {
            std::fs::read_to_string(marks.join("victim")).ok()
        });
        prism_tests::kill(m.node_pid(host_of(&m, &victim)));
        must(
            std::fs::write(marks.join("killed"), ""),
            "the driver is told",
        );
        must(driver.join().map_err(|_| "panicked"), "the driver ends")
    });
    assert!(
        said.contains("ADOPTED tasks_on_their_nodes=true listed=true"),
        "{said}"
    );
    let said = m.run_driver(
        0,
        test,
        &head,
        &[(DRIVER, "1"), ("PRISM_CLI_TEST_PHASE", "ended")],
        Duration::from_secs(90),
    );
    assert!(said.contains("ENDED slots_free=2"), "{said}");
    let _ = std::fs::remove_dir_all(&marks);
}

/// A driver on a slot node makes a group there (its home) and waits to be
/// cut off: the test kills its node, and with it the driver's job.
fn group_of_a_dying_driver() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = PathBuf::from(std::env::var(MARKS).unwrap_or_default());
    let slot = || prism::Bundle::new().resource("slot", 1.0);
    let group = must(
        prism::placement_group(vec![slot(), slot()], prism::PlacementStrategy::StrictSpread),
        "the group is asked for",
    );
    assert!(must(
        group.wait(Duration::from_secs(30)),
        "the group is placed"
    ));
    must(std::fs::write(marks.join("placed"), ""), "the test is told");
    must_eventually("the test killed the node", Duration::from_secs(60), || {
        marks.join("killed").exists()
    });
    // Its node is gone: the driver just leaves.
    std::process::exit(0);
}

/// Run on the head after the home died with its driver: the group's
/// bundles on the live nodes were given back.
fn dead_drivers_group_freed() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let free = must_become(
        "the dead driver's group is removed from its live nodes",
        Duration::from_secs(30),
        || {
            let listed = prism::list_placement_groups().ok()?;
            let free = free_slots_on_live_nodes()?;
            (listed.is_empty() && free >= 2.0).then_some(free)
        },
    );
    println!("FREED slots_free={free}");
    prism::shutdown();
}

#[test]
fn a_placement_group_whose_home_dies_with_its_driver_gives_its_bundles_back() {
    let test = "a_placement_group_whose_home_dies_with_its_driver_gives_its_bundles_back";
    if std::env::var_os(DRIVER).is_some() {
        return match std::env::var("PRISM_CLI_TEST_PHASE").as_deref() {
            Ok("freed") => dead_drivers_group_freed(),
            _ => group_of_a_dying_driver(),
        };
    }
    let Some((m, head)) = head_and_three("pgorphan", "slot") else {
        return;
    };
    let marks = fresh_marks("pgorphan");
    let marks_text = marks.display().to_string();
    std::thread::scope(|scope| {
        let driver = scope.spawn(|| {
            m.run_driver(
                1,
                test,
                &head,
                &[(DRIVER, "1"), (MARKS, marks_text.as_str())],
                Duration::from_secs(120),
            )
        });
        must_eventually("the group is placed", Duration::from_secs(60), || {
            marks.join("placed").exists()
        });
        prism_tests::kill(m.node_pid(1));
        must(
            std::fs::write(marks.join("killed"), ""),
            "the driver is told",
        );
        let _ = driver.join();
    });
    let said = m.run_driver(
        0,
        test,
        &head,
        &[(DRIVER, "1"), ("PRISM_CLI_TEST_PHASE", "freed")],
        Duration::from_secs(90),
    );
    assert!(said.contains("FREED slots_free=2"), "{said}");
    let _ = std::fs::remove_dir_all(&marks);
}

/// The free `slot`s summed over the live nodes, once the dead one is out
/// of the view (two live slot nodes are left).
fn free_slots_on_live_nodes() -> Option<f64> {
    let live: Vec<prism::NodeInfo> = prism::nodes()
        .ok()?
        .into_iter()
        .filter(|n| n.alive && n.total.get("slot").as_f64() > 0.0)
        .collect();
    (live.len() == 2).then(|| live.iter().map(|n| n.available.get("slot").as_f64()).sum())
}

/// A driver on a slot node has a task on the head make a group (the head
/// is its home); the test kills the whole head node and starts it again;
/// the new head takes the group up: it is listed, and its bundles are used;
/// and it creates again elsewhere a detached actor that ran on the old head.
fn group_homed_at_the_head() {
    must(
        prism::init(prism::Config::default()),
        "the driver joins its node",
    );
    let marks = PathBuf::from(std::env::var(MARKS).unwrap_or_default());
    let nodes = must(prism::nodes(), "the nodes");
    let head = must(
        nodes.iter().find(|n| n.is_head).ok_or("no head"),
        "the head",
    );
    let made = must(
        prism::get(&must(
            make_named_group::remote_with(on(head).num_cpus(0.0), "headhome".to_string()),
            "submitted",
        )),
        "the task runs",
    );
    assert_eq!(made, "placed");
    let group = must(prism::get_placement_group("headhome"), "the group by name");
    let before = must(group.bundle_nodes(), "the bundles' nodes");
    // A detached actor on the head, which dies with it.
    let on_head = prism::ActorOptions::new()
        .name("on-head")
        .detached()
        .max_restarts(1)
        .scheduling_strategy(prism::SchedulingStrategy::NodeAffinity {
            node_id: must(
                prism::NodeId::parse(&head.node_id).ok_or("bad id"),
                "the head's id",
            ),
            soft: true,
        });
    let keeper = must(Where::remote_with(on_head), "a detached actor on the head");
    let first = must(prism::get(&must(keeper.node(), "asked")), "it answers");
    assert_eq!(first, head.node_id);
    must(std::fs::write(marks.join("placed"), ""), "the test is told");
    must_eventually("the head is started again", Duration::from_secs(90), || {
        marks.join("restarted").exists()
    });
    let listed = must_become(
        "the new head lists the group",
        Duration::from_secs(30),
        || {
            let listed = prism::list_placement_groups().ok()?;
            listed
                .iter()
                .any(|(name, _, _)| name == "headhome")
                .then_some(true)
        },
    );
    let after = must(group.bundle_nodes(), "the bundles' nodes");
    let mut on_their_nodes = true;
    for (i, node) in after.iter().enumerate() {
        let options = prism::TaskOptions::new()
            .placement_group(&group, Some(i))
            .num_cpus(0.0);
        let ran = must(
            prism::get(&must(node_of::remote_with(options), "submitted")),
            "a task in a bundle runs",
        );
        on_their_nodes &= ran == *node;
    }
    // The head started again created the detached actor anew elsewhere
    // (its first node, the old head, is dead).
    let moved = must_become(
        "the detached actor answers from another node",
        Duration::from_secs(40),
        || {
            let found = prism::get_actor::<Where>("on-head").ok()?;
            let node = prism::get(&found.node().ok()?).ok()?;
            (node != head.node_id).then_some(node)
        },
    );
    println!(
        "TAKEN_UP listed={listed} same_nodes={} tasks_on_their_nodes={on_their_nodes} detached_moved={}",
        after == before,
        !moved.is_empty()
    );
    prism::shutdown();
}

/// Makes a STRICT_SPREAD group named `name` of two `slot` bundles from the
/// node it runs on (its home) and says whether it was placed.
#[prism::remote]
fn make_named_group(name: String) -> String {
    let slot = || prism::Bundle::new().resource("slot", 1.0);
    let group = prism::named_placement_group(
        &name,
        vec![slot(), slot()],
        prism::PlacementStrategy::StrictSpread,
    );
    match group.and_then(|g| g.wait(Duration::from_secs(30))) {
        Ok(true) => "placed".into(),
        Ok(false) => "not placed in 30 s".into(),
        Err(e) => format!("failed: {e}"),
    }
}

#[test]
fn a_head_started_again_takes_up_the_groups_its_earlier_self_was_home_to() {
    let test = "a_head_started_again_takes_up_the_groups_its_earlier_self_was_home_to";
    if std::env::var_os(DRIVER).is_some() {
        return group_homed_at_the_head();
    }
    let Some((m, head)) = head_and_three("pghead", "slot") else {
        return;
    };
    let marks = fresh_marks("pghead");
    let marks_text = marks.display().to_string();
    std::thread::scope(|scope| {
        let driver = scope.spawn(|| {
            m.run_driver(
                1,
                test,
                &head,
                &[(DRIVER, "1"), (MARKS, marks_text.as_str())],
                Duration::from_secs(180),
            )
        });
        must_eventually("the group is placed", Duration::from_secs(60), || {
            marks.join("placed").exists()
        });
        prism_tests::kill(m.node_pid(0));
        std::thread::sleep(Duration::from_secs(1));
        // The new head has room for a bundle: taking the group up must not
        // move bundles that live nodes hold.
        let again = m.start_head_with(
            common::FAST_DEATH,
            &["--num-cpus", "1", "--resources", "{\"slot\": 1}"],
        );
        assert_eq!(again, head);
        must(
            std::fs::write(marks.join("restarted"), ""),
            "the driver is told",
        );
        let said = must(driver.join().map_err(|_| "panicked"), "the driver ends");
        assert!(
            said.contains(
                "TAKEN_UP listed=true same_nodes=true tasks_on_their_nodes=true detached_moved=true"
            ),
            "{said}"
        );
    });
    let _ = std::fs::remove_dir_all(&marks);
}
