//! The scheduler on its own: no processes, no sockets. A waiting client is
//! a number, and the tests play the launcher's part by registering the
//! workers the scheduler asks for (or reporting that they failed).

use super::*;
use prism_protocol::messages::{
    PlacementGroupInfo, PlacementGroupSpec, PlacementGroupState, PlacementStrategy,
};
use prism_protocol::resources::{Quantity, GPU};

type Sched = Scheduler<u32>;

fn shape(cpu: f64, gpu: f64) -> ResourceSet {
    let mut s = ResourceSet::new();
    s.set(CPU, Quantity::from_f64(CPU, cpu).unwrap());
    if gpu > 0.0 {
        s.set(GPU, Quantity::from_f64(GPU, gpu).unwrap());
    }
    s
}

fn scheduler(cpus: f64, gpus: f64, prestart: usize, max_workers: usize) -> Sched {
    Scheduler::new(
        shape(cpus, gpus),
        Limits {
            prestart_workers: prestart,
            max_workers_per_job: max_workers,
            worker_start_attempts: 3,
            idle_worker_timeout: Duration::from_secs(10),
            removed_placement_groups_kept: 2,
            logs_dir: PathBuf::from("/tmp/logs"),
        },
    )
}

fn lease(job: JobId, reply: u32, shape: ResourceSet) -> LeaseRequest<u32> {
    LeaseRequest {
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
        shape,
        job,
        env: Default::default(),
        bundle: None,
        grantee: Grantee::Client {
            holder: u64::from(reply),
            reply,
        },
    }
}

/// What one round of decisions holds, by kind.
#[derive(Debug, Default)]
struct Round {
    started: Vec<(WorkerId, Vec<u32>)>,
    granted: Vec<(u32, WorkerId, LeaseId)>,
    refused: Vec<(u32, Error)>,
    stopped: Vec<u32>,
    lost: Vec<ActorId>,
    actor_grants: Vec<(ActorId, WorkerId)>,
    group_answers: Vec<(u32, Result<PlacementGroupInfo, Error>)>,
    wanted: Vec<(u64, Vec<LeaseId>)>,
}

fn round(s: &mut Sched) -> Round {
    let mut r = Round::default();
    for d in s.drain() {
        match d {
            Decision::StartWorker {
                worker, gpu_ids, ..
            } => r.started.push((worker, gpu_ids)),
            Decision::Granted {
                grantee: Grantee::Client { reply, .. },
                lease,
                worker,
                ..
            } => r.granted.push((reply, worker, lease)),
            Decision::Granted {
                grantee: Grantee::Actor(a),
                worker,
                ..
            } => r.actor_grants.push((a, worker)),
            Decision::Refused {
                grantee: Grantee::Client { reply, .. },
                error,
            } => r.refused.push((reply, error)),
            Decision::Refused {
                grantee: Grantee::Actor(a),
                ..
            }
            | Decision::ActorLost { actor: a, .. } => r.lost.push(a),
            Decision::StopWorker { pid } => r.stopped.push(pid),
            Decision::GroupAnswer { reply, answer } => r.group_answers.push((reply, answer)),
            Decision::LeasesWanted { holder, leases } => r.wanted.push((holder, leases)),
        }
    }
    r
}

/// Plays the launcher: every worker asked for forks and registers, with
/// pids from 100 on.
fn boot(s: &mut Sched, started: &[(WorkerId, Vec<u32>)]) {
    for (i, (worker, _)) in started.iter().enumerate() {
        let pid = 100 + i as u32;
        assert!(s.set_pid(*worker, pid));
        s.register_worker(*worker, format!("w{pid}"), pid).unwrap();
    }
}

/// A job with `prestart` workers up and registered.
fn job_with_workers(s: &mut Sched) -> JobId {
    let job = JobId::new();
    s.add_job(job, "/bin/demo".into());
    let r = round(s);
    boot(s, &r.started);
    assert!(round(s).granted.is_empty());
    job
}

