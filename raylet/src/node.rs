//! One node: the components the raylet is made of, and the glue that
//! carries out what they decide.
//!
//! - the object store (`store`, a [`StoreSide`], store.rs), with its own
//!   lock so object traffic never waits on scheduling;
//! - the control state (`state`): the [`Scheduler`], the actor table, and
//!   what the node needs to start and reach each job's workers;
//! - the key-value table (`kv`);
//! - the [`Launcher`] that forks workers;
//! - the components a cluster adds: [`Placement`] (groups over nodes),
//!   [`Detached`] (detached actors' records and their restart at the
//!   head), [`Transfers`], [`Programs`] and [`Names`]. They reach the
//!   scheduler only through the verbs of `node/verbs.rs` ([`Verbs`]).
//!
//! Every change to the control state goes through [`Node::control`], which
//! runs it under the lock, carries out the scheduler's decisions (answers,
//! actor starts and deaths), and only after releasing the lock forks and
//! kills processes.

mod exits;
mod verbs;

use exits::ExitLog;

use crate::actors::{ActorTable, Answers, Lost};
use crate::config::RayletConfig;
use crate::detached::Detached;
use crate::launcher::{Launcher, WorkerLaunch};
use crate::membership::{MemberNode, Membership};
use crate::memory::Relief;
use crate::names::Names;
use crate::placement::{HeadRecords, Placement, Placer};
use crate::programs::Programs;
use crate::reply::ReplyTo;
use crate::scheduler::{Decision, Grantee, LeaseRequest, Limits, Scheduler};
use crate::store::StoreSide;
use crate::transfer::Transfers;
use parking_lot::Mutex;
use prism_gcs::KvTable;
use prism_object_store::Segment;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, NodeId, WorkerId};
use prism_protocol::messages::{
    ActorEnded, ActorPlacement, ActorRestarted, ActorSpec, ActorState, BecomeActor, LeaseGrant,
    LeaseReply, LeasesWanted, NodeDied, Registration, Response, SchedulingStrategy,
};
use prism_protocol::resources::ResourceSet;
use prism_protocol::rpc::{Connection, Endpoint};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A driver and the binary its workers run.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) executable: PathBuf,
    pub(crate) cwd: PathBuf,
    pub(crate) driver: Connection,
    pub(crate) log_to_driver: bool,
    /// The namespace the job's workers look up and name actors in.
    pub(crate) namespace: String,
    /// Environment variables for each of the job's workers.
    pub(crate) env_vars: std::collections::BTreeMap<String, String>,
}

/// How the node reaches a worker it started.
#[derive(Debug)]
struct WorkerLink {
    /// Set when the worker registers.
    conn: Option<Connection>,
    /// Its output's prefix on the driver's terminal.
    label: Arc<Mutex<String>>,
}

/// Everything behind the scheduling lock.
#[derive(Debug)]
pub(crate) struct Control {
    pub(crate) scheduler: Scheduler<ReplyTo>,
    pub(crate) actors: ActorTable<ReplyTo>,
    jobs: HashMap<JobId, Job>,
    links: HashMap<WorkerId, WorkerLink>,
    exits: ExitLog,
    /// The connection of each actor's creator on another node, to tell it
    /// when the actor dies for good (it creates the actor again elsewhere
    /// if this node dies, and must not after that).
    remote_owners: HashMap<ActorId, Connection>,
    /// The connection of each client holding a lease (by connection id),
    /// to tell it when others wait for its leases.
    pub(crate) lease_holders: HashMap<u64, Connection>,
}

/// Process work decided under the lock, done after it is released.
#[derive(Debug, Default)]
struct AfterLock {
    launches: Vec<WorkerLaunch>,
    kills: Vec<u32>,
    /// Creators on other nodes to tell that their actor died for good.
    ended: Vec<(Connection, ActorId)>,
    /// Creators on other nodes to tell that their actor restarted here.
    restarted: Vec<(Connection, ActorId, u32)>,
    /// Clients to tell that others wait for these leases of theirs.
    wanted: Vec<(Connection, Vec<LeaseId>)>,
    /// Actors dead for good, and actors restarted (with their count): for
    /// the detached actors' records.
    gone: Vec<ActorId>,
    restarts: Vec<(ActorId, u32)>,
}

/// A node as its components reach it: the verbs they need of its
/// scheduler (`node/verbs.rs` implements their traits), each taking the
/// lock once.
pub(crate) struct Verbs(Arc<Node>);

