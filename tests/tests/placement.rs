//! Placement groups and the control store's key-value table, through a real
//! cluster: reservations hold resources, work placed in a bundle runs on
//! them, removal stops it, and the key-value table is shared by processes.

mod common;

use common::{cluster, is_gone as gone, must_eventually};
use prism::{Bundle, PlacementGroupState, PlacementStrategy, TaskOptions};
use std::sync::Mutex;
use std::time::Duration;

/// Tests here reserve most of the node: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[prism::remote]
fn visible_gpus() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
}

#[prism::remote]
fn pid() -> u32 {
    std::process::id()
}

/// Waits for a task outside any group: a blocked worker of a group lends
/// its CPU to the node, so this cannot deadlock a node whose CPUs are all
/// reserved by the group.
#[prism::remote]
fn nested_outside() -> u32 {
    prism::get(&pid::remote().expect("submit from a worker")).expect("the child runs")
}

#[prism::remote]
fn kv_roundtrip(key: String) -> Option<Vec<u8>> {
    prism::kv::put(&format!("{key}/from-worker"), b"worker").ok()?;
    prism::kv::get(&key).ok()?
}

#[prism::actor]
struct Sleeper {}

#[prism::actor]
impl Sleeper {
    fn new() -> Self {
        Sleeper {}
    }
    fn pid(&self) -> u32 {
        std::process::id()
    }
}