#[test]
fn a_request_with_its_own_environment_gets_a_worker_started_with_it() {
    let mut s = scheduler(2.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    let env: EnvVars = [("MODE".to_string(), "fast".to_string())].into();
    let with_env = |reply: u32| LeaseRequest {
        env: env.clone(),
        ..lease(job, reply, shape(1.0, 0.0))
    };
    s.request_lease(with_env(1));
    let r = round(&mut s);
    assert!(
        r.granted.is_empty(),
        "the idle worker has the job's environment only"
    );
    assert_eq!(
        r.started.len(),
        1,
        "a worker with the environment is started"
    );
    let mut started_env = None;
    for d in s.drain() {
        if let Decision::StartWorker { env, .. } = d {
            started_env = Some(env);
        }
    }
    assert_eq!(started_env, None, "one start, not two");
    let new = r.started[0].0;
    assert!(s.set_pid(new, 200));
    s.register_worker(new, "w200".into(), 200).unwrap();
    let r = round(&mut s);
    assert_eq!(
        r.granted.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        vec![(1, new)]
    );
    assert_eq!(s.worker(new).map(|w| w.env.clone()), Some(env.clone()));
    // Returned, it serves the next request with that environment, and a
    // plain request goes to a plain worker.
    s.return_lease(r.granted[0].2, false);
    s.request_lease(with_env(2));
    s.request_lease(lease(job, 3, shape(1.0, 0.0)));
    let r = round(&mut s);
    let grants: Vec<(u32, bool)> = r.granted.iter().map(|g| (g.0, g.1 == new)).collect();
    assert_eq!(grants, vec![(2, true), (3, false)]);
    assert!(r.started.is_empty());
}

#[test]
fn at_the_job_limit_an_idle_worker_of_another_environment_makes_room() {
    let mut s = scheduler(4.0, 0.0, 1, 1);
    let job = job_with_workers(&mut s);
    let plain = s
        .workers
        .iter()
        .find(|(_, w)| w.job == job)
        .map(|(id, _)| *id)
        .expect("the prestarted worker");
    let env: EnvVars = [("MODE".to_string(), "fast".to_string())].into();
    s.request_lease(LeaseRequest {
        env: env.clone(),
        ..lease(job, 1, shape(1.0, 0.0))
    });
    let r = round(&mut s);
    assert!(r.granted.is_empty() && r.started.is_empty());
    assert_eq!(r.stopped, vec![100], "the plain idle worker is stopped");
    s.request_lease(LeaseRequest {
        env: env.clone(),
        ..lease(job, 2, shape(1.0, 0.0))
    });
    assert!(round(&mut s).stopped.is_empty(), "one at a time");
    s.worker_exited(plain, "stopped".into());
    let r = round(&mut s);
    assert_eq!(
        r.started.len(),
        1,
        "the request's worker starts once room is made"
    );
}

#[test]
fn leases_go_in_arrival_order_and_wait_for_free_cpus() {
    let mut s = scheduler(2.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    for reply in 1..=3 {
        s.request_lease(lease(job, reply, shape(1.0, 0.0)));
    }
    let r = round(&mut s);
    let granted: Vec<u32> = r.granted.iter().map(|g| g.0).collect();
    assert_eq!(granted, vec![1, 2], "two CPUs, two leases");
    assert!(
        r.started.is_empty(),
        "the third waits for a CPU, not a worker"
    );
    let returned_worker = r.granted[0].1;
    s.return_lease(r.granted[0].2, false);
    let r = round(&mut s);
    assert_eq!(r.granted.iter().map(|g| g.0).collect::<Vec<_>>(), vec![3]);
    assert_eq!(
        r.granted[0].1, returned_worker,
        "the returned worker serves the next lease"
    );
    assert!(s.resources().available().get(CPU).is_zero());
}

#[test]
fn waiting_requests_that_may_spill_are_handed_out_and_the_rest_stay() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    for reply in 2..=4 {
        let mut request = lease(job, reply, shape(1.0, 0.0));
        request.may_spill = reply != 3;
        s.request_lease(request);
    }
    assert_eq!(
        round(&mut s).granted.len(),
        1,
        "one CPU: one lease, three wait"
    );
    // Another node has room for one.
    let mut room = 1;
    let moved = s.take_spillable(|_| {
        (room > 0).then(|| {
            room -= 1;
            "node-b"
        })
    });
    assert_eq!(moved, vec![(2, "node-b")]);
    // The others still wait here, in order, and get the CPU as it frees.
    let lease_id = s.leases.keys().copied().next().unwrap();
    s.return_lease(lease_id, false);
    let granted: Vec<u32> = round(&mut s).granted.iter().map(|g| g.0).collect();
    assert_eq!(granted, vec![3]);
}

#[test]
fn a_request_no_node_holds_waits_for_one_as_demand_then_fails_in_time() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    let now = std::time::Instant::now();
    // Two GPU requests that wait for a node that has one, the second
    // only briefly; and a CPU one granted here meanwhile.
    for (reply, wait) in [(1, 60), (2, 0)] {
        let mut request = lease(job, reply, shape(0.0, 1.0));
        request.may_spill = true;
        request.wait_for_node_until = Some(now + Duration::from_secs(wait));
        s.request_lease(request);
    }
    s.request_lease(lease(job, 3, shape(1.0, 0.0)));
    let r = round(&mut s);
    assert_eq!(r.granted.iter().map(|g| g.0).collect::<Vec<_>>(), vec![3]);
    assert!(r.refused.is_empty(), "they wait: {:?}", r.refused);
    assert_eq!(
        s.demands(),
        vec![(shape(0.0, 1.0), 2)],
        "reported as demand while they wait"
    );
    // No node has a GPU yet: the first keeps waiting, the second's time
    // is up and it fails as infeasible.
    let moved = s.take_spillable(|_| None::<&str>);
    assert!(moved.is_empty());
    let r = round(&mut s);
    assert_eq!(r.refused.len(), 1);
    assert_eq!(r.refused[0].0, 2);
    assert!(
        matches!(r.refused[0].1, Error::Infeasible { .. }),
        "{:?}",
        r.refused[0].1
    );
    // A node with a GPU joins: the first goes there.
    let moved = s.take_spillable(|shape| (shape.get("GPU").units() > 0).then_some("gpu-node"));
    assert_eq!(moved, vec![(1, "gpu-node")]);
    assert!(s.demands().is_empty());
}