/// One node: its store, its scheduler, its workers and (on the head) the
/// actor table.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) node_id: NodeId,
    pub(crate) config: RayletConfig,
    /// The object store: its segment, its table (under its own lock) and
    /// spilling.
    pub(crate) store: Arc<StoreSide>,
    pub(crate) kv: Mutex<KvTable>,
    state: Mutex<Control>,
    launcher: Arc<dyn Launcher>,
    /// The node's membership of a cluster, once registered.
    pub(crate) membership: Arc<std::sync::OnceLock<Membership>>,
    /// The TCP listener for other nodes' processes (in a cluster).
    pub(crate) tcp_server: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Open connections of other nodes' processes leasing workers here,
    /// per job: the job ends here when its last one closes.
    /// Per job: its lessee connections here, and whether the job was
    /// registered here otherwise first (its driver runs here), so that it
    /// does not end with its last lessee.
    lessees: Mutex<HashMap<JobId, (usize, bool)>>,
    /// Objects pulled from and served to other nodes.
    pub(crate) transfers: Arc<Transfers>,
    /// The placement groups placed from here over several nodes.
    placement: Arc<Placement>,
    /// Detached actors' records, and the head's creating them again.
    pub(crate) detached: Arc<Detached>,
    /// Copies of other nodes' jobs' programs, fetched one at a time.
    pub(crate) programs: Programs,
    /// The node's part in the cluster's directory of actor names.
    pub(crate) names: Names,
    /// Counts of tasks ended, as owners on this node report them.
    pub(crate) task_totals: crate::metrics::TaskTotals,
    /// Tasks ended, run or running here, one row each.
    pub(crate) tasks: crate::task_table::TaskTable,
    /// The machine's CPU use between scrapes.
    pub(crate) cpu: crate::metrics::CpuSampler,
    /// Actors waiting for a node that can hold them to join.
    pub(crate) awaiting: crate::awaiting::Awaiting,
}

impl Node {
    pub(crate) fn new(
        config: RayletConfig,
        node_id: NodeId,
        segment: Segment,
        launcher: Arc<dyn Launcher>,
    ) -> Arc<Node> {
        let limits = Limits {
            prestart_workers: config.prestart_workers,
            max_workers_per_job: config.max_workers_per_job,
            worker_start_attempts: config.worker_start_attempts,
            idle_worker_timeout: config.idle_worker_timeout,
            removed_placement_groups_kept: config.removed_placement_groups_kept,
            logs_dir: config.session_dir.join("logs"),
        };
        let task_events_kept = config.task_events_kept;
        let store = Arc::new(StoreSide::new(
            segment,
            config.object_store_bytes,
            config.spill.clone(),
        ));
        let membership = Arc::new(std::sync::OnceLock::new());
        let transfers = Arc::new(Transfers::new(node_id, store.clone(), membership.clone()));
        let programs = Programs::new(node_id, config.session_dir.join("programs"));
        let names = Names::new(node_id, membership.clone());
        let records = Arc::new(HeadRecords::new(membership.clone()));
        let placement = Arc::new(Placement::new(
            node_id,
            membership.clone(),
            records.clone(),
            !config.infeasible_wait.is_zero(),
        ));
        let detached = Arc::new(Detached::new(
            node_id,
            membership.clone(),
            records,
            config.session_dir.clone(),
        ));
        Arc::new(Node {
            node_id,
            store,
            kv: Mutex::new(KvTable::default()),
            state: Mutex::new(Control {
                scheduler: Scheduler::new(config.resources.clone(), limits),
                actors: ActorTable::default(),
                jobs: HashMap::new(),
                links: HashMap::new(),
                exits: ExitLog::default(),
                remote_owners: HashMap::new(),
                lease_holders: HashMap::new(),
            }),
            launcher,
            config,
            membership,
            tcp_server: Mutex::new(None),
            lessees: Mutex::new(HashMap::new()),
            transfers,
            placement,
            detached,
            programs,
            names,
            task_totals: crate::metrics::TaskTotals::default(),
            tasks: crate::task_table::TaskTable::new(task_events_kept),
            cpu: Default::default(),
            awaiting: Default::default(),
        })
    }

    /// The scheduler's verbs, for the node's server and views.
    pub(crate) fn verbs(self: &Arc<Self>) -> Verbs {
        Verbs(self.clone())
    }