#[test]
fn a_group_reserves_its_bundles_and_work_placed_in_it_runs_on_them() {
    let _one = serial();
    cluster();
    let pg = prism::placement_group(
        vec![
            Bundle::new().num_cpus(1.0).num_gpus(1.0),
            Bundle::new().num_cpus(1.0).num_gpus(1.0),
        ],
        PlacementStrategy::Pack,
    )
    .unwrap();
    assert!(
        pg.wait(Duration::from_secs(10)).unwrap(),
        "2 of 2 CPUs free"
    );
    let (state, gpus) = pg.state().unwrap();
    assert_eq!(state, PlacementGroupState::Created);
    assert_eq!(gpus.len(), 2);
    // The node's CPUs are all reserved: a plain task waits...
    let (_, available) = prism::cluster_resources().unwrap();
    assert_eq!(available.get("CPU").as_f64(), 0.0, "{available}");
    let outside = pid::remote().unwrap();
    assert!(matches!(
        prism::get_timeout(&outside, Duration::from_millis(300)),
        Err(prism::Error::GetTimeout { .. })
    ));
    // ...while tasks placed in the bundles run, on the bundle's GPU.
    for (i, devices) in gpus.iter().enumerate() {
        let opts = TaskOptions::new()
            .num_gpus(1.0)
            .placement_group(&pg, Some(i));
        let seen = prism::get(&visible_gpus::remote_with(opts).unwrap()).unwrap();
        assert_eq!(seen, devices[0].to_string(), "bundle {i}");
    }
    // An actor placed in a bundle dies with the group, and the plain task
    // gets the CPUs back.
    let actor = Sleeper::remote_with(
        prism::ActorOptions::new()
            .num_cpus(1.0)
            .placement_group(&pg, None),
    )
    .unwrap();
    let actor_pid = prism::get(&actor.pid().unwrap()).unwrap();
    prism::remove_placement_group(&pg).unwrap();
    assert!(prism::get_timeout(&outside, Duration::from_secs(10)).is_ok());
    let err = prism::get(&actor.pid().unwrap()).unwrap_err();
    assert!(matches!(err, prism::Error::ActorDied { .. }), "{err}");
    must_eventually("the actor's process exits", Duration::from_secs(5), || {
        gone(actor_pid)
    });
    let err = prism::get(&pid::remote_with(TaskOptions::new().placement_group(&pg, None)).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, prism::Error::PlacementGroupRemoved { .. }),
        "{err}"
    );
    // Once its last worker is gone the raylet forgets the group's bundles,
    // but the group still reads as removed, as in Ray.
    for _ in 0..10 {
        let (state, _) = pg.state().unwrap();
        assert_eq!(state, prism::PlacementGroupState::Removed);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_group_that_does_not_fit_yet_waits_for_resources() {
    let _one = serial();
    cluster();
    let first = prism::placement_group(
        vec![Bundle::new().num_cpus(2.0)],
        PlacementStrategy::StrictPack,
    )
    .unwrap();
    first.ready().unwrap();
    let second =
        prism::placement_group(vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack).unwrap();
    assert!(
        !second.wait(Duration::from_millis(200)).unwrap(),
        "no CPU free yet"
    );
    prism::remove_placement_group(&first).unwrap();
    assert!(second.wait(Duration::from_secs(10)).unwrap());
    prism::remove_placement_group(&second).unwrap();
    prism::remove_placement_group(&second).unwrap();
    let err = second.wait(Duration::from_secs(1)).unwrap_err();
    assert!(
        matches!(err, prism::Error::PlacementGroupRemoved { .. }),
        "{err}"
    );
}

#[test]
fn groups_that_can_never_be_placed_are_refused_by_name() {
    let _one = serial();
    cluster();
    let err = prism::placement_group(
        vec![Bundle::new().num_cpus(1.0), Bundle::new().num_cpus(1.0)],
        PlacementStrategy::StrictSpread,
    )
    .unwrap_err();
    assert!(
        matches!(err, prism::Error::Infeasible { .. }) && err.to_string().contains("STRICT_SPREAD"),
        "{err}"
    );
    let err = prism::placement_group(vec![Bundle::new().num_cpus(3.0)], PlacementStrategy::Pack)
        .unwrap_err();
    assert!(matches!(err, prism::Error::Infeasible { .. }), "{err}");
    let err = prism::placement_group(vec![Bundle::new()], PlacementStrategy::Pack).unwrap_err();
    assert!(err.to_string().contains("bundle 0 is empty"), "{err}");
    let err = prism::placement_group(vec![], PlacementStrategy::Pack).unwrap_err();
    assert!(matches!(err, prism::Error::InvalidArgument { .. }), "{err}");
    // 1.8 GPUs in all, but three 0.6 shares do not pack onto two devices.
    let shares = (0..3).map(|_| Bundle::new().num_gpus(0.6)).collect();
    let err = prism::placement_group(shares, PlacementStrategy::Pack).unwrap_err();
    assert!(matches!(err, prism::Error::Infeasible { .. }), "{err}");

    let pg =
        prism::placement_group(vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack).unwrap();
    pg.ready().unwrap();
    let err = pid::remote_with(TaskOptions::new().placement_group(&pg, Some(1))).unwrap_err();
    assert!(err.to_string().contains("the group has 1 bundles"), "{err}");
    let err = prism::get(
        &pid::remote_with(
            TaskOptions::new()
                .num_cpus(2.0)
                .placement_group(&pg, Some(0)),
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(err, prism::Error::Infeasible { .. }) && err.to_string().contains("bundle 0"),
        "{err}"
    );
    prism::remove_placement_group(&pg).unwrap();
}

#[test]
fn the_key_value_table_is_shared_by_driver_and_workers() {
    cluster();
    let key = format!("kv-test-{}", std::process::id());
    assert!(prism::kv::put(&key, b"driver").unwrap(), "a new key");
    assert!(
        !prism::kv::put(&key, b"driver again").unwrap(),
        "replaced, not new"
    );
    assert!(!prism::kv::put_if_absent(&key, b"ignored").unwrap());
    let seen = prism::get(&kv_roundtrip::remote(key.clone()).unwrap()).unwrap();
    assert_eq!(seen.as_deref(), Some(&b"driver again"[..]));
    assert_eq!(
        prism::kv::get(&format!("{key}/from-worker"))
            .unwrap()
            .as_deref(),
        Some(&b"worker"[..])
    );
    assert_eq!(
        prism::kv::keys(&key).unwrap(),
        vec![key.clone(), format!("{key}/from-worker")]
    );
    assert!(prism::kv::delete(&key).unwrap());
    assert!(!prism::kv::delete(&key).unwrap());
    assert_eq!(prism::kv::get(&key).unwrap(), None);
}

#[test]
fn a_blocked_worker_in_a_group_lends_its_cpu_to_work_outside_it() {
    let _one = serial();
    cluster();
    let pg = prism::placement_group(
        vec![Bundle::new().num_cpus(1.0), Bundle::new().num_cpus(1.0)],
        PlacementStrategy::Pack,
    )
    .unwrap();
    pg.ready().unwrap();
    let outer =
        nested_outside::remote_with(TaskOptions::new().placement_group(&pg, Some(0))).unwrap();
    let child_pid = prism::get_timeout(&outer, Duration::from_secs(20)).expect("no deadlock");
    assert!(child_pid > 0);
    prism::remove_placement_group(&pg).unwrap();
    // The bundles come back once the group's workers are gone.
    must_eventually(
        "the node's CPUs are free again",
        Duration::from_secs(10),
        || {
            let (total, available) = prism::cluster_resources().unwrap();
            available.get("CPU") == total.get("CPU")
        },
    );
}

/// Finds the group named `name` from a worker and says its id.
#[prism::remote]
fn group_id_from_worker(name: String) -> String {
    match prism::get_placement_group(&name) {
        Ok(group) => group.id().to_string(),
        Err(e) => format!("not found: {e}"),
    }
}

#[test]
fn a_named_group_is_found_and_listed_by_name_which_is_free_again_once_removed() {
    let _one = serial();
    cluster();
    let one_cpu = || vec![Bundle::new().num_cpus(1.0)];
    let pg = prism::named_placement_group("named-test", one_cpu(), PlacementStrategy::Pack)
        .expect("a named group is made");
    assert_eq!(pg.name(), Some("named-test"));
    pg.wait(Duration::from_secs(10)).expect("created");
    let found = prism::get_placement_group("named-test").expect("found by name");
    assert_eq!(found.id(), pg.id());
    let from_worker = prism::get(&group_id_from_worker::remote("named-test".to_string()).unwrap())
        .expect("the worker runs");
    assert_eq!(from_worker, pg.id().to_string(), "found from a worker too");
    let listed = prism::list_placement_groups().expect("listed");
    assert!(
        listed.iter().any(|(name, g, state)| name == "named-test"
            && g.id() == pg.id()
            && *state == PlacementGroupState::Created),
        "{listed:?}"
    );
    let taken = prism::named_placement_group("named-test", one_cpu(), PlacementStrategy::Pack)
        .expect_err("a name is held by one group");
    assert!(taken.to_string().contains("is held by group"), "{taken}");
    let empty = prism::named_placement_group("", one_cpu(), PlacementStrategy::Pack)
        .expect_err("an empty name is refused");
    assert!(empty.to_string().contains("must not be empty"), "{empty}");
    prism::remove_placement_group(&pg).expect("removed");
    assert!(
        prism::get_placement_group("named-test").is_err(),
        "gone by name"
    );
    assert!(
        !prism::list_placement_groups()
            .expect("listed")
            .iter()
            .any(|(name, _, _)| name == "named-test"),
        "no longer listed"
    );
    let again = prism::named_placement_group("named-test", one_cpu(), PlacementStrategy::Pack)
        .expect("the name is free again");
    assert_ne!(again.id(), pg.id());
    prism::remove_placement_group(&again).expect("removed");
}