#[test]
fn a_request_that_cannot_fit_now_does_not_hold_back_smaller_ones() {
    let mut s = scheduler(2.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    s.request_lease(lease(job, 2, shape(2.0, 0.0)));
    s.request_lease(lease(job, 3, shape(1.0, 0.0)));
    let granted: Vec<u32> = round(&mut s).granted.iter().map(|g| g.0).collect();
    assert_eq!(granted, vec![1, 3]);
}

#[test]
fn an_infeasible_request_is_refused_at_once_naming_shape_and_node() {
    let mut s = scheduler(2.0, 0.0, 0, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 9, shape(3.0, 0.0)));
    let r = round(&mut s);
    assert_eq!(r.refused.len(), 1);
    let text = r.refused[0].1.to_string();
    assert!(text.contains("CPU: 3") && text.contains("CPU: 2"), "{text}");
}

#[test]
fn a_missing_worker_is_started_once_per_request_up_to_the_job_limit() {
    let mut s = scheduler(8.0, 0.0, 0, 3);
    let job = job_with_workers(&mut s);
    for reply in 1..=5 {
        s.request_lease(lease(job, reply, shape(1.0, 0.0)));
    }
    let r = round(&mut s);
    assert_eq!(r.started.len(), 3, "bounded by max_workers_per_job");
    assert!(r.granted.is_empty());
    boot(&mut s, &r.started);
    let r = round(&mut s);
    assert_eq!(r.granted.len(), 3);
    assert!(r.started.is_empty(), "no worker beyond the limit");
    // A worker blocked in `get` does not count against the limit: the
    // tasks it waits for need workers of their own.
    s.set_blocked(r.granted[0].1, true);
    assert_eq!(round(&mut s).started.len(), 1);
}

#[test]
fn fractional_gpus_pack_onto_one_device_and_need_a_worker_that_sees_it() {
    let mut s = scheduler(4.0, 2.0, 0, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.5)));
    s.request_lease(lease(job, 2, shape(1.0, 0.5)));
    let r = round(&mut s);
    let devices: Vec<Vec<u32>> = r.started.iter().map(|(_, g)| g.clone()).collect();
    assert_eq!(devices, vec![vec![0], vec![0]], "workers that see device 0");
    boot(&mut s, &r.started);
    assert_eq!(round(&mut s).granted.len(), 2);
    s.request_lease(lease(job, 3, shape(1.0, 1.0)));
    let r = round(&mut s);
    assert_eq!(r.started[0].1, vec![1], "a whole GPU is the free device");
    boot(&mut s, &r.started);
    let r = round(&mut s);
    assert_eq!(s.worker(r.granted[0].1).unwrap().gpu_ids, vec![1]);
    s.request_lease(lease(job, 4, shape(0.0, 0.5)));
    assert!(round(&mut s).granted.is_empty(), "both devices are taken");
}