    /// The placement groups placed from here, worked with this node's
    /// scheduler.
    pub(crate) fn groups(self: &Arc<Self>) -> Placer {
        self.placement.with(Arc::new(Verbs(self.clone())))
    }

    /// At the head: creates again the detached actors whose node died
    /// (see `crate::detached`).
    pub(crate) fn restart_orphaned_detached(self: &Arc<Self>) {
        self.detached.restart_orphans(Arc::new(Verbs(self.clone())));
    }

    /// Tells every driver and worker of this node (and every process of
    /// another node leasing here) that `node_id` died, and frees the task
    /// results here that processes of that node owned.
    pub(crate) fn announce_node_death(&self, node_id: &str) {
        self.store
            .owner_gone(|owner| Endpoint::parse(owner).node.as_deref() == Some(node_id));
        let conns: Vec<Connection> = {
            let c = self.state.lock();
            c.jobs
                .values()
                .map(|j| j.driver.clone())
                .chain(c.links.values().filter_map(|l| l.conn.clone()))
                .collect()
        };
        for conn in conns {
            let _ = conn.notify(NodeDied {
                node_id: node_id.to_string(),
            });
        }
    }

    /// The connections of the registered workers (only the one with
    /// `pid`, if given), with their ids and pids.
    pub(crate) fn worker_conns(&self, pid: Option<u32>) -> Vec<(WorkerId, u32, Connection)> {
        let c = self.state.lock();
        {
            c.links
                .iter()
                .filter_map(|(id, link)| {
                    let worker = c.scheduler.worker(*id)?;
                    if pid.is_some_and(|p| p != worker.pid) {
                        return None;
                    }
                    Some((*id, worker.pid, link.conn.clone()?))
                })
                .collect()
        }
    }

    pub(crate) fn registration(&self, job_id: JobId) -> Registration {
        Registration {
            node_id: self.node_id,
            job_id,
            store_path: self.store.segment.path().to_path_buf(),
            store_capacity: self.config.object_store_bytes,
            session_dir: self.config.session_dir.clone(),
            infeasible_waits: !self.config.infeasible_wait.is_zero(),
        }
    }

    /// Runs `change` on the control state, carries out what the scheduler
    /// decided, then forks (on blocking threads) and kills outside the
    /// lock.
    fn control<T>(self: &Arc<Self>, change: impl FnOnce(&mut Control) -> T) -> T {
        let (out, after) = self.control_locked(change);
        for launch in after.launches {
            let node = self.clone();
            tokio::task::spawn_blocking(move || node.launch(launch));
        }
        self.kill(after.kills);
        for (conn, actor_id) in after.ended {
            let _ = conn.notify(ActorEnded { actor_id });
        }
        for (conn, leases) in after.wanted {
            let _ = conn.notify(LeasesWanted { leases });
        }
        for (conn, actor_id, num_restarts) in after.restarted {
            let _ = conn.notify(ActorRestarted {
                actor_id,
                num_restarts,
            });
        }
        for (actor, n) in after.restarts {
            self.detached.restarted(actor, n);
        }
        for actor in after.gone {
            self.detached.ended(actor);
        }
        out
    }

    fn control_locked<T>(
        self: &Arc<Self>,
        change: impl FnOnce(&mut Control) -> T,
    ) -> (T, AfterLock) {
        let mut control = self.state.lock();
        let out = change(&mut control);
        let mut after = AfterLock::default();
        // Carrying out a decision may make more (an actor start fails at
        // once), so drain until none are left.
        loop {
            let decisions = control.scheduler.drain();
            if decisions.is_empty() {
                break;
            }
            for decision in decisions {
                self.carry_out(&mut control, decision, &mut after);
            }
        }
        for (actor, n) in control.actors.take_restarted() {
            if let Some(conn) = control.remote_owners.get(&actor) {
                after.restarted.push((conn.clone(), actor, n));
            }
            after.restarts.push((actor, n));
        }
        for actor in control.actors.take_ended() {
            if let Some(conn) = control.remote_owners.remove(&actor) {
                after.ended.push((conn, actor));
            }
            after.gone.push(actor);
        }
        (out, after)
    }

    fn kill(&self, pids: Vec<u32>) {
        for pid in pids {
            self.launcher.kill(pid);
        }
    }

