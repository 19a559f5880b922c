//! The lease scheduler, as plain logic.
//!
//! It knows the node's resources, its jobs, its workers and what each is
//! doing, the queue of lease requests, the leases granted and the
//! placement groups. It does no I/O: no sockets, no processes, no clock
//! but the one passed in. Every call records what must happen as a
//! [`Decision`] (answer a waiting client, start a worker, stop one, an actor
//! lost its worker), and the caller drains them with [`Scheduler::drain`]
//! and carries them out once its lock is released where that matters
//! (forking, killing). The caller chooses what a waiting client is: `R`,
//! the handle that answers it (a connection and request id in the raylet, a
//! plain number in the tests).
//!
//! A lease is granted when the shape fits in the free resources (of the
//! node, or of the placement-group bundle it names) *and* an idle worker of
//! the requesting job with the right GPU devices exists. If only the worker
//! is missing, one is started (at most `max_workers_per_job` task workers
//! per job); the request stays queued until it registers. Requests are
//! served in arrival order, and one that cannot run now does not hold back
//! those behind it.

mod decision;
mod groups;
mod placement_groups;
#[cfg(test)]
mod tests;

pub(crate) use decision::{Decision, Grantee};

use crate::resources::{Allocation, NodeResources};
use groups::Groups;
use prism_protocol::error::Error;
use prism_protocol::ids::{ActorId, JobId, LeaseId, PlacementGroupId, WorkerId};
use prism_protocol::messages::{BundleRef, EnvVars};
use prism_protocol::resources::{ResourceSet, CPU};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The limits the scheduler works within (from [`crate::config::RayletConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Workers started for each job as soon as it registers, and kept.
    pub(crate) prestart_workers: usize,
    /// The most task workers one job may have at once (actors not counted).
    pub(crate) max_workers_per_job: usize,
    /// Failed worker starts in a row before a job's requests fail.
    pub(crate) worker_start_attempts: u32,
    /// Idle workers beyond the prestarted pool stop after this long.
    pub(crate) idle_worker_timeout: Duration,
    /// Removed placement groups kept readable as `Removed`.
    pub(crate) removed_placement_groups_kept: usize,
    /// Where worker logs go (named in start-failure errors).
    pub(crate) logs_dir: PathBuf,
}

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerUse {
    Starting,
    Idle,
    Leased(LeaseId),
    Actor(ActorId),
    /// A holder could not connect to it, or it was stopped to make room
    /// for a worker of another environment: stopped, never granted again,
    /// kept until its exit is seen (so the actors it owns end then).
    Unreachable,
}

/// A worker process as the scheduler sees it.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) job: JobId,
    /// The environment variables it was started with beyond its job's:
    /// it serves only requests that ask for the same.
    pub(crate) env: EnvVars,
    /// Zero until forked (or until it registers, whichever is first).
    pub(crate) pid: u32,
    pub(crate) gpu_ids: Vec<u32>,
    pub(crate) address: Option<String>,
    pub(crate) usage: WorkerUse,
    /// Waiting in `get` for other tasks' results.
    pub(crate) blocked: bool,
    /// When it last became idle.
    pub(crate) idle_since: Instant,
    /// It created actors that end with it (as a task's or an actor's
    /// caller). It is never made an actor's host: an actor's process is
    /// stopped when the actor is killed or ends, which would end those
    /// actors too.
    pub(crate) owns_actors: bool,
}

impl Worker {
    fn set_idle(&mut self) {
        self.usage = WorkerUse::Idle;
        self.idle_since = Instant::now();
    }
}

/// A queued lease request.
#[derive(Debug)]
pub(crate) struct LeaseRequest<R> {
    pub(crate) shape: ResourceSet,
    pub(crate) job: JobId,
    /// The environment variables its worker must have beyond its job's.
    pub(crate) env: EnvVars,
    /// The placement-group bundle to draw from instead of the node.
    pub(crate) bundle: Option<BundleRef>,
    pub(crate) grantee: Grantee<R>,
    /// Whether it may still be sent on to another node while it waits
    /// (a local client's request, in a multi-node cluster).
    pub(crate) may_spill: bool,
    /// When it was asked for (its wait is counted when it is granted).
    pub(crate) asked_at: std::time::Instant,
    /// Set for a local client's request that fits no live node of the
    /// cluster, in a cluster that may grow: it waits (reported as demand)
    /// until a node that can hold it joins and it is sent there, or until
    /// this time, when it fails as infeasible.
    pub(crate) wait_for_node_until: Option<std::time::Instant>,
}

#[derive(Debug)]
struct Lease {
    worker: WorkerId,
    allocation: Allocation,
    /// The connection that holds it (None for actors).
    holder: Option<u64>,
    /// Its CPUs, lent back to the node while its worker is blocked.
    lent: Option<ResourceSet>,
    /// The bundle (group, index) it was drawn from.
    bundle: Option<(PlacementGroupId, usize)>,
    /// When it was granted.
    granted_at: Instant,
    /// Its holder was told that others wait for it (`contended` in its
    /// grant, or a later [`Decision::LeasesWanted`]).
    wanted: bool,
}

#[derive(Debug)]
struct JobRecord {
    executable: String,
    /// Worker processes that failed to start (or exited before they
    /// registered) since one last registered.
    start_failures: u32,
    /// Its driver left, but detached actors of it live on: it keeps no
    /// worker pool, and its record stays so they can be restarted.
    retired: bool,
}

/// The node's scheduling state; see the module docs.
#[derive(Debug)]
pub(crate) struct Scheduler<R> {
    limits: Limits,
    resources: NodeResources,
    jobs: HashMap<JobId, JobRecord>,
    workers: HashMap<WorkerId, Worker>,
    pending: VecDeque<LeaseRequest<R>>,
    leases: HashMap<LeaseId, Lease>,
    /// The placement groups held here.
    groups: Groups<R>,
    stopping: bool,
    out: Vec<Decision<R>>,
    /// How long granted clients' lease requests waited, from their
    /// arrival to their grant.
    lease_waits: prism_protocol::messages::Latencies,
}

impl<R> Scheduler<R> {
    /// A node with `total` resources and no jobs.
    pub(crate) fn new(total: ResourceSet, limits: Limits) -> Self {
        Scheduler {
            groups: Groups::new(limits.removed_placement_groups_kept),
            limits,
            resources: NodeResources::new(total),
            jobs: HashMap::new(),
            workers: HashMap::new(),
            pending: VecDeque::new(),
            leases: HashMap::new(),
            stopping: false,
            out: Vec::new(),
            lease_waits: Default::default(),
        }
    }

    /// How long granted lease requests waited, since the node started.
    pub(crate) fn lease_waits(&self) -> &prism_protocol::messages::Latencies {
        &self.lease_waits
    }

    /// Takes the decisions made since the last call, in order.
    pub(crate) fn drain(&mut self) -> Vec<Decision<R>> {
        std::mem::take(&mut self.out)
    }

    /// The node's totals and what is free now.
    pub(crate) fn resources(&self) -> &NodeResources {
        &self.resources
    }

    /// The shapes of the lease requests waiting for resources, and how many
    /// of each, in the order they first arrived.
    pub(crate) fn demands(&self) -> Vec<(ResourceSet, u64)> {
        let mut out: Vec<(ResourceSet, u64)> = Vec::new();
        for request in &self.pending {
            match out.iter_mut().find(|(shape, _)| *shape == request.shape) {
                Some((_, n)) => *n += 1,
                None => out.push((request.shape.clone(), 1)),
            }
        }
        out
    }

    /// Every worker process, as the state API lists it, at most `limit`;
    /// and how many there are.
    pub(crate) fn worker_rows(&self, limit: usize) -> (Vec<serde_json::Value>, usize) {
        let now = Instant::now();
        let rows = self
            .workers
            .iter()
            .take(limit)
            .map(|(id, w)| {
                let (state, actor) = match w.usage {
                    WorkerUse::Starting => ("STARTING", None),
                    WorkerUse::Idle => ("IDLE", None),
                    WorkerUse::Leased(_) => ("LEASED", None),
                    WorkerUse::Actor(a) => ("ACTOR", Some(a.to_string())),
                    WorkerUse::Unreachable => ("STOPPING", None),
                };
                let idle_ms = matches!(w.usage, WorkerUse::Idle)
                    .then(|| now.duration_since(w.idle_since).as_millis() as u64);
                serde_json::json!({
                    "worker_id": id.to_string(),
                    "pid": w.pid,
                    "state": state,
                    "job_id": w.job.to_string(),
                    "actor_id": actor,
                    "blocked": w.blocked,
                    "gpu_ids": w.gpu_ids,
                    "idle_for_ms": idle_ms,
                    "worker_type": "WORKER",
                })
            })
            .collect();
        (rows, self.workers.len())
    }

    /// The placement groups held here, as the state API lists them.
    pub(crate) fn group_rows(&self) -> Vec<serde_json::Value> {
        self.groups.rows()
    }

    /// How many worker processes are in each state, and how many lease
    /// requests wait.
    pub(crate) fn worker_counts(&self) -> (std::collections::BTreeMap<&'static str, u64>, u64) {
        // Every state, 0 when none is in it: a series per state exists
        // from the start.
        let mut out: std::collections::BTreeMap<&'static str, u64> =
            ["STARTING", "IDLE", "LEASED", "ACTOR", "STOPPING"]
                .into_iter()
                .map(|s| (s, 0))
                .collect();
        for worker in self.workers.values() {
            let state = match worker.usage {
                WorkerUse::Starting => "STARTING",
                WorkerUse::Idle => "IDLE",
                WorkerUse::Leased(_) => "LEASED",
                WorkerUse::Actor(_) => "ACTOR",
                WorkerUse::Unreachable => "STOPPING",
            };
            *out.entry(state).or_insert(0) += 1;
        }
        (out, self.pending.len() as u64)
    }

    /// A worker's record.
    pub(crate) fn worker(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.get(&id)
    }

    /// Records a job and starts its prestarted workers.
    pub(crate) fn add_job(&mut self, job: JobId, executable: String) {
        self.jobs.insert(
            job,
            JobRecord {
                executable,
                start_failures: 0,
                retired: false,
            },
        );
        for _ in 0..self.limits.prestart_workers {
            self.start_worker(job, Vec::new(), EnvVars::new());
        }
    }

    /// A job's driver left: forgets it and its placement groups, and stops
    /// its workers, except the detached actors in `keep` (and their queued
    /// leases): while any is kept the job stays, retired, so they can be
    /// restarted.
    pub(crate) fn end_job(&mut self, job: JobId, keep: &HashSet<ActorId>) {
        let kept = |usage: &WorkerUse| matches!(usage, WorkerUse::Actor(a) if keep.contains(a));
        if keep.is_empty() {
            self.jobs.remove(&job);
        } else if let Some(record) = self.jobs.get_mut(&job) {
            record.retired = true;
            self.pending.retain(|r| {
                r.job != job || matches!(r.grantee, Grantee::Actor(a) if keep.contains(&a))
            });
        }
        for id in self.groups.groups_of(job) {
            self.remove_group(id);
        }
        let pids: Vec<u32> = self
            .workers
            .values()
            .filter(|w| w.job == job && !kept(&w.usage))
            .map(|w| w.pid)
            .collect();
        for pid in pids {
            self.out.push(Decision::StopWorker { pid });
        }
    }

    /// The node is stopping: nothing more is scheduled or restarted, and
    /// every worker's pid is returned (zero for those not forked yet).
    pub(crate) fn stop(&mut self) -> Vec<u32> {
        self.stopping = true;
        self.workers.values().map(|w| w.pid).collect()
    }

    /// Rejects a lease that could never be granted, naming why.
    pub(crate) fn check_feasible(
        &self,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
    ) -> Result<(), Error> {
        self.resources.check_feasible(shape)?;
        match bundle {
            Some(bundle) => self.groups.check_bundle_fits(bundle, shape),
            None => Ok(()),
        }
    }

    /// Queues a lease request; one that could never be granted is refused
    /// at once (a [`Decision::Refused`]).
    pub(crate) fn request_lease(&mut self, request: LeaseRequest<R>) {
        if request.wait_for_node_until.is_some() {
            // It waits for another node; it is never granted here.
            self.pending.push_back(request);
            return;
        }
        if let Err(error) = self.check_feasible(&request.shape, request.bundle) {
            self.out.push(Decision::Refused {
                grantee: request.grantee,
                error,
            });
            return;
        }
        self.pending.push_back(request);
        self.schedule();
    }

    /// Takes out the waiting requests that may go to another node, do not
    /// fit here now, and for which `place` finds a node; returns each
    /// request's client with what `place` answered.
    pub(crate) fn take_spillable<T>(
        &mut self,
        mut place: impl FnMut(&ResourceSet) -> Option<T>,
    ) -> Vec<(R, T)> {
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(self.pending.len());
        let now = Instant::now();
        for request in self.pending.drain(..) {
            if let Some(until) = request.wait_for_node_until {
                if now >= until {
                    let error = self
                        .resources
                        .check_feasible(&request.shape)
                        .err()
                        .unwrap_or_else(|| Error::Infeasible {
                            shape: request.shape.to_string(),
                            total: self.resources.total().to_string(),
                        });
                    self.out.push(Decision::Refused {
                        grantee: request.grantee,
                        error,
                    });
                    continue;
                }
            }
            let movable = request.may_spill
                && request.bundle.is_none()
                && !self.resources.available().contains(&request.shape);
            let target = if movable { place(&request.shape) } else { None };
            match (target, request.grantee) {
                (Some(target), Grantee::Client { reply, .. }) => out.push((reply, target)),
                (_, grantee) => kept.push_back(LeaseRequest { grantee, ..request }),
            }
        }
        self.pending = kept;
        out
    }

    /// Takes out the queued requests of client connection `holder` for
    /// leases of `shape` (from `bundle`), and returns their replies.
    pub(crate) fn cancel_requests(
        &mut self,
        holder: u64,
        shape: &ResourceSet,
        bundle: Option<BundleRef>,
        env: &EnvVars,
    ) -> Vec<R> {
        let mut withdrawn = Vec::new();
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for request in self.pending.drain(..) {
            match request.grantee {
                Grantee::Client { holder: h, reply }
                    if h == holder
                        && request.shape == *shape
                        && request.bundle == bundle
                        && request.env == *env =>
                {
                    withdrawn.push(reply)
                }
                grantee => kept.push_back(LeaseRequest { grantee, ..request }),
            }
        }
        self.pending = kept;
        withdrawn
    }

    /// Drops an actor's queued request (it was killed before it got a
    /// worker).
    pub(crate) fn cancel_actor(&mut self, actor: ActorId) {
        self.pending
            .retain(|p| !matches!(p.grantee, Grantee::Actor(a) if a == actor));
    }

    /// Grants every queued lease that can run now, in arrival order, and
    /// starts workers where only a worker is missing.
    fn schedule(&mut self) {
        if self.stopping {
            return;
        }
        self.groups
            .place_pending(&mut self.resources, &mut self.out);
        let first_decision = self.out.len();
        let mut still_pending = VecDeque::new();
        // Workers being started, per (job, devices), not yet promised to a
        // request.
        let mut spare_starting: HashMap<(JobId, Vec<u32>, EnvVars), usize> = HashMap::new();
        for w in self.workers.values() {
            if w.usage == WorkerUse::Starting {
                *spare_starting
                    .entry((w.job, w.gpu_ids.clone(), w.env.clone()))
                    .or_default() += 1;
            }
        }
        while let Some(request) = self.pending.pop_front() {
            if !self.jobs.contains_key(&request.job) {
                continue; // its driver is gone
            }
            if request.wait_for_node_until.is_some() {
                // Waits for another node (see `take_spillable`).
                still_pending.push_back(request);
                continue;
            }
            let (allocation, bundle) = match self.allocate(&request.shape, request.bundle) {
                Ok(Some(taken)) => taken,
                Ok(None) => {
                    still_pending.push_back(request);
                    continue;
                }
                Err(error) => {
                    self.out.push(Decision::Refused {
                        grantee: request.grantee,
                        error,
                    });
                    continue;
                }
            };
            let gpu_ids = allocation.gpu_ids();
            let for_actor = matches!(request.grantee, Grantee::Actor(_));
            let idle = self
                .workers
                .iter()
                .find(|(_, w)| {
                    w.usage == WorkerUse::Idle
                        && w.job == request.job
                        && w.gpu_ids == gpu_ids
                        && w.env == request.env
                        && !(for_actor && w.owns_actors)
                })
                .map(|(id, _)| *id);
            match idle {
                Some(worker) => self.grant(request, worker, allocation, bundle),
                None => {
                    self.release_to(bundle, &allocation);
                    let spare = spare_starting
                        .entry((request.job, gpu_ids.clone(), request.env.clone()))
                        .or_default();
                    if *spare > 0 {
                        *spare -= 1;
                    } else if self.task_workers_of(request.job) < self.limits.max_workers_per_job
                        || matches!(request.grantee, Grantee::Actor(_))
                    {
                        self.start_worker(request.job, gpu_ids, request.env.clone());
                    } else {
                        // At the job's limit, with idle workers of another
                        // environment: one makes room (the request's
                        // worker starts once its exit is seen).
                        self.stop_idle_of_other_env(request.job, &request.env);
                    }
                    still_pending.push_back(request);
                }
            }
        }
        self.pending = still_pending;
        self.want_leases_back(first_decision);
    }

    /// Requests still waiting after a round may want resources that
    /// leases hold idle, kept by their holders for back-to-back calls. A
    /// lease is wanted while a request (a client's, or an actor's) waits
    /// that asks for a resource it holds, from the same pool (the node's,
    /// or the same placement group's), unless that request is its own
    /// holder's for the same shape (which its holder's idle workers
    /// serve). A grant of this round says so itself (`contended`); the
    /// holder of a lease granted before is told once, with
    /// [`Decision::LeasesWanted`].
    fn want_leases_back(&mut self, first_decision: usize) {
        let unwanted = |l: &Lease| l.holder.is_some() && !l.wanted;
        if self.pending.is_empty() || !self.leases.values().any(unwanted) {
            return;
        }
        // The waiting requests, one per holder, shape and group. An
        // actor's request is no client's own: it has no holder.
        const NO_HOLDER: u64 = u64::MAX;
        let mut waiting: Vec<(u64, &ResourceSet, Option<PlacementGroupId>)> = Vec::new();
        for p in &self.pending {
            let holder = match &p.grantee {
                Grantee::Client { holder, .. } => *holder,
                Grantee::Actor(_) => NO_HOLDER,
            };
            let key = (holder, &p.shape, p.bundle.map(|b| b.group));
            if !waiting.contains(&key) {
                waiting.push(key);
            }
        }
        let wanted = |holder: u64, lease: &Lease| {
            let held = &lease.allocation.shape;
            let pool = lease.bundle.map(|(group, _)| group);
            waiting.iter().any(|(h, shape, group)| {
                *group == pool
                    && (*h != holder || *shape != held)
                    && shape
                        .iter()
                        .any(|(name, q)| !q.is_zero() && !held.get(name).is_zero())
            })
        };
        let mut this_round: Vec<LeaseId> = Vec::new();
        for decision in &mut self.out[first_decision..] {
            if let Decision::Granted {
                grantee: Grantee::Client { holder, .. },
                lease,
                contended,
                ..
            } = decision
            {
                if let Some(l) = self.leases.get_mut(lease) {
                    *contended = wanted(*holder, l);
                    l.wanted = *contended;
                }
                this_round.push(*lease);
            }
        }
        let mut tell: Vec<(u64, Vec<LeaseId>)> = Vec::new();
        for (id, lease) in &mut self.leases {
            let Some(holder) = lease.holder else {
                continue;
            };
            if lease.wanted || this_round.contains(id) || !wanted(holder, lease) {
                continue;
            }
            lease.wanted = true;
            match tell.iter_mut().find(|(h, _)| *h == holder) {
                Some((_, ids)) => ids.push(*id),
                None => tell.push((holder, vec![*id])),
            }
        }
        for (holder, leases) in tell {
            self.out.push(Decision::LeasesWanted { holder, leases });
        }
    }

    /// Stops an idle worker of `job` whose environment is not `env`,
    /// unless one is being stopped already.
    fn stop_idle_of_other_env(&mut self, job: JobId, env: &EnvVars) {
        let stopping = self
            .workers
            .values()
            .any(|w| w.job == job && w.usage == WorkerUse::Unreachable);
        if stopping {
            return;
        }
        let other = self
            .workers
            .values_mut()
            .find(|w| w.job == job && w.usage == WorkerUse::Idle && w.env != *env && w.pid > 0);
        if let Some(w) = other {
            w.usage = WorkerUse::Unreachable;
            self.out.push(Decision::StopWorker { pid: w.pid });
        }
    }

    fn task_workers_of(&self, job: JobId) -> usize {
        self.workers
            .values()
            .filter(|w| w.job == job && !w.blocked && !matches!(w.usage, WorkerUse::Actor(_)))
            .count()
    }

    fn start_worker(&mut self, job: JobId, gpu_ids: Vec<u32>, env: EnvVars) {
        if !self.jobs.contains_key(&job) {
            return;
        }
        let worker = WorkerId::new();
        self.workers.insert(
            worker,
            Worker {
                job,
                env: env.clone(),
                pid: 0,
                gpu_ids: gpu_ids.clone(),
                address: None,
                usage: WorkerUse::Starting,
                blocked: false,
                idle_since: Instant::now(),
                owns_actors: false,
            },
        );
        self.out.push(Decision::StartWorker {
            worker,
            job,
            gpu_ids,
            env,
        });
    }

    fn grant(
        &mut self,
        request: LeaseRequest<R>,
        worker_id: WorkerId,
        allocation: Allocation,
        bundle: Option<(PlacementGroupId, usize)>,
    ) {
        let lease = LeaseId::new();
        let Some(worker) = self.workers.get_mut(&worker_id) else {
            self.release_to(bundle, &allocation);
            return;
        };
        let holder = match &request.grantee {
            Grantee::Client { holder, .. } => {
                worker.usage = WorkerUse::Leased(lease);
                Some(*holder)
            }
            Grantee::Actor(actor) => {
                worker.usage = WorkerUse::Actor(*actor);
                None
            }
        };
        let (address, pid) = (worker.address.clone().unwrap_or_default(), worker.pid);
        if matches!(request.grantee, Grantee::Client { .. }) {
            let waited = request.asked_at.elapsed().as_micros() as u64;
            self.lease_waits.observe(waited);
        }
        self.leases.insert(
            lease,
            Lease {
                worker: worker_id,
                allocation,
                holder,
                lent: None,
                bundle,
                granted_at: Instant::now(),
                wanted: false,
            },
        );
        self.out.push(Decision::Granted {
            grantee: request.grantee,
            lease,
            worker: worker_id,
            address,
            pid,
            contended: false,
        });
    }

    /// A leased worker comes back to the pool.
    pub(crate) fn return_lease(&mut self, lease_id: LeaseId, unreachable: bool) {
        let Some(lease) = self.leases.remove(&lease_id) else {
            return;
        };
        self.release_lease(&lease);
        let held = self
            .workers
            .get(&lease.worker)
            .is_some_and(|w| w.usage == WorkerUse::Leased(lease_id));
        if held && unreachable {
            // Its holder could not connect: the process died (its exit may
            // not be seen yet) or does not listen. Granting it again would
            // fail the next request the same way, so it is stopped and set
            // aside until its exit arrives; a new worker starts if requests
            // wait.
            if let Some(w) = self.workers.get_mut(&lease.worker) {
                w.usage = WorkerUse::Unreachable;
                if w.pid > 0 {
                    self.out.push(Decision::StopWorker { pid: w.pid });
                }
            }
        } else if held {
            if let Some(w) = self.workers.get_mut(&lease.worker) {
                w.set_idle();
            }
        }
        self.schedule();
    }

    /// A client connection closed: its leases and queued requests go.
    pub(crate) fn client_gone(&mut self, holder: u64) {
        let held: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.holder == Some(holder))
            .map(|(id, _)| *id)
            .collect();
        for id in held {
            if let Some(lease) = self.leases.remove(&id) {
                self.release_lease(&lease);
                if let Some(w) = self.workers.get_mut(&lease.worker) {
                    w.set_idle();
                }
            }
        }
        self.pending.retain(|p| match &p.grantee {
            Grantee::Client { holder: h, .. } => *h != holder,
            Grantee::Actor(_) => true,
        });
        self.schedule();
    }

    /// A leased worker started or stopped waiting for objects: its CPUs are
    /// lent to other tasks meanwhile, so nested `get`s cannot deadlock a
    /// full node.
    pub(crate) fn set_blocked(&mut self, worker_id: WorkerId, blocked: bool) {
        let Some(worker) = self.workers.get_mut(&worker_id) else {
            return;
        };
        worker.blocked = blocked;
        let WorkerUse::Leased(lease_id) = worker.usage else {
            return;
        };
        let Some(lease) = self.leases.get_mut(&lease_id) else {
            return;
        };
        // A blocked worker's CPUs go to the node even when its lease came
        // from a bundle: the tasks it waits for are not in its group.
        match (blocked, lease.lent.take()) {
            (true, None) => {
                let mut cpu = ResourceSet::new();
                cpu.set(CPU, lease.allocation.shape.get(CPU));
                self.resources.lend(&cpu);
                lease.lent = Some(cpu);
            }
            (false, Some(cpu)) => self.resources.take_back(&cpu),
            (_, still) => lease.lent = still,
        }
        self.schedule();
    }

    /// Records the pid of a worker just forked. False if the worker is
    /// still recorded but no longer wanted (its job ended, or the node is
    /// stopping, while it was being forked): the caller must kill it, as
    /// nobody else knows its pid. A worker that already exited is not
    /// recorded any more, and needs nothing.
    pub(crate) fn set_pid(&mut self, worker_id: WorkerId, pid: u32) -> bool {
        let stopping = self.stopping;
        let Some(worker) = self.workers.get_mut(&worker_id) else {
            return true;
        };
        if stopping || !self.jobs.contains_key(&worker.job) {
            return false;
        }
        if worker.pid == 0 {
            worker.pid = pid;
        }
        true
    }

    /// A started worker connected back and is ready for leases.
    pub(crate) fn register_worker(
        &mut self,
        worker_id: WorkerId,
        address: String,
        pid: u32,
    ) -> Result<JobId, Error> {
        let Some(worker) = self.workers.get_mut(&worker_id) else {
            return Err(Error::UnknownWorker { worker: worker_id });
        };
        // It may register before its launcher recorded the pid.
        if worker.pid == 0 {
            worker.pid = pid;
        }
        worker.address = Some(address);
        worker.set_idle();
        let job = worker.job;
        if let Some(job) = self.jobs.get_mut(&job) {
            job.start_failures = 0;
        }
        self.schedule();
        Ok(job)
    }

    /// A worker process exited, or could not be started (`reason` says
    /// which). A worker that never registered counts as a failed start:
    /// after `worker_start_attempts` in a row, its job's queued requests
    /// fail. A worker that served leases gives its resources back, its
    /// actor dies, and the job's pool is refilled to its prestart size.
    pub(crate) fn worker_exited(&mut self, worker_id: WorkerId, reason: String) {
        let Some(worker) = self.workers.remove(&worker_id) else {
            return;
        };
        if worker.usage == WorkerUse::Starting && !self.stopping {
            // No pool refill here, so a binary that cannot start is not
            // restarted in a loop.
            let reason = if worker.pid == 0 {
                reason // never forked: the reason says why
            } else {
                format!(
                    "{reason} before it registered; its output is in {}",
                    self.limits
                        .logs_dir
                        .join(format!("worker-{}.err", worker_id.0 as u64))
                        .display()
                )
            };
            self.start_failed(worker.job, reason);
            self.schedule();
            return;
        }
        let lease = match worker.usage {
            WorkerUse::Leased(lease) => Some(lease),
            WorkerUse::Actor(actor) => {
                self.out.push(Decision::ActorLost {
                    actor,
                    reason: reason.clone(),
                });
                self.leases
                    .iter()
                    .find(|(_, l)| l.worker == worker_id)
                    .map(|(id, _)| *id)
            }
            _ => None,
        };
        if let Some(lease) = lease.and_then(|id| self.leases.remove(&id)) {
            self.release_lease(&lease);
        }
        // The pool is refilled while nothing of the job waits: requests
        // that wait start the workers they need (of their environment).
        let keeps_pool = self.jobs.get(&worker.job).is_some_and(|j| !j.retired)
            && !self.pending.iter().any(|r| r.job == worker.job);
        if keeps_pool && !self.stopping {
            let pool = self
                .workers
                .values()
                .filter(|w| {
                    w.job == worker.job
                        && w.env.is_empty()
                        && matches!(w.usage, WorkerUse::Idle | WorkerUse::Starting)
                })
                .count();
            if pool < self.limits.prestart_workers {
                self.start_worker(worker.job, Vec::new(), EnvVars::new());
            }
        }
        self.schedule();
    }

    /// The worker of the most recently granted task lease (not an actor's),
    /// with its pid: the one the memory monitor stops first, as its task
    /// has run the shortest and loses the least work.
    pub(crate) fn newest_task_worker(&self) -> Option<(WorkerId, u32)> {
        self.leases
            .values()
            .filter(|l| l.holder.is_some())
            .max_by_key(|l| l.granted_at)
            .and_then(|l| Some((l.worker, self.workers.get(&l.worker)?.pid)))
            .filter(|(_, pid)| *pid != 0)
    }

    /// Counts a failed start of one of `job`'s workers; the last allowed
    /// one fails the job's queued requests, and counting starts afresh (a
    /// later request tries again).
    fn start_failed(&mut self, job: JobId, reason: String) {
        let attempts = self.limits.worker_start_attempts.max(1);
        let Some(record) = self.jobs.get_mut(&job) else {
            return;
        };
        record.start_failures += 1;
        if record.start_failures < attempts {
            return;
        }
        record.start_failures = 0;
        let error = Error::WorkerStartFailed {
            executable: record.executable.clone(),
            attempts,
            reason,
        };
        let (mine, rest): (VecDeque<_>, _) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.job == job);
        self.pending = rest;
        for request in mine {
            self.out.push(Decision::Refused {
                grantee: request.grantee,
                error: error.clone(),
            });
        }
    }

    /// Idle workers beyond each job's prestarted pool that have been idle
    /// for `idle_worker_timeout` at `now`: their pids, to be stopped. The
    /// most recently used are kept.
    /// The worker at `address` (if it is one of this node's) created an
    /// actor that ends with it: it will not host an actor from now on.
    pub(crate) fn owns_actors(&mut self, address: &str) {
        if let Some(w) = self
            .workers
            .values_mut()
            .find(|w| w.address.as_deref() == Some(address))
        {
            w.owns_actors = true;
        }
    }

    pub(crate) fn idle_workers_to_stop(&self, now: Instant) -> Vec<(WorkerId, u32)> {
        // The prestarted pool is of workers with the job's environment
        // only; one started for a task's own variables stops when idle.
        let mut kept: HashMap<(JobId, bool), usize> = HashMap::new();
        let mut idle: Vec<(&WorkerId, &Worker)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.usage == WorkerUse::Idle)
            .collect();
        idle.sort_by_key(|(_, w)| std::cmp::Reverse(w.idle_since));
        let mut victims = Vec::new();
        for (id, w) in idle {
            let plain = w.env.is_empty();
            let n = kept.entry((w.job, plain)).or_default();
            let pool = match self.jobs.get(&w.job) {
                Some(j) if !j.retired && plain => self.limits.prestart_workers,
                _ => 0,
            };
            if *n < pool
                || now.saturating_duration_since(w.idle_since) < self.limits.idle_worker_timeout
            {
                *n += 1;
            } else {
                victims.push((*id, w.pid));
            }
        }
        victims
    }

    /// Returns a lease's resources, taking back first what its worker lent.
    fn release_lease(&mut self, lease: &Lease) {
        // Lent CPUs went to the node (the tasks a blocked worker waits for
        // are not in its group), so they come back from the node.
        if let Some(cpu) = &lease.lent {
            self.resources.take_back(cpu);
        }
        self.release_to(lease.bundle, &lease.allocation);
        if let Some((group, _)) = lease.bundle {
            self.forget_if_done(group);
        }
    }
}