#[test]
fn a_blocked_worker_lends_its_cpu_until_it_wakes() {
    let mut s = scheduler(1.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    let first = round(&mut s).granted[0];
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    assert!(round(&mut s).granted.is_empty());
    s.set_blocked(first.1, true);
    let second = round(&mut s).granted;
    assert_eq!(second.len(), 1, "the lent CPU runs the nested task");
    s.set_blocked(first.1, false);
    s.return_lease(second[0].2, false);
    s.return_lease(first.2, false);
    assert_eq!(&s.resources().available(), s.resources().total());
}

#[test]
fn failed_starts_fail_the_jobs_queued_requests_after_the_allowed_attempts() {
    let mut s = scheduler(4.0, 0.0, 0, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    for attempt in 1..=3 {
        let r = round(&mut s);
        assert_eq!(r.started.len(), 1, "attempt {attempt} starts a worker");
        assert!(r.refused.is_empty());
        s.worker_exited(r.started[0].0, "no such file".into());
    }
    let r = round(&mut s);
    assert_eq!(r.refused.len(), 1);
    let text = r.refused[0].1.to_string();
    assert!(
        text.contains("/bin/demo") && text.contains("no such file"),
        "{text}"
    );
    // A later request tries again.
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    assert_eq!(round(&mut s).started.len(), 1);
}

#[test]
fn a_closed_client_gives_back_its_leases_and_drops_its_queue() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    assert_eq!(round(&mut s).granted.len(), 1);
    s.client_gone(1);
    let r = round(&mut s);
    assert_eq!(r.granted.iter().map(|g| g.0).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn a_client_withdraws_its_queued_requests_of_one_shape_and_others_keep_theirs() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    let from = |holder: u64, reply: u32, cpus: f64| LeaseRequest {
        grantee: Grantee::Client { holder, reply },
        ..lease(job, reply, shape(cpus, 0.0))
    };
    s.request_lease(from(1, 10, 1.0));
    s.request_lease(from(1, 11, 1.0));
    s.request_lease(from(2, 20, 1.0));
    s.request_lease(from(1, 12, 0.5));
    let r = round(&mut s);
    assert_eq!(r.granted.iter().map(|g| g.0).collect::<Vec<_>>(), vec![10]);
    assert_eq!(
        s.cancel_requests(1, &shape(1.0, 0.0), None, &EnvVars::new()),
        vec![11]
    );
    assert!(
        s.cancel_requests(1, &shape(1.0, 0.0), None, &EnvVars::new())
            .is_empty(),
        "a request is withdrawn once"
    );
    s.return_lease(r.granted[0].2, false);
    let r = round(&mut s);
    assert_eq!(
        r.granted.iter().map(|g| g.0).collect::<Vec<_>>(),
        vec![20],
        "the withdrawn request does not take the freed CPU"
    );
    assert_eq!(
        s.cancel_requests(1, &shape(0.5, 0.0), None, &EnvVars::new()),
        vec![12],
        "a request of another shape stays until withdrawn itself"
    );
}

#[test]
fn a_grant_is_contended_only_while_another_holder_waits() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    let contended = |s: &mut Sched| -> Vec<(u32, bool)> {
        s.drain()
            .into_iter()
            .filter_map(|d| match d {
                Decision::Granted {
                    grantee: Grantee::Client { reply, .. },
                    contended,
                    ..
                } => Some((reply, contended)),
                _ => None,
            })
            .collect()
    };
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    let first = contended(&mut s);
    assert_eq!(first, vec![(1, false)], "nobody else waits");
    let lease_id = s.leases.keys().copied().next().expect("one lease");
    // The same holder's second request waits, then another holder's.
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    s.return_lease(lease_id, false);
    assert_eq!(
        contended(&mut s),
        vec![(1, true)],
        "holder 2 still waits for the CPU"
    );
    let lease_id = s.leases.keys().copied().next().expect("one lease");
    s.return_lease(lease_id, false);
    assert_eq!(contended(&mut s), vec![(2, false)]);
}

#[test]
fn a_lease_granted_before_others_wait_is_named_to_its_holder_once() {
    let mut s = scheduler(2.0, 1.0, 3, 8);
    let job = job_with_workers(&mut s);
    let cpu = shape(1.0, 0.0);
    let gpu = shape(0.0, 1.0);
    s.request_lease(lease(job, 1, cpu.clone()));
    s.request_lease(lease(job, 2, gpu.clone()));
    let first = round(&mut s);
    // The GPU lease needs a worker that sees the device: it starts one.
    boot(&mut s, &first.started);
    let second = round(&mut s);
    assert!(
        first.wanted.is_empty() && second.wanted.is_empty(),
        "nobody waits yet"
    );
    let lease_of = |holder: u32| {
        let granted = first.granted.iter().chain(&second.granted);
        granted.filter(|g| g.0 == holder).map(|g| g.2).next()
    };
    let (cpu_lease, gpu_lease) = (
        lease_of(1).expect("a CPU lease"),
        lease_of(2).expect("a GPU lease"),
    );
    // Holder 1's own request for the same shape waits behind nothing it
    // could take from itself: its lease is not wanted.
    s.request_lease(lease(job, 1, cpu.clone()));
    s.request_lease(lease(job, 1, cpu.clone()));
    let r = round(&mut s);
    assert_eq!(r.granted.len(), 1, "the second CPU is granted");
    assert!(
        r.wanted.is_empty(),
        "{:?}: holder 1 waits only on itself",
        r.wanted
    );
    // Holder 3 waits for a GPU: only the GPU lease is wanted, not holder
    // 1's CPU leases, and it is named once.
    s.request_lease(lease(job, 3, gpu.clone()));
    let r = round(&mut s);
    assert_eq!(r.wanted, vec![(2, vec![gpu_lease])]);
    s.request_lease(lease(job, 4, gpu.clone()));
    assert!(round(&mut s).wanted.is_empty(), "each lease is named once");
    // Holder 1 asks for another shape that needs a CPU: its own CPU
    // leases are wanted now, for that request.
    s.request_lease(lease(job, 1, shape(0.5, 0.0)));
    let r = round(&mut s);
    assert_eq!(r.wanted.len(), 1, "{:?}", r.wanted);
    let (holder, mut named) = r.wanted[0].clone();
    named.sort();
    let mut cpu_leases: Vec<LeaseId> = s
        .leases
        .iter()
        .filter(|(_, l)| l.holder == Some(1))
        .map(|(id, _)| *id)
        .collect();
    cpu_leases.sort();
    assert_eq!((holder, named), (1, cpu_leases));
    assert!(s.leases.contains_key(&cpu_lease));
}

#[test]
fn an_actor_waiting_for_a_cpu_wants_the_lease_that_holds_it() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    let held = round(&mut s).granted[0].2;
    let actor = ActorId::new();
    s.request_lease(LeaseRequest {
        shape: shape(1.0, 0.0),
        ..actor_lease(job, actor)
    });
    assert_eq!(round(&mut s).wanted, vec![(1, vec![held])]);
}