    fn carry_out(
        self: &Arc<Self>,
        c: &mut Control,
        decision: Decision<ReplyTo>,
        after: &mut AfterLock,
    ) {
        match decision {
            Decision::Granted {
                grantee: Grantee::Client { reply, holder },
                lease,
                worker,
                address,
                pid,
                contended,
            } => {
                // (A grant routed through a bundle's node may come after
                // its client left: a closed connection is not kept.)
                if !reply.conn().is_closed() {
                    c.lease_holders
                        .entry(holder)
                        .or_insert_with(|| reply.conn().clone());
                }
                reply.send(Response::Lease(LeaseReply::Granted(LeaseGrant {
                    lease_id: lease,
                    worker_id: worker,
                    address,
                    pid,
                    contended,
                })))
            }
            Decision::LeasesWanted { holder, leases } => {
                if let Some(conn) = c.lease_holders.get(&holder) {
                    after.wanted.push((conn.clone(), leases));
                }
            }
            Decision::Granted {
                grantee: Grantee::Actor(actor),
                worker,
                ..
            } => self.start_actor_on(c, actor, worker),
            Decision::Refused {
                grantee: Grantee::Client { reply, .. },
                error,
            } => reply.send(Response::Error(error)),
            Decision::Refused {
                grantee: Grantee::Actor(actor),
                error,
            } => answer_actor_waiters(c.actors.died(actor, error.to_string())),
            Decision::ActorLost { actor, reason } => {
                let job_runs = c
                    .actors
                    .job_of(actor)
                    .is_some_and(|job| c.jobs.contains_key(&job));
                match c.actors.lost(actor, reason, job_runs) {
                    Lost::Restart(_) if crate::faults::injected("actor_restart").is_some() => {
                        let why = "its restart failed (fail point actor_restart)".to_string();
                        answer_actor_waiters(c.actors.died(actor, why));
                        self.forget_checkpoint(actor);
                    }
                    Lost::Restart(spec) => c.scheduler.request_lease(actor_lease(&spec)),
                    Lost::Dead(answers) => {
                        answer_actor_waiters(answers);
                        self.forget_checkpoint(actor);
                    }
                }
            }
            Decision::StartWorker {
                worker,
                job,
                gpu_ids,
                env,
            } => {
                let Some(job_info) = c.jobs.get(&job) else {
                    return;
                };
                let label = Arc::new(Mutex::new("starting".to_string()));
                after.launches.push(WorkerLaunch {
                    worker,
                    job,
                    executable: job_info.executable.clone(),
                    cwd: job_info.cwd.clone(),
                    namespace: job_info.namespace.clone(),
                    // The request's variables over the job's.
                    env_vars: job_info
                        .env_vars
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .chain(env)
                        .collect(),
                    gpu_ids,
                    driver: job_info.log_to_driver.then(|| job_info.driver.clone()),
                    label: label.clone(),
                });
                c.links.insert(worker, WorkerLink { conn: None, label });
            }
            Decision::StopWorker { pid } => after.kills.push(pid),
            Decision::GroupAnswer { reply, answer } => reply.send_result(answer),
        }
    }

    /// Forks a worker the scheduler asked for, without the lock.
    fn launch(self: Arc<Self>, launch: WorkerLaunch) {
        let worker = launch.worker;
        let node = self.clone();
        let on_exit = Box::new(move |reason: String| node.worker_exited(worker, reason));
        match self.launcher.launch(launch, on_exit) {
            Ok(pid) => {
                let wanted = self.control(|c| c.scheduler.set_pid(worker, pid));
                if !wanted {
                    self.launcher.kill(pid);
                }
            }
            Err(reason) => self.worker_exited(worker, reason),
        }
    }

    fn worker_exited(self: &Arc<Self>, worker: WorkerId, reason: String) {
        tracing::debug!(%worker, %reason, "worker exited");
        self.tasks.worker_gone(&worker.to_string());
        let kills = self.control(|c| {
            let address = c.scheduler.worker(worker).and_then(|w| w.address.clone());
            c.links.remove(&worker);
            c.exits.record(worker, reason.clone());
            c.scheduler.worker_exited(worker, reason.clone());
            let Some(address) = address else {
                return Vec::new();
            };
            let why = format!(
                "its owner (the process that created it, worker {worker}) exited: {reason}"
            );
            self.end_owned_actors(c, &address, &why)
        });
        self.kill(kills);
    }