#[test]
fn a_worker_its_holder_could_not_reach_is_stopped_and_never_granted_again() {
    let mut s = scheduler(1.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    let (_, unreachable, lease_id) = round(&mut s).granted[0];
    // Holder 1 could not connect: the process died and its exit is not
    // seen yet.
    s.return_lease(lease_id, true);
    let r = round(&mut s);
    assert_eq!(r.stopped, vec![100], "the unreachable process is stopped");
    assert!(
        r.granted.is_empty(),
        "holder 2 must not get the dead worker"
    );
    assert_eq!(r.started.len(), 1, "a new worker starts for holder 2");
    boot_unique(&mut s, &r.started);
    let r = round(&mut s);
    assert_eq!(r.granted.len(), 1);
    assert_eq!(r.granted[0].0, 2);
    assert_ne!(r.granted[0].1, unreachable);
    assert_eq!(
        s.worker(unreachable).map(|w| w.usage),
        Some(WorkerUse::Unreachable),
        "kept until its exit is seen, for the actors it may own"
    );
    // Its exit, reaped later, only removes it.
    s.worker_exited(unreachable, "killed".into());
    assert!(s.worker(unreachable).is_none());
    let r = round(&mut s);
    assert!(r.granted.is_empty());
    assert_eq!(s.resources().available().get(CPU), Quantity::ZERO);
}

#[test]
fn an_exited_leased_worker_frees_its_resources_and_the_pool_is_refilled() {
    let mut s = scheduler(2.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(2.0, 0.0)));
    let granted = round(&mut s).granted[0];
    s.worker_exited(granted.1, "killed".into());
    let r = round(&mut s);
    assert_eq!(r.started.len(), 1, "back to two workers");
    assert_eq!(&s.resources().available(), s.resources().total());
}

#[test]
fn an_ended_job_stops_its_workers_and_a_late_fork_is_unwanted() {
    let mut s = scheduler(2.0, 0.0, 1, 8);
    let job = JobId::new();
    s.add_job(job, "/bin/demo".into());
    let starting = round(&mut s).started[0].0;
    s.end_job(job, &HashSet::new());
    assert!(round(&mut s).stopped.contains(&0));
    assert!(
        !s.set_pid(starting, 42),
        "forked after its job ended: kill it"
    );
    s.worker_exited(starting, "killed".into());
    assert!(s.set_pid(starting, 42), "gone already: nothing to do");
}

#[test]
fn idle_workers_beyond_the_pool_stop_after_the_timeout() {
    let mut s = scheduler(4.0, 0.0, 1, 8);
    let job = job_with_workers(&mut s);
    for reply in 1..=3 {
        s.request_lease(lease(job, reply, shape(1.0, 0.0)));
    }
    let first = round(&mut s);
    boot(&mut s, &first.started);
    let rest = round(&mut s);
    let leases: Vec<LeaseId> = first
        .granted
        .iter()
        .chain(&rest.granted)
        .map(|g| g.2)
        .collect();
    assert_eq!(leases.len(), 3);
    for l in leases {
        s.return_lease(l, false);
    }
    let now = Instant::now();
    assert!(
        s.idle_workers_to_stop(now).is_empty(),
        "not idle long enough"
    );
    let later = now + Duration::from_secs(11);
    assert_eq!(s.idle_workers_to_stop(later).len(), 2, "one is kept");
}

fn group(bundles: Vec<ResourceSet>) -> PlacementGroupSpec {
    PlacementGroupSpec {
        id: PlacementGroupId::new(),
        name: None,
        bundles,
        strategy: PlacementStrategy::Pack,
    }
}

fn in_bundle(job: JobId, reply: u32, shape: ResourceSet, g: PlacementGroupId) -> LeaseRequest<u32> {
    LeaseRequest {
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
        bundle: Some(BundleRef {
            group: g,
            index: None,
        }),
        ..lease(job, reply, shape)
    }
}

#[test]
fn a_group_reserves_all_bundles_at_once_or_waits() {
    let mut s = scheduler(4.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(2.0, 0.0)));
    let held = round(&mut s).granted[0];
    let spec = group(vec![shape(1.0, 0.0), shape(2.0, 0.0)]);
    let id = spec.id;
    s.create_group(job, spec).unwrap();
    assert!(
        s.watch_group(id, true, 7).is_some(),
        "3 CPUs wanted, 2 free"
    );
    assert!(round(&mut s).group_answers.is_empty());
    s.return_lease(held.2, false);
    let answers = round(&mut s).group_answers;
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answers[0].1.as_ref().unwrap().state,
        PlacementGroupState::Created
    );
    // Leases in the group draw from its bundles, not from the node.
    s.request_lease(in_bundle(job, 2, shape(2.0, 0.0), id));
    assert_eq!(round(&mut s).granted.len(), 1);
    s.request_lease(in_bundle(job, 3, shape(2.0, 0.0), id));
    let r = round(&mut s);
    assert!(
        r.granted.is_empty() && r.refused.is_empty(),
        "waits for its bundle"
    );
    s.request_lease(lease(job, 4, shape(1.0, 0.0)));
    assert_eq!(round(&mut s).granted.len(), 1, "the node's last CPU");
}

#[test]
fn a_group_that_cannot_fit_the_node_is_refused_and_strict_spread_needs_nodes() {
    let mut s = scheduler(2.0, 2.0, 0, 8);
    let job = job_with_workers(&mut s);
    let three = group(vec![shape(0.0, 0.6), shape(0.0, 0.6), shape(0.0, 0.6)]);
    let err = s.create_group(job, three).unwrap_err();
    assert!(matches!(err, Error::Infeasible { .. }), "{err}");
    let mut spread = group(vec![shape(1.0, 0.0), shape(1.0, 0.0)]);
    spread.strategy = PlacementStrategy::StrictSpread;
    assert!(s.create_group(job, spread).is_err());
    let empty = group(vec![ResourceSet::new()]);
    assert!(s.create_group(job, empty).is_err());
}