    /// Ends the actors that the process at `owner` created (all but
    /// detached ones), as Ray's actors share their owner's fate; returns
    /// the pids to kill once the lock is released.
    fn end_owned_actors(&self, c: &mut Control, owner: &str, why: &str) -> Vec<u32> {
        let mut pids = Vec::new();
        for actor in c.actors.owned_by(owner) {
            let worker = c.actors.worker_of(actor).ok().flatten();
            answer_actor_waiters(c.actors.died(actor, why.to_string()));
            self.forget_checkpoint(actor);
            match worker.and_then(|w| c.scheduler.worker(w)) {
                Some(w) => pids.push(w.pid),
                None => c.scheduler.cancel_actor(actor),
            }
        }
        pids
    }

    /// Records a driver and prestarts its workers. They are forked here,
    /// before the driver hears it is registered (so they boot while it
    /// starts), but without the lock.
    pub(crate) fn register_job(self: &Arc<Self>, job_id: JobId, job: Job) {
        let executable = job.executable.display().to_string();
        let ((), after) = self.control_locked(|c| {
            c.jobs.insert(job_id, job);
            c.scheduler.add_job(job_id, executable);
        });
        for launch in after.launches {
            self.clone().launch(launch);
        }
        self.kill(after.kills);
    }

    /// A process of another node will lease workers for `job` here: the
    /// job is registered on its first such connection (with the program
    /// file found or fetched for it, see programs.rs).
    pub(crate) fn add_lessee(self: &Arc<Self>, job_id: JobId, job: Job) {
        let mut lessees = self.lessees.lock();
        let entry = match lessees.entry(job_id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                // A job its driver registered here keeps that driver's
                // record (its connection, where its workers' output goes).
                let known = self.control(|c| c.jobs.contains_key(&job_id));
                if !known {
                    self.register_job(job_id, job);
                }
                v.insert((0, known))
            }
        };
        entry.0 += 1;
    }

    /// A lessee's connection closed; the job ends here with its last one.
    pub(crate) fn lessee_gone(self: &Arc<Self>, job_id: JobId) {
        let last = {
            let mut lessees = self.lessees.lock();
            match lessees.get_mut(&job_id) {
                Some((n, _)) if *n > 1 => {
                    *n -= 1;
                    false
                }
                // Registered by its driver here first: it ends when that
                // driver leaves, not with its last lessee.
                Some((_, known)) => {
                    let known = *known;
                    lessees.remove(&job_id);
                    !known
                }
                None => false,
            }
        };
        if last {
            self.end_job(job_id);
        }
    }

    /// A driver left: its workers, actors and placement groups end with
    /// it, except its detached actors, which live on (their job stays,
    /// retired, so they can be restarted; its output has nowhere to go but
    /// the logs).
    pub(crate) fn end_job(self: &Arc<Self>, job_id: JobId) {
        // Its groups over several nodes go from the other nodes too.
        let spread = self.control(|c| c.scheduler.spread_groups_of(job_id));
        let here = self.node_id.to_string();
        for (id, nodes) in spread {
            let others: std::collections::BTreeSet<String> =
                nodes.into_iter().filter(|n| *n != here).collect();
            for node in others {
                self.groups().tell_node_remove(node, id);
            }
        }
        let kept = self.control(|c| {
            let keep = c.actors.detached_of(job_id);
            c.actors.job_ending(job_id, &keep);
            if keep.is_empty() {
                c.jobs.remove(&job_id);
            } else if let Some(job) = c.jobs.get_mut(&job_id) {
                job.log_to_driver = false;
            }
            c.scheduler.end_job(job_id, &keep);
            keep.len()
        });
        self.groups().forget_ended_groups();
        tracing::info!(job = %job_id, detached_actors_kept = kept, "job ended; its workers were stopped");
    }

    /// A started worker connected back.
    pub(crate) fn register_worker(
        self: &Arc<Self>,
        worker: WorkerId,
        address: String,
        pid: u32,
        conn: &Connection,
    ) -> Result<JobId, Error> {
        self.control(|c| {
            let job = c.scheduler.register_worker(worker, address, pid)?;
            if let Some(link) = c.links.get_mut(&worker) {
                link.conn = Some(conn.clone());
            }
            Ok(job)
        })
    }

    /// Stops workers beyond the prestarted pool that have been idle for
    /// `idle_worker_timeout` (a burst of tasks can grow the pool).
    /// Workers that created live actors are kept: their actors would end
    /// with them.
    pub(crate) fn reap_idle_workers(&self) {
        let victims: Vec<u32> = {
            let c = self.state.lock();
            c.scheduler
                .idle_workers_to_stop(Instant::now())
                .into_iter()
                .filter(|(id, _)| {
                    let address = c.scheduler.worker(*id).and_then(|w| w.address.as_deref());
                    address.is_none_or(|a| c.actors.owned_by(a).is_empty())
                })
                .map(|(_, pid)| pid)
                .collect()
        };
        for pid in victims {
            tracing::debug!(pid, "stopping an idle worker beyond the pool size");
            self.launcher.kill(pid);
        }
    }

    /// Stops every worker process (shutdown) and reaps them.
    pub(crate) fn kill_all_workers(&self) {
        self.detached.forget_all();
        let pids = self.state.lock().scheduler.stop();
        self.launcher.kill_and_reap(pids);
    }

    /// Where a local request should run: here (`None`), or on the node
    /// whose raylet is returned.
    pub(crate) fn place(
        self: &Arc<Self>,
        shape: &ResourceSet,
        strategy: SchedulingStrategy,
    ) -> Result<Option<(String, String)>, Error> {
        let here = self.node_id;
        let membership = self.membership.get();
        let default = || {
            let Some(m) = membership else { return Ok(None) };
            let (fits_now, fits_ever, total) = self.control(|c| {
                let r = c.scheduler.resources();
                (
                    r.available().contains(shape),
                    r.total().contains(shape),
                    r.total().clone(),
                )
            });
            if fits_now {
                return Ok(None);
            }
            m.spill_target(shape, fits_ever, &total)
        };
        match strategy {
            SchedulingStrategy::Default => default(),
            SchedulingStrategy::Spread => match membership.and_then(|m| m.spread_target(shape)) {
                Some(Some(target)) => Ok(Some(target)),
                Some(None) => Ok(None),
                None => default(),
            },
            SchedulingStrategy::NodeAffinity { node_id, .. } if node_id == here => Ok(None),
            SchedulingStrategy::NodeAffinity { node_id, soft } => {
                match membership.and_then(|m| m.raylet_of(&node_id.to_string())) {
                    Some(raylet) => Ok(Some((raylet, node_id.to_string()))),
                    None if soft => default(),
                    None => Err(Error::AffinityNodeNotAlive {
                        node_id: node_id.to_string(),
                    }),
                }
            }
        }
    }

    /// Job `job`'s program file here, namespace and workers' environment.
    pub(crate) fn job_setup(
        self: &Arc<Self>,
        job: JobId,
    ) -> Option<(PathBuf, String, std::collections::BTreeMap<String, String>)> {
        self.control(|c| {
            c.jobs.get(&job).map(|j| {
                (
                    j.executable.clone(),
                    j.namespace.clone(),
                    j.env_vars.clone(),
                )
            })
        })
    }

    /// Takes an actor here, or, for a request from this node's own
    /// processes (no `lessee`), names the node its strategy puts it on.
    /// An actor a process of another node sends here (its `lessee`
    /// connection) is reported to that process when it dies for good.
    pub(crate) fn accept_actor(
        self: &Arc<Self>,
        job: JobId,
        spec: ActorSpec,
        lessee: Option<Connection>,
    ) -> Result<ActorPlacement, Error> {
        if lessee.is_none() && spec.options.placement.is_none() {
            let (shape, strategy) = (&spec.options.resources, spec.options.strategy);
            if let Some((raylet, node_id)) = self.place(shape, strategy)? {
                return Ok(ActorPlacement::Elsewhere { raylet, node_id });
            }
        }
        self.create_actor(job, spec, lessee)?;
        Ok(ActorPlacement::Accepted)
    }

    /// Accepts an actor: checks it could ever be placed and takes its name,
    /// then queues the lease for its lifetime.
    pub(crate) fn create_actor(
        self: &Arc<Self>,
        job: JobId,
        spec: ActorSpec,
        lessee: Option<Connection>,
    ) -> Result<(), Error> {
        let detached = spec.options.detached.then(|| spec.clone());
        self.control(|c| {
            let (shape, bundle) = (spec.options.resources.clone(), spec.options.placement);
            c.scheduler.check_feasible(&shape, bundle)?;
            debug_assert_eq!(job, spec.job);
            let lease = actor_lease(&spec);
            let actor = spec.actor_id;
            if !spec.options.detached {
                c.scheduler.owns_actors(&spec.owner);
            }
            c.actors.add(spec)?;
            if let Some(conn) = lessee {
                c.remote_owners.insert(actor, conn);
            }
            c.scheduler.request_lease(lease);
            Ok::<(), Error>(())
        })?;
        if let Some(spec) = detached {
            self.detached.record(&spec, || self.job_setup(spec.job));
        }
        Ok(())
    }

    /// A worker was leased for an actor: tell it to run the constructor.
    fn start_actor_on(self: &Arc<Self>, c: &mut Control, actor: ActorId, worker_id: WorkerId) {
        let Some(spec) = c.actors.assign(actor, worker_id) else {
            return;
        };
        let (Some(worker), Some(link)) = (c.scheduler.worker(worker_id), c.links.get(&worker_id))
        else {
            return;
        };
        // The class's own name, without its module path, as Ray prints it.
        let class = spec.class.rsplit("::").next().unwrap_or(&spec.class);
        *link.label.lock() = format!("{class} pid={}", worker.pid);
        let (Some(conn), Some(address)) = (link.conn.clone(), worker.address.clone()) else {
            return;
        };
        let pid = worker.pid;
        let node = self.clone();
        tokio::spawn(async move {
            let outcome = conn.request(BecomeActor { spec }).await;
            let state = match outcome {
                Ok(_) => ActorState::Alive {
                    address,
                    worker: worker_id,
                    pid,
                },
                // The process died while constructing: its exit decides
                // (a restart, or death with the exit's reason).
                Err(Error::Disconnected { .. }) => return,
                Err(e) => ActorState::Dead(e),
            };
            let answers = node.control(|c| c.actors.started(actor, worker_id, state));
            answer_actor_waiters(answers);
        });
    }

    /// Answers with an actor's state now, or once it leaves `Pending`.
    /// With `ask_others`, an actor this node does not hold is looked up on
    /// the other nodes of the cluster.
    pub(crate) fn get_actor(&self, actor: ActorId, wait: bool, ask_others: bool, reply: ReplyTo) {
        if let Some(m) = self.membership.get().filter(|_| ask_others) {
            if !self.state.lock().actors.knows(actor) {
                let lookup = m.find_actor(actor, wait);
                tokio::spawn(async move { reply.send_result(lookup.await) });
                return;
            }
        }
        let now = self.state.lock().actors.watch(actor, wait, reply);
        if let Some((reply, answer)) = now {
            reply.send_result(answer);
        }
    }

    /// An actor's state now, if this node holds it.
    pub(crate) fn actor_info(&self, actor: ActorId) -> Option<prism_protocol::messages::ActorInfo> {
        self.state.lock().actors.info(actor)
    }

    pub(crate) fn get_named_actor(
        &self,
        name: &str,
        namespace: &str,
    ) -> Result<prism_protocol::messages::ActorInfo, Error> {
        let here = self.node_id.to_string();
        self.state.lock().actors.named(name, namespace, &here)
    }

    /// Kills an actor's process. With `no_restart` it is marked dead at
    /// once (its queued lease dropped); otherwise its exit restarts it if
    /// it has restarts left, as any other death of its process would.
    pub(crate) fn kill_actor(
        self: &Arc<Self>,
        actor: ActorId,
        no_restart: bool,
        out_of_scope: bool,
    ) -> Result<(), Error> {
        let reason = if out_of_scope {
            "every handle to it was dropped: an actor without a name ends with its last \
             handle (keep a handle, or give it a name or lifetime = detached, to keep it)"
        } else {
            "killed by prism::kill"
        };
        let pid = self.control(|c| {
            let worker = c.actors.worker_of(actor)?;
            if !no_restart {
                c.actors
                    .set_death_reason(actor, "killed by prism::kill_allow_restart".into());
                // A process not started yet is left to start.
                return Ok::<_, Error>(worker.and_then(|w| c.scheduler.worker(w)).map(|w| w.pid));
            }
            answer_actor_waiters(c.actors.died(actor, reason.into()));
            self.forget_checkpoint(actor);
            match worker {
                None => {
                    c.scheduler.cancel_actor(actor);
                    Ok(None)
                }
                Some(w) => Ok(c.scheduler.worker(w).map(|w| w.pid)),
            }
        })?;
        self.kill(pid.into_iter().collect());
        Ok(())
    }

    /// An actor ended itself with `prism::exit_actor`: dead for good, its
    /// name free; its process exits by itself.
    pub(crate) fn exit_actor(self: &Arc<Self>, actor: ActorId) -> Result<(), Error> {
        let answers = self.control(|c| {
            c.actors.worker_of(actor)?;
            Ok::<_, Error>(
                c.actors
                    .died(actor, "it ended itself with prism::exit_actor".into()),
            )
        })?;
        answer_actor_waiters(answers);
        self.forget_checkpoint(actor);
        Ok(())
    }

    /// Drops the checkpoint of an actor that is dead for good.
    fn forget_checkpoint(&self, actor: ActorId) {
        let key = prism_protocol::messages::actor_checkpoint_key(actor);
        match self.membership.get() {
            // In a cluster, checkpoints are in the head's table.
            Some(m) => {
                let mut gcs = m.gcs();
                tokio::spawn(async move {
                    if let Err(e) = gcs.kv_delete(key).await {
                        tracing::warn!(%actor, error = %e, "could not drop an actor's checkpoint");
                    }
                });
            }
            None => {
                self.kv.lock().delete(&key);
            }
        }
    }
    /// Why a worker exited, if known.
    pub(crate) fn worker_exit_reason(&self, worker: WorkerId) -> Option<String> {
        self.state.lock().exits.reasons.get(&worker).cloned()
    }

    /// Starts the memory monitor (see [`crate::memory::watch`]) on this
    /// node.
    pub(crate) fn start_memory_monitor(self: &Arc<Self>) {
        crate::memory::watch(self.config.memory_monitor.clone(), Arc::downgrade(self));
    }
}