#[test]
fn removing_a_group_stops_its_workers_fails_its_queue_and_frees_it_last() {
    let mut s = scheduler(2.0, 0.0, 2, 8);
    let job = job_with_workers(&mut s);
    let spec = group(vec![shape(1.0, 0.0)]);
    let id = spec.id;
    s.create_group(job, spec).unwrap();
    s.request_lease(in_bundle(job, 1, shape(1.0, 0.0), id));
    let inside = round(&mut s).granted[0];
    s.request_lease(in_bundle(job, 2, shape(1.0, 0.0), id));
    assert!(round(&mut s).granted.is_empty());
    s.remove_group(id);
    let r = round(&mut s);
    assert_eq!(r.refused.len(), 1, "the queued request fails");
    assert!(matches!(
        r.refused[0].1,
        Error::PlacementGroupRemoved { .. }
    ));
    let pid = s.worker(inside.1).unwrap().pid;
    assert_eq!(r.stopped, vec![pid]);
    // Until its worker is gone the bundle stays reserved.
    assert_eq!(s.resources().available().get(CPU), Quantity::whole(1));
    s.worker_exited(inside.1, "killed".into());
    round(&mut s);
    assert_eq!(&s.resources().available(), s.resources().total());
    // Still readable as removed, up to the configured number of groups.
    assert!(s.watch_group(id, false, 3).is_none());
    let answer = round(&mut s).group_answers.remove(0).1.unwrap();
    assert_eq!(answer.state, PlacementGroupState::Removed);
    for _ in 0..2 {
        let other = group(vec![shape(1.0, 0.0)]);
        let other_id = other.id;
        s.create_group(job, other).unwrap();
        s.remove_group(other_id);
    }
    s.watch_group(id, false, 4);
    assert!(
        round(&mut s).group_answers.remove(0).1.is_err(),
        "forgotten"
    );
}

#[test]
fn an_actor_lease_is_not_bound_by_the_job_limit_and_dies_with_its_worker() {
    let mut s = scheduler(4.0, 0.0, 0, 1);
    let job = job_with_workers(&mut s);
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    let r = round(&mut s);
    boot(&mut s, &r.started);
    assert_eq!(round(&mut s).granted.len(), 1);
    let actor = ActorId::new();
    s.request_lease(LeaseRequest {
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
        shape: shape(1.0, 0.0),
        job,
        env: Default::default(),
        bundle: None,
        grantee: Grantee::Actor(actor),
    });
    let r = round(&mut s);
    assert_eq!(
        r.started.len(),
        1,
        "actors get a worker past the task limit"
    );
    boot(&mut s, &r.started);
    let r = round(&mut s);
    assert_eq!(r.actor_grants, vec![(actor, r.actor_grants[0].1)]);
    s.worker_exited(r.actor_grants[0].1, "crashed".into());
    assert_eq!(round(&mut s).lost, vec![actor]);
}

/// [`boot`] with pids unique across rounds.
fn boot_unique(s: &mut Sched, started: &[(WorkerId, Vec<u32>)]) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1000);
    for (worker, _) in started {
        let pid = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(s.set_pid(*worker, pid));
        s.register_worker(*worker, format!("w{pid}"), pid).unwrap();
    }
}

fn actor_lease(job: JobId, actor: ActorId) -> LeaseRequest<u32> {
    LeaseRequest {
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
        shape: shape(0.0, 0.0),
        job,
        env: Default::default(),
        bundle: None,
        grantee: Grantee::Actor(actor),
    }
}