/// What the memory monitor stops: the worker of the node's newest task
/// lease, with why recorded so that its caller's error says so.
impl Relief for Node {
    fn stop_newest_task(self: &Arc<Self>, reason: &str) -> Option<(WorkerId, u32)> {
        let victim = self.control(|c| {
            let victim = c.scheduler.newest_task_worker();
            if let Some((worker, _)) = victim {
                c.exits.record(worker, reason.to_string());
            }
            victim
        });
        if let Some((_, pid)) = victim {
            self.kill(vec![pid]);
        }
        victim
    }
}

/// The node as a member of a cluster, for its membership's heartbeats.
impl MemberNode for Node {
    fn node_id(&self) -> NodeId {
        self.node_id
    }

    fn session_dir(&self) -> &Path {
        &self.config.session_dir
    }

    fn resources(self: &Arc<Self>) -> (ResourceSet, ResourceSet) {
        self.control(|c| {
            let r = c.scheduler.resources();
            (r.total().clone(), r.available())
        })
    }

    fn load(self: &Arc<Self>) -> crate::membership::Load {
        self.verbs().load()
    }

    fn membership(&self) -> Option<&Membership> {
        self.membership.get()
    }

    fn waits_for_nodes(&self) -> bool {
        !self.config.infeasible_wait.is_zero()
    }

    /// Tells this node's processes, and places again the bundles of the
    /// groups created here that the node held; at the head, takes up the
    /// groups whose home died and creates again the detached actors that
    /// ran there.
    fn node_left(self: &Arc<Self>, dead: &str) {
        self.announce_node_death(dead);
        let groups = self.groups();
        groups.replace_lost_bundles(dead);
        groups.adopt_orphan_groups();
        self.restart_orphaned_detached();
    }

    fn owners_exited(&self, addresses: &[String]) {
        addresses.iter().for_each(|a| self.store.owner_exited(a));
    }

    fn spill_waiting(
        self: &Arc<Self>,
        place: impl FnMut(&ResourceSet) -> Option<(String, String)>,
    ) {
        let moved = self.control(|c| c.scheduler.take_spillable(place));
        for (reply, (raylet, node_id)) in moved {
            reply.send(Response::Lease(LeaseReply::Spillback { raylet, node_id }));
        }
    }
}

/// The lease an actor's process holds for its lifetime.
fn actor_lease(spec: &ActorSpec) -> LeaseRequest<ReplyTo> {
    LeaseRequest {
        may_spill: false,
        asked_at: std::time::Instant::now(),
        wait_for_node_until: None,
        shape: spec.options.resources.clone(),
        job: spec.job,
        env: spec.options.env_vars.clone(),
        bundle: spec.options.placement,
        grantee: Grantee::Actor(spec.actor_id),
    }
}

fn answer_actor_waiters(answers: Answers<ReplyTo>) {
    for (reply, info) in answers {
        reply.send(Response::Actor(info));
    }
}