#[test]
fn an_ended_job_keeps_its_detached_actors_and_can_restart_them_without_a_pool() {
    let mut s = scheduler(2.0, 0.0, 1, 8);
    let job = JobId::new();
    s.add_job(job, "/bin/demo".into());
    let r = round(&mut s);
    boot_unique(&mut s, &r.started);
    let (detached, attached) = (ActorId::new(), ActorId::new());
    s.request_lease(actor_lease(job, detached));
    s.request_lease(actor_lease(job, attached));
    let mut grants = Vec::new();
    for _ in 0..4 {
        let r = round(&mut s);
        boot_unique(&mut s, &r.started);
        grants.extend(r.actor_grants);
    }
    assert_eq!(grants.len(), 2, "both actors got a worker: {grants:?}");
    let worker_of = |a: ActorId| grants.iter().find(|g| g.0 == a).map(|g| g.1).unwrap();
    let kept_pid = s.worker(worker_of(detached)).unwrap().pid;
    s.end_job(job, &HashSet::from([detached]));
    let r = round(&mut s);
    assert!(
        !r.stopped.contains(&kept_pid),
        "the detached actor's process lives on"
    );
    assert!(!r.stopped.is_empty(), "every other worker of the job stops");
    for pid in r.stopped {
        let id = s
            .workers
            .iter()
            .find(|(_, w)| w.pid == pid)
            .map(|(id, _)| *id);
        s.worker_exited(id.unwrap(), "stopped".into());
    }
    let r = round(&mut s);
    assert_eq!(r.lost, vec![attached]);
    assert!(r.started.is_empty(), "a retired job keeps no worker pool");
    // The detached actor's process dies: a restart gets a new worker.
    s.worker_exited(worker_of(detached), "crashed".into());
    assert_eq!(round(&mut s).lost, vec![detached]);
    s.request_lease(actor_lease(job, detached));
    let r = round(&mut s);
    assert_eq!(r.started.len(), 1, "the restart starts a worker");
    boot_unique(&mut s, &r.started);
    assert_eq!(round(&mut s).actor_grants.len(), 1);
}

#[test]
fn bundles_moved_off_a_dead_node_are_reserved_once_or_not_at_all() {
    let mut s = scheduler(2.0, 0.0, 0, 4);
    let job = JobId::new();
    let spec = group(vec![shape(1.0, 0.0), shape(1.0, 0.0), shape(1.0, 0.0)]);
    let id = spec.id;
    let nodes = |n: [&str; 3]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    s.prepare_shard(job, spec.clone(), nodes(["a", "b", "c"]), "a")
        .unwrap();
    s.commit_shard(id).unwrap();
    assert_eq!(s.resources().available(), shape(1.0, 0.0));
    assert_eq!(s.groups_on_node("b").len(), 1);
    // b died: its bundle moves here, and a second telling takes nothing.
    s.move_bundles(job, spec.clone(), nodes(["a", "a", "c"]), "a")
        .unwrap();
    assert_eq!(s.resources().available(), shape(0.0, 0.0));
    s.move_bundles(job, spec.clone(), nodes(["a", "a", "c"]), "a")
        .unwrap();
    assert_eq!(s.resources().available(), shape(0.0, 0.0));
    assert_eq!(s.group_nodes(id), nodes(["a", "a", "c"]));
    assert!(s.groups_on_node("b").is_empty());
    // c died too: no room here, so nothing is taken and the nodes stay.
    let err = s
        .move_bundles(job, spec.clone(), nodes(["a", "a", "a"]), "a")
        .unwrap_err();
    assert!(matches!(err, Error::Infeasible { .. }), "{err}");
    assert_eq!(s.group_nodes(id), nodes(["a", "a", "c"]));
    // A node that held none of the group takes it up.
    let mut other = scheduler(1.0, 0.0, 0, 4);
    other
        .move_bundles(job, spec.clone(), nodes(["a", "a", "d"]), "d")
        .unwrap();
    assert_eq!(other.resources().available(), shape(0.0, 0.0));
    // A removed group is not taken up again.
    s.remove_group(id);
    assert!(s
        .move_bundles(job, spec, nodes(["a", "a", "a"]), "a")
        .is_err());
}

#[test]
fn a_worker_that_owns_actors_runs_tasks_but_never_hosts_an_actor() {
    let mut s = scheduler(4.0, 0.0, 1, 4);
    let job = job_with_workers(&mut s);
    // The prestarted worker (address w100) runs a task that creates an
    // actor, and comes back idle.
    s.request_lease(lease(job, 1, shape(1.0, 0.0)));
    let (_, owner, lease_id) = round(&mut s).granted[0];
    s.owns_actors("w100");
    s.return_lease(lease_id, false);
    // An actor's lease starts a worker of its own rather than take it:
    // killing that actor would stop the process, and the actors it owns.
    let actor = ActorId::new();
    s.request_lease(actor_lease(job, actor));
    let r = round(&mut s);
    assert!(r.actor_grants.is_empty(), "{:?}", r.actor_grants);
    assert_eq!(r.started.len(), 1);
    boot_unique(&mut s, &r.started);
    let r = round(&mut s);
    assert_eq!(r.actor_grants.len(), 1);
    assert_ne!(r.actor_grants[0].1, owner);
    // Tasks still run on it.
    s.request_lease(lease(job, 2, shape(1.0, 0.0)));
    assert_eq!(round(&mut s).granted[0].1, owner);
}
